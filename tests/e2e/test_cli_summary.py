"""The eval summary in the terminal: the mean reward says what it is over, and failures
are shown by error type with a short reason (the real CLI in a subprocess)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

from agentcore_rl.local.policy import ScriptedPolicy
from tests.e2e.test_cli_eval import REPO, _common, _stack


async def test_the_summary_shows_failures_by_type_and_the_reward_s_basis(
    s3_endpoint: str, tmp_path: Path
) -> None:
    data = tmp_path / "in.jsonl"
    good = [{"id": f"q-{i}", "prompt": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(3)]
    bad = {"id": "q-bad", "prompt": 5, "answer": "1"}  # the agent refuses it with a 400
    data.write_text("".join(json.dumps(p) + "\n" for p in [*good, bad]))
    async with _stack(s3_endpoint, ScriptedPolicy(accuracy=1.0)) as stack:
        argv = _common(stack, data, tmp_path / "out.jsonl", "summary")
        argv += ["--agent-url", stack.agent_urls[0], "--retry-rollouts", "0"]
        done = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "agentcore_rl.cli", *argv],
            cwd=REPO,
            env=dict(os.environ),
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert done.returncode == 1, done.stderr
    rows = {}
    for line in done.stdout.splitlines():
        label, _, value = line.strip().partition("  ")
        rows[label] = value.strip()
    assert rows["mean reward"] == "1.000 (3 finished)"
    assert rows["failed"] == "1"
    assert rows["failures by kind"] == "1 agent"  # the agent refused the input: not infra
    assert rows["agent: InvocationError"].startswith("1  (")
    assert "prompt must be a string" in rows["agent: InvocationError"], done.stdout


def test_agent_failures_are_told_apart_by_what_failed_in_the_agent(tmp_path: Path) -> None:
    from agentcore_rl.cli.show import load_run

    def failed(n: int, reason: str) -> dict[str, object]:
        envelope = {"status_code": 500, "error_type": "handler_exception", "stop_reason": reason}
        return {
            "input_id": f"q-{n}",
            "outcome": "failed",
            "error_type": "RolloutError",
            "error": "rollout 0f31... failed",
            "result": envelope,
        }

    lines = [
        failed(1, "KeyError: 'a'"),
        failed(2, "KeyError: 'b'"),
        failed(3, "RuntimeError: boom"),
    ]
    timeout = {"input_id": "q-4", "outcome": "timeout", "error_type": "RolloutTimeoutError"}
    out = tmp_path / "results.jsonl"
    out.write_text(
        "".join(json.dumps(x) + "\n" for x in [*lines, {**timeout, "error": "no result"}])
    )
    failures = load_run(out).summary()["failures"]
    assert {kind: f["count"] for kind, f in failures.items()} == {
        "RolloutError (KeyError)": 2,
        "RolloutError (RuntimeError)": 1,
        "RolloutTimeoutError": 1,
    }
    assert failures["RolloutError (KeyError)"]["reason"] == "KeyError: 'a'"
    assert failures["RolloutError (RuntimeError)"]["reason"] == "RuntimeError: boom"
