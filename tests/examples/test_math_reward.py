"""The math example's pure parts: reward, calculator tool and dataset generator."""

from __future__ import annotations

import json

import pytest

from agentcore_rl.local.policy import evaluate_arithmetic, solve_word_problem
from examples.math_agent.calculator import calculate
from examples.math_agent.dataset import DEFAULT_DATA_PATH, generate, load_problems, main
from examples.math_agent.reward import RewardFunction


@pytest.mark.parametrize(
    ("response", "truth", "expected"),
    [
        ("The answer is 14.", "14", 1.0),
        ("The answer is 13.", "14", 0.0),
        ("12 + 2 = 14, so the answer is 14", "14", 1.0),
        ("First 14, then 15. The answer is 15.", "14", 0.0),  # the LAST number counts
        ("The answer is 14.0", "14", 1.0),
        ("The answer is 1,200.", "1200", 1.0),
        ("The answer is -3.", "-3", 1.0),
        ("The answer is 3.", "-3", 0.0),
        ("I do not know.", "14", 0.0),
        ("", "14", 0.0),
        ("The answer is 14.", "fourteen", 0.0),
        ("The answer is 2.5", "2.50", 1.0),
    ],
)
def test_reward_is_exact_numeric_match(response: str, truth: str, expected: float) -> None:
    assert RewardFunction()(response, truth) == expected


def test_reward_values_are_configurable() -> None:
    reward = RewardFunction(correct=2.0, incorrect=-1.0)
    assert reward("The answer is 4.", "4") == 2.0
    assert reward("The answer is 5.", "4") == -1.0


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ('{"expression": "(12 + 6) / 3"}', "6"),
        ('{"expression": "7 / 2"}', "3.5"),
        ('{"expression": "-4 * 2"}', "-8"),
        ("{\"expression\": \"__import__('os').system('true')\"}", "error:"),
        ('{"expression": "2 ** 100000"}', "error:"),
        ('{"expression": "1 / 0"}', "error: division by zero"),
        ('{"expr": "1"}', "error:"),
        ("not json", "error:"),
    ],
)
def test_calculator_is_safe_arithmetic(arguments: str, expected: str) -> None:
    assert calculate(arguments).startswith(expected)


def test_generator_is_deterministic_and_shipped_file_matches() -> None:
    assert generate(20, seed=7) == generate(20, seed=7)
    assert generate(20, seed=7) != generate(20, seed=8)
    shipped = [json.loads(line) for line in DEFAULT_DATA_PATH.read_text().splitlines()]
    assert shipped == generate(len(shipped), seed=0)
    assert len({p["id"] for p in shipped}) == len(shipped) >= 200
    assert [p.id for p in load_problems(limit=3)] == ["math-0000", "math-0001", "math-0002"]


def test_every_problem_is_solvable_by_the_stand_in_policy() -> None:
    for problem in generate(300, seed=1):
        assert int(problem["answer"]) >= 0
        assert evaluate_arithmetic(problem["solution"]) == int(problem["answer"])
        assert solve_word_problem(problem["prompt"]) == problem["solution"]


def test_generator_cli_writes_jsonl(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--n", "3", "--seed", "0"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [json.loads(line) for line in lines] == generate(3, seed=0)
