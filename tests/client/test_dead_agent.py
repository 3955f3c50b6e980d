"""One crash detector that notices the dead: an agent killed with SIGKILL and never restarted
loses its sessions once its heartbeat has stayed unchanged for three intervals (over HTTP and
over AgentCore Runtime alike), and their rollouts end done on the other agent. The detector
runs on an injected clock, so the test moves time past the three intervals instead of
waiting for them (the probes' ``lost_after`` for servers without a heartbeat is
tests/client/test_liveness.py's). Also: eval's latency counts a rollout's retries, and a
resumed eval whose re-send meets a restarting agent runs the rollout in a new session."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from starlette.types import ASGIApp, Receive, Scope, Send

from agentcore_rl import protocol
from agentcore_rl.cli.eval import EvalEngine, Progress
from agentcore_rl.cli.eval_config import EvalInput, EvalOptions
from agentcore_rl.cli.journal import EvalJournal
from agentcore_rl.cli.show import load_run
from agentcore_rl.client import AwsConfig, LivenessConfig
from agentcore_rl.local.background import BackgroundServer
from agentcore_rl.local.runtime import DEFAULT_AGENT_RUNTIME_ARN, LocalAgentCoreRuntime
from agentcore_rl.s3 import ResultStore
from agentcore_rl.server.options import SpoolConfig
from tests.client.agents import Recorder, make_agent
from tests.client.conftest import ClientFactory
from tests.client.test_crash import AGENT, Agent, lose_when_silent
from tests.conftest import FAST_RETRY
from tests.server.test_sigterm import free_port

LOST_AFTER = 5.0
PROBE_INTERVAL = 0.05
#: Probes every pending session each round; the clock they read is the test's.
WATCHFUL = LivenessConfig(
    probe_after=0.0,
    probe_interval=PROBE_INTERVAL,
    max_rate=100.0,
    lost_after=LOST_AFTER,
    lease=None,
)

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")


@pytest.fixture
async def agents(tmp_path: Path, s3_endpoint: str) -> AsyncIterator[tuple[Agent, Agent]]:
    """Two agent processes: the first hangs in its handler (it is about to be killed),
    the second answers at once."""
    script = tmp_path / "agent.py"
    script.write_text(AGENT)
    env = {**os.environ, "AWS_ENDPOINT_URL_S3": s3_endpoint, "PYTHONUNBUFFERED": "1"}
    doomed = Agent(script, free_port(), {**env, "AGENTCORE_RL_SPOOL_DIR": str(tmp_path / "a")})
    healthy = Agent(script, free_port(), {**env, "AGENTCORE_RL_SPOOL_DIR": str(tmp_path / "b")})
    try:
        await doomed.start(1)
        await healthy.start(2)
        yield doomed, healthy
    finally:
        await doomed.kill()
        await healthy.kill()


async def test_an_http_agent_killed_for_good_loses_its_rollouts_to_the_other(
    make_client: ClientFactory, agents: tuple[Agent, Agent]
) -> None:
    doomed, healthy = agents
    client = make_client(agent_url=[doomed.url, healthy.url], liveness=WATCHFUL)
    url_for = client.transport.url_for  # type: ignore[attr-defined]
    sid = next(s for s in iter(protocol.new_session_id, None) if url_for(s) == doomed.url)
    fut = await client.invoke({"n": 7}, session_id=sid)
    await doomed.entered()
    await doomed.kill()  # and never restarted
    await lose_when_silent(client, fut)
    result = await asyncio.wait_for(fut, 30)
    assert (result["generation"], result["n"]) == ("2", 7)
    assert fut.previous_sessions == [sid]
    assert fut.attempts == 2
    assert fut.losses == 1
    stats = client.stats
    assert (stats.agents_lost, stats.lost_retries, stats.results) == (1, 1, 1)


async def test_a_runtime_agent_killed_for_good_loses_its_rollouts_to_the_other(
    make_client: ClientFactory, agents: tuple[Agent, Agent]
) -> None:
    doomed, healthy = agents
    # The runtime answers 424 for a session whose agent is gone.
    runtime = LocalAgentCoreRuntime({DEFAULT_AGENT_RUNTIME_ARN: [doomed.url, healthy.url]})
    async with BackgroundServer(runtime) as server:
        client = make_client(
            agent_url=None,
            agent_runtime_arn=DEFAULT_AGENT_RUNTIME_ARN,
            aws=AwsConfig(endpoint_url=server.url),
            liveness=WATCHFUL,
        )
        fut = await client.invoke({"n": 8})  # the first session goes to the first agent
        first = fut.session_id
        await doomed.entered()
        await doomed.kill()
        await lose_when_silent(client, fut)
        result = await asyncio.wait_for(fut, 30)
        assert (result["generation"], result["n"]) == ("2", 8)
        assert fut.previous_sessions == [first]
        assert client.stats.agents_lost == 1
        await client.aclose()


def _options(tmp_path: Path, bucket: str, url: str, **more: Any) -> EvalOptions:
    return EvalOptions(
        data=tmp_path / "in.jsonl",
        out=tmp_path / "results.jsonl",
        s3_bucket=bucket,
        exp_id="exp",
        agent_urls=[url],
        **more,
    )


async def test_the_eval_latency_counts_the_retries(
    make_client: ClientFactory, recorder: Recorder, agent_url: str, bucket: str, tmp_path: Path
) -> None:
    # The first session is slow and ends retryably (its server shut down): the input's
    # latency runs from its first invocation to the outcome of the second session.
    client = make_client()
    options = _options(tmp_path, bucket, agent_url)
    journal = EvalJournal.open(options.out, resume=False)
    engine = EvalEngine(options, client, journal, Progress(1, 0, enabled=False))
    item = EvalInput("q-1", {"mode": "shutdown", "hold": True, "n": 1})
    try:
        run = asyncio.create_task(engine.run([item], [], {"q-1": item}))
        await recorder.wait_for(lambda: len(recorder.sessions) == 1)
        opened = time.time()
        recorder.open_gate()
        await asyncio.wait_for(run, 20)
    finally:
        journal.close()
    (line,) = [json.loads(x) for x in options.out.read_text().splitlines()]
    journaled = [
        json.loads(x) for x in (tmp_path / "results.jsonl.journal").read_text().splitlines()
    ]
    assert (line["outcome"], line["attempts"]) == ("done", 2)
    first_sent = journaled[0]["started_at"]
    assert line["elapsed"] >= round(opened - first_sent, 4) - 1e-3  # both sessions
    summary = load_run(options.out).summary()
    assert (summary["latencies"], summary["retries"]) == ([line["elapsed"]], 1)


class Restarting:
    """An agent server that answers 503 to its first ``failures`` invocations (restarting),
    then serves; the runtime in front of it turns them into 424 RuntimeClientError."""

    def __init__(self, app: ASGIApp, failures: int) -> None:
        self.app = app
        self.failures = failures
        self.refused: list[str] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path")
        if scope["type"] == "http" and path == protocol.INVOCATIONS_PATH and self.failures > 0:
            self.failures -= 1
            header = protocol.SESSION_ID_HEADER.lower().encode()
            self.refused.append(dict(scope["headers"]).get(header, b"").decode())
            await send({"type": "http.response.start", "status": 503, "headers": []})
            await send({"type": "http.response.body", "body": b'{"error": "restarting"}'})
            return
        await self.app(scope, receive, send)


async def test_a_resumed_rollout_whose_resend_meets_a_restarting_agent_runs_anew(
    make_client: ClientFactory,
    recorder: Recorder,
    bucket: str,
    s3_endpoint: str,
    tmp_path: Path,
) -> None:
    agent_store = ResultStore(endpoint_url=s3_endpoint, retry=FAST_RETRY)
    app = make_agent(agent_store, recorder, spool=SpoolConfig(directory=tmp_path / "spool"))
    restarting = Restarting(app, failures=3)  # every attempt of the re-send (3 in tests)
    async with BackgroundServer(restarting) as agent:
        runtime = LocalAgentCoreRuntime({DEFAULT_AGENT_RUNTIME_ARN: [agent.url]}, tps=None)
        async with BackgroundServer(runtime) as server:
            # The killed run journaled q-1 in flight under ``sid``; nothing ran it.
            sid = "a" * 48
            entry: dict[str, object] = {"event": "started", "input_id": "q-1"}
            entry.update(session_id=sid, s3_bucket=bucket, result_key=f"exp/q-1/{sid}.json")
            entry["started_at"] = time.time()
            (tmp_path / "results.jsonl.journal").write_text(json.dumps(entry) + "\n")
            options = _options(tmp_path, bucket, agent.url, resume=True)
            options.out.write_text("")
            client = make_client(
                agent_url=None,
                agent_runtime_arn=DEFAULT_AGENT_RUNTIME_ARN,
                aws=AwsConfig(endpoint_url=server.url),
            )
            journal = EvalJournal.open(options.out, resume=True)
            engine = EvalEngine(options, client, journal, Progress(1, 0, enabled=False))
            item = EvalInput("q-1", {"n": 5})
            try:
                in_flight = list(journal.in_flight.values())
                await asyncio.wait_for(engine.run([], in_flight, {"q-1": item}), 20)
            finally:
                journal.close()
            await client.aclose()
    await agent_store.aclose()
    assert restarting.refused == [sid] * 3  # the re-send met the restart...
    (line,) = [json.loads(x) for x in options.out.read_text().splitlines()]
    assert line["outcome"] == "done"  # ...and the rollout ran in a new session
    assert line["session_id"] != sid
    assert recorder.sessions == [line["session_id"]]
    assert line["attempts"] == 2
    journaled = (tmp_path / "results.jsonl.journal").read_text()
    assert line["session_id"] in journaled  # journaled before it was sent
