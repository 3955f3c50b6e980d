"""Crash detection on real processes: an agent killed with SIGKILL mid-rollout and restarted
on the same port. Its heartbeat stays unchanged, the rollout ends in AgentLostError and, by
policy, runs again in a new session; a retryable shutdown envelope does the same."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import textwrap
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from agentcore_rl.cli.eval import EvalEngine, Progress
from agentcore_rl.cli.eval_config import EvalInput, EvalOptions
from agentcore_rl.cli.journal import EvalJournal
from agentcore_rl.cli.show import load_run
from agentcore_rl.client import AsyncRolloutClient, LivenessConfig
from agentcore_rl.client.outcomes import is_agent_loss, is_retryable
from agentcore_rl.errors import (
    AgentLostError,
    ClientClosedError,
    InvalidPayloadError,
    InvocationError,
    RolloutError,
    RolloutTimeoutError,
)
from agentcore_rl.s3 import ResultStore
from tests.client.agents import Recorder
from tests.client.conftest import ClientFactory, fast_limits, quick_retries
from tests.client.fakeclock import FakeClock
from tests.server.test_sigterm import free_port, read_until

# Generation 1 hangs in its handler (it is about to crash); generation 2 answers at once.
AGENT = textwrap.dedent(
    """
    import sys, threading
    from agentcore_rl.server import AgentCoreRLApp, ShutdownConfig

    GENERATION = sys.argv[2]
    app = AgentCoreRLApp(shutdown=ShutdownConfig(grace=0.05))

    @app.rollout_entrypoint
    def solve(payload):
        print("entered", GENERATION, flush=True)
        if GENERATION == "1":
            threading.Event().wait(60)
        return {"rewards": [1.0], "generation": GENERATION, "n": payload.get("n")}

    if __name__ == "__main__":
        app.run(host="127.0.0.1", port=int(sys.argv[1]), log_level="info")
    """
)

#: Probe every pending session at once and often: the test checks behaviour, not pacing.
EAGER = LivenessConfig(probe_after=0.0, probe_interval=0.05, max_rate=100.0)
#: The agents' heartbeat interval (the server's default).
HEARTBEAT = 5.0


async def lose_when_silent(client: AsyncRolloutClient, fut: Any) -> None:
    """The agent is dead: move the crash detector's clock (a test clock from now on) a
    heartbeat interval at a time until the session is lost; its threshold is
    tests/client/test_liveness.py's."""
    lost = client.stats.agents_lost
    client._rollouts.prober.clock = clock = FakeClock(time.monotonic())
    for _ in range(200):  # bounded: three intervals are enough
        if client.stats.agents_lost > lost or fut.done():
            return
        clock.advance(HEARTBEAT)
        await asyncio.sleep(0.05)  # a round on the moved clock
    pytest.fail("the dead agent's session was never lost")


