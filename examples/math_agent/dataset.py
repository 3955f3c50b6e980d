"""A deterministic generator of small GSM8K-style arithmetic word problems.

Each problem is a starting amount followed by one to three changes (buy, give away,
double, share equally...) and a question; every intermediate value is a whole number. The
same ``--seed`` always gives the same problems. The shipped ``data/problems.jsonl`` was made
with::

    python -m examples.math_agent.dataset --n 300 --seed 0 > examples/math_agent/data/problems.jsonl

Each line is ``{"id": "math-0000", "prompt": "...", "answer": "14", "solution": "12 + 5 - 3"}``
(``answer`` is a string, as the agent's payload validation requires).

The sentences use a small, fixed phrasing on purpose: the offline stand-in policy
(``agentcore_rl.local.policy``) is a pattern-based script, not a language model, and it
reads exactly this phrasing. A real model reads anything.

Example::

    from examples.math_agent.dataset import generate

    problems = generate(5, seed=0)
    problems[0]["prompt"]   # "Maya has 12 apples. She buys 5 more apples. ..."
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

__all__ = ["DEFAULT_DATA_PATH", "Problem", "generate", "load_problems", "main"]

#: The shipped dataset (300 problems, seed 0).
DEFAULT_DATA_PATH: Final = Path(__file__).parent / "data" / "problems.jsonl"

_PEOPLE: Final = (
    ("Maya", "She", "her"),
    ("Leo", "He", "him"),
    ("Ana", "She", "her"),
    ("Sam", "He", "him"),
    ("Priya", "She", "her"),
    ("Omar", "He", "him"),
    ("Lena", "She", "her"),
    ("Kofi", "He", "him"),
    ("Hana", "She", "her"),
    ("Diego", "He", "him"),
    ("Zoe", "She", "her"),
    ("Ravi", "He", "him"),
)
_ITEMS: Final = (
    "apples",
    "marbles",
    "stickers",
    "pencils",
    "books",
    "shells",
    "coins",
    "cookies",
    "stamps",
    "cards",
)
_MAX_VALUE: Final = 999


@dataclass
class _State:
    name: str
    pronoun: str
    obj: str
    items: str
    value: int
    expression: str
    low_precedence: bool = False  # the expression's top-level operator is + or -


def _start(rng: random.Random, s: _State) -> str:
    return rng.choice(
        (
            f"{s.name} has {s.value} {s.items}.",
            f"{s.name} starts the day with {s.value} {s.items}.",
            f"There are {s.value} {s.items} in {s.name}'s basket.",
        )
    )


def _add(rng: random.Random, s: _State) -> str | None:
    amount = rng.randint(2, 30)
    if s.value + amount > _MAX_VALUE:
        return None
    s.value += amount
    s.expression, s.low_precedence = f"{s.expression} + {amount}", True
    return rng.choice(
        (
            f"{s.pronoun} buys {amount} more {s.items}.",
            f"{s.pronoun} finds {amount} more {s.items} on the way home.",
            f"A friend gives {s.obj} {amount} more {s.items}.",
            f"{s.pronoun} receives {amount} {s.items} as a gift.",
        )
    )


def _subtract(rng: random.Random, s: _State) -> str | None:
    if s.value < 3:
        return None
    amount = rng.randint(1, min(s.value - 1, 25))
    s.value -= amount
    s.expression, s.low_precedence = f"{s.expression} - {amount}", True
    return rng.choice(
        (
            f"{s.pronoun} gives away {amount} {s.items}.",
            f"{s.pronoun} loses {amount} of them.",
            f"{s.pronoun} sells {amount} {s.items} at the market.",
            f"{s.pronoun} uses {amount} {s.items} for a school project.",
        )
    )


def _multiply(rng: random.Random, s: _State) -> str | None:
    factor = rng.choice((2, 2, 3, 4))
    if s.value * factor > _MAX_VALUE:
        return None
    left = f"({s.expression})" if s.low_precedence else s.expression
    s.value *= factor
    s.expression, s.low_precedence = f"{left} * {factor}", False
    if factor == 2:
        return f"Then the number of {s.items} doubles."
    if factor == 3:
        return f"Then the number of {s.items} triples."
    return f"{s.pronoun} ends up with {factor} times as many {s.items} as before."


def _halve(rng: random.Random, s: _State) -> str | None:
    if s.value % 2 or s.value < 4:
        return None
    left = f"({s.expression})" if s.low_precedence else s.expression
    s.value //= 2
    s.expression, s.low_precedence = f"{left} / 2", False
    return f"{s.pronoun} gives away half of them."


_CHANGES: Final[tuple[Callable[[random.Random, _State], str | None], ...]] = (
    _add,
    _add,
    _subtract,
    _subtract,
    _multiply,
    _halve,
)


def _share(rng: random.Random, s: _State) -> str | None:
    friends = [k for k in range(2, 7) if s.value % k == 0 and s.value // k >= 2]
    if not friends:
        return None
    k = rng.choice(friends)
    left = f"({s.expression})" if s.low_precedence else s.expression
    s.value //= k
    s.expression, s.low_precedence = f"{left} / {k}", False
    return f"{s.pronoun} shares them equally among {k} friends."


def _one(rng: random.Random, index: int) -> dict[str, str]:
    name, pronoun, obj = rng.choice(_PEOPLE)
    items = rng.choice(_ITEMS)
    start = rng.randint(5, 60)
    state = _State(name, pronoun, obj, items, start, str(start))
    sentences = [_start(rng, state)]
    steps = rng.randint(1, 3)
    while len(sentences) <= steps:
        sentence = rng.choice(_CHANGES)(rng, state)
        if sentence is not None:
            sentences.append(sentence)
    question = f"How many {items} does {name} have now?"
    if rng.random() < 0.25:
        shared = _share(rng, state)
        if shared is not None:
            sentences.append(shared)
            question = f"How many {items} does each friend get?"
    sentences.append(question)
    return {
        "id": f"math-{index:04d}",
        "prompt": " ".join(sentences),
        "answer": str(state.value),
        "solution": state.expression,
    }


def generate(n: int, *, seed: int = 0) -> list[dict[str, str]]:
    """``n`` problems; the same ``seed`` always gives the same list.

    Example::

        generate(2, seed=0)[1]["answer"]   # a whole number, as a string
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    rng = random.Random(seed)
    return [_one(rng, i) for i in range(n)]


