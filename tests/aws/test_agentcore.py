"""LeanAgentCore against the local AgentCore Runtime, side by side with the generic client."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import pytest
from aiobotocore.session import get_session
from botocore.exceptions import ClientError

from agentcore_rl.aws import LeanAgentCore
from agentcore_rl.local.background import BackgroundServer
from agentcore_rl.local.runtime import LocalAgentCoreRuntime
from agentcore_rl.protocol import new_session_id, parse_runtime_arn
from tests.aws.conftest import GENERIC_CONFIG
from tests.local.test_runtime import ARN, OTHER_ARN, FakeAgent, FakeClock

Pair = tuple[Any, LeanAgentCore]


@pytest.fixture
async def agent() -> AsyncIterator[FakeAgent]:
    fake = FakeAgent("a")
    async with BackgroundServer(fake.app) as server:
        fake.url = server.url  # type: ignore[attr-defined]
        yield fake


@asynccontextmanager
async def runtime_clients(
    runtime: LocalAgentCoreRuntime,
    *,
    arn: str = ARN,
    qualifier: str | None = None,
    via_env: pytest.MonkeyPatch | None = None,
) -> AsyncIterator[Pair]:
    """Serve ``runtime``; yield a generic client on it and a lean one built from it."""
    async with AsyncExitStack() as stack:
        server = await stack.enter_async_context(BackgroundServer(runtime))
        endpoint: str | None = server.url
        if via_env is not None:
            via_env.setenv("AWS_ENDPOINT_URL_BEDROCK_AGENTCORE", server.url)
            endpoint = None
        client = await stack.enter_async_context(
            get_session().create_client(
                "bedrock-agentcore",
                region_name=parse_runtime_arn(arn).region,
                endpoint_url=endpoint,
                config=GENERIC_CONFIG,
            )
        )
        lean = await LeanAgentCore.create(client, arn, qualifier=qualifier)
        stack.push_async_callback(lean.aclose)
        yield client, lean


async def generic_invoke(client: Any, sid: str, payload: dict[str, Any], arn: str = ARN) -> Any:
    response = await client.invoke_agent_runtime(
        agentRuntimeArn=arn,
        runtimeSessionId=sid,
        payload=json.dumps(payload).encode(),
        contentType="application/json",
        accept="application/json",
    )
    async with response["response"] as stream:
        return json.loads(await stream.read())


async def error_of(call: Any) -> dict[str, Any]:
    with pytest.raises(ClientError) as exc_info:
        await call
    response = exc_info.value.response
    error = dict(response["Error"])
    error["Message"] = str(error["Message"]).split(" (", 1)[0]  # ids and URLs differ per call
    return {
        "class": type(exc_info.value).__name__,
        "error": error,
        "status": response["ResponseMetadata"]["HTTPStatusCode"],
        "operation": exc_info.value.operation_name,
    }


async def test_invoke_returns_the_agents_answer_and_stop_frees_the_session(
    agent: FakeAgent,
) -> None:
    runtime = LocalAgentCoreRuntime({ARN: [agent.url]}, tps=None)  # type: ignore[attr-defined]
    sid = new_session_id()
    async with runtime_clients(runtime, qualifier="DEFAULT") as (_, lean):
        body = await lean.invoke(sid, json.dumps({"prompt": "2+2"}).encode())
        assert json.loads(body) == {"agent": "a", "echo": {"prompt": "2+2"}}
        [(seen_sid, payload, headers)] = agent.invocations
        assert (seen_sid, payload) == (sid, {"prompt": "2+2"})
        assert headers["content-type"] == "application/json"
        await lean.stop(sid)
        assert agent.stops == [sid]
        assert runtime.live_sessions(ARN) == 0


async def test_endpoint_comes_from_aws_endpoint_url_bedrock_agentcore(
    agent: FakeAgent, monkeypatch: pytest.MonkeyPatch
) -> None:
    runtime = LocalAgentCoreRuntime({ARN: [agent.url]}, tps=None)  # type: ignore[attr-defined]
    async with runtime_clients(runtime, via_env=monkeypatch) as (_, lean):
        body = await lean.invoke(new_session_id(), b'{"n": 1}')
    assert json.loads(body)["echo"] == {"n": 1}


async def test_errors_are_botocores_exceptions_with_the_same_codes(agent: FakeAgent) -> None:
    runtime = LocalAgentCoreRuntime({ARN: [agent.url]}, tps=None)  # type: ignore[attr-defined]
    sid = new_session_id()
    async with runtime_clients(runtime) as (client, lean):
        cases: list[tuple[dict[str, Any], str, int]] = [
            ({"fail": 500}, "RuntimeClientError", 424),
            ({"reject": "prompt must be a string"}, "ValidationException", 400),
            ({"fail": 429}, "ThrottlingException", 429),
        ]
        for payload, code, status in cases:
            lean_error = await error_of(lean.invoke(sid, json.dumps(payload).encode()))
            generic_error = await error_of(generic_invoke(client, sid, payload))
            assert lean_error == generic_error
            assert (lean_error["error"]["Code"], lean_error["status"]) == (code, status)
        bad_sid = await error_of(lean.invoke("too-short", b"{}"))
        assert bad_sid == await error_of(generic_invoke(client, "too-short", {}))
        assert bad_sid["error"]["Code"] == "ValidationException"
        unknown = new_session_id()
        stop_error = await error_of(lean.stop(unknown))
        generic_stop = client.stop_runtime_session(agentRuntimeArn=ARN, runtimeSessionId=unknown)
        assert stop_error == await error_of(generic_stop)
        assert (stop_error["error"]["Code"], stop_error["status"]) == (
            "ResourceNotFoundException",
            404,
        )


async def test_unknown_runtime_is_resource_not_found(agent: FakeAgent) -> None:
    runtime = LocalAgentCoreRuntime({ARN: [agent.url]}, tps=None)  # type: ignore[attr-defined]
    async with runtime_clients(runtime, arn=OTHER_ARN) as (client, lean):
        lean_error = await error_of(lean.invoke(new_session_id(), b"{}"))
        sid = new_session_id()
        assert lean_error == await error_of(generic_invoke(client, sid, {}, arn=OTHER_ARN))
    assert lean_error["error"]["Code"] == "ResourceNotFoundException"


async def test_tps_quota_throttles_lean_invoke_and_stop(agent: FakeAgent) -> None:
    clock = FakeClock()
    runtime = LocalAgentCoreRuntime(
        {ARN: [agent.url]},  # type: ignore[attr-defined]
        tps=2,
        burst=2,
        clock=clock,
    )
    sid = new_session_id()
    async with runtime_clients(runtime) as (_, lean):
        await lean.invoke(sid, b"{}")
        await lean.stop(sid)
        for call in (lean.invoke(sid, b"{}"), lean.stop(sid)):
            throttled = await error_of(call)
            assert (throttled["class"], throttled["status"]) == ("ThrottlingException", 429)