class Agent:
    """One agent process on ``port``; ``start(generation)`` after a ``kill`` restarts it."""

    def __init__(self, script: Path, port: int, env: dict[str, str]) -> None:
        self.script, self.port, self.env = script, port, env
        self.proc: asyncio.subprocess.Process | None = None
        self.log: list[str] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self, generation: int) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable,
            str(self.script),
            str(self.port),
            str(generation),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=self.env,
        )
        assert self.proc.stderr is not None
        await asyncio.wait_for(read_until(self.proc.stderr, "Uvicorn running on", self.log), 30)

    async def entered(self) -> None:
        assert self.proc is not None
        assert self.proc.stdout is not None
        await asyncio.wait_for(read_until(self.proc.stdout, "entered", self.log), 30)

    async def kill(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.send_signal(signal.SIGKILL)
            await asyncio.wait_for(self.proc.wait(), 30)


@pytest.fixture
async def agent(tmp_path: Path, s3_endpoint: str) -> AsyncIterator[Agent]:
    script = tmp_path / "agent.py"
    script.write_text(AGENT)
    env = {
        **os.environ,
        "AWS_ENDPOINT_URL_S3": s3_endpoint,
        "PYTHONUNBUFFERED": "1",
        "AGENTCORE_RL_SPOOL_DIR": str(tmp_path / "spool"),
    }
    process = Agent(script, free_port(), env)
    try:
        yield process
    finally:
        await process.kill()


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
async def test_a_crashed_agent_is_detected_and_the_rollout_runs_again(
    make_client: ClientFactory, agent: Agent
) -> None:
    await agent.start(1)
    client = make_client(agent_url=agent.url, liveness=EAGER)
    fut = await client.invoke({"n": 3})
    first = fut.session_id
    await agent.entered()
    await agent.kill()
    await agent.start(2)  # restarted: a new process, with a heartbeat of its own
    await lose_when_silent(client, fut)
    result = await asyncio.wait_for(fut, 30)
    assert result["generation"] == "2"
    assert result["n"] == 3
    assert fut.attempts == 2
    assert fut.previous_sessions == [first]
    assert fut.session_id != first
    stats = client.stats
    assert stats.agents_lost == 1
    assert stats.rollout_retries == 1
    assert stats.results == 1


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
async def test_a_lost_session_without_retries_ends_in_agent_lost_error(
    make_client: ClientFactory, agent: Agent
) -> None:
    await agent.start(1)
    client = make_client(agent_url=agent.url, liveness=EAGER, retries=quick_retries(lost=0))
    fut = await client.invoke({"n": 3})
    await agent.entered()
    await agent.kill()
    await agent.start(2)
    await lose_when_silent(client, fut)
    with pytest.raises(AgentLostError, match="crashed or restarted"):
        await asyncio.wait_for(fut, 30)
    assert client.stats.agents_lost == 1
    assert client.stats.in_flight == 0


async def test_a_shutdown_envelope_is_retried_in_a_new_session(
    make_client: ClientFactory, recorder: Recorder
) -> None:
    client = make_client()
    fut = await client.invoke({"mode": "shutdown", "n": 1})
    assert (await asyncio.wait_for(fut, 10))["n"] == 1
    assert fut.attempts == 2
    assert recorder.sessions == [*fut.previous_sessions, fut.session_id]
    assert client.stats.rollout_retries == 1


async def test_retries_are_bounded_and_counted(
    make_client: ClientFactory, recorder: Recorder
) -> None:
    client = make_client(retries=quick_retries(lost=1))
    fut = await client.invoke({"mode": "shutdown", "shutdowns": 5, "n": 1})
    with pytest.raises(RolloutError, match="shutting down"):
        await asyncio.wait_for(fut, 10)
    assert fut.attempts == 2
    assert len(recorder.sessions) == 2
    assert client.stats.rollout_retries == 1
    assert client.stats.rollout_errors == 1


async def test_agent_losses_have_a_budget_of_their_own(
    make_client: ClientFactory, recorder: Recorder
) -> None:
    # Three shutdowns in a row outlast two rollout retries (a shared budget would end it), not
    # the loss budget.
    client = make_client(retries=quick_retries(rollouts=0))
    fut = await client.invoke({"mode": "shutdown", "shutdowns": 3, "n": 1})
    assert (await asyncio.wait_for(fut, 10))["n"] == 1
    assert (fut.attempts, fut.losses) == (4, 3)
    assert len(recorder.sessions) == 4
    assert client.stats.lost_retries == 3


def test_outcome_classification() -> None:
    shutdown = {
        "status_code": 503,
        "error_type": "cancelled",
        "stop_reason": "server shutting down",
    }
    user_cancel = {"status_code": 499, "error_type": "cancelled", "stop_reason": "cancelled"}
    assert is_retryable(AgentLostError("lost"))
    assert is_retryable(InvocationError("refused connection"))
    assert is_retryable(InvocationError("RuntimeClientError", status_code=424))
    assert is_retryable(InvocationError("throttled", status_code=429))
    assert is_retryable(RolloutError(shutdown))
    assert not is_retryable(RolloutError(user_cancel))
    assert not is_retryable(RolloutError({"status_code": 500, "error_type": "ValueError"}))
    assert not is_retryable(InvocationError("bad payload", status_code=400))
    assert not is_retryable(InvalidPayloadError("bad"))
    assert not is_retryable(RolloutTimeoutError("slow", session_id="s", timeout=1.0))
    assert not is_retryable(ClientClosedError("closed"))
    assert is_agent_loss(AgentLostError("lost"))
    assert is_agent_loss(RolloutError(shutdown))
    assert not is_agent_loss(InvocationError("RuntimeClientError", status_code=424))


async def test_eval_reruns_an_input_its_agents_lost_on_the_loss_budget(
    make_client: ClientFactory, recorder: Recorder, agent_url: str, bucket: str, tmp_path: Path
) -> None:
    # Three losses in a row (server shutdowns) with no rollout retries: eval's own loop
    # reruns the input on the loss budget, and the results line says how many were lost.
    client = make_client(retries=quick_retries(rollouts=0))
    out = tmp_path / "results.jsonl"
    options = EvalOptions(
        data=tmp_path / "in.jsonl", out=out, s3_bucket=bucket, exp_id="exp", agent_urls=[agent_url]
    )
    journal = EvalJournal.open(out, resume=False)
    engine = EvalEngine(options, client, journal, Progress(1, 0, enabled=False))
    try:
        item = EvalInput("q-1", {"mode": "shutdown", "shutdowns": 3, "n": 1})
        await asyncio.wait_for(engine.run([item], [], {"q-1": item}), 20)
    finally:
        journal.close()
    (line,) = [json.loads(x) for x in out.read_text().splitlines()]
    assert line["outcome"] == "done"
    assert (line["attempts"], line["losses"], line["agent_lost"]) == (4, 3, False)
    assert load_run(out).summary()["retries"] == 3
    assert len(recorder.sessions) == 4


@pytest.mark.parametrize("slots", [1, 2])
async def test_a_resumed_eval_reruns_a_lost_rollout_at_once_not_behind_the_queue(
    slots: int,
    make_client: ClientFactory,
    recorder: Recorder,
    agent_url: str,
    bucket: str,
    store: ResultStore,
    tmp_path: Path,
) -> None:
    # The killed run left q-lost in flight; its agent died and a successor wrote its
    # agent_lost envelope. With one worker it runs again before the queued inputs (the
    # gated q-1, q-2, q-3), at once, and counts its loss.
    sid = "f" * 48
    key = f"exp/q-lost/{sid}.json"
    lost = {"status_code": 503, "error_type": "agent_lost", "stop_reason": "lost: died"}
    await store.put_json(bucket, key, lost)
    out = tmp_path / "results.jsonl"
    entry: dict[str, object] = {"event": "started", "input_id": "q-lost", "session_id": sid}
    entry.update(s3_bucket=bucket, result_key=key, started_at=time.time())
    (tmp_path / "results.jsonl.journal").write_text(json.dumps(entry) + "\n")
    out.write_text("")
    client = make_client(limits=fast_limits(max_concurrent_sessions=slots))
    options = EvalOptions(
        data=tmp_path / "in.jsonl",
        out=out,
        s3_bucket=bucket,
        exp_id="exp",
        agent_urls=[agent_url],
        concurrency=1,
        resume=True,
    )
    journal = EvalJournal.open(out, resume=True)
    items = {f"q-{n}": EvalInput(f"q-{n}", {"mode": "gate", "n": n}) for n in (1, 2, 3)}
    items["q-lost"] = EvalInput("q-lost", {"n": 0})
    engine = EvalEngine(options, client, journal, Progress(4, 0, enabled=False))
    try:
        fresh = [items[f"q-{n}"] for n in (1, 2, 3)]
        with anyio.fail_after(20):
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(engine.run, fresh, list(journal.in_flight.values()), items)
                await recorder.wait_for(lambda: "q-1" in _inputs_seen(recorder))
                if slots == 1:
                    journal_file = tmp_path / "results.jsonl.journal"
                    for _ in range(1000):  # bounded: the new session's line appears
                        if journal_file.read_text().count('"q-lost", "session_id"') > 1:
                            break
                        await anyio.sleep(0.01)
                    else:
                        pytest.fail("the lost rollout's rerun waited for a slot")
                else:
                    await recorder.wait_for(lambda: "q-lost" in _inputs_seen(recorder))
                recorder.open_gate()
    finally:
        journal.close()
    lines = {x["input_id"]: x for x in map(json.loads, out.read_text().splitlines())}
    assert sorted(lines) == ["q-1", "q-2", "q-3", "q-lost"]
    assert {line["outcome"] for line in lines.values()} == {"done"}
    assert lines["q-lost"]["losses"] == 1
    # The earlier run's rollouts go first: the one worker took q-lost before q-1.
    assert recorder.rollout_blocks[0]["input_id"] == "q-lost"


def _inputs_seen(recorder: Recorder) -> set[str]:
    return {block["input_id"] for block in recorder.rollout_blocks}
