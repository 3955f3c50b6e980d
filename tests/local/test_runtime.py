"""LocalAgentCoreRuntime through the REAL aiobotocore ``bedrock-agentcore`` client.

The agents behind the runtime are small Starlette apps that speak the agent side of the
contract (``POST /invocations``, ``POST /sessions/{sid}/stop``): test doubles of an external
peer, served by real uvicorn like every other part.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any, cast
from urllib.parse import quote

import httpx
import pytest
from aiobotocore.config import AioConfig
from aiobotocore.session import get_session
from botocore.exceptions import ClientError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from agentcore_rl.errors import ConfigurationError
from agentcore_rl.local.background import BackgroundServer
from agentcore_rl.local.runtime import (
    DEFAULT_AGENT_RUNTIME_ARN,
    LocalAgentCoreRuntime,
    parse_runtime_path,
)
from agentcore_rl.protocol import (
    REQUEST_ID_HEADER,
    SESSION_ID_HEADER,
    new_session_id,
    parse_runtime_arn,
)
from agentcore_rl.s3 import ResultStore
from agentcore_rl.server import AgentCoreRLApp, RequestContext
from tests.conftest import FAST_RETRY

ARN = DEFAULT_AGENT_RUNTIME_ARN
OTHER_ARN = "arn:aws:bedrock-agentcore:us-west-2:123456789012:runtime/other-agent"
NO_RETRY = AioConfig(retries={"total_max_attempts": 1})


class FakeAgent:
    """The agent side of the contract, recording what it was sent.

    Payload ``{"fail": N}`` answers status N; ``{"reject": "why"}`` answers 400 like our
    agent server does for a bad payload.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.invocations: list[tuple[str, dict[str, Any], dict[str, str]]] = []
        self.stops: list[str] = []
        self.stop_status = 200
        self.app = Starlette(
            routes=[
                Route("/invocations", self.invoke, methods=["POST"]),
                Route("/sessions/{session_id}/stop", self.stop, methods=["POST"]),
            ]
        )

    async def invoke(self, request: Request) -> Response:
        payload = await request.json()
        self.invocations.append(
            (request.headers[SESSION_ID_HEADER], payload, dict(request.headers))
        )
        if "fail" in payload:
            return PlainTextResponse("agent exploded", status_code=payload["fail"])
        if "reject" in payload:
            return JSONResponse({"error": payload["reject"], "field": "prompt"}, status_code=400)
        return JSONResponse({"agent": self.name, "echo": payload})

    async def stop(self, request: Request) -> Response:
        session_id = request.path_params["session_id"]
        self.stops.append(session_id)
        if self.stop_status != 200:
            return PlainTextResponse("cannot stop", status_code=self.stop_status)
        return JSONResponse({"session_id": session_id, "stopped": True})

    def sessions(self) -> set[str]:
        return {sid for sid, _, _ in self.invocations}


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@asynccontextmanager
async def serve_runtime(
    runtime: LocalAgentCoreRuntime, *, config: AioConfig = NO_RETRY
) -> AsyncIterator[Any]:
    """Serve ``runtime`` on loopback and yield a real aiobotocore client pointed at it."""
    async with AsyncExitStack() as stack:
        server = await stack.enter_async_context(BackgroundServer(runtime))
        client = await stack.enter_async_context(
            get_session().create_client(
                "bedrock-agentcore",
                region_name=parse_runtime_arn(ARN).region,
                endpoint_url=server.url,
                config=config,
            )
        )
        yield client


@pytest.fixture
async def agents() -> AsyncIterator[list[FakeAgent]]:
    fakes = [FakeAgent("a"), FakeAgent("b")]
    async with AsyncExitStack() as stack:
        for fake in fakes:
            server = await stack.enter_async_context(BackgroundServer(fake.app))
            fake.url = server.url  # type: ignore[attr-defined]
        yield fakes


def urls(agents: list[FakeAgent]) -> list[str]:
    return [agent.url for agent in agents]  # type: ignore[attr-defined]


async def invoke(client: Any, session_id: str | None, payload: dict[str, Any], **kw: Any) -> Any:
    params: dict[str, Any] = {"agentRuntimeArn": ARN, "payload": json.dumps(payload).encode()}
    if session_id is not None:
        params["runtimeSessionId"] = session_id
    params.update(kw)
    response = await client.invoke_agent_runtime(**params)
    async with response["response"] as stream:
        response["body"] = json.loads(await stream.read())
    return response


