"""An agent server without our stop extension (BedrockAgentCoreApp, the reference toolkit's
server) answers 404 to ``POST /sessions/{id}/stop``. One rule for the HTTP transport and the
local runtime: remember per agent URL that stop is unsupported, say so once at INFO, count
it apart from failures. The agent here is a test double of that external server on real
uvicorn; our client and runtime are real."""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack

import pytest
from aiobotocore.config import AioConfig
from aiobotocore.session import get_session
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from agentcore_rl.client import AsyncRolloutClient, AwsConfig, LivenessConfig, Retries
from agentcore_rl.client.liveness import LivenessProber
from agentcore_rl.client.outcomes import ClientStats
from agentcore_rl.client.transports.http import HttpTransport
from agentcore_rl.client.transports.transport import RetryableError, StopUnsupportedError
from agentcore_rl.errors import InvocationError
from agentcore_rl.local.background import BackgroundServer
from agentcore_rl.local.runtime import DEFAULT_AGENT_RUNTIME_ARN, LocalAgentCoreRuntime
from agentcore_rl.protocol import new_session_id, parse_runtime_arn
from agentcore_rl.ratelimit import TokenBucket
from agentcore_rl.retry import RetryPolicy


class SdkLikeAgent:
    """Only ``/invocations`` and ``/ping``, like AWS's app: anything else is a 404."""

    def __init__(self) -> None:
        self.requests: Counter[str] = Counter()
        self.app = Starlette(
            routes=[
                Route("/invocations", self.invoke, methods=["POST"]),
                Route("/ping", self.ping, methods=["GET"]),
            ]
        )

    async def invoke(self, request: Request) -> Response:
        self.requests["invoke"] += 1
        return JSONResponse({"status": "processing"})

    async def ping(self, request: Request) -> Response:
        return JSONResponse({"status": "Healthy", "time_of_last_update": 0})


@pytest.fixture
async def agent_url() -> AsyncIterator[tuple[SdkLikeAgent, str]]:
    agent = SdkLikeAgent()

    async def counting(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/sessions/"):
            agent.requests["stop"] += 1
        await agent.app(scope, receive, send)

    async with BackgroundServer(counting) as server:
        yield agent, server.url


def _info_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.INFO and "no stop route" in r.getMessage()
    ]


async def test_http_transport_asks_once_then_remembers(
    agent_url: tuple[SdkLikeAgent, str], caplog: pytest.LogCaptureFixture
) -> None:
    agent, url = agent_url
    caplog.set_level(logging.INFO, logger="agentcore_rl")
    transport = HttpTransport(url)
    try:
        for _ in range(3):
            with pytest.raises(StopUnsupportedError):
                await transport.stop(new_session_id())
    finally:
        await transport.aclose()
    assert agent.requests["stop"] == 1
    assert len(_info_lines(caplog)) == 1
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


async def test_the_stopper_counts_unsupported_stops_apart_from_failures(
    agent_url: tuple[SdkLikeAgent, str],
) -> None:
    _, url = agent_url
    client = AsyncRolloutClient(
        agent_url=url,
        s3_bucket="compat-stops",
        exp_id="e",
        retries=Retries(call=RetryPolicy(attempts=1)),
        liveness=LivenessConfig(lease=None),
        aws=AwsConfig(s3_endpoint_url="http://127.0.0.1:9"),  # never called
        preflight=False,  # which checks S3 first
    )
    async with client:
        for _ in range(3):
            client.stop_session(new_session_id())
    stats = client.stats
    assert (stats.stops_unsupported, stats.stop_failures, stats.stops) == (3, 0, 0)


async def test_the_local_runtime_applies_the_same_rule(
    agent_url: tuple[SdkLikeAgent, str], caplog: pytest.LogCaptureFixture
) -> None:
    agent, url = agent_url
    arn = DEFAULT_AGENT_RUNTIME_ARN
    runtime = LocalAgentCoreRuntime({arn: [url]}, tps=None)
    caplog.set_level(logging.INFO, logger="agentcore_rl")
    async with AsyncExitStack() as stack:
        server = await stack.enter_async_context(BackgroundServer(runtime))
        client = await stack.enter_async_context(
            get_session().create_client(
                "bedrock-agentcore",
                region_name=parse_runtime_arn(arn).region,
                endpoint_url=server.url,
                config=AioConfig(retries={"total_max_attempts": 1}),
            )
        )
        for _ in range(3):
            sid = new_session_id()
            response = await client.invoke_agent_runtime(
                agentRuntimeArn=arn, runtimeSessionId=sid, payload=json.dumps({}).encode()
            )
            async with response["response"] as stream:
                await stream.read()
            await client.stop_runtime_session(agentRuntimeArn=arn, runtimeSessionId=sid)
        assert runtime.live_sessions(arn) == 0
    assert agent.requests["stop"] == 1
    assert runtime.counts["AgentStopUnsupported"] == 3
    assert runtime.counts["StopRuntimeSession"] == 3
    assert len(_info_lines(caplog)) == 1


async def test_a_server_without_the_status_route_is_up_not_unreachable(
    agent_url: tuple[SdkLikeAgent, str],
) -> None:
    """Its 404 to ``GET /sessions/{id}`` is an answer: the prober never counts the agent as
    unreachable, so its rollouts are not declared lost after ``lost_after`` and run twice."""
    _, url = agent_url
    transport = HttpTransport(url)
    sid = new_session_id()
    lost: list[str] = []

    class Waiting:
        session_id, waiting, beat = sid, True, None

        def wake(self, kind: str, value: object) -> None:
            lost.append(kind)

    now = [0.0]
    config = LivenessConfig(probe_after=0, probe_interval=1, lost_after=10, max_rate=10)
    prober = LivenessProber(
        transport,
        TokenBucket(1000),
        {sid: Waiting()},
        ClientStats(),
        config=config,
        clock=lambda: now[0],
    )
    try:
        with pytest.raises(InvocationError) as caught:
            await transport.status(sid)
        assert not isinstance(caught.value, RetryableError)
        assert caught.value.status_code == 404
        for second in range(30):
            now[0] = float(second)
            await prober.round()
    finally:
        await transport.aclose()
    assert lost == []
