"""uvicorn defaults, and refusing invocations (503) while the event loop runs behind.

A refusal costs a fraction of an acceptance, so the backlog drains instead of every
request waiting seconds.
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

#: Longer than clients' idle expiry (httpx 5 s, aiohttp 15 s): closing first races their
#: next request into a reset connection.
DEFAULT_KEEP_ALIVE: Final = 20.0
#: uvicorn's default is 2,048.
DEFAULT_BACKLOG: Final = 4096


def serve_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` plus our defaults for the uvicorn options it does not set."""
    return {"timeout_keep_alive": DEFAULT_KEEP_ALIVE, "backlog": DEFAULT_BACKLOG, **options}


class LoopLag:
    """How far behind the event loop runs; overloaded after two late sleeps in a row
    (a sustained backlog, not one blocking call). ``threshold`` None: never."""

    def __init__(
        self,
        threshold: float | None,
        *,
        interval: float = 0.1,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.threshold = threshold
        self.interval = interval
        self._clock = clock
        self._sleep = sleep
        self._late = 0  # measurements in a row over the threshold
        self._told_blocked = False
        self.refused = 0

    @property
    def overloaded(self) -> bool:
        return self.threshold is not None and self._late >= 2

    async def run(self) -> None:
        """Measure until cancelled."""
        if self.threshold is None:
            return
        while True:
            await self.measure()

    async def measure(self) -> float:
        """Sleep ``interval`` once; return how much longer it took."""
        started = self._clock()
        await self._sleep(self.interval)
        lag = max(0.0, self._clock() - started - self.interval)
        was = self.overloaded
        over = self.threshold is not None and lag > self.threshold
        self._late = self._late + 1 if over else 0
        if over and not self._told_blocked:
            # Once: a handler that blocks does so on every rollout, and each waits for it.
            self._told_blocked = True
            logger.warning(
                "event loop blocked for %.2f s: a blocking call in an async handler (time.sleep, "
                "a synchronous HTTP client, heavy CPU) holds up every other rollout meanwhile; "
                "make the handler a plain def (it runs in a worker thread) or await "
                "asyncio.to_thread(...) around the call",
                lag,
            )
        if self.overloaded and not was:
            logger.warning(
                "event loop %.2f s behind: refusing new invocations (503, Retry-After)", lag
            )
        elif was and not self.overloaded:
            logger.warning("event loop caught up: accepting invocations again")
        return lag


class OverloadGuard:
    """ASGI middleware: 503 to ``POST /invocations`` before its body is read while overloaded."""

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