def error_of(exc_info: pytest.ExceptionInfo[ClientError]) -> tuple[str, int, str]:
    response = exc_info.value.response
    return (
        response["Error"]["Code"],
        response["ResponseMetadata"]["HTTPStatusCode"],
        response["Error"]["Message"],
    )


async def test_invoke_forwards_payload_and_session_and_returns_agent_body(
    agents: list[FakeAgent],
) -> None:
    runtime = LocalAgentCoreRuntime({ARN: urls(agents)[:1]}, tps=None)
    sid = new_session_id()
    async with serve_runtime(runtime) as client:
        response = await invoke(client, sid, {"prompt": "2+2"}, qualifier="DEFAULT")
    assert response["body"] == {"agent": "a", "echo": {"prompt": "2+2"}}
    assert response["runtimeSessionId"] == sid
    assert response["contentType"] == "application/json"
    assert response["statusCode"] == 200
    assert response["ResponseMetadata"]["RequestId"]
    [(seen_sid, payload, headers)] = agents[0].invocations
    assert seen_sid == sid
    assert payload == {"prompt": "2+2"}
    assert headers[REQUEST_ID_HEADER.lower()] == response["ResponseMetadata"]["RequestId"]
    assert runtime.session_agent(ARN, sid) == agents[0].url  # type: ignore[attr-defined]
    assert runtime.counts["InvokeAgentRuntime"] == 1


async def test_botocore_idempotency_token_becomes_the_session_id(agents: list[FakeAgent]) -> None:
    runtime = LocalAgentCoreRuntime({ARN: urls(agents)[:1]}, tps=None)
    async with serve_runtime(runtime) as client:
        response = await invoke(client, None, {"prompt": "hi"})
    [(seen_sid, _, _)] = agents[0].invocations
    assert response["runtimeSessionId"] == seen_sid
    assert len(seen_sid) == 36  # botocore's uuid4


async def test_stop_reaches_the_agent_and_forgets_the_session(agents: list[FakeAgent]) -> None:
    runtime = LocalAgentCoreRuntime({ARN: urls(agents)}, tps=None)
    sid = new_session_id()
    async with serve_runtime(runtime) as client:
        await invoke(client, sid, {"prompt": "x"})
        owner = next(agent for agent in agents if agent.invocations)
        response = await client.stop_runtime_session(agentRuntimeArn=ARN, runtimeSessionId=sid)
        assert response["runtimeSessionId"] == sid
        assert response["statusCode"] == 200
        assert owner.stops == [sid]
        assert runtime.live_sessions(ARN) == 0
        # Stopped sessions are gone, as are sessions never seen.
        for unknown in (sid, new_session_id()):
            with pytest.raises(ClientError) as exc_info:
                await client.stop_runtime_session(agentRuntimeArn=ARN, runtimeSessionId=unknown)
            assert error_of(exc_info)[:2] == ("ResourceNotFoundException", 404)
    assert sum(len(agent.stops) for agent in agents) == 1


async def test_a_retried_stop_with_the_same_client_token_succeeds_again(
    agents: list[FakeAgent],
) -> None:
    runtime = LocalAgentCoreRuntime({ARN: urls(agents)[:1]}, tps=None)
    sid, token = new_session_id(), new_session_id()
    async with serve_runtime(runtime) as client:
        await invoke(client, sid, {"prompt": "x"})
        for _ in range(2):
            response = await client.stop_runtime_session(
                agentRuntimeArn=ARN, runtimeSessionId=sid, clientToken=token
            )
            assert response["statusCode"] == 200
    assert agents[0].stops == [sid]


async def test_tps_limit_answers_throttling_for_invoke_and_stop_alike(
    agents: list[FakeAgent],
) -> None:
    clock = FakeClock()
    runtime = LocalAgentCoreRuntime({ARN: urls(agents)[:1]}, tps=2, burst=2, clock=clock)
    sid = new_session_id()
    async with serve_runtime(runtime) as client:
        await invoke(client, sid, {"n": 1})
        await client.stop_runtime_session(agentRuntimeArn=ARN, runtimeSessionId=sid)
        with pytest.raises(ClientError) as exc_info:
            await invoke(client, sid, {"n": 2})
        code, status, message = error_of(exc_info)
        assert (code, status) == ("ThrottlingException", 429)
        assert "2 requests per second" in message
        with pytest.raises(ClientError) as exc_info:
            await client.stop_runtime_session(agentRuntimeArn=ARN, runtimeSessionId=sid)
        assert error_of(exc_info)[0] == "ThrottlingException"
        clock.now += 0.5  # one token back
        await invoke(client, sid, {"n": 3})
    assert [payload["n"] for _, payload, _ in agents[0].invocations] == [1, 3]
    assert runtime.counts["ThrottlingException"] == 2


