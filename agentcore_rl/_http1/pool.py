"""A keep-alive pool of HTTP/1.1 connections to one origin: the client the lean AWS path
(:mod:`agentcore_rl.aws.wire`) and the gateway's upstream calls
(:mod:`agentcore_rl.gateway.upstream`) share.

Both send few, fixed-shape requests at high rates, where a general-purpose client's
per-request machinery (request and response objects, header multidicts, URL objects,
timers, traces) was the largest CPU cost left. So a request is bytes the caller built (one
``write``), an answer is what the parser hands back, no request starts a task or a timer:
it runs in its caller's task, and the read timeout is one loop timer per pool that sweeps
the exchanges in flight (``sweep_interval``) while there are any. Idle connections are
reused last-in-first-out, not after ``keepalive`` seconds (the server may be closing them);
a kept connection that the server closed before any answer byte (its keep-alive timer
fired as the request went out) is replaced and the request sent once more: the server
never saw it. Everything else that fails raises an :class:`~.errors.HttpError`.

Example::

    pool = Pool("http://127.0.0.1:8000", limit=64, read_timeout=60)
    status, headers, body = await pool.send(b"GET /v1/models HTTP/1.1\\r\\nHost: h\\r\\n\\r\\n")
    pool.close()
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import ssl as ssl_module
from collections.abc import AsyncIterator
from typing import Any, Final

from agentcore_rl._http1.connection import Connection, Response
from agentcore_rl._http1.errors import HttpClosedError, HttpConnectError, HttpTimeoutError

__all__ = ["DEFAULT_KEEPALIVE", "Pool"]

#: How long an idle connection is reused (aiobotocore's default keep-alive time).
DEFAULT_KEEPALIVE: Final = 12.0
#: Seconds between two checks of the exchanges in flight for the read timeout (at most).
SWEEP_INTERVAL: Final = 1.0
# asyncio.timeout (Python 3.11+: a timer, not a task); older Pythons use wait_for.
_timeout: Any = getattr(asyncio, "timeout", None)


class Pool:
    """Keep-alive connections to ``origin`` (``http(s)://host[:port]``), at most ``limit``
    exchanges at once (callers beyond wait).

    ``ssl_context`` for ``https``: ``None`` the default verified context, ``False`` no
    verification. ``host_header``: the ``Host`` value callers put in their requests
    (:attr:`host_header`; default the origin's ``host[:port]``). Timeouts in seconds,
    ``None``: none. Needs httptools (the ``client`` and ``gateway`` extras).

    Example::

        pool = Pool("https://s3.us-west-2.amazonaws.com", limit=64, connect_timeout=10)
        status, headers, body = await pool.send(request_bytes)
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
        sweep_interval: float | None = None,
    ) -> None:
        from httptools import HttpResponseParser  # ImportError: the caller falls back

        self._parser = HttpResponseParser
        scheme, _, rest = origin.partition("://")
        if scheme not in ("http", "https") or not rest or "/" in rest:
            raise ValueError(f"an origin is http(s)://host[:port], got {origin!r}")
        self.origin = origin
        self.host, self.port = _split_host(rest, 443 if scheme == "https" else 80)
        self.host_header = host_header or rest
        self.limit = max(1, limit)
        self.connect_timeout = connect_timeout or None
        self.read_timeout = read_timeout or None
        self.keepalive = keepalive
        if sweep_interval is None:
            sweep_interval = min(SWEEP_INTERVAL, self.read_timeout or SWEEP_INTERVAL)
        self.sweep_interval = sweep_interval
        self._ssl = _ssl_context(ssl_context) if scheme == "https" else None
        self._idle: list[Connection] = []
        self._free = self.limit
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._busy: set[Connection] = set()
        self._sweeper: asyncio.TimerHandle | None = None
        self._closed = False

    def __repr__(self) -> str:
        return f"Pool({self.origin!r}, idle={len(self._idle)}, busy={len(self._busy)})"

    async def send(self, request: bytes) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        """One whole exchange (``request``: head and body, framed by the caller); -> the
        status, the raw headers and the whole body.

        Example::

            status, headers, body = await pool.send(head + body)
        """
        conn = await self._exchange(request, streaming=False)
        status, headers, body = conn.status, conn.headers, conn.take()
        self._release(conn)
        return status, headers, body

    @contextlib.asynccontextmanager
    async def stream(self, request: bytes) -> AsyncIterator[Response]:
        """An exchange whose body is read as it arrives (the connection is released after).

        Example::

            async with pool.stream(request) as response:
                async for piece in response:
                    ...
        """
        conn = await self._exchange(request, streaming=True)
        try:
            yield Response(conn)
        finally:
            self._release(conn)

    def close(self) -> None:
        """Close the idle connections; connections in use close when released. Idempotent.

        Example::

            pool.close()
        """
        self._closed = True
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.abort()

    # ---------------------------------------------------------------- internals
    async def _exchange(self, request: bytes, *, streaming: bool) -> Connection:
        if self._closed:
            raise HttpClosedError(f"the connection pool to {self.origin} is closed")
        if self._free > 0 and not self._waiters:
            self._free -= 1
        else:
            await self._wait_for_slot()
        try:
            conn = self._reuse() or await self._connect()
            for last in (False, True):
                self._busy.add(conn)
                if self._sweeper is None and self.read_timeout is not None:
                    self._sweeper = conn.loop.call_later(self.sweep_interval, self._sweep)
                waiter = conn.start(request, streaming)
                try:
                    await waiter
                except BaseException:  # cancelled: the exchange cannot go on
                    self._busy.discard(conn)
                    conn.abort()
                    raise
                error = conn.error
                if error is None:
                    return conn
                self._busy.discard(conn)
                conn.abort()
                if last or not (conn.reused and conn.dropped and not conn.got_bytes):
                    raise error
                # The server closed a kept connection as the request went out: it never
                # saw the request, so it goes once more on a new connection.
                conn = await self._connect()
            raise AssertionError("unreachable")  # pragma: no cover
        except BaseException:
            self._give_slot()
            raise

    def _reuse(self) -> Connection | None:
        idle = self._idle
        if not idle:
            return None
        now = idle[-1].loop.time()
        while idle:
            conn = idle.pop()
            if conn.closed:
                continue
            if now - conn.idle_since < self.keepalive:
                conn.reused = True
                return conn
            conn.abort()  # idle too long: the server may be closing it right now
        return None

    async def _connect(self) -> Connection:
        loop = asyncio.get_running_loop()
        opening = loop.create_connection(
            lambda: Connection(loop, self._parser),
            self.host,
            self.port,
            ssl=self._ssl,
            server_hostname=self.host if self._ssl is not None else None,
        )
        try:
            if self.connect_timeout is None:
                _, conn = await opening
            elif _timeout is not None:
                async with _timeout(self.connect_timeout):
                    _, conn = await opening
            else:  # pragma: no cover - Python 3.10
                _, conn = await asyncio.wait_for(opening, self.connect_timeout)
        except (TimeoutError, asyncio.TimeoutError) as exc:
            raise HttpTimeoutError(
                f"no connection to {self.origin} within {self.connect_timeout:g} s", connect=True
            ) from exc
        except OSError as exc:  # refused, unknown host, TLS (ssl.SSLError is an OSError)
            raise HttpConnectError(f"cannot connect to {self.origin}: {exc}") from exc
        return conn

    def _sweep(self) -> None:
        """Fail the exchanges that got no byte for ``read_timeout`` seconds (aiohttp's
        ``sock_read``: the time between reads, not the whole answer's)."""
        self._sweeper = None
        timeout = self.read_timeout
        if not self._busy or timeout is None:
            return
        loop = asyncio.get_running_loop()
        now = loop.time()
        silent = []
        for conn in self._busy:
            if conn.paused:  # the consumer lags, not the server
                conn.last_read = now
            elif now - conn.last_read >= timeout and not conn.complete:
                silent.append(conn)
        for conn in silent:
            conn.fail(HttpTimeoutError(f"no answer from {self.origin} for {timeout:g} s"))
            conn.abort()
        self._sweeper = loop.call_later(self.sweep_interval, self._sweep)

    def _release(self, conn: Connection) -> None:
        self._busy.discard(conn)
        if not self._closed and conn.reusable():
            conn.reused = False
            conn.idle_since = conn.last_read
            self._idle.append(conn)
        else:
            conn.abort()
        self._give_slot()

    async def _wait_for_slot(self) -> None:
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter  # done: the slot was handed over
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self._give_slot()  # handed over as we were cancelled: pass it on
            raise

    def _give_slot(self) -> None:
        waiters = self._waiters
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self._free += 1


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
