"""The math agent's reward: exact numeric match of the final answer.

Example::

    from examples.math_agent.reward import RewardFunction

    reward = RewardFunction()
    reward("3 + 4 = 7, so the answer is 7.", "7")   # 1.0
    reward("The answer is 8.", "7")                  # 0.0
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Final

__all__ = ["RewardFunction", "last_number"]

# Signed numbers with optional thousands separators and decimals: "-3", "1,200", "2.50".
_NUMBER_RE: Final = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?|-?\d+(?:\.\d+)?")


def last_number(text: str) -> Decimal | None:
    """The last number written in ``text`` (commas dropped), or ``None`` if there is none.

    Example::

        last_number("I had 3, now 1,200 apples.")   # Decimal("1200")
    """
    found = _NUMBER_RE.findall(text)
    if not found:
        return None
    try:
        return Decimal(found[-1].replace(",", ""))
    except InvalidOperation:  # pragma: no cover - the pattern only matches numbers
        return None


class RewardFunction:
    """Scores a response against the ground truth: ``correct`` when the last number in the
    response equals the answer exactly (``7``, ``7.0`` and ``7.00`` are equal), else
    ``incorrect``. A response without a number, or a ground truth that is not a number,
    scores ``incorrect``.

    Example::

        reward = RewardFunction(correct=1.0, incorrect=0.0)
        reward("The answer is 1,200.", "1200")   # 1.0
    """

    def __init__(self, *, correct: float = 1.0, incorrect: float = 0.0) -> None:
        self.correct = correct
        self.incorrect = incorrect

    def __repr__(self) -> str:
        return f"RewardFunction(correct={self.correct}, incorrect={self.incorrect})"

    def __call__(self, response: str, ground_truth: str) -> float:
        predicted = last_number(response)
        expected = last_number(ground_truth)
        if predicted is None or expected is None:
            return self.incorrect
        return self.correct if predicted == expected else self.incorrect