def load_problems(path: Path = DEFAULT_DATA_PATH, *, limit: int | None = None) -> list[Problem]:
    """Read problems from a JSONL file (the shipped one by default).

    Example::

        problems = load_problems(limit=10)
    """
    problems: list[Problem] = []
    with path.open(encoding="utf-8") as lines:
        for line in lines:
            if limit is not None and len(problems) >= limit:
                break
            if line.strip():
                record = json.loads(line)
                problems.append(Problem(record["id"], record["prompt"], record["answer"]))
    return problems


@dataclass(frozen=True)
class Problem:
    """One problem: its id, the text and the ground-truth answer (a string).

    Example::

        Problem("math-0000", "What is 2 + 2?", "4")
    """

    id: str
    prompt: str
    answer: str


def main(argv: list[str] | None = None) -> int:
    """Write ``--n`` problems as JSONL to stdout.

    Example::

        python -m examples.math_agent.dataset --n 300 --seed 0 > problems.jsonl
    """
    parser = argparse.ArgumentParser(
        prog="python -m examples.math_agent.dataset",
        description="Generate arithmetic word problems as JSONL on stdout.",
    )
    parser.add_argument("--n", type=int, default=300, help="number of problems (default 300)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    args = parser.parse_args(argv)
    if args.n < 0:
        parser.error("--n must be >= 0")
    for problem in generate(args.n, seed=args.seed):
        sys.stdout.write(json.dumps(problem) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
