"""The gateway's upstream client against small loopback servers: reuse, retry, framing, errors;
and what the gateway makes of answers a real server would not send."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import httpx
import pytest

from agentcore_rl.gateway import RolloutGateway
from agentcore_rl.gateway.upstream import UpstreamError, UpstreamPool

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[bool]]


async def _read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length")
    )
    return await reader.readexactly(length)


@asynccontextmanager
async def _server(handler: Handler) -> AsyncIterator[tuple[str, list[int]]]:
    """A loopback server; ``handler(reader, writer, connection no.)`` answers one request
    and says whether to keep the connection. Yields (base URL, requests per connection)."""
    counts: list[int] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        number = len(counts)
        counts.append(0)
        try:
            for _ in range(100):  # bounded: at most 100 requests per connection
                try:
                    await _read_request(reader)
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                counts[number] += 1
                if not await handler(reader, writer, number):
                    return
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}/v1", counts
    finally:
        server.close()
        await server.wait_closed()


def _answer(body: bytes, extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n%s\r\n%s" % (len(body), extra, body)


async def test_connections_are_reused_and_bodies_come_whole_or_in_pieces() -> None:
    async def handler(_: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> bool:
        chunks = [b'data: {"a":1}\n\n', b"data: [DONE]\n\n"]
        head = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
        writer.write(head + b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks) + b"0\r\n\r\n")
        return True

    async with _server(handler) as (url, counts):
        pool = UpstreamPool(url)
        target = pool.target("/chat/completions")
        for _ in range(3):
            assert await pool.fetch(target, b"{}") == (200, b'data: {"a":1}\n\ndata: [DONE]\n\n')
        async with pool.stream(target, b"{}") as response:
            assert response.status == 200
            assert await response.read() == b'data: {"a":1}\n\ndata: [DONE]\n\n'
        pool.close()
    assert counts == [4]  # one connection, kept alive


async def test_a_kept_alive_connection_closed_by_the_server_is_retried_once() -> None:
    async def handler(_: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> bool:
        writer.write(_answer(b"ok"))
        await writer.drain()
        return False  # closes after each answer without saying so

    async with _server(handler) as (url, counts):
        pool = UpstreamPool(url)
        target = pool.target("/models", "GET")
        assert await pool.fetch(target, None) == (200, b"ok")
        await asyncio.sleep(0)  # let the close arrive (or not: the retry covers both)
        assert await pool.fetch(target, None) == (200, b"ok")
        pool.close()
    assert counts == [1, 1]


async def test_bodies_ended_by_the_connection_and_cut_short_bodies() -> None:
    async def handler(_: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> bool:
        if n == 0:
            writer.write(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nuntil the end")
        else:
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nshort")
        return False

    async with _server(handler) as (url, _):
        pool = UpstreamPool(url)
        target = pool.target("/completions")
        assert await pool.fetch(target, b"{}") == (200, b"until the end")
        with pytest.raises(UpstreamError, match="closed the connection"):
            await pool.fetch(target, b"{}")
        pool.close()


async def test_silence_invalid_http_and_a_refused_connection_are_upstream_errors() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> bool:
        if n == 0:
            await reader.read(1)  # silent until the client gives up (after 0.2 s)
            return False
        writer.write(b"NOT HTTP\r\n\r\n")
        return False

    async with _server(handler) as (url, _):
        pool = UpstreamPool(url, read_timeout=0.2)
        target = pool.target("/chat/completions")
        with pytest.raises(UpstreamError, match=r"no answer for 0\.2 s"):
            await pool.fetch(target, b"{}")
        with pytest.raises(UpstreamError, match="invalid HTTP"):
            await pool.fetch(target, b"{}")
        pool.close()
        with pytest.raises(UpstreamError, match="shutting down"):
            await pool.fetch(target, b"{}")
    pool = UpstreamPool(url)
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

    async def handler(_: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> bool:
        writer.write(_answer(json.dumps(answers[sum(counts) - 1]).encode()))
        return True

    async with _server(handler) as (url, counts):
        gateway = RolloutGateway(url)
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
