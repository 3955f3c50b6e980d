"""``agentcore-rl eval`` end to end on the local stack: the math agent on real agent servers,
the stand-in policy, moto S3, and the local AgentCore Runtime for the ACR transport.

The CLI runs in-process (``main`` in a worker thread, so that the stack keeps serving on the
test's event loop) or as a subprocess where it must be killed."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from agentcore_rl.cli import main
from agentcore_rl.cli.eval import make_client
from agentcore_rl.cli.eval_config import EvalOptions
from agentcore_rl.client.config import DEFAULT_RETRY_LOST
from agentcore_rl.local.policy import ScriptedPolicy, Serving
from agentcore_rl.local.stack import LocalStack, StackS3
from agentcore_rl.s3 import ResultStore
from tests.conftest import FAST_RETRY

REPO = Path(__file__).resolve().parents[2]
_buckets = itertools.count()


class Gate:
    """The policy's injected "latency": lets ``free`` requests through, then holds every
    other request until ``opened`` is set (no real waiting anywhere)."""

    def __init__(self, free: int) -> None:
        self.free = free
        self.held = 0  # requests waiting at the gate: proof that a rollout reached the agent
        self.opened = asyncio.Event()

    async def sleep(self, _: float) -> None:
        if self.free > 0:
            self.free -= 1
            return
        self.held += 1
        await self.opened.wait()


def _write_problems(path: Path, n: int) -> list[str]:
    from examples.math_agent.dataset import generate

    problems = generate(n, seed=5)
    path.write_text("".join(json.dumps(p) + "\n" for p in problems))
    return [p["id"] for p in problems]


def _lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


async def _spawn_eval(argv: list[str], *, stderr: int) -> asyncio.subprocess.Process:
    """The CLI in a process of its own, so the test can kill it or send it a signal."""
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "agentcore_rl.cli",
        *argv,
        cwd=REPO,
        env=dict(os.environ),
        stdout=subprocess.DEVNULL,
        stderr=stderr,
    )


async def _wait_until(
    process: asyncio.subprocess.Process, reached: Callable[[], bool], state: str
) -> None:
    """Bounded wait (10 s) for the running eval to reach the state under test."""
    for _ in range(400):
        if reached():
            return
        assert process.returncode is None, f"the eval exited before it reached: {state}"
        await asyncio.sleep(0.025)
    pytest.fail(f"the eval did not reach: {state}")


@contextlib.asynccontextmanager
async def _stack(s3_endpoint: str, policy: ScriptedPolicy) -> AsyncIterator[LocalStack]:
    stack = LocalStack(
        "examples.math_agent.agent:app",
        agents=2,
        s3=StackS3(endpoint_url=s3_endpoint, bucket=f"cli-eval-{next(_buckets)}"),
        policy=policy,
        tps=None,
    )
    async with stack:
        yield stack


@pytest.fixture
async def stack(s3_endpoint: str) -> AsyncIterator[LocalStack]:
    async with _stack(s3_endpoint, ScriptedPolicy(accuracy=0.5, seed=1)) as value:
        yield value


def _common(stack: LocalStack, data: Path, out: Path, exp_id: str) -> list[str]:
    assert stack.s3_endpoint_url is not None
    return [
        "eval",
        str(data),
        "--s3-bucket",
        stack.bucket,
        "--exp-id",
        exp_id,
        "--out",
        str(out),
        "--base-url",
        str(stack.policy_base_url),
        "--model-id",
        str(stack.policy_model),
        "--s3-endpoint-url",
        stack.s3_endpoint_url,
        "--timeout",
        "30",
        "--tps",
        "0",
        "--no-progress",
    ]


@pytest.mark.parametrize("transport", ["http", "acr"])
async def test_eval_runs_every_input_once(
    stack: LocalStack, tmp_path: Path, transport: str, capsys: pytest.CaptureFixture[str]
) -> None:
    ids = _write_problems(tmp_path / "in.jsonl", 8)
    out = tmp_path / "results.jsonl"
    argv = _common(stack, tmp_path / "in.jsonl", out, f"e2e-{transport}")
    argv += ["--param", "temperature=0.5", "--param", "system_tag=eval"]
    if transport == "http":
        for url in stack.agent_urls:
            argv += ["--agent-url", url]
    else:
        assert stack.runtime_endpoint_url is not None
        argv += ["--agent-runtime-arn", stack.agent_runtime_arn]
        argv += ["--endpoint-url", stack.runtime_endpoint_url]

    code = await asyncio.to_thread(main, argv)

    records = _lines(out)
    assert sorted(r["input_id"] for r in records) == sorted(ids)
    assert {r["outcome"] for r in records} == {"done"}
    assert code == 0
    rewards = [r["reward"] for r in records]
    assert set(rewards) <= {0.0, 1.0}
    assert 0.0 in rewards  # accuracy 0.5: the rewards vary
    assert 1.0 in rewards
    assert all(r["result"]["status_code"] == 200 for r in records)
    rollout = records[0]["result"]["payload"]["_rollout"]
    assert (rollout["temperature"], rollout["system_tag"]) == (0.5, "eval")
    printed = capsys.readouterr().out
    assert "mean reward" in printed
    assert str(out.resolve()) in printed


async def test_resume_after_sigkill_collects_every_outcome_exactly_once(
    s3_endpoint: str, tmp_path: Path
) -> None:
    # Two rollouts (two policy requests each) go through; the third blocks at the policy.
    gate = Gate(free=4)
    policy = ScriptedPolicy(accuracy=1.0, serving=Serving(latency=0.001), sleep=gate.sleep)
    n = 6
    async with _stack(s3_endpoint, policy) as stack:
        ids = _write_problems(tmp_path / "in.jsonl", n)
        out = tmp_path / "results.jsonl"
        journal = tmp_path / "results.jsonl.journal"
        argv = _common(stack, tmp_path / "in.jsonl", out, "resume")
        argv += ["--agent-url", stack.agent_urls[0], "--concurrency", "1"]
        process = await _spawn_eval(argv, stderr=subprocess.DEVNULL)
        try:
            # The journal line comes before the invoke; the gate proves the agent runs it.
            await _wait_until(
                process,
                lambda: len(_lines(out)) == 2 and len(_lines(journal)) == 3 and gate.held > 0,
                "two outcomes and a third rollout running on the agent",
            )
        finally:
            process.send_signal(signal.SIGKILL)
            await asyncio.wait_for(process.wait(), 10)
        in_flight = _lines(journal)[-1]["input_id"]
        assert in_flight not in {r["input_id"] for r in _lines(out)}

        gate.opened.set()  # the orphaned rollout now finishes and writes its result
        code = await asyncio.to_thread(main, [*argv, "--resume"])

        records = _lines(out)
        assert code == 0
        assert sorted(r["input_id"] for r in records) == sorted(ids)  # each exactly once
        assert {r["outcome"] for r in records} == {"done"}
        reattached = [r["input_id"] for r in records if r["reattached"]]
        assert reattached == [in_flight]
        # Re-attached, not re-run: the agent ran that input once.
        store = ResultStore(endpoint_url=s3_endpoint, retry=FAST_RETRY)
        async with store:
            keys = await store.list_keys(stack.bucket, f"resume/{in_flight}/")
        assert len(keys) == 1
        assert policy.requests == 2 * n


async def test_resume_skips_finished_inputs(stack: LocalStack, tmp_path: Path) -> None:
    _write_problems(tmp_path / "in.jsonl", 4)
    out = tmp_path / "results.jsonl"
    argv = [*_common(stack, tmp_path / "in.jsonl", out, "skip"), "--agent-url"]
    argv.append(stack.agent_urls[0])
    assert await asyncio.to_thread(main, argv) == 0
    before = out.read_text()
    requests = stack.policy.requests if stack.policy else 0

    assert await asyncio.to_thread(main, [*argv, "--resume"]) == 0
    assert out.read_text() == before
    assert stack.policy is not None
    assert stack.policy.requests == requests
    # Without --resume an existing results file is refused, not overwritten.
    assert await asyncio.to_thread(main, argv) == 2
    assert out.read_text() == before


async def test_ctrl_c_stops_in_flight_rollouts_and_resume_runs_them_again(
    s3_endpoint: str, tmp_path: Path
) -> None:
    gate = Gate(free=2)  # one rollout goes through; the second blocks at the policy
    policy = ScriptedPolicy(accuracy=1.0, serving=Serving(latency=0.001), sleep=gate.sleep)
    n = 3
    async with _stack(s3_endpoint, policy) as stack:
        ids = _write_problems(tmp_path / "in.jsonl", n)
        out = tmp_path / "results.jsonl"
        journal = tmp_path / "results.jsonl.journal"
        argv = _common(stack, tmp_path / "in.jsonl", out, "ctrl-c")
        argv += ["--agent-url", stack.agent_urls[0], "--concurrency", "1"]
        process = await _spawn_eval(argv, stderr=subprocess.PIPE)
        try:
            await _wait_until(
                process,
                lambda: len(_lines(out)) == 1 and len(_lines(journal)) == 2 and gate.held > 0,
                "one outcome and a second rollout running on the agent",
            )
            process.send_signal(signal.SIGINT)
            assert process.stderr is not None
            err = (await asyncio.wait_for(process.stderr.read(), 30)).decode()
            code = await asyncio.wait_for(process.wait(), 30)
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
        assert code == 130, err
        assert "Traceback" not in err
        assert "--resume" in err
        stopped = _lines(journal)[-1]
        assert stopped == {"event": "abandoned", "input_id": stopped["input_id"]}

        gate.opened.set()
        assert await asyncio.to_thread(main, [*argv, "--resume"]) == 0
        records = _lines(out)
        assert sorted(r["input_id"] for r in records) == sorted(ids)
        assert {r["outcome"] for r in records} == {"done"}
        assert not any(r["reattached"] for r in records)  # stopped ones run again
        # The stopped session left its "cancelled" envelope; the re-run wrote a second key.
        store = ResultStore(endpoint_url=s3_endpoint, retry=FAST_RETRY)
        async with store:
            keys = await store.list_keys(stack.bucket, f"ctrl-c/{stopped['input_id']}/")
            envelopes = [await store.get_json(stack.bucket, key) for key in keys]
        assert sorted(e["status_code"] for e in envelopes if e) == [200, 500]


async def test_resume_gives_up_on_an_orphan_past_its_deadline(
    stack: LocalStack, tmp_path: Path
) -> None:
    ids = _write_problems(tmp_path / "in.jsonl", 3)
    out = tmp_path / "results.jsonl"
    # An earlier run started ids[0] long ago and died; its result never appeared.
    orphan = {
        "event": "started",
        "input_id": ids[0],
        "session_id": "a" * 40,
        "s3_bucket": stack.bucket,
        "result_key": f"orphan/{ids[0]}/{'a' * 40}.json",
        "started_at": 0.0,
    }
    (tmp_path / "results.jsonl.journal").write_text(json.dumps(orphan) + "\n")
    argv = [*_common(stack, tmp_path / "in.jsonl", out, "orphan"), "--resume"]
    argv += ["--agent-url", stack.agent_urls[0]]

    assert await asyncio.to_thread(main, argv) == 1  # a rollout timed out

    records = {r["input_id"]: r for r in _lines(out)}
    assert sorted(records) == sorted(ids)
    assert records[ids[0]]["outcome"] == "timeout"
    assert records[ids[0]]["reattached"] is True
    assert "re-attached after a restart" in records[ids[0]]["error"]
    assert {records[i]["outcome"] for i in ids[1:]} == {"done"}


async def test_resume_invokes_a_journaled_rollout_again_with_its_session_id(
    stack: LocalStack, tmp_path: Path
) -> None:
    ids = _write_problems(tmp_path / "in.jsonl", 3)
    out = tmp_path / "results.jsonl"
    # An earlier run journaled ids[0] and died before its invocation reached the agent.
    sid = "b" * 48
    started = {
        "event": "started",
        "input_id": ids[0],
        "session_id": sid,
        "s3_bucket": stack.bucket,
        "result_key": f"again/{ids[0]}/{sid}.json",
        "started_at": time.time(),
    }
    (tmp_path / "results.jsonl.journal").write_text(json.dumps(started) + "\n")
    argv = [*_common(stack, tmp_path / "in.jsonl", out, "again"), "--resume"]
    argv += ["--agent-url", stack.agent_urls[0]]

    assert await asyncio.to_thread(main, argv) == 0

    records = {r["input_id"]: r for r in _lines(out)}
    assert sorted(records) == sorted(ids)
    assert {r["outcome"] for r in records.values()} == {"done"}
    assert (records[ids[0]]["session_id"], records[ids[0]]["reattached"]) == (sid, True)
    assert records[ids[0]]["result_key"] == started["result_key"]
    assert records[ids[0]]["result"]["session_id"] == sid


async def test_resume_runs_a_retryable_failure_again(stack: LocalStack, tmp_path: Path) -> None:
    # A line recorded as a retryable failure (here: the agent was lost) is
    # not final for --resume: the input runs again and keeps exactly one results line.
    _write_problems(tmp_path / "in.jsonl", 3)
    out = tmp_path / "results.jsonl"
    argv = [*_common(stack, tmp_path / "in.jsonl", out, "retryable"), "--agent-url"]
    argv.append(stack.agent_urls[0])
    assert await asyncio.to_thread(main, argv) == 0
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    lines[0].update(outcome="failed", error_type="AgentLostError", retryable=True, result=None)
    out.write_text("".join(json.dumps(line) + "\n" for line in lines))

    assert await asyncio.to_thread(main, [*argv, "--resume"]) == 0
    after = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(line["input_id"] for line in after) == sorted(x["input_id"] for x in lines)
    assert all(line["outcome"] == "done" for line in after)


async def test_retry_budgets_reach_the_client(tmp_path: Path) -> None:
    options = EvalOptions(
        data=tmp_path / "in.jsonl",
        out=tmp_path / "out.jsonl",
        s3_bucket="rollouts",
        exp_id="e1",
        agent_urls=("http://127.0.0.1:9",),
        retry_lost=0,
        retry_rollouts=4,
    )
    client = make_client(options)
    try:
        assert (client.retries.lost, client.retries.rollouts) == (0, 4)
    finally:
        await client.aclose()
    default = make_client(dataclasses.replace(options, retry_lost=None))
    try:
        assert default.retries.lost == DEFAULT_RETRY_LOST
    finally:
        await default.aclose()
