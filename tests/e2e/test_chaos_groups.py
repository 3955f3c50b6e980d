"""Faults change nothing a trainer trains on: ``benchmarks/chaos.py --groups`` at a small
size, as a real run (agent processes SIGKILLed and restarted, S3 writes, invocations and
model calls failing, handlers raising InfraError). The rows of every group both runs
completed are identical, no member is zeroed for an infra failure, and each injected
fault that ended a session is counted once under its cause."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import pytest

from tests.e2e.test_cli_eval import REPO


@pytest.mark.timeout(420)
async def test_a_faulty_grouped_run_trains_on_what_a_clean_one_does() -> None:
    argv = [
        "--groups", "--inputs", "6", "--n", "3", "--agents", "2", "--concurrency", "12",
        "--min-sleep", "0.2", "--max-sleep", "1.0", "--crash-every", "3", "--timeout", "120",
        "--infra-fail", "0.15", "--upstream-fail", "0.1", "--acr-fail", "0.1",
        "--s3-fail", "0.1", "--seed", "3",
    ]  # fmt: skip
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "benchmarks.chaos", *argv],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=400,
    )
    report = json.loads(done.stdout)
    assert done.returncode == 0, json.dumps(report, indent=2)
    assert report["ok"]
    assert report["groups_compared"] == 6
    assert report["groups_differing"] == []
    assert report["response_tokens_compared"] > 0
    faulty = report["faulty"]
    assert faulty["zeroed_for_infra"] == 0
    assert faulty["agent_crashes"] > 0
    assert faulty["failures_by_kind"].get("infra", 0) > 0
    assert set(faulty["failures_by_kind"]) == {"infra"}  # the agent itself never failed
    assert report["faults_counted_differently"] == {}
