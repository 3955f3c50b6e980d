"""A small HTTP/1.1 client for the lean path: asyncio protocols, httptools' parser, a
keep-alive pool per origin.

The lean requests are few and fixed in shape (a signed POST or GET, a small body back), and
at the client's rates the general-purpose client's per-request machinery (request and
response objects, header multidicts, URL objects, timers, traces, the connector's
bookkeeping) was the largest CPU cost left per request. Here a request is one ``write`` of
a pre-built head and body, and a response is whatever the parser hands back.

Settings come from the generic client's aiohttp session (pool size, connect and read
timeouts, TLS context, keep-alive time); failures raise what aiobotocore raises for the
same aiohttp failure (see :func:`agentcore_rl.aws.http.transport_error`). A connection that
was idle in the pool and closes before any answer byte (the server's keep-alive timer
fired as the request went out) is retried once on a new connection, as the request never
reached the server's application.

Example::

    pool = WirePool("http://127.0.0.1:9000", limit=64, connect_timeout=10, read_timeout=60)
    status, headers, body = await pool.request("GET", "/bucket/key", [("X-Amz-Date", d)], b"")
    pool.close()
"""

from __future__ import annotations

import asyncio
import collections
import ssl as ssl_module
from typing import TYPE_CHECKING, Any, Final, cast

from agentcore_rl.errors import ConfigurationError

if TYPE_CHECKING:
    import httptools

__all__ = ["WireClosedError", "WirePool", "WireTimeoutError"]

#: How long an idle connection is kept (aiobotocore's default keep-alive time).
DEFAULT_KEEPALIVE: Final = 12.0
# asyncio.timeout (Python 3.11+); older Pythons use wait_for.
_timeout: Any = getattr(asyncio, "timeout", None)
#: Seconds between two checks of the requests in flight for the read timeout.
SWEEP_INTERVAL: Final = 1.0


class WireClosedError(ConnectionError):
    """The connection closed before the whole answer arrived."""


class WireTimeoutError(TimeoutError):
    """No answer byte for ``read_timeout`` seconds (``connect`` says whether it was the
    connection that did not open)."""

    def __init__(self, message: str, *, connect: bool = False) -> None:
        super().__init__(message)
        self.connect = connect


