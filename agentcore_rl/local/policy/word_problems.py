"""The scripted voice's "reasoning": a pattern-based solver for simple arithmetic word
problems (the phrase language of ``examples/math_agent/dataset.py``) and a safe arithmetic
evaluator. Not a language model.

The first sentence with a number and no operation word sets the starting value; ``more``,
``buys``, ``finds``... add; ``gives away``, ``loses``, ``eats``... subtract; ``times as
many``, ``doubles``, ``triples`` multiply; ``equally among N``, ``splits``, ``half``
divide. A prompt that already holds an expression ("What is 3 + 4 * 2?") is taken as is.

Example::

    solve_word_problem("Maya has 12 apples. She buys 5 more. She eats 3.")   # "12 + 5 - 3"
"""

from __future__ import annotations

import ast
import operator
import re
from collections.abc import Callable
from fractions import Fraction
from typing import Final

__all__ = ["evaluate_arithmetic", "solve_word_problem"]

_SENTENCE_RE: Final = re.compile(r"[^.?!]+[.?!]?")
_NUMBER_RE: Final = re.compile(r"\d+(?:\.\d+)?")
# An explicit expression: two or more numbers joined by operators (parentheses allowed).
_EXPRESSION_RE: Final = re.compile(
    r"\(*\s*\d+(?:\.\d+)?\s*\)*(?:\s*[-+*/]\s*\(*\s*\d+(?:\.\d+)?\s*\)*)+"
)

# Word lists per operation; the first matching operation in this order wins, so that
# "gives away" (subtract) is not read as "gives ... more" (add).
_DIVIDE: Final = ("equally among", "equally between", "split", "splits", "divide", "divides")
_MULTIPLY: Final = ("times as many", "times as much", "times more")
_SUBTRACT: Final = tuple(
    ["gives away", "give away", "loses", "eats", "sells", "spends", "uses", "breaks", "fewer"]
)
_ADD: Final = ("more", "buys", "finds", "receives", "earns", "picks", "gets", "collects")
_IMPLIED_FACTORS: Final = {"doubles": 2, "triples": 3, "half": 2, "halves": 2}

_BINARY: Final[dict[type[ast.operator], Callable[[Fraction, Fraction], Fraction]]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
}


def _contains(sentence: str, phrases: tuple[str, ...]) -> bool:
    return any(re.search(rf"\b{re.escape(p)}\b", sentence) for p in phrases)


def _operation(sentence: str) -> tuple[str, int | None] | None:
    """(operator, implied operand) for a sentence, or None when it names no operation."""
    words = sentence.lower()
    for word, factor in _IMPLIED_FACTORS.items():
        if re.search(rf"\b{word}\b", words):
            return ("/" if word in ("half", "halves") else "*"), factor
    if _contains(words, _DIVIDE):
        return "/", None
    if _contains(words, _MULTIPLY):
        return "*", None
    if _contains(words, _SUBTRACT):
        return "-", None
    if _contains(words, _ADD):
        return "+", None
    return None


def solve_word_problem(text: str) -> str | None:
    """Turn a problem into an arithmetic expression, or ``None`` when it is not understood."""
    explicit = _EXPRESSION_RE.search(text)
    if explicit is not None:
        return " ".join(explicit.group(0).split())
    expr: str | None = None
    low_precedence = False  # whether expr's top-level operator is + or -
    for sentence in _SENTENCE_RE.findall(text):
        numbers = _NUMBER_RE.findall(sentence)
        op = _operation(sentence)
        if expr is None:
            if numbers and op is None:
                expr = numbers[0]
            continue
        if op is None:
            continue
        symbol, implied = op
        operand = str(implied) if implied is not None else (numbers[0] if numbers else None)
        if operand is None:
            continue
        if symbol in "+-":
            expr, low_precedence = f"{expr} {symbol} {operand}", True
        else:
            left = f"({expr})" if low_precedence else expr
            expr, low_precedence = f"{left} {symbol} {operand}", False
    if expr is None or expr == (_NUMBER_RE.findall(text) or [None])[0]:
        return None  # no operation found: nothing to compute
    return expr


def _eval_node(node: ast.AST) -> Fraction:
    if isinstance(node, ast.Expression):
        return _eval_node(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
        if isinstance(node.value, bool):
            raise ValueError("booleans are not numbers here")
        return Fraction(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        value = _eval_node(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval_node(node.left), _eval_node(node.right)
        if isinstance(node.op, ast.Div) and right == 0:
            raise ValueError("division by zero")
        return _BINARY[type(node.op)](left, right)
    raise ValueError(f"unsupported element in expression: {type(node).__name__}")


def evaluate_arithmetic(expression: str) -> int | float:
    """Evaluate ``+ - * /`` and parentheses over numbers exactly (never ``eval``).

    Returns an ``int`` when the result is whole. Raises ``ValueError`` for anything else.
    """
    if len(expression) > 200:
        raise ValueError("expression is too long")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as exc:
        raise ValueError(f"not an arithmetic expression: {expression!r}") from exc
    value = _eval_node(tree)
    return int(value) if value.denominator == 1 else float(value)
