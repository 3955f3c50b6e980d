"""``agentcore-rl eval --group-size``: groups, their summary and rows, and --resume after a
SIGKILL (every group once, no member run twice), on the local stack."""

from __future__ import annotations

import asyncio
import signal
import subprocess
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agentcore_rl.cli import main
from agentcore_rl.cli.journal import rows_path_for
from agentcore_rl.local.policy import ScriptedPolicy, Serving
from agentcore_rl.local.stack import LocalStack
from agentcore_rl.training import read_jsonl
from tests.e2e.test_cli_eval import (
    Gate,
    _common,
    _lines,
    _spawn_eval,
    _stack,
    _wait_until,
    _write_problems,
)


@pytest.fixture
async def stack(s3_endpoint: str) -> AsyncIterator[LocalStack]:
    async with _stack(s3_endpoint, ScriptedPolicy(accuracy=0.5, seed=1)) as value:
        yield value


async def test_eval_runs_groups_and_writes_rows(
    stack: LocalStack, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ids = _write_problems(tmp_path / "in.jsonl", 4)
    out = tmp_path / "results.jsonl"
    argv = _common(stack, tmp_path / "in.jsonl", out, "groups")
    argv += ["--agent-url", stack.agent_urls[0], "--group-size", "4", "--redundancy", "1"]

    code = await asyncio.to_thread(main, argv)

    records = _lines(out)
    assert sorted(r["input_id"] for r in records) == sorted(ids)
    assert {r["outcome"] for r in records} == {"done"}
    assert all(len(r["rewards"]) == 4 for r in records)
    assert all(len(r["discarded"]) == 1 for r in records)  # the extra, stopped
    assert code == 0
    rows = read_jsonl(rows_path_for(out))
    assert len(rows) == 16
    assert {row.group_id for row in rows} == set(ids)
    printed = capsys.readouterr().out
    assert "groups of 4" in printed
    assert "pass@4" in printed


async def test_resume_after_sigkill_runs_every_group_once_and_no_member_twice(
    s3_endpoint: str, tmp_path: Path
) -> None:
    # Group 1 (two members, two policy requests each) goes through; group 2 blocks.
    gate = Gate(free=4)
    policy = ScriptedPolicy(accuracy=1.0, serving=Serving(latency=0.001), sleep=gate.sleep)
    n = 3
    async with _stack(s3_endpoint, policy) as local:
        ids = _write_problems(tmp_path / "in.jsonl", n)
        out = tmp_path / "results.jsonl"
        journal = tmp_path / "results.jsonl.journal"
        argv = _common(local, tmp_path / "in.jsonl", out, "group-resume")
        argv += ["--agent-url", local.agent_urls[0], "--concurrency", "2", "--group-size", "2"]
        process = await _spawn_eval(argv, stderr=subprocess.DEVNULL)
        try:
            await _wait_until(
                process,
                lambda: len(_lines(out)) == 1 and gate.held == 2,
                "one group recorded and both members of the second running on the agent",
            )
        finally:
            process.send_signal(signal.SIGKILL)
            await asyncio.wait_for(process.wait(), 10)
        started = [e["session_id"] for e in _lines(journal) if e["event"] == "member_started"]
        assert len(started) == 4

        gate.opened.set()  # the orphaned members now finish and write their results
        code = await asyncio.to_thread(main, [*argv, "--resume"])

        records = _lines(out)
        assert code == 0
        assert sorted(r["input_id"] for r in records) == sorted(ids)  # each group once
        assert {r["outcome"] for r in records} == {"done"}
        members = [m["session_id"] for r in records for m in r["members"]]
        assert len(members) == len(set(members)) == 2 * n
        assert set(started) <= set(members)  # the in-flight members were picked up again
        # No member ran twice: two policy requests per member, six members.
        assert policy.requests == 2 * 2 * n
        starts = Counter(e["session_id"] for e in _lines(journal) if e["event"] == "member_started")
        assert max(starts.values()) == 1