class _Connection(asyncio.Protocol):
    """One HTTP/1.1 connection: one request at a time, the answer parsed as it arrives."""

    __slots__ = (
        "body",
        "closed",
        "got_bytes",
        "headers",
        "idle_since",
        "keep_alive",
        "last_read",
        "loop",
        "parser",
        "status",
        "transport",
        "waiter",
    )

    def __init__(self, loop: asyncio.AbstractEventLoop, parser: type[Any]) -> None:
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.parser: httptools.HttpResponseParser = parser(self)
        self.waiter: asyncio.Future[None] | None = None
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.body: list[bytes] = []
        self.keep_alive = True
        self.closed = False
        self.got_bytes = False
        self.last_read = 0.0
        self.idle_since = 0.0

    # --- asyncio.Protocol ------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # Not an isinstance check: uvloop's transports do not subclass asyncio's.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.got_bytes = True
        self.last_read = self.loop.time()
        try:
            self.parser.feed_data(data)
        except Exception as exc:  # httptools.HttpParserError: a malformed answer
            self._fail(WireClosedError(f"bad HTTP answer: {exc}"))
            self.close()

    def eof_received(self) -> bool:
        return False  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.waiter is not None and not self.waiter.done():
            if self.status and not self.parser.should_keep_alive() and not self._has_length():
                # An answer delimited by the end of the connection (HTTP/1.0 style).
                self._complete()
                return
            self._fail(WireClosedError(f"connection closed: {exc or 'by the server'}"))

    # --- httptools callbacks -------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        self.keep_alive = self.parser.should_keep_alive()
        self._complete()

    # --- the request -----------------------------------------------------------------

    def _has_length(self) -> bool:
        return any(
            name.lower() in (b"content-length", b"transfer-encoding") for name, _ in self.headers
        )

    def _complete(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _fail(self, exc: BaseException) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)

    def start(self, data: bytes) -> asyncio.Future[None]:
        self.status = 0
        self.headers = []
        self.body = []
        self.got_bytes = False
        self.waiter = waiter = self.loop.create_future()
        assert self.transport is not None
        self.transport.write(data)
        self.last_read = self.loop.time()
        return waiter

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class WirePool:
    """Keep-alive connections to one origin (``scheme://host[:port]``), at most ``limit``
    open at once; requests beyond wait for a free connection.

    ``ssl_context`` is used for ``https`` (``None``: the default verified context;
    ``False``: no verification, as botocore's ``verify=False``). ``host_header`` is the
    ``Host`` value that was signed.

    Example::

        pool = WirePool("https://s3.us-west-2.amazonaws.com", limit=64)
        status, headers, body = await pool.request("GET", "/b/k", headers, b"")
    """

    def __init__(
        self,
        origin: str,
        *,
        limit: int = 64,
        connect_timeout: float | None = None,
        read_timeout: float | None = None,
        keepalive: float = DEFAULT_KEEPALIVE,
        ssl_context: ssl_module.SSLContext | bool | None = None,
        host_header: str | None = None,
        sweep_interval: float = SWEEP_INTERVAL,
    ) -> None:
        # The `client` extra's parser; without it the lean path stays on aiohttp.
        from httptools import HttpResponseParser

        self._parser = HttpResponseParser
        scheme, _, rest = origin.partition("://")
        if scheme not in ("http", "https") or not rest or "/" in rest:
            raise ConfigurationError(f"WirePool needs scheme://host[:port], got {origin!r}")
        host, port = _split_host(rest, 443 if scheme == "https" else 80)
        self.origin = origin
        self.host = host
        self.port = port
        self.limit = max(1, limit)
        self.connect_timeout = connect_timeout or None
        self.read_timeout = read_timeout or None
        self.keepalive = keepalive
        self.sweep_interval = sweep_interval
        self._ssl: ssl_module.SSLContext | None = None
        if scheme == "https":
            self._ssl = _ssl_context(ssl_context)
        self._host_line = f"Host: {host_header or rest}\r\n"
        self._idle: list[_Connection] = []
        self._open = 0
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._closed = False
        # Requests in flight, checked for the read timeout once per sweep_interval (a timer
        # per request would cost more than the request's own work).
        self._busy: set[_Connection] = set()
        self._sweeper: asyncio.TimerHandle | None = None

    def __repr__(self) -> str:
        return f"WirePool({self.origin!r}, open={self._open}, idle={len(self._idle)})"

    async def request(
        self, method: str, target: str, headers: list[tuple[str, str]], body: bytes
    ) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        """Send one request (``target``: path and query, already encoded); return the
        status, the raw headers and the whole body.

        Example::

            status, headers, body = await pool.request("POST", "/x", [("A", "b")], b"{}")
        """
        parts = [method, " ", target, " HTTP/1.1\r\n", self._host_line]
        for name, value in headers:
            parts += (name, ": ", value, "\r\n")
        if body or method != "GET":
            parts += ("Content-Length: ", str(len(body)), "\r\n")
        parts.append("\r\n")
        data = "".join(parts).encode("latin-1")
        if body:
            data += body
        conn, reused = await self._acquire()
        self._busy.add(conn)
        if self._sweeper is None and self.read_timeout is not None:
            self._sweeper = conn.loop.call_later(self.sweep_interval, self._sweep)
        try:
            await conn.start(data)
        except WireClosedError:
            self._drop(conn)
            if not reused or conn.got_bytes:
                raise
            # The server closed an idle connection as the request went out: it never saw it.
            conn, _ = await self._connect_slot()
            self._busy.add(conn)
            try:
                await conn.start(data)
            except BaseException:
                self._drop(conn)
                raise
        except BaseException:
            self._drop(conn)
            raise
        status, raw, chunks = conn.status, conn.headers, conn.body
        conn.waiter = None
        self._release(conn)
        return status, raw, chunks[0] if len(chunks) == 1 else b"".join(chunks)

    async def _acquire(self) -> tuple[_Connection, bool]:
        if self._closed:
            raise WireClosedError(f"the connection pool to {self.origin} is closed")
        idle = self._idle
        if idle:
            now = asyncio.get_running_loop().time()
            while idle:
                conn = idle.pop()
                if conn.closed:
                    self._open -= 1
                elif now - conn.idle_since > self.keepalive:
                    conn.close()
                    self._open -= 1
                else:
                    return conn, True
        while self._open >= self.limit:
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except BaseException:
                if waiter.done() and not waiter.cancelled():
                    self._wake()  # pass the turn on
                raise
            if idle:
                conn = idle.pop()
                if not conn.closed:
                    return conn, True
                self._open -= 1
        return await self._connect_slot()

    async def _connect_slot(self) -> tuple[_Connection, bool]:
        self._open += 1
        try:
            return await self._connect(), False
        except BaseException:
            self._open -= 1
            self._wake()
            raise

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        opening = loop.create_connection(
            lambda: _Connection(loop, self._parser),
            self.host,
            self.port,
            ssl=self._ssl,
            server_hostname=self.host if self._ssl is not None else None,
        )
        try:
            if self.connect_timeout is None:
                _, conn = await opening
            elif _timeout is not None:  # Python 3.11+: a timer, not a task or a cancel scope
                async with _timeout(self.connect_timeout):
                    _, conn = await opening
            else:
                _, conn = await asyncio.wait_for(opening, self.connect_timeout)
        except (TimeoutError, asyncio.TimeoutError) as exc:
            raise WireTimeoutError(
                f"connecting to {self.origin} took over {self.connect_timeout} s", connect=True
            ) from exc
        return conn

    def _sweep(self) -> None:
        """Fail the requests that got no answer byte for ``read_timeout`` seconds
        (aiohttp's ``sock_read``: the time between reads, not the whole answer's)."""
        self._sweeper = None
        timeout = self.read_timeout
        if not self._busy or timeout is None:
            return
        loop = asyncio.get_running_loop()
        now = loop.time()
        for conn in [c for c in self._busy if now - c.last_read >= timeout]:
            conn._fail(WireTimeoutError(f"no answer from {self.origin} for {timeout} s"))
            conn.close()
        self._sweeper = loop.call_later(self.sweep_interval, self._sweep)

    def _release(self, conn: _Connection) -> None:
        self._busy.discard(conn)
        if conn.closed or not conn.keep_alive or self._closed:
            self._drop(conn)
            return
        conn.idle_since = conn.last_read
        self._idle.append(conn)
        self._wake()

    def _drop(self, conn: _Connection) -> None:
        """Close a connection taken from the pool and free its slot."""
        self._busy.discard(conn)
        conn.close()
        self._open -= 1
        self._wake()

    def _wake(self) -> None:
        waiters = self._waiters
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def close(self) -> None:
        """Close every idle connection; a connection in use closes when its request ends.
        Idempotent.

        Example::

            pool.close()
        """
        self._closed = True
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
        self._open -= len(idle)


