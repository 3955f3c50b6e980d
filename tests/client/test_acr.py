"""The ACR transport through the local AgentCore Runtime stand-in (real aiobotocore over
loopback, real agent server behind it), and the ARN rules."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiobotocore.session import get_session

from agentcore_rl import protocol
from agentcore_rl.client import AsyncRolloutClient, AwsConfig, Retries, TokenBucket
from agentcore_rl.client.transports.acr import AcrTransport
from agentcore_rl.errors import ConfigurationError, InvocationError, RolloutError
from agentcore_rl.local.background import BackgroundServer
from agentcore_rl.local.runtime import DEFAULT_AGENT_RUNTIME_ARN, LocalAgentCoreRuntime
from agentcore_rl.s3 import AWS_USER_AGENT, ResultStore
from tests.client.agents import Recorder
from tests.client.conftest import FAST_WATCH, ClientFactory, quick_retries


@pytest.fixture
async def runtime(agent_url: str) -> AsyncIterator[tuple[LocalAgentCoreRuntime, str]]:
    local = LocalAgentCoreRuntime({DEFAULT_AGENT_RUNTIME_ARN: [agent_url]}, tps=None)
    async with BackgroundServer(local) as server:
        yield local, server.url


def acr_client(make_client: ClientFactory, endpoint: str, **options: Any) -> AsyncRolloutClient:
    return make_client(
        agent_url=None,
        agent_runtime_arn=DEFAULT_AGENT_RUNTIME_ARN,
        aws=AwsConfig(endpoint_url=endpoint),
        **options,
    )


async def test_rollout_through_the_runtime_then_the_session_is_stopped(
    make_client: ClientFactory, runtime: tuple[LocalAgentCoreRuntime, str], recorder: Recorder
) -> None:
    local, endpoint = runtime
    client = acr_client(make_client, endpoint)
    fut = await client.invoke({"n": 3}, input_id="q-3")
    result = await asyncio.wait_for(fut, 10)
    assert result["n"] == 3
    assert recorder.sessions == [fut.session_id]
    await client.aclose()  # drains the background StopRuntimeSession
    assert client.stats.stops == 1
    assert local.counts["StopRuntimeSession"] == 1


async def test_error_envelope_and_cancel_through_the_runtime(
    make_client: ClientFactory, runtime: tuple[LocalAgentCoreRuntime, str], recorder: Recorder
) -> None:
    _, endpoint = runtime
    client = acr_client(make_client, endpoint)
    with pytest.raises(RolloutError):
        await asyncio.wait_for(client.rollout({"mode": "raise"}), 10)
    fut = await client.invoke({"mode": "hang"})
    await recorder.wait_for(lambda: fut.session_id in recorder.sessions)
    fut.cancel()
    await recorder.wait_for(lambda: fut.session_id in recorder.cancelled)


async def test_environment_variable_endpoint(
    make_client: ClientFactory,
    runtime: tuple[LocalAgentCoreRuntime, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _, endpoint = runtime
    monkeypatch.setenv("AWS_ENDPOINT_URL_BEDROCK_AGENTCORE", endpoint)
    client = make_client(agent_url=None, agent_runtime_arn=DEFAULT_AGENT_RUNTIME_ARN)
    assert (await asyncio.wait_for(client.rollout({"n": 1}), 10))["n"] == 1


async def test_agent_refusal_is_a_validation_error_not_retried(
    make_client: ClientFactory, runtime: tuple[LocalAgentCoreRuntime, str]
) -> None:
    _local, endpoint = runtime
    client = acr_client(make_client, endpoint)
    with pytest.raises(InvocationError, match="ValidationException") as info:
        # A control field beside the payload: the client sends it, the agent refuses it (400).
        await client.invoke({protocol.CONTROL_FIELD: {"op": "no-such-op"}})
    assert info.value.status_code == 400
    assert client.stats.invocations == 1


async def test_throttling_is_retried_with_the_same_session(
    make_client: ClientFactory, agent_url: str, recorder: Recorder, store: ResultStore
) -> None:
    clock_now = [0.0]
    local = LocalAgentCoreRuntime(
        {DEFAULT_AGENT_RUNTIME_ARN: [agent_url]}, tps=1.0, burst=1.0, clock=lambda: clock_now[0]
    )
    delays: list[float] = []

    async def advance(delay: float) -> None:
        delays.append(delay)
        clock_now[0] += 1.0  # the runtime refills one token per retry

    from agentcore_rl.client import RetryPolicy

    retry = RetryPolicy(attempts=3, initial=0.1, maximum=1.0, jitter=0.0, sleep=advance)
    async with BackgroundServer(local) as server:
        client = acr_client(
            make_client, server.url, retries=Retries(call=retry), stop_finished_sessions=False
        )
        first = await client.invoke({"n": 1})
        second = await client.invoke({"n": 2})  # throttled once, then accepted
        await asyncio.wait_for(asyncio.gather(first, second), 10)
        assert local.counts["ThrottlingException"] == 1
        assert client.stats.throttles == 1
        assert client.stats.retries == 1
        assert recorder.sessions == [first.session_id, second.session_id]
        assert isinstance(client.rate_limiter, TokenBucket)
        assert client.rate_limiter.rate < client.rate_limiter.max_rate
        await client.aclose()


async def test_calls_carry_the_fixed_user_agent(
    runtime: tuple[LocalAgentCoreRuntime, str],
) -> None:
    _, endpoint = runtime
    session = get_session()
    sent: list[str] = []

    def record(request: Any, **_: Any) -> None:
        sent.append(request.headers["User-Agent"].decode())

    session.register("before-send.bedrock-agentcore", record)
    transport = AcrTransport(DEFAULT_AGENT_RUNTIME_ARN, endpoint_url=endpoint, session=session)
    try:
        sid = protocol.new_session_id()
        assert await transport.status(sid) is protocol.SessionState.UNKNOWN
        await transport.stop(sid)
    finally:
        await transport.aclose()
    # The session's own extra, if any, follows ours.
    assert [ua[: len(AWS_USER_AGENT)] for ua in sent] == [AWS_USER_AGENT] * 2


def test_runtime_arn_is_checked() -> None:
    assert protocol.parse_runtime_arn(DEFAULT_AGENT_RUNTIME_ARN).region == "us-west-2"
    arn = "arn:aws-cn:bedrock-agentcore:cn-north-1:123456789012:runtime/math_agent-x1"
    assert protocol.parse_runtime_arn(arn) == (
        "aws-cn",
        "cn-north-1",
        "123456789012",
        "math_agent-x1",
    )
    for wrong in ("arn:aws:bedrock-agentcore:US-west-2:123456789012:runtime/x", None):
        with pytest.raises(ConfigurationError, match="not an AgentCore Runtime ARN; expected"):
            protocol.parse_runtime_arn(wrong)
    for bad in ("arn:aws:s3:::bucket", "arn:aws:bedrock-agentcore:us-west-2:123:runtime/x", ""):
        with pytest.raises(ConfigurationError, match="not an AgentCore Runtime ARN"):
            AsyncRolloutClient(agent_runtime_arn=bad, s3_bucket="bkt", exp_id="e")


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({}, "exactly one of"),
        (
            {"agent_url": "http://127.0.0.1:1", "agent_runtime_arn": DEFAULT_AGENT_RUNTIME_ARN},
            "exactly one of",
        ),
        ({"agent_url": "ftp://host"}, "not an http"),
        ({"agent_url": []}, "at least one URL"),
        ({"agent_url": "http://127.0.0.1:1", "limits": "many"}, "limits must be a Limits"),
        ({"agent_url": "http://127.0.0.1:1", "rollout": ["x"]}, "rollout= takes a mapping"),
        ({"agent_url": "http://127.0.0.1:1", "rollout": {"exp_id": "x"}}, "cannot set 'exp_id'"),
        ({"agent_url": "http://127.0.0.1:1", "exp_id": "a/b"}, "exp_id"),
        ({"agent_url": "http://127.0.0.1:1", "s3_bucket": "Bad_Bucket"}, "s3_bucket"),
    ],
)
def test_bad_constructor_arguments(options: dict[str, Any], match: str) -> None:
    settings: dict[str, Any] = {
        "s3_bucket": "bkt",
        "exp_id": "e",
        "watcher": FAST_WATCH,
        "retries": quick_retries(),
    }
    settings.update(options)
    with pytest.raises(ConfigurationError, match=match):
        AsyncRolloutClient(**settings)
