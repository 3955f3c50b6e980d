"""One HTTP/1.1 client connection: an asyncio protocol fed to httptools' C parser, one
exchange at a time, and the streamed view of its answer.

The answer's status and raw headers are kept; its body is handed over whole (the waiter
wakes once, at the end) or as it arrives (it wakes at the head, then per piece; reading
pauses while more than ``HIGH_WATER`` bytes wait for a slow consumer). Failures are
recorded on the connection (``error``), never set on the waiter, so a waiter nobody awaits
any more leaves no "exception never retrieved" behind. The pool
(:mod:`agentcore_rl._http1.pool`) owns timing: ``last_read`` is what its read-timeout
sweep looks at.

Example::

    waiter = conn.start(b"GET / HTTP/1.1\\r\\nHost: h\\r\\n\\r\\n", streaming=False)
    await waiter
    status, headers, body = conn.status, conn.headers, conn.take()
"""

from __future__ import annotations

import asyncio
from typing import Any, Final, cast

from agentcore_rl._http1.errors import HttpClosedError, HttpError

__all__ = ["HIGH_WATER", "Connection", "Response"]

#: How far (bytes) a stream's reader may run ahead of its consumer before reading pauses.
HIGH_WATER: Final = 2**15
_FRAMING: Final = (b"content-length", b"transfer-encoding")


class Connection(asyncio.Protocol):
    """One keep-alive connection and the exchange running on it (at most one)."""

    __slots__ = (
        "_buffered",
        "chunks",
        "closed",
        "complete",
        "dropped",
        "error",
        "got_bytes",
        "headers",
        "idle_since",
        "keep_alive",
        "last_read",
        "loop",
        "parser",
        "paused",
        "reused",
        "status",
        "streaming",
        "transport",
        "waiter",
    )

    def __init__(self, loop: asyncio.AbstractEventLoop, parser: type[Any]) -> None:
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.parser = parser(self)  # httptools.HttpResponseParser (imported by the pool)
        self.waiter: asyncio.Future[None] | None = None
        self.streaming = False
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.chunks: list[bytes] = []
        self.complete = False
        self.error: HttpError | None = None
        self.keep_alive = False
        self.closed = False
        self.dropped = False  # the server closed it mid-exchange (not a timeout or bad HTTP)
        self.got_bytes = False
        self.reused = False
        self.paused = False
        self.last_read = 0.0
        self.idle_since = 0.0
        self._buffered = 0

    # ---------------------------------------------------------------- the exchange
    def start(self, request: bytes, streaming: bool) -> asyncio.Future[None]:
        """Send ``request`` (one write); -> a future done at the answer's head (streaming)
        or at its end, or at the failure (then ``error`` is set)."""
        self.streaming = streaming
        self.status = 0
        self.headers = []
        self.complete = False
        self.keep_alive = False
        self.got_bytes = False
        self.waiter = waiter = self.loop.create_future()
        self.last_read = self.loop.time()
        assert self.transport is not None
        self.transport.write(request)
        return waiter

    def take(self) -> bytes:
        """Everything of the body that arrived and was not taken yet."""
        chunks = self.chunks
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        self.chunks = []
        self._buffered = 0
        if self.paused and self.transport is not None:
            self.paused = False
            self.last_read = self.loop.time()
            self.transport.resume_reading()
        return data

    async def next_piece(self) -> bytes:
        """The next piece of a streamed body (b"" at its end); raises the exchange's error."""
        while not self.chunks:
            if self.error is not None:
                raise self.error
            if self.complete:
                return b""
            self.waiter = self.loop.create_future()
            await self.waiter
        return self.take()

    def fail(self, error: HttpError) -> None:
        """End the exchange with ``error`` (the first failure wins; a complete one stays)."""
        if self.error is None and not self.complete:
            self.error = error
        self._wake()

    def _wake(self) -> None:
        waiter = self.waiter
        if waiter is not None:
            self.waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def abort(self) -> None:
        """Drop the connection (its exchange cannot go on, or the pool is done with it)."""
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    def reusable(self) -> bool:
        """Whether the exchange ended cleanly and the server keeps the connection open."""
        return (
            self.complete
            and self.error is None
            and self.keep_alive
            and not self.closed
            and not self.chunks
            and self.transport is not None
            and not self.transport.is_closing()
        )

    # ---------------------------------------------------------------- asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # Not an isinstance check: uvloop's transports do not subclass asyncio's (Ray's
        # async actors run on uvloop).
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.got_bytes = True
        self.last_read = self.loop.time()
        try:
            self.parser.feed_data(data)
        except Exception as exc:  # httptools.HttpParserError: not HTTP
            self.fail(HttpClosedError(f"the server sent invalid HTTP: {exc}"))
            self.abort()

    def eof_received(self) -> bool | None:
        return None  # close the transport; connection_lost settles the exchange

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.status and not self.complete and self.error is None and not self._framed():
            self.on_message_complete()  # a body delimited by the connection's end
            return
        self.dropped = self.error is None and not self.complete  # the drop is the failure
        reason = f": {exc}" if exc else ""
        self.fail(HttpClosedError(f"the server closed the connection{reason}"))

    def _framed(self) -> bool:
        return any(name.lower() in _FRAMING for name, _ in self.headers)

    # ---------------------------------------------------------------- httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        self.keep_alive = self.parser.should_keep_alive()  # llhttp resets it by the end
        if self.streaming:
            self._wake()

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)
        if self.streaming:
            self._buffered += len(body)
            if self._buffered > HIGH_WATER and not self.paused and self.transport is not None:
                self.paused = True
                self.transport.pause_reading()
            self._wake()

    def on_message_complete(self) -> None:
        self.complete = True
        self._wake()


class Response:
    """A streamed answer: its status and raw headers, then its body piece by piece
    (``async for``).

    Example::

        async with pool.stream(request) as response:
            pieces = [piece async for piece in response] if response.status == 200 else []
    """

    __slots__ = ("_conn", "headers", "status")

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self.status = conn.status
        self.headers = conn.headers

    def __aiter__(self) -> Response:
        return self

    async def __anext__(self) -> bytes:
        piece = await self._conn.next_piece()
        if not piece:
            raise StopAsyncIteration
        return piece

    async def read(self) -> bytes:
        """The rest of the body, whole."""
        return b"".join([piece async for piece in self])
