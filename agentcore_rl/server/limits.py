"""Serving with limits: connection cap, first-request timeout, open files, EMFILE logging.

uvicorn alone keeps a connection that never sends a request open forever, and its
``limit_concurrency`` answers 503 to every request beyond the cap, ``/ping`` included,
logging a warning for each. A few thousand slow connections then exhaust the open-file
limit, ``/ping`` goes dark (AgentCore Runtime kills the session) and asyncio logs
"Too many open files" with a traceback every second per listening socket. So
:func:`serve_options` gives uvicorn a protocol that

- closes a connection that has not sent a complete request head within
  ``first_request_timeout`` seconds (slowloris),
- never closes a connection as idle (that timeout, or keep-alive's) while bytes it sent
  wait unread behind a busy event loop: such a close would reset a request the server
  already received. The verdict waits two loop iterations, so what arrived is read
  first, and
- beyond ``max_connections`` closes the oldest connection that has not started a
  request, so a new one (``/ping``) still gets in; only when every connection is busy
  with a request is the new one refused,

and :func:`prepare_process` raises the open-file soft limit to the hard limit and lets
"Too many open files" through to the log once per interval.

Example::

    prepare_process()
    uvicorn.run(app, host="0.0.0.0", port=8080, **serve_options({}))
"""

from __future__ import annotations

import asyncio
import errno
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final

__all__ = [
    "DEFAULT_FIRST_REQUEST_TIMEOUT",
    "DEFAULT_MAX_CONNECTIONS",
    "FD_RESERVE",
    "LoopLag",
    "OpenFilesLogFilter",
    "guarded_protocol",
    "prepare_process",
    "raise_open_file_limit",
    "serve_options",
]

logger = logging.getLogger(__name__)

#: Seconds a new connection gets to send its first request head. ACR and our client send
#: at once; only a stalled or hostile peer takes longer.
DEFAULT_FIRST_REQUEST_TIMEOUT: Final = 10.0
#: Connections served at once (never more than the open-file limit minus FD_RESERVE).
DEFAULT_MAX_CONNECTIONS: Final = 4096
#: File descriptors kept free for everything but client connections: the S3 client's
#: pool, spool files, log files, worker threads' I/O.
FD_RESERVE: Final = 128
#: Seconds between two "Too many open files" log records.
DEFAULT_EMFILE_LOG_INTERVAL: Final = 60.0
#: Keep-alive: an idle connection between requests is closed after this many seconds.
#: Longer than common clients' own idle expiry (httpx 5 s, aiohttp 15 s): a server that
#: closes first races the client's next request, which then meets a reset connection.
#: Idle connections still make room for new ones at the connection cap.
DEFAULT_KEEP_ALIVE: Final = 20.0
#: Seconds between two measurements of the event loop's lag.
DEFAULT_LAG_INTERVAL: Final = 0.1
#: Seconds of event loop lag past which new invocations are refused (503, Retry-After).
DEFAULT_OVERLOAD_LAG: Final = 1.0
#: Pending connections the kernel queues before refusing more (uvicorn's default: 2,048).
DEFAULT_BACKLOG: Final = 4096


def raise_open_file_limit() -> tuple[int, int]:
    """Raise the open-file soft limit to the hard limit; return ``(soft, hard)`` after.

    Only for a process the server owns (``app.run()``, ``agentcore-rl serve``): the soft
    limit is often 1,024 while the hard one allows far more. No-op where there is no
    ``resource`` module (Windows).
    """
    try:
        # lazy: resource is POSIX-only (the ImportError below is Windows)
        import resource
    except ImportError:  # pragma: no cover - Windows
        return (-1, -1)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    # An unlimited hard limit cannot be the soft one (the kernel caps it at nr_open).
    wanted = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if soft == resource.RLIM_INFINITY or soft >= wanted:
        return (soft, hard)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    except (ValueError, OSError) as exc:
        logger.warning("could not raise the open-file limit from %d to %d: %s", soft, wanted, exc)
        return (soft, hard)
    logger.info("open-file limit raised from %d to %d", soft, wanted)
    return (wanted, hard)