def _split_host(rest: str, default_port: int) -> tuple[str, int]:
    if rest.startswith("["):  # [IPv6]:port
        end = rest.index("]")
        host, tail = rest[1:end], rest[end + 1 :]
        return host, int(tail[1:]) if tail.startswith(":") else default_port
    host, sep, port = rest.rpartition(":")
    if sep and port.isdigit():
        return host, int(port)
    return rest, default_port


def _ssl_context(setting: ssl_module.SSLContext | bool | None) -> ssl_module.SSLContext:
    if isinstance(setting, ssl_module.SSLContext):
        return setting
    context = ssl_module.create_default_context()
    if setting is False:
        context.check_hostname = False
        context.verify_mode = ssl_module.CERT_NONE
    return context


def pool_settings(http_session: Any, ssl_context: Any = None) -> dict[str, Any]:
    """A :class:`WirePool`'s settings from aiobotocore's HTTP session (``AIOHTTPSession``):
    pool size, connect and read timeouts, keep-alive time; ``ssl_context`` is the TLS
    context of its aiohttp connector (for ``https`` origins).

    Example::

        pool = WirePool(origin, **pool_settings(client._endpoint.http_session))
    """
    timeout = http_session._timeout
    connector_args = getattr(http_session, "_connector_args", None) or {}
    keepalive = connector_args.get("keepalive_timeout")
    if not isinstance(ssl_context, ssl_module.SSLContext | bool):
        ssl_context = None
    return {
        "limit": http_session._max_pool_connections or 1024,
        "connect_timeout": timeout.sock_connect or timeout.connect,
        "read_timeout": timeout.sock_read,
        "keepalive": keepalive if isinstance(keepalive, int | float) else DEFAULT_KEEPALIVE,
        "ssl_context": ssl_context,
    }