async def test_each_runtime_has_its_own_tps_bucket(agents: list[FakeAgent]) -> None:
    runtime = LocalAgentCoreRuntime(
        {ARN: urls(agents)[:1], OTHER_ARN: urls(agents)[1:]}, tps=1, clock=FakeClock()
    )
    async with serve_runtime(runtime) as client:
        await invoke(client, new_session_id(), {})
        with pytest.raises(ClientError):
            await invoke(client, new_session_id(), {})
        await invoke(client, new_session_id(), {}, agentRuntimeArn=OTHER_ARN)
    assert len(agents[1].invocations) == 1


async def test_invalid_session_ids_are_validation_errors(agents: list[FakeAgent]) -> None:
    runtime = LocalAgentCoreRuntime({ARN: urls(agents)[:1]}, tps=None)
    # botocore itself refuses ids under 33 characters; switch that off to reach the server.
    lax = AioConfig(retries={"total_max_attempts": 1}, parameter_validation=False)
    async with serve_runtime(runtime, config=lax) as client:
        for bad in ("short-id", "x" * 257, "-" + "a" * 40, "a_" * 20):
            with pytest.raises(ClientError) as exc_info:
                await invoke(client, bad, {"prompt": "x"})
            code, status, message = error_of(exc_info)
            assert (code, status) == ("ValidationException", 400)
            assert "runtimeSessionId" in message
            assert (
                cast("dict[str, Any]", exc_info.value.response)["reason"] == "FieldValidationFailed"
            )
            with pytest.raises(ClientError) as exc_info:
                await client.stop_runtime_session(agentRuntimeArn=ARN, runtimeSessionId=bad)
            assert error_of(exc_info)[0] == "ValidationException"
    assert agents[0].invocations == []


async def test_empty_and_oversized_payloads_are_validation_errors(
    agents: list[FakeAgent],
) -> None:
    runtime = LocalAgentCoreRuntime({ARN: urls(agents)[:1]}, tps=None, max_payload_bytes=100)
    async with serve_runtime(runtime) as client:
        for payload, words in ((b"", "empty"), (b"x" * 101, "101 bytes")):
            with pytest.raises(ClientError) as exc_info:
                await client.invoke_agent_runtime(
                    agentRuntimeArn=ARN, runtimeSessionId=new_session_id(), payload=payload
                )
            code, status, message = error_of(exc_info)
            assert (code, status) == ("ValidationException", 400)
            assert words in message
    assert agents[0].invocations == []


async def test_unknown_runtime_is_resource_not_found(agents: list[FakeAgent]) -> None:
    runtime = LocalAgentCoreRuntime({ARN: urls(agents)[:1]}, tps=None)
    async with serve_runtime(runtime) as client:
        with pytest.raises(ClientError) as exc_info:
            await invoke(client, new_session_id(), {}, agentRuntimeArn=OTHER_ARN)
        code, status, message = error_of(exc_info)
        assert (code, status) == ("ResourceNotFoundException", 404)
        assert OTHER_ARN in message
        assert ARN in message
        with pytest.raises(ClientError) as exc_info:
            await client.stop_runtime_session(
                agentRuntimeArn=OTHER_ARN, runtimeSessionId=new_session_id()
            )
        assert error_of(exc_info)[0] == "ResourceNotFoundException"


async def test_agent_failure_is_runtime_client_error(agents: list[FakeAgent]) -> None:
    runtime = LocalAgentCoreRuntime({ARN: urls(agents)[:1]}, tps=None)
    sid = new_session_id()
    async with serve_runtime(runtime) as client:
        with pytest.raises(ClientError) as exc_info:
            await invoke(client, sid, {"fail": 500})
        code, status, message = error_of(exc_info)
        assert (code, status) == ("RuntimeClientError", 424)
        assert "agent exploded" in message
        assert "(500)" in message
        # A session no agent accepted holds no affinity.
        assert runtime.live_sessions(ARN) == 0
        with pytest.raises(ClientError) as exc_info:
            await invoke(client, sid, {"fail": 503})
        assert error_of(exc_info)[0] == "RuntimeClientError"


