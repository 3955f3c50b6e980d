"""What a new user runs into first, on the local stack: group seeds (groups on the stand-in
are not all uniform, a dropped group says why at WARNING), the summary after ``--resume``
covers the whole results file, eval's log level, demo's ``--out`` checked before the stack
starts, cost on every results line, and latency counting an input's retries."""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agentcore_rl import AsyncRolloutClient, AwsConfig, GroupRules
from agentcore_rl.cli import main
from agentcore_rl.local.policy import ScriptedPolicy
from agentcore_rl.local.stack import LocalStack
from tests.e2e.test_cli_eval import _common, _lines, _stack, _write_problems


@pytest.fixture
async def stack(s3_endpoint: str) -> AsyncIterator[LocalStack]:
    async with _stack(s3_endpoint, ScriptedPolicy(accuracy=0.5, seed=1)) as value:
        yield value


async def _groups(stack: LocalStack, tmp_path: Path, name: str, *extra: str) -> list[float]:
    out = tmp_path / f"{name}.jsonl"
    argv = [*_common(stack, tmp_path / "in.jsonl", out, name), "--agent-url"]
    argv += [stack.agent_urls[0], "--group-size", "4", *extra]
    assert await asyncio.to_thread(main, argv) == 0
    return [len(set(r["rewards"])) for r in _lines(out)]


async def test_group_seed_samples_each_member_apart(stack: LocalStack, tmp_path: Path) -> None:
    _write_problems(tmp_path / "in.jsonl", 6)

    # Without seeds every member of a group is the same request: the stand-in answers alike.
    assert set(await _groups(stack, tmp_path, "unseeded")) == {1}
    assert max(await _groups(stack, tmp_path, "seeded", "--group-seed", "11")) > 1


async def test_a_uniform_group_dropped_says_why_at_warning(
    stack: LocalStack, caplog: pytest.LogCaptureFixture
) -> None:
    """The README's GRPO rules without member seeds: the drop is logged where the default
    log level shows it, with what to change."""
    from examples.math_agent.dataset import generate

    rules = GroupRules(n=3, filter_uniform=True)
    async with AsyncRolloutClient(
        agent_url=stack.agent_urls[0],
        s3_bucket=stack.bucket,
        exp_id="uniform",
        rollout={"base_url": stack.policy_base_url, "model_id": stack.policy_model},
        aws=AwsConfig(s3_endpoint_url=stack.s3_endpoint_url),
    ) as client:
        with caplog.at_level(logging.WARNING):
            groups = [g async for g in client.run_groups(generate(2, seed=3), rules=rules)]

    assert groups == []
    drops = [r for r in caplog.records if "dropped (uniform)" in r.getMessage()]
    assert len(drops) == 2
    assert all(r.levelno == logging.WARNING for r in drops)
    assert "member_seed" in drops[0].getMessage()


async def test_summary_after_resume_covers_the_whole_results_file(
    stack: LocalStack, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _write_problems(tmp_path / "in.jsonl", 3)
    out = tmp_path / "results.jsonl"
    argv = [*_common(stack, tmp_path / "in.jsonl", out, "whole"), "--agent-url"]
    argv += [stack.agent_urls[0], "--log-level", "error"]
    assert await asyncio.to_thread(main, [*argv, "--limit", "2"]) == 0
    capsys.readouterr()

    assert await asyncio.to_thread(main, [*argv, "--resume"]) == 0
    first = capsys.readouterr().out
    assert await asyncio.to_thread(main, [*argv, "--resume"]) == 0  # already finished
    again = capsys.readouterr().out

    records = _lines(out)
    rewards = [r["reward"] for r in records]
    for printed in (first, again):
        assert re.search(r"\nrollouts +3\n", printed)
        assert re.search(rf"\nmean reward +{sum(rewards) / 3:.3f} \(3 finished\)", printed)
        assert "(;" not in printed
    # Throughput is this run's rollouts in this run's time: the last one ran none.
    assert re.search(r"\nthroughput +0\.0 rollouts/s\n", again)
    # Every line has its cost estimate (the runtime from the envelope) and its end time.
    assert all(r["cost"]["runtime_s"] is not None and r["ended_at"] for r in records)


def test_eval_takes_a_log_level(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["eval", "x.jsonl", "--agent-url", "http://127.0.0.1:9", "--s3-bucket", "b",
                 "--exp-id", "e", "--log-level", "loud"]) == 2  # fmt: skip
    assert "--log-level: invalid choice: 'loud'" in capsys.readouterr().err


def test_demo_refuses_a_missing_out_directory_before_starting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "missing" / "r.jsonl"
    assert main(["demo", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"the directory of --out does not exist: {out.parent}" in err
    assert "starting" not in err  # nothing was started