def _open_file_limit() -> int | None:
    try:
        # lazy: as in raise_open_file_limit
        import resource
    except ImportError:  # pragma: no cover - Windows
        return None
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return None if soft == resource.RLIM_INFINITY else int(soft)


def _is_out_of_files(record: logging.LogRecord) -> bool:
    exc = record.exc_info[1] if record.exc_info else None
    if isinstance(exc, OSError) and exc.errno in (errno.EMFILE, errno.ENFILE):
        return True
    return "Too many open files" in record.getMessage()


class OpenFilesLogFilter(logging.Filter):
    """Let one "Too many open files" record through per ``interval`` seconds.

    The next one that passes says how many were held back. ``clock`` is monotonic seconds.
    """

    def __init__(
        self,
        interval: float = DEFAULT_EMFILE_LOG_INTERVAL,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        self.interval = interval
        self._clock = clock
        self._last: float | None = None
        self.suppressed = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if not _is_out_of_files(record):
            return True
        now = self._clock()
        if self._last is not None and now - self._last < self.interval:
            self.suppressed += 1
            return False
        self._last = now
        if self.suppressed:
            record.msg = f"{record.msg} ({self.suppressed} like it in the last interval hidden)"
            self.suppressed = 0
        # The traceback says nothing new after the first time.
        record.exc_info = None
        record.exc_text = None
        return True


def install_open_files_filter(interval: float = DEFAULT_EMFILE_LOG_INTERVAL) -> None:
    """Rate-limit "Too many open files" on the loggers that report it (asyncio, uvicorn)."""
    for name in ("asyncio", "uvicorn.error"):
        target = logging.getLogger(name)
        if not any(isinstance(f, OpenFilesLogFilter) for f in target.filters):
            target.addFilter(OpenFilesLogFilter(interval))


def prepare_process() -> None:
    """What a process the server owns does before serving: more open files, quieter EMFILE."""
    raise_open_file_limit()
    install_open_files_filter()


def guarded_protocol(
    base: type[asyncio.Protocol], *, max_connections: int, first_request_timeout: float
) -> type[asyncio.Protocol]:
    """A subclass of a uvicorn HTTP protocol with the connection guards described above."""

    class Guarded(base):  # type: ignore[valid-type,misc]
        _born: float
        _head_timer: asyncio.TimerHandle | None
        _received: int

        def connection_made(self, transport: asyncio.Transport) -> None:
            super().connection_made(transport)
            self._born = self.loop.time()
            self._head_timer = None
            self._received = 0
            if len(self.connections) > max_connections and not self._make_room():
                logger.debug("refused a connection: %d busy connections", max_connections)
                transport.close()
                return
            self._head_timer = self.loop.call_later(first_request_timeout, self._drop_if_idle)

        def _make_room(self) -> bool:
            idle = [c for c in self.connections if c is not self and c.cycle is None]
            if not idle:
                return False
            oldest = min(idle, key=lambda c: c._born)
            logger.debug("closing the oldest idle connection to admit a new one")
            oldest.transport.close()
            oldest._cancel_head_timer()
            self.connections.discard(oldest)
            return True

        def data_received(self, data: bytes) -> None:
            self._received += 1
            super().data_received(data)

        def _close_when_idle(self, still_idle: Callable[[], bool], why: str) -> None:
            # Timers run after the I/O callbacks of their loop iteration, but bytes that
            # arrived during a long iteration are only read in the next one. Two hops
            # (call_soon runs before the next iteration's reads) let them be read first.
            received = self._received

            def verdict() -> None:
                if self._received == received and still_idle() and not self.transport.is_closing():
                    logger.debug("closing a connection: %s", why)
                    self.transport.close()

            self.loop.call_soon(self.loop.call_soon, verdict)

        def _drop_if_idle(self) -> None:
            self._head_timer = None
            self._close_when_idle(lambda: self.cycle is None, "it sent no request in time")

        def timeout_keep_alive_handler(self) -> None:
            self._close_when_idle(
                lambda: self.cycle is None or self.cycle.response_complete,
                "idle past its keep-alive",
            )

        def _cancel_head_timer(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def connection_lost(self, exc: Exception | None) -> None:
            self._cancel_head_timer()
            super().connection_lost(exc)

    Guarded.__name__ = Guarded.__qualname__ = f"Guarded{base.__name__}"
    return Guarded


def _default_protocol() -> type[asyncio.Protocol]:
    # The same choice as uvicorn's http="auto": httptools when installed, else h11.
    try:
        # lazy: httptools is optional; h11 is the fallback
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

        return HttpToolsProtocol
    except ImportError:
        from uvicorn.protocols.http.h11_impl import H11Protocol

        return H11Protocol


def serve_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """uvicorn keyword arguments with our limits, for those the caller did not set.

    Understands two options of its own: ``max_connections`` (default 4,096, at most the
    open-file limit minus :data:`FD_RESERVE`; ``None``: no cap) and
    ``first_request_timeout`` (default 10 s). An ``http`` protocol the caller passes is
    used as given, without the guards.
    """
    merged = dict(options)
    cap = merged.pop("max_connections", DEFAULT_MAX_CONNECTIONS)
    timeout = merged.pop("first_request_timeout", DEFAULT_FIRST_REQUEST_TIMEOUT)
    merged.setdefault("timeout_keep_alive", DEFAULT_KEEP_ALIVE)
    merged.setdefault("backlog", DEFAULT_BACKLOG)
    if "http" not in merged:
        files = _open_file_limit()
        if cap is None:
            cap = 1 << 30
        elif files is not None:
            cap = max(1, min(cap, files - FD_RESERVE))
        merged["http"] = guarded_protocol(
            _default_protocol(), max_connections=cap, first_request_timeout=timeout
        )
    return merged


class LoopLag:
    """How far behind the event loop runs, and whether that is overload.

    :meth:`run` sleeps ``interval`` seconds at a time and records how much longer each
    sleep took (``lag``). While the last ``samples`` sleeps each took more than
    ``threshold`` seconds longer (a sustained backlog, not one blocking call such as a
    slow import at startup), :attr:`overloaded` is true and the server answers new
    invocations 503 with ``Retry-After`` before reading them: a refusal costs a fraction
    of an acceptance, so the backlog drains instead of every request waiting seconds (and
    connections being reset). ``threshold`` ``None``: never overloaded.
    ``clock``/``sleep`` are injectable.
    """

    def __init__(
        self,
        threshold: float | None,
        *,
        interval: float = DEFAULT_LAG_INTERVAL,
        samples: int = 2,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.threshold = threshold
        self.interval = interval
        self._clock = clock
        self._sleep = sleep
        self.samples = samples
        self.lag = 0.0
        self._late = 0  # measurements in a row over the threshold
        #: Invocations refused because of overload.
        self.refused = 0

    def __repr__(self) -> str:
        return f"LoopLag(lag={self.lag:.3f}, threshold={self.threshold}, refused={self.refused})"

    @property
    def overloaded(self) -> bool:
        """Whether the last measured lag was over the threshold."""
        return self.threshold is not None and self._late >= self.samples

    async def run(self) -> None:
        """Measure until cancelled (the app's task group owns it)."""
        if self.threshold is None:
            return
        while True:
            await self.measure()

    async def measure(self) -> float:
        """Sleep ``interval`` once; record and return how much longer it took."""
        started = self._clock()
        await self._sleep(self.interval)
        lag = max(0.0, self._clock() - started - self.interval)
        was = self.overloaded
        self.lag = lag
        over = self.threshold is not None and lag > self.threshold
        self._late = self._late + 1 if over else 0
        if self.overloaded and not was:
            logger.warning(
                "event loop %.2f s behind: refusing new invocations (503, Retry-After)", lag
            )
        elif was and not self.overloaded:
            logger.warning("event loop caught up: accepting invocations again")
        return lag