async def test_unreachable_agent_is_runtime_client_error(agents: list[FakeAgent]) -> None:
    async with BackgroundServer(agents[0].app) as gone:
        dead_url = gone.url
    runtime = LocalAgentCoreRuntime({ARN: [dead_url]}, tps=None, timeout=5.0)
    async with serve_runtime(runtime) as client:
        with pytest.raises(ClientError) as exc_info:
            await invoke(client, new_session_id(), {})
        code, status, message = error_of(exc_info)
        assert (code, status) == ("RuntimeClientError", 424)
        assert dead_url in message
        assert "unreachable" in message


async def test_agent_rejection_is_a_validation_error_with_its_message(
    agents: list[FakeAgent],
) -> None:
    runtime = LocalAgentCoreRuntime({ARN: urls(agents)[:1]}, tps=None)
    async with serve_runtime(runtime) as client:
        with pytest.raises(ClientError) as exc_info:
            await invoke(client, new_session_id(), {"reject": "prompt must be a string"})
        code, status, message = error_of(exc_info)
        assert (code, status) == ("ValidationException", 400)
        assert "prompt must be a string" in message
        assert cast("dict[str, Any]", exc_info.value.response)["fieldList"][0]["name"] == "prompt"
    assert runtime.live_sessions(ARN) == 0


async def test_failed_stop_is_runtime_client_error_and_keeps_the_session(
    agents: list[FakeAgent],
) -> None:
    runtime = LocalAgentCoreRuntime({ARN: urls(agents)[:1]}, tps=None)
    sid = new_session_id()
    async with serve_runtime(runtime) as client:
        await invoke(client, sid, {})
        agents[0].stop_status = 500
        with pytest.raises(ClientError) as exc_info:
            await client.stop_runtime_session(agentRuntimeArn=ARN, runtimeSessionId=sid)
        assert error_of(exc_info)[:2] == ("RuntimeClientError", 424)
        assert runtime.live_sessions(ARN) == 1  # the caller may try again
        agents[0].stop_status = 404  # an agent without the stop extension
        await client.stop_runtime_session(agentRuntimeArn=ARN, runtimeSessionId=sid)
        assert runtime.live_sessions(ARN) == 0


async def test_sessions_stick_to_one_agent_and_spread_across_agents(
    agents: list[FakeAgent],
) -> None:
    runtime = LocalAgentCoreRuntime({ARN: urls(agents)}, tps=None)
    sessions = [new_session_id() for _ in range(4)]
    async with serve_runtime(runtime) as client:
        for turn in range(3):
            for sid in sessions:
                response = await invoke(client, sid, {"turn": turn})
                assert response["body"]["agent"] == agents[sessions.index(sid) % 2].name
        assert agents[0].sessions() == set(sessions[0::2])
        assert agents[1].sessions() == set(sessions[1::2])
        # Stopping both of agent a's sessions makes it the least loaded: new ones go there.
        for sid in sessions[0::2]:
            await client.stop_runtime_session(agentRuntimeArn=ARN, runtimeSessionId=sid)
        fresh = [new_session_id() for _ in range(2)]
        for sid in fresh:
            await invoke(client, sid, {"turn": 0})
    assert set(fresh) <= agents[0].sessions()
    assert [len(agent.invocations) for agent in agents] == [8, 6]


async def test_raw_http_paths_and_unencoded_arns(agents: list[FakeAgent]) -> None:
    runtime = LocalAgentCoreRuntime({ARN: urls(agents)[:1]}, tps=None)
    async with BackgroundServer(runtime) as server, httpx.AsyncClient(base_url=server.url) as http:
        answer = await http.get("/runtimes")
        assert answer.status_code == 404
        assert answer.headers["x-amzn-errortype"] == "UnknownOperationException"
        answer = await http.post(f"/runtimes/{quote(ARN, safe='')}/nonsense")
        assert answer.headers["x-amzn-errortype"] == "UnknownOperationException"
        # No session id header: the runtime makes one up, as ACR does.
        answer = await http.post(f"/runtimes/{ARN}/invocations", json={"prompt": "raw"})
        assert answer.status_code == 200
        assert answer.json()["echo"] == {"prompt": "raw"}
        assert len(answer.headers[SESSION_ID_HEADER]) >= 33
        answer = await http.post(
            f"/runtimes/{quote(ARN, safe='')}/stopruntimesession",
            headers={SESSION_ID_HEADER: answer.headers[SESSION_ID_HEADER]},
            content=b"[not json",
        )
        assert answer.status_code == 400
        assert answer.json()["reason"] == "CannotParse"
    await runtime.aclose()  # idempotent after the lifespan closed it


