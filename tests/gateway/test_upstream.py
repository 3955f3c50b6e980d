"""The gateway's upstream client: requests built under the upstream's
base path, bodies whole or streamed, every failure an UpstreamError; and what the gateway
makes of answers a real server would not send."""

from __future__ import annotations

import asyncio
import contextlib
import json

import httpx
import pytest

from agentcore_rl.gateway import RolloutGateway
from agentcore_rl.gateway.upstream import UpstreamError, UpstreamPool
from tests.gateway.loopback import answer, echo_target, loopback


async def test_requests_go_under_the_base_path_and_failures_are_upstream_errors() -> None:
    async with loopback(echo_target) as (origin, counts):
        pool = UpstreamPool(f"{origin}/v1/")
        target = pool.target("/chat/completions")
        assert (target.method, str(target.url)) == ("POST", f"{origin}/v1/chat/completions")
        assert target.headers["Content-Type"] == "application/json"
        assert await pool.fetch(target, b"{}") == (200, b"/v1/chat/completions")
        async with pool.stream(pool.target("/models", "GET"), None) as response:
            assert (response.status, await response.read()) == (200, b"/v1/models")
        await pool.aclose()
        with pytest.raises(UpstreamError, match="closed"):
            await pool.fetch(target, b"{}")
    assert counts == [2]
    async with contextlib.aclosing(UpstreamPool(f"{origin}/v1")) as pool:
        with pytest.raises(UpstreamError, match="cannot connect"):
            await pool.fetch(pool.target("/models", "GET"), None)
    with pytest.raises(ValueError, match="http"):
        UpstreamPool("ftp://127.0.0.1/v1")


async def test_a_malformed_or_incomplete_answer_is_a_502_and_a_failed_record() -> None:
    answers = [
        {"prompt_token_ids": [1], "choices": [{"index": 0, "token_ids": 7}]},
        {
            "prompt_token_ids": [1, 2],
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "a b"},
                    "token_ids": [5, 6],
                    "logprobs": {"content": [{"token": "a", "logprob": -0.5}]},
                }
            ],
        },
    ]

    sent: list[bytes] = []

    async def handler(_: asyncio.StreamReader, w: asyncio.StreamWriter, n: int, h: bytes) -> bool:
        if b"/render " in h:  # a server without vLLM's scale-out routes: the chat route
            w.write(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")
            return True
        sent.append(h)
        w.write(answer(json.dumps(answers[len(sent) - 1]).encode()))
        return True

    async with loopback(handler) as (origin, _):
        gateway = RolloutGateway(f"{origin}/v1")
        transport = httpx.ASGITransport(app=gateway)
        async with gateway, httpx.AsyncClient(transport=transport, base_url="http://gw") as http:
            body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
            errors = []
            for _ in answers:
                response = await http.post("/sessions/s1/v1/chat/completions", json=body)
                assert response.status_code == 502
                errors.append(response.json()["error"]["message"])
            trace = await gateway.finish_session("s1")
    assert "malformed answer" in errors[0]
    assert "one logprob per completion token" in errors[1]
    assert [(r.status, r.error) for r in trace.records] == [(502, e) for e in errors]


async def test_silence_and_a_body_cut_short_are_upstream_errors() -> None:
    async def silent(r: asyncio.StreamReader, w: asyncio.StreamWriter, n: int, h: bytes) -> bool:
        await r.read()  # until the client gives up and closes
        return False

    async with (
        loopback(silent) as (origin, _),
        contextlib.aclosing(UpstreamPool(origin, read_timeout=0.2)) as pool,
    ):
        with pytest.raises(UpstreamError, match="read timeout"):
            await pool.fetch(pool.target("/completions"), b"{}")

    async def cut(_: asyncio.StreamReader, w: asyncio.StreamWriter, n: int, h: bytes) -> bool:
        w.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\ndata: {}\n\n")
        await w.drain()
        return False  # closes with 90 bytes missing

    async with loopback(cut) as (origin, _), contextlib.aclosing(UpstreamPool(origin)) as pool:
        async with pool.stream(pool.target("/completions"), b"{}") as response:
            assert response.status == 200
            pieces: list[bytes] = []

            async def read_all() -> None:
                async for piece in response:
                    pieces.append(piece)

            with pytest.raises(UpstreamError):
                await read_all()
        assert b"".join(pieces) == b"data: {}\n\n"
