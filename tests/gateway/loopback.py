"""A raw HTTP/1.1 server on loopback for the upstream client's tests: a handler answers each
request as it likes (or not at all), so tests can send what no well-behaved server sends."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

#: ``handler(reader, writer, connection no., request head)`` answers one request and says
#: whether to keep the connection.
Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int, bytes], Awaitable[bool]]


async def _read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length"):
            await reader.readexactly(int(line.split(b":")[1]))
    return head


@asynccontextmanager
async def loopback(handler: Handler) -> AsyncIterator[tuple[str, list[int]]]:
    """Serve on a free loopback port; yields (origin, requests served per connection)."""
    counts: list[int] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        number = len(counts)
        counts.append(0)
        try:
            for _ in range(100):  # bounded: at most 100 requests per connection
                try:
                    head = await _read_request(reader)
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                counts[number] += 1
                if not await handler(reader, writer, number, head):
                    return
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", counts
    finally:
        server.close()
        await server.wait_closed()


def answer(body: bytes, extra: bytes = b"") -> bytes:
    """A 200 answer with ``body`` and a content-length (``extra``: more header lines)."""
    return b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n%s\r\n%s" % (len(body), extra, body)


async def echo_target(
    _: asyncio.StreamReader, w: asyncio.StreamWriter, n: int, head: bytes
) -> bool:
    """Answers each request with its target as the body, keeps the connection."""
    w.write(answer(head.split(b" ", 2)[1], b"x-seen: yes\r\n"))
    return True