def test_parse_runtime_path() -> None:
    encoded = quote(ARN, safe="").encode()
    assert parse_runtime_path(b"/runtimes/" + encoded + b"/invocations") == (ARN, "invocations")
    assert parse_runtime_path(b"/runtimes/" + ARN.encode() + b"/x") == (ARN, "x")
    assert parse_runtime_path(b"/runtimes//invocations") is None
    assert parse_runtime_path(b"/other/a/b") is None


@pytest.mark.parametrize(
    ("runtimes", "words"),
    [
        ({}, "at least one"),
        ({"arn:aws:s3:::bucket": ["http://127.0.0.1:1"]}, "not an AgentCore Runtime ARN"),
        ({ARN: []}, "non-empty list"),
        ({ARN: "http://127.0.0.1:1"}, "non-empty list"),
        ({ARN: ["127.0.0.1:8080"]}, "http://"),
    ],
)
def test_bad_configuration_is_refused(runtimes: Any, words: str) -> None:
    with pytest.raises(ConfigurationError, match=words):
        LocalAgentCoreRuntime(runtimes)


# --- with the real agent server (AgentCoreRLApp) writing to moto ----------------------------


def blocking_agent(store: ResultStore, started: asyncio.Event) -> AgentCoreRLApp:
    """A real agent server whose rollouts run until stopped."""
    app = AgentCoreRLApp(store=store)

    @app.rollout_entrypoint
    async def solve(payload: dict[str, Any], context: RequestContext) -> dict[str, Any]:
        started.set()
        await asyncio.Event().wait()
        return {"rewards": [1.0]}

    return app


async def test_stop_runtime_session_cancels_the_real_agents_rollout(
    s3_endpoint: str, store: ResultStore, bucket: str
) -> None:
    started = asyncio.Event()
    sid = new_session_id()
    rollout = {"exp_id": "stop", "input_id": "q-1", "s3_bucket": bucket}
    async with (
        ResultStore(endpoint_url=s3_endpoint, retry=FAST_RETRY) as agent_store,
        BackgroundServer(blocking_agent(agent_store, started)) as agent,
    ):
        runtime = LocalAgentCoreRuntime({ARN: [agent.url]}, tps=None)
        async with serve_runtime(runtime) as client:
            answer = await invoke(client, sid, {"_rollout": rollout})
            assert answer["body"]["status"] == "processing"
            await asyncio.wait_for(started.wait(), 5)
            await client.stop_runtime_session(agentRuntimeArn=ARN, runtimeSessionId=sid)
            # The agent answers the stop once the cancelled envelope is delivered.
            envelope = await store.get_json(bucket, answer["body"]["result_key"])
    assert envelope is not None
    assert envelope["error_type"] == "cancelled"
    assert envelope["session_id"] == sid
    assert envelope["status_code"] >= 400


async def test_real_agent_rejecting_a_bad_rollout_block_is_a_validation_error(
    s3_endpoint: str, bucket: str
) -> None:
    async with (
        ResultStore(endpoint_url=s3_endpoint, retry=FAST_RETRY) as agent_store,
        BackgroundServer(blocking_agent(agent_store, asyncio.Event())) as agent,
    ):
        runtime = LocalAgentCoreRuntime({ARN: [agent.url]}, tps=None)
        async with serve_runtime(runtime) as client:
            with pytest.raises(ClientError) as exc_info:
                await invoke(
                    client,
                    new_session_id(),
                    {"_rollout": {"exp_id": "../x", "input_id": "q", "s3_bucket": bucket}},
                )
    code, status, message = error_of(exc_info)
    assert (code, status) == ("ValidationException", 400)
    assert "exp_id" in message
    assert runtime.live_sessions(ARN) == 0
