"""Bad input and lost traces: clear 4xx/5xx errors, failed calls recorded, nothing dropped."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from openai import APIStatusError

from agentcore_rl.errors import ConfigurationError
from agentcore_rl.gateway import DirectorySink, GatewayOptions, RolloutGateway, TraceLostError
from agentcore_rl.local.background import BackgroundServer
from agentcore_rl.local.policy import ScriptedPolicy, Serving
from tests.gateway.helpers import chat, served

BODY: Any = {"model": "m", "messages": [{"role": "user", "content": "What is 1 + 1?"}]}


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize(
    ("path", "headers", "content", "status", "words"),
    [
        ("/sessions/bad%20id/v1/chat/completions", {}, b"{}", 400, "malformed session id"),
        ("/sessions/-x/v1/chat/completions", {}, b"{}", 400, "malformed session id"),
        ("/v1/chat/completions", {}, b"{}", 401, "no session id"),
        ("/v1/chat/completions", {"authorization": "Bearer a/b"}, b"{}", 400, "malformed"),
        ("/sessions/s1/v1/chat/completions", {}, b"{nope", 400, "not valid JSON"),
        ("/sessions/s1/v1/chat/completions", {}, b"[1]", 400, "must be a JSON object"),
        ("/sessions/s1/v1/chat/completions", {}, b'{"model": "m"}', 400, "no 'messages'"),
        ("/sessions/s1/v1/embeddings", {}, b"{}", 404, "no route"),
        ("/sessions/s1/admin/stats", {}, b"{}", 404, "no route"),
        ("/sessions/s1/v1/../../admin/stats", {}, b"{}", 404, "no route"),
    ],
)
async def test_bad_requests_get_a_json_error_naming_the_problem(
    path: str, headers: dict[str, str], content: bytes, status: int, words: str
) -> None:
    async with served() as stack, httpx.AsyncClient(base_url=stack.url) as http:
        response = await http.post(path, content=content, headers=headers)
        assert response.status_code == status
        assert words in response.json()["error"]["message"]
        assert stack.policy.requests == 0


async def test_an_oversized_body_is_refused_with_413() -> None:
    async with (
        served(options=GatewayOptions(max_body_bytes=1000)) as stack,
        httpx.AsyncClient(base_url=stack.url) as h,
    ):
        big = {**BODY, "messages": [{"role": "user", "content": "x" * 2000}]}
        response = await h.post("/sessions/s1/v1/chat/completions", json=big)
        assert response.status_code == 413
        assert "the limit is 1000 bytes" in response.json()["error"]["message"]


async def test_unknown_sessions_are_refused_when_the_client_opens_them() -> None:
    async with (
        served(options=GatewayOptions(require_open=True)) as stack,
        httpx.AsyncClient(base_url=stack.url) as h,
    ):
        response = await h.post("/sessions/never-opened/v1/chat/completions", json=BODY)
        assert response.status_code == 404
        assert "unknown session" in response.json()["error"]["message"]
        stack.gateway.open_session("opened")
        ok = await h.post("/sessions/opened/v1/chat/completions", json=BODY)
        assert ok.status_code == 200
    with pytest.raises(ValueError, match="malformed session id"):
        stack.gateway.open_session("../x")


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
async def test_upstream_down_is_a_502_and_a_failed_record(stream: bool) -> None:
    gateway = RolloutGateway(f"http://127.0.0.1:{_closed_port()}/v1")
    async with BackgroundServer(gateway) as server:
        llm = type(gateway).session_base_url(server.url, "d1")
        from openai import AsyncOpenAI

        async with AsyncOpenAI(base_url=llm, api_key="x", max_retries=0) as client:
            with pytest.raises(APIStatusError) as caught:
                await chat(client, BODY["messages"], stream=stream)
        assert caught.value.status_code == 502
        assert "upstream http://127.0.0.1" in str(caught.value)
        trace = await gateway.finish_session("d1")
    assert [(r.status, r.ok) for r in trace.records] == [(502, False)]
    assert "cannot connect" in (trace.records[0].error or "")


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
async def test_an_upstream_without_token_ids_is_named(stream: bool) -> None:
    policy = ScriptedPolicy(accuracy=1.0, serving=Serving(token_ids="never"))
    async with served(policy) as stack, httpx.AsyncClient(base_url=stack.url) as http:
        response = await http.post(
            "/sessions/n1/v1/chat/completions", json={**BODY, "stream": stream}
        )
        assert response.status_code == 502
        message = response.json()["error"]["message"]
        assert "no prompt token ids and no completion token ids" in message
        assert "vLLM >= 0.10.2" in message
        trace = await stack.gateway.finish_session("n1")
    assert [r.status for r in trace.records] == [502]
    assert trace.failed_calls == 1


async def test_upstream_errors_pass_through_and_are_recorded() -> None:
    async with served() as stack, httpx.AsyncClient(base_url=stack.url) as http:
        response = await http.post(
            "/sessions/u1/v1/chat/completions", json={"model": "m", "messages": []}
        )
        assert response.status_code == 400
        assert "non-empty" in response.json()["error"]["message"]
        trace = await stack.gateway.finish_session("u1")
    assert trace.records[0].status == 400
    assert "HTTP 400" in (trace.records[0].error or "")


async def test_a_finished_or_unknown_session_is_a_lost_trace() -> None:
    async with served() as stack:
        with pytest.raises(TraceLostError, match="no record of it"):
            await stack.gateway.finish_session("never-seen")
        stack.gateway.open_session("empty")
        assert (await stack.gateway.finish_session("empty")).records == []
        with pytest.raises(TraceLostError):
            await stack.gateway.finish_session("empty")


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_idle_sessions_expire_into_the_sink_and_finish_from_it(tmp_path: Path) -> None:
    clock = _Clock()
    sink = DirectorySink(tmp_path / "expired")
    async with served(options=GatewayOptions(session_ttl=60.0), sink=sink, clock=clock) as stack:
        async with stack.llm("e1") as llm:
            await chat(llm, BODY["messages"], stream=False)
        stack.gateway.open_session("e2")
        clock.now += 30
        assert await stack.gateway.expire_idle() == 0
        clock.now += 31
        assert await stack.gateway.expire_idle() == 2
        assert stack.gateway.stats["live_sessions"] == 0
        trace = await stack.gateway.finish_session("e1")
    assert not trace.complete
    assert len(trace.records) == 1
    assert trace.records[0].ok
    assert (tmp_path / "expired" / "e1.trace.json.gz").exists()


async def test_without_a_sink_expiry_is_counted_and_the_trace_lost(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = _Clock()
    async with served(options=GatewayOptions(session_ttl=60.0), clock=clock) as stack:
        stack.gateway.open_session("x1")
        clock.now += 61
        assert await stack.gateway.expire_idle() == 1
        assert stack.gateway.stats["expired_lost"] == 1
        assert "no sink" in caplog.text
        with pytest.raises(TraceLostError):
            await stack.gateway.finish_session("x1")


async def test_a_gateway_that_is_not_started_says_so() -> None:
    gateway = RolloutGateway("http://127.0.0.1:9/v1")
    transport = httpx.ASGITransport(app=gateway)
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as http:
        response = await http.post("/sessions/s/v1/chat/completions", json=BODY)
    assert response.status_code == 503
    assert "not started" in response.json()["error"]["message"]


def test_constructor_refuses_bad_options() -> None:
    with pytest.raises(ValueError, match="at least one upstream"):
        RolloutGateway([])
    with pytest.raises(ValueError, match="http"):
        RolloutGateway("vllm:8000")
    with pytest.raises(ValueError, match="unknown backend"):
        RolloutGateway("http://h/v1", backend="tgi")


def _broken_upstream(tail: str, agent_saw_first: anyio.Event) -> Any:
    """A vLLM-shaped server that sends its first chunk, then (once the agent has it) ``tail``
    or a dropped connection."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import StreamingResponse
    from starlette.routing import Route

    first = {
        "id": "c",
        "object": "chat.completion.chunk",
        "prompt_token_ids": [1, 2],
        "choices": [{"index": 0, "delta": {"content": "Hi"}, "token_ids": [5]}],
    }

    async def chat(request: Request) -> StreamingResponse:
        async def events() -> Any:
            yield "data: " + json.dumps(first) + "\n\n"
            await agent_saw_first.wait()  # the break comes after the headers are out
            if tail == "drop":
                raise RuntimeError("the upstream died mid-stream")
            yield tail

        return StreamingResponse(events(), media_type="text/event-stream")

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])


