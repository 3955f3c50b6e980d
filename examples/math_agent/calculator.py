"""The math agent's calculator tool: exact arithmetic over an AST, never ``eval``.

Example::

    from examples.math_agent.calculator import calculate

    calculate('{"expression": "(12 + 6) / 3"}')   # "6"
    calculate('{"expression": "__import__(\\'os\\')"}')  # "error: ..."
"""

from __future__ import annotations

import ast
import json
import operator
from collections.abc import Callable
from fractions import Fraction
from typing import Any, Final

__all__ = ["CALCULATOR_TOOL", "calculate", "evaluate"]

#: The tool's schema in the OpenAI ``tools`` format.
CALCULATOR_TOOL: Final[Any] = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression with + - * / and parentheses.",
        "parameters": {
            "type": "object",
            "properties": {
                "expression": {"type": "string", "description": "for example (12 + 5) * 3"}
            },
            "required": ["expression"],
        },
    },
}

_MAX_EXPRESSION: Final = 200
_OPERATORS: Final[dict[type[ast.AST], Callable[[Fraction, Fraction], Fraction]]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
}


def _value(node: ast.AST) -> Fraction:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return Fraction(str(node.value))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.UAdd | ast.USub):
        inner = _value(node.operand)
        return inner if isinstance(node.op, ast.UAdd) else -inner
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        left, right = _value(node.left), _value(node.right)
        if isinstance(node.op, ast.Div) and right == 0:
            raise ValueError("division by zero")
        return _OPERATORS[type(node.op)](left, right)
    raise ValueError(f"only numbers, + - * / and parentheses are allowed, not {ast.dump(node)}")


def evaluate(expression: str) -> Fraction:
    """The exact value of an arithmetic expression; ``ValueError`` for anything else.

    Example::

        evaluate("7 / 2")   # Fraction(7, 2)
    """
    if len(expression) > _MAX_EXPRESSION:
        raise ValueError(f"expression longer than {_MAX_EXPRESSION} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as exc:
        raise ValueError(f"not an arithmetic expression: {expression!r}") from exc
    return _value(tree.body)


def calculate(arguments: str) -> str:
    """Run the tool on the model's JSON arguments; errors come back as text for the model.

    Example::

        calculate('{"expression": "2 * 21"}')   # "42"
    """
    try:
        parsed = json.loads(arguments)
        expression = parsed["expression"] if isinstance(parsed, dict) else None
        if not isinstance(expression, str):
            return 'error: arguments must be {"expression": "<arithmetic>"}'
        value = evaluate(expression)
    except (ValueError, KeyError) as exc:
        return f"error: {exc}"
    if value.denominator == 1:
        return str(value.numerator)
    return f"{float(value):.10g}"
