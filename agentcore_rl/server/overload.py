"""Serving on uvicorn's own options, and refusing invocations while the event loop runs behind.

:func:`serve_options` fills in the uvicorn options the agent server wants unless the
caller set them (keep-alive longer than clients keep theirs, a deep accept backlog).
:class:`LoopLag` measures how far behind the event loop runs, and :class:`OverloadGuard`,
an ASGI middleware, answers ``POST /invocations`` 503 with ``Retry-After`` while it is
overloaded: a refusal costs a fraction of an acceptance, so the backlog drains instead of
every request waiting seconds. ``/ping`` always passes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from agentcore_rl import protocol

__all__ = ["LoopLag", "OverloadGuard", "serve_options"]

logger = logging.getLogger(__name__)

#: Keep-alive: an idle connection between requests is closed after this many seconds.
#: Longer than common clients' own idle expiry (httpx 5 s, aiohttp 15 s): a server that
#: closes first races the client's next request, which then meets a reset connection.
DEFAULT_KEEP_ALIVE: Final = 20.0
#: Pending connections the kernel queues before refusing more (uvicorn's default: 2,048).
DEFAULT_BACKLOG: Final = 4096


def serve_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """uvicorn keyword arguments: ``options`` plus our defaults for those it does not set
    (``timeout_keep_alive`` 20 s, ``backlog`` 4,096). Every other uvicorn option
    (``limit_concurrency``, ``h11_max_incomplete_event_size``, ...) passes through."""
    return {"timeout_keep_alive": DEFAULT_KEEP_ALIVE, "backlog": DEFAULT_BACKLOG, **options}


class LoopLag:
    """How far behind the event loop runs, and whether that is overload.

    :meth:`run` sleeps ``interval`` seconds at a time and records how much longer each
    sleep took (``lag``). While the last ``samples`` sleeps each took more than
    ``threshold`` seconds longer (a sustained backlog, not one blocking call such as a
    slow import at startup), :attr:`overloaded` is true. ``threshold`` ``None``: never.
    ``clock``/``sleep`` are injectable.
    """

    def __init__(
        self,
        threshold: float | None,
        *,
        interval: float = 0.1,
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

    @property
    def overloaded(self) -> bool:
        """Whether the last ``samples`` measured lags were over the threshold."""
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


class OverloadGuard:
    """ASGI middleware: while the :class:`LoopLag` that ``lag`` returns is overloaded,
    ``POST /invocations`` is answered 503 with ``Retry-After: 1`` before its body is read;
    every other request passes.
    """

    def __init__(self, app: ASGIApp, lag: Callable[[], LoopLag]) -> None:
        self.app = app
        self.lag = lag

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        lag = self.lag()
        if (
            lag.overloaded
            and scope["type"] == "http"
            and scope["method"] == "POST"
            and scope["path"].endswith(protocol.INVOCATIONS_PATH)
        ):
            lag.refused += 1
            refusal = JSONResponse(
                {"error": "the agent server is overloaded; retry later", "field": None},
                status_code=503,
                headers={"Retry-After": "1"},
            )
            await refusal(scope, receive, send)
            return
        await self.app(scope, receive, send)
