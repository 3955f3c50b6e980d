"""The gateway's HTTP/1.1 client for its inference servers: keep-alive connections, no frills.

Every model call crosses this client, so it does only what a proxy to an OpenAI server needs:
one write per request (head and body, the head prebuilt per endpoint), httptools (the C
parser uvicorn uses) for the answer, the answer's body handed over whole (one wake-up) or as
it arrives (streaming, with reading paused while the agent lags), and idle connections reused
in last-in-first-out order. No cookies, redirects, proxies, compression or per-request
tracing: measured on loopback, aiohttp's per-request machinery cost about 0.6 ms of CPU per
call, twice this client's whole hop.

Errors are one type, :class:`UpstreamError` (refused, reset, cut short, silent past the
read timeout, unparsable), so the gateway can turn each into a 502 naming its upstream.

Example::

    pool = UpstreamPool("http://127.0.0.1:8000/v1")
    status, body = await pool.fetch(pool.target("/chat/completions"), b'{"messages": []}')
    async with pool.stream(pool.target("/chat/completions"), body) as response:
        async for piece in response:
            ...
    pool.close()
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import ssl
import time
from collections.abc import AsyncIterator
from typing import Final, cast
from urllib.parse import urlsplit

import anyio
import httptools

__all__ = ["UpstreamError", "UpstreamPool", "UpstreamResponse"]

#: How far (bytes) a stream's reader may run ahead of its consumer before reading pauses.
_HIGH_WATER: Final = 2**15


class UpstreamError(Exception):
    """The upstream could not be reached, broke off, went silent or spoke no HTTP."""


class _Connection(asyncio.Protocol):
    """One keep-alive connection and the exchange running on it (at most one)."""

    __slots__ = (
        "_buffered",
        "_chunks",
        "_deadline",
        "_framed",
        "_keep_alive",
        "_paused",
        "_timer",
        "complete",
        "dropped",
        "error",
        "idle_since",
        "loop",
        "parser",
        "pool",
        "reused",
        "status",
        "streaming",
        "transport",
        "waiter",
    )

    def __init__(self, pool: UpstreamPool, loop: asyncio.AbstractEventLoop) -> None:
        self.pool = pool
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.waiter: asyncio.Future[None] | None = None
        self.streaming = False
        self.status = 0
        self.complete = False
        self.error: UpstreamError | None = None
        self.reused = False
        self.dropped = False  # the server closed it (not a timeout or a parse error)
        self.idle_since = 0.0
        self._chunks: collections.deque[bytes] = collections.deque()
        self._buffered = 0
        self._paused = False
        self._framed = False
        self._keep_alive = False
        self._deadline = 0.0
        self._timer: asyncio.TimerHandle | None = None

    # ---------------------------------------------------------------- exchange
    def start(self, request: bytes, streaming: bool) -> asyncio.Future[None]:
        """Send ``request``; -> a future done at the head (streaming) or the whole answer."""
        self.streaming = streaming
        self.status = 0
        self.complete = False
        self._framed = False
        self._keep_alive = False
        self.waiter = waiter = self.loop.create_future()
        self._deadline = self.loop.time() + self.pool.read_timeout
        if self._timer is None:
            self._timer = self.loop.call_at(self._deadline, self._check_silence)
        assert self.transport is not None
        self.transport.write(request)
        return waiter

    def take(self) -> bytes:
        """Everything of the body that arrived and was not taken yet."""
        chunks = self._chunks
        if len(chunks) == 1:
            data = chunks.popleft()
        else:
            data = b"".join(chunks)
            chunks.clear()
        self._buffered = 0
        if self._paused and self.transport is not None:
            self._paused = False
            self._deadline = self.loop.time() + self.pool.read_timeout
            self.transport.resume_reading()
        return data

    async def next_piece(self) -> bytes:
        """The next piece of a streamed body (b"" at its end); raises :class:`UpstreamError`."""
        while not self._chunks:
            if self.error is not None:
                raise self.error
            if self.complete:
                return b""
            self.waiter = self.loop.create_future()
            await self.waiter
        data = self.take()
        return data

    def _wake(self) -> None:
        waiter = self.waiter
        if waiter is not None:
            self.waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def _fail(self, error: UpstreamError) -> None:
        if self.error is None and not self.complete:
            self.error = error
        self._wake()

    def _check_silence(self) -> None:
        # One timer per connection, re-armed lazily: data moves the deadline, not the timer.
        self._timer = None
        if self.complete or self.error is not None or self.transport is None:
            return  # no exchange is running (the next one arms the timer again)
        now = self.loop.time()
        if self._paused:  # the agent lags, not the upstream
            self._deadline = now + self.pool.read_timeout
        if now < self._deadline:
            self._timer = self.loop.call_at(self._deadline, self._check_silence)
            return
        self._fail(UpstreamError(f"no answer for {self.pool.read_timeout:g} s"))
        self.abort()

    # ---------------------------------------------------------------- asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self._deadline = self.loop.time() + self.pool.read_timeout
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(UpstreamError(f"the upstream sent invalid HTTP: {exc}"))
            self.abort()

    def eof_received(self) -> bool | None:
        return None  # close the transport; connection_lost settles the exchange

    def connection_lost(self, exc: Exception | None) -> None:
        self.pool.forget(self)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.status and not self.complete and not self._framed and self.error is None:
            self.on_message_complete()  # a body delimited by the connection's end
            return
        reason = f": {exc}" if exc else ""
        self.dropped = self.error is None and not self.complete  # the drop is the failure
        self._fail(UpstreamError(f"the upstream closed the connection{reason}"))
        self.transport = None

    # ---------------------------------------------------------------- httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        if len(name) in (14, 17) and name.lower() in (b"content-length", b"transfer-encoding"):
            self._framed = True

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        self._keep_alive = self.parser.should_keep_alive()  # llhttp resets it by the end
        if self.streaming:
            self._wake()

    def on_body(self, body: bytes) -> None:
        self._chunks.append(body)
        if self.streaming:
            self._buffered += len(body)
            if self._buffered > _HIGH_WATER and not self._paused and self.transport is not None:
                self._paused = True
                self.transport.pause_reading()
            self._wake()

    def on_message_complete(self) -> None:
        self.complete = True
        self._wake()

    # ---------------------------------------------------------------- ending
    def abort(self) -> None:
        """Drop the connection (its exchange cannot go on)."""
        if self.transport is not None:
            self.transport.abort()

    def reusable(self) -> bool:
        """Whether the exchange ended cleanly and the server keeps the connection open."""
        return (
            self.complete
            and self.error is None
            and not self._chunks
            and self.transport is not None
            and not self.transport.is_closing()
            and self._keep_alive
        )


class UpstreamResponse:
    """A streamed answer: its status, then its body piece by piece (``async for``).

    Example::

        async with pool.stream(target, body) as response:
            pieces = [piece async for piece in response] if response.status == 200 else []
    """

    __slots__ = ("_conn", "status")

    def __init__(self, conn: _Connection) -> None:
        self._conn = conn
        self.status = conn.status

    def __aiter__(self) -> UpstreamResponse:
        return self

    async def __anext__(self) -> bytes:
        piece = await self._conn.next_piece()
        if not piece:
            raise StopAsyncIteration
        return piece

    async def read(self) -> bytes:
        """The rest of the body, whole."""
        parts = []
        async for piece in self:
            parts.append(piece)
        return b"".join(parts)


class UpstreamPool:
    """Keep-alive connections to one upstream (``http(s)://host:port/base``).

    ``max_connections`` bounds the open connections (callers beyond it wait); a connection
    idle for ``idle_timeout`` s is not reused (closed before a server's keep-alive of 5 s
    closes it under a request); ``read_timeout``: silence (no byte) that fails a call.

    Example::

        pool = UpstreamPool("http://vllm:8000/v1", headers={"authorization": "Bearer k"})
        status, body = await pool.fetch(pool.target("/models", "GET"), None)
    """

    def __init__(
        self,
        base_url: str,
        *,
        headers: dict[str, str] | None = None,
        max_connections: int = 1024,
        connect_timeout: float = 10.0,
        read_timeout: float = 600.0,
        idle_timeout: float = 4.0,
    ) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"upstream must be an http(s) URL, got {base_url!r}")
        self.base = base_url
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self._ssl = ssl.create_default_context() if parts.scheme == "https" else None
        self._path = parts.path.rstrip("/")
        host = self.host if ":" not in self.host else f"[{self.host}]"
        default_port = self.port == (443 if self._ssl else 80)
        lines = [f"host: {host if default_port else f'{host}:{self.port}'}"]
        lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
        self._head = ("\r\n".join(lines) + "\r\n").encode("latin-1")
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.idle_timeout = idle_timeout
        self._idle: list[_Connection] = []
        self._slots = asyncio.Semaphore(max_connections)
        self._closed = False

    def __repr__(self) -> str:
        return f"UpstreamPool({self.base!r})"

    def target(self, path: str, method: str = "POST") -> bytes:
        """The request line and fixed headers for ``path`` under the base (built once)."""
        line = f"{method} {self._path}{path} HTTP/1.1\r\n".encode("latin-1")
        return line + self._head

    async def fetch(self, target: bytes, body: bytes | None) -> tuple[int, bytes]:
        """One whole exchange: -> (status, body). ``target`` from :meth:`target`."""
        conn = await self._send(target, body, streaming=False)
        try:
            while not conn.complete:
                if conn.error is not None:
                    raise conn.error
                conn.waiter = conn.loop.create_future()
                await conn.waiter
            return conn.status, conn.take()
        finally:
            self._release(conn)

    @contextlib.asynccontextmanager
    async def stream(self, target: bytes, body: bytes | None) -> AsyncIterator[UpstreamResponse]:
        """An exchange whose body is read as it arrives (the connection is released after)."""
        conn = await self._send(target, body, streaming=True)
        try:
            yield UpstreamResponse(conn)
        finally:
            self._release(conn)

    def close(self) -> None:
        """Close the idle connections; connections in use close when released."""
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.abort()

    # ---------------------------------------------------------------- internals
    def forget(self, conn: _Connection) -> None:
        """``conn`` is gone: never hand it out again."""
        with contextlib.suppress(ValueError):
            self._idle.remove(conn)

    async def _send(self, target: bytes, body: bytes | None, *, streaming: bool) -> _Connection:
        if self._closed:
            raise UpstreamError("the gateway is shutting down")
        data = body or b""
        request = b"%scontent-length: %d\r\n\r\n%s" % (target, len(data), data)
        await self._slots.acquire()
        try:
            for attempt in (0, 1):
                conn = await self._acquire(fresh=attempt == 1)
                waiter = conn.start(request, streaming)
                try:
                    await waiter
                except asyncio.CancelledError:
                    conn.abort()
                    raise
                if conn.error is None or conn.status or not conn.dropped or not conn.reused:
                    break
                # A kept-alive connection the server closed just as it was reused: once more,
                # on a new connection (the server answered nothing on the old one).
                conn.abort()
                self._release_slotless(conn)
            if conn.error is not None and not conn.status:
                error = conn.error
                self._release_slotless(conn)
                raise error
        except BaseException:
            self._slots.release()
            raise
        return conn

    async def _acquire(self, *, fresh: bool = False) -> _Connection:
        loop = asyncio.get_running_loop()
        idle = [] if fresh else self._idle
        now = time.monotonic()
        while idle:
            conn = idle.pop()
            transport = conn.transport
            if transport is not None and not transport.is_closing():
                if now - conn.idle_since < self.idle_timeout:
                    conn.reused = True
                    return conn
                transport.close()  # idle too long: the server may be closing it right now
        try:
            with anyio.fail_after(self.connect_timeout):
                _, conn = await loop.create_connection(
                    lambda: _Connection(self, loop),
                    self.host,
                    self.port,
                    ssl=self._ssl,
                    server_hostname=self.host if self._ssl else None,
                )
        except TimeoutError:
            raise UpstreamError(
                f"no connection to {self.host}:{self.port} within {self.connect_timeout:g} s"
            ) from None
        except OSError as exc:
            raise UpstreamError(f"cannot connect to {self.host}:{self.port}: {exc}") from None
        return conn

    def _release(self, conn: _Connection) -> None:
        self._release_slotless(conn)
        self._slots.release()

    def _release_slotless(self, conn: _Connection) -> None:
        if conn.reusable() and not self._closed:
            conn.waiter = None
            conn.idle_since = time.monotonic()
            self._idle.append(conn)
        else:
            conn.abort()