@pytest.mark.parametrize(
    ("tail", "words"),
    [("data: {broken\n\n", "invalid stream event"), ("drop", "upstream http://127.0.0.1")],
)
async def test_a_stream_that_breaks_midway_ends_with_an_error_event_and_a_failed_record(
    tail: str, words: str
) -> None:
    agent_saw_first = anyio.Event()
    async with BackgroundServer(_broken_upstream(tail, agent_saw_first)) as upstream:
        gateway = RolloutGateway(upstream.url + "/v1")
        async with BackgroundServer(gateway) as server, httpx.AsyncClient() as http:
            url = f"{server.url}/sessions/b1/v1/chat/completions"
            parts: list[str] = []
            async with http.stream("POST", url, json={**BODY, "stream": True}) as response:
                async for part in response.aiter_text():
                    parts.append(part)
                    agent_saw_first.set()
            trace = await gateway.finish_session("b1")
    text = "".join(parts)
    assert response.status_code == 200  # the headers were out before the break
    assert '"content": "Hi"' in text or '"content":"Hi"' in text
    assert words in text
    assert "[DONE]" not in text
    assert [r.status for r in trace.records] == [502]
    assert words in (trace.records[0].error or "")


DEEP = b"[" * 5000 + b"]" * 5000


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (DEEP, "nested deeper than 254 levels"),
        (b'{"messages": ' + b"[" * 254 + b"]" * 254 + b"}", "nested deeper than 254 levels"),
        (b'{"messages": [NaN]}', "not valid JSON"),
        (b'{"messages": [{"role": "user", "content": "\\ud800"}]}', "surrogate"),
        (b'{"messages": [], "n": 123456789012345678901234567890}', "64-bit"),
        (b'{"messages": [], "seed": 18446744073709551616}', "64-bit"),
        (b'{"messages": [], "model": "\xff\xfe"}', "not valid JSON"),
        (b"", "not valid JSON"),
        (b"null", "must be a JSON object"),
    ],
    ids=["deep", "deep-255", "nan", "surrogate", "bigint", "2**64", "utf8", "empty", "null"],
)
async def test_hostile_json_gets_a_400_naming_the_problem(content: bytes, words: str) -> None:
    async with served() as stack, httpx.AsyncClient(base_url=stack.url) as http:
        response = await http.post("/sessions/h1/v1/chat/completions", content=content)
        assert response.status_code == 400, response.text
        assert words in response.json()["error"]["message"]
        assert stack.policy.requests == 0


