"""Every failure's kind, end to end through ``agentcore-rl eval`` on the local stack: the
agent's own failure (its handler raising on a malformed tool call), a reward failure (NaN,
no reward) and an infrastructure one (``InfraError``) each land in the results line, the
groups' members, the summary and the report's failures section under their kind; and a
run whose infrastructure keeps failing stops, naming the counts by cause."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agentcore_rl.cli import main
from agentcore_rl.cli.common import EXIT_FAILURES, EXIT_UNAVAILABLE
from agentcore_rl.local.policy import ScriptedPolicy
from agentcore_rl.local.stack import LocalStack, StackS3
from tests.e2e.test_cli_eval import _lines


@pytest.fixture
async def stack(s3_endpoint: str) -> AsyncIterator[LocalStack]:
    async with LocalStack(
        "tests.e2e.failing_agent:app",
        agents=1,
        s3=StackS3(endpoint_url=s3_endpoint, bucket="failure-kinds"),
        policy=ScriptedPolicy(accuracy=1.0),
        tps=None,
    ) as value:
        yield value


def _problem(input_id: str, **extra: object) -> dict[str, object]:
    return {"id": input_id, "prompt": "What is 2 + 2?", "answer": "4", **extra}


async def _eval(stack: LocalStack, data: Path, out: Path, *extra: str) -> int:
    assert stack.s3_endpoint_url is not None
    argv = [
        "eval", str(data), "--agent-url", stack.agent_urls[0], "--s3-bucket", stack.bucket,
        "--exp-id", out.stem, "--out", str(out), "--model-id", str(stack.policy_model),
        "--base-url", str(stack.policy_base_url), "--s3-endpoint-url", stack.s3_endpoint_url,
        "--timeout", "30", "--tps", "0", "--no-progress", "--retry-rollouts", "0", *extra,
    ]  # fmt: skip
    return await asyncio.to_thread(main, argv)


@pytest.mark.timeout(180)
async def test_each_failure_is_classified_in_the_results_summary_groups_and_report(
    stack: LocalStack, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "in.jsonl"
    problems = [
        _problem("ok"),
        _problem("explode", explode=True),
        _problem("nan", reward="nan"),
        _problem("none", reward="none"),
        _problem("infra", infra=True),
    ]
    data.write_text("".join(json.dumps(p) + "\n" for p in problems))
    out = tmp_path / "plain.jsonl"
    assert await _eval(stack, data, out) == EXIT_FAILURES
    lines = {line["input_id"]: line for line in _lines(out)}
    assert {i: line["failure_kind"] for i, line in lines.items()} == {
        "ok": None,
        "explode": "agent",
        "nan": "reward",
        "none": "reward",
        "infra": "infra",
    }
    assert lines["nan"]["result"]["stop_reason"] == "rewards[0] must be finite, got nan"
    assert lines["none"]["error"] == (
        "the result has no reward: return rewards: [r, ...] or reward: r"
    )
    summary = {}
    for row in capsys.readouterr().out.splitlines():
        label, _, value = row.strip().partition("  ")
        summary[label] = value.strip()
    assert summary["failures by kind"] == "1 agent, 1 infra, 2 reward"
    assert summary["reward: RolloutError"] == "1  (rewards[0] must be finite, got nan)"
    assert summary["reward: RewardError"].startswith("1  (the result has no reward")
    assert summary["infra: RolloutError (InfraError)"].startswith("1  (InfraError: the calc")
    assert summary["agent: RolloutError (ValueError)"].startswith("1  (ValueError: the calc")

    groups_out = tmp_path / "groups.jsonl"
    assert await _eval(stack, data, groups_out, "--group-size", "2") == EXIT_FAILURES
    groups = {line["input_id"]: line for line in _lines(groups_out)}
    kinds = {
        i: sorted({m["failure_kind"] for m in g["members"] + g["discarded"]} - {None})
        for i, g in groups.items()
    }
    assert kinds == {"ok": [], "explode": ["agent"], "nan": ["reward"], "none": ["reward"],
                     "infra": ["infra"]}  # fmt: skip
    assert groups["infra"]["reason"] == "too_few_members"  # left out, never zeroed

    report = tmp_path / "report.html"
    assert main(["report", str(out), "-o", str(report)]) == 0
    html = report.read_text()
    assert "by kind: 1 agent, 1 infra, 2 reward</p>" in html
    for cause in ("agent: RolloutError (ValueError)", "reward: RolloutError",
                  "infra: RolloutError (InfraError)", "reward: RewardError"):  # fmt: skip
        assert f"<b>{cause}</b> &times; 1" in html


@pytest.mark.timeout(180)
async def test_an_eval_whose_infrastructure_keeps_failing_stops_and_names_the_cause(
    stack: LocalStack, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "in.jsonl"
    problems = [_problem(f"q-{n}", infra=n % 10 < 3) for n in range(120)]
    data.write_text("".join(json.dumps(p) + "\n" for p in problems))
    out = tmp_path / "stopped.jsonl"
    code = await _eval(stack, data, out, "--concurrency", "4")
    assert code == EXIT_UNAVAILABLE
    err = capsys.readouterr().err
    # More than 20 of a window of 100 (the default), here after about 70 rollouts.
    assert re.search(
        r"infrastructure failures in 21 of the last \d+ rollouts \(21 InfraError\)", err
    )
    assert len(_lines(out)) < len(problems)
    # Fixed (here: stopped off), the run resumes as any other.
    assert await _eval(stack, data, out, "--concurrency", "4", "--resume",
                       "--infra-stop", "off") == EXIT_FAILURES  # fmt: skip
    assert len(_lines(out)) == len(problems)