@pytest.mark.parametrize(
    "body",
    [
        {**BODY, "stream": True, "stream_options": "yes"},
        {**BODY, "stream": "yes", "stream_options": [1]},
        {**BODY, "logprobs": {"a": 1}},
        {**BODY, "model": 7},
        {**BODY, "messages": "hello"},
        {**BODY, "messages": None},
    ],
)
async def test_odd_types_never_get_a_5xx_from_the_gateway(body: dict[str, Any]) -> None:
    async with served() as stack, httpx.AsyncClient(base_url=stack.url) as http:
        content = json.dumps(body).encode()
        response = await http.post("/sessions/t1/v1/chat/completions", content=content)
        forwarded = stack.policy.requests > 0
        # What the gateway forwards is the upstream's to judge; what it refuses is a 4xx.
        assert response.status_code < 500 or forwarded, response.text


async def _raw_request(url: str, head: bytes, body: bytes = b"") -> bytes:
    """Send ``head`` (and ``body``) on a plain socket and read the whole answer."""
    host, port = url.removeprefix("http://").split(":")
    stream = await anyio.connect_tcp(host, int(port))
    async with stream:
        await stream.send(head + body)
        answer = b""
        with anyio.fail_after(20):  # bounded: the gateway answers long before
            while b"\r\n\r\n" not in answer or not answer.endswith(b"}"):
                try:
                    answer += await stream.receive()
                except anyio.EndOfStream:
                    break
    return answer


async def test_a_body_declared_too_large_is_refused_before_it_is_sent() -> None:
    async with served(options=GatewayOptions(max_body_bytes=1000)) as stack:
        head = (
            b"POST /sessions/s1/v1/chat/completions HTTP/1.1\r\nhost: gw\r\n"
            b"content-type: application/json\r\ncontent-length: 52428800\r\n\r\n"
        )
        answer = await _raw_request(stack.url, head)  # no byte of the body is ever sent
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert b"request body is 52428800 bytes; the limit is 1000 bytes" in answer


async def test_a_body_that_does_not_arrive_in_time_gets_a_408() -> None:
    async with served(options=GatewayOptions(body_timeout=0.5)) as stack:
        head = (
            b"POST /sessions/s1/v1/chat/completions HTTP/1.1\r\nhost: gw\r\n"
            b"content-type: application/json\r\ncontent-length: 100\r\n\r\n"
        )
        answer = await _raw_request(stack.url, head, b'{"messages": ')  # and then nothing
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert b"request body not received within 0.5 seconds" in answer
    with pytest.raises(ConfigurationError, match=r"GatewayOptions\.body_timeout must be"):
        GatewayOptions(body_timeout=0)
    with pytest.raises(TypeError, match=r"options=GatewayOptions\(body_timeout=\.\.\.\)"):
        RolloutGateway("http://127.0.0.1:9/v1", body_timeout=60.0)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="did you mean 'model'"):
        RolloutGateway("http://127.0.0.1:9/v1", modle="m")  # type: ignore[call-arg]
    with pytest.raises(ConfigurationError, match="options must be a GatewayOptions"):
        RolloutGateway("http://127.0.0.1:9/v1", options={"session_ttl": 5})  # type: ignore[arg-type]
