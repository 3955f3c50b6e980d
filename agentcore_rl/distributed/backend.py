"""How a process talks to the shared limits: the LimitsBackend protocol, and outages.

:class:`~agentcore_rl.distributed.actor.LimitsActor` itself satisfies the protocol (an
in-process backend, for tests and single-process use); ``RayBackend`` calls the named
actor through Ray and turns Ray's failures into :class:`BackendUnavailable`.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import anyio

from agentcore_rl.distributed.ledger import Demand, RateLease
from agentcore_rl.errors import SharedLimitsUnavailableError

__all__ = [
    "BackendUnavailable",
    "LimitsBackend",
    "Outage",
    "SharedLimitsUnavailableError",
]

logger = logging.getLogger(__name__)


class BackendUnavailable(Exception):
    """One call to the backend failed (actor dead, restarting or unreachable)."""


class LimitsBackend(Protocol):
    """The calls a process makes to the shared limits (one actor serves the cluster).

    Example::

        granted, excess = await backend.lease_slots("worker-1", held=4, want=8, max_wait=2)
    """

    async def lease_rate(
        self,
        holder: str,
        held: float,
        held_for: float,
        demand: Demand,
        throttles: int = 0,
        max_wait: float = 0.0,
        seq: int = 0,
    ) -> RateLease:
        """Renew (or ask for) a share of the rate, reporting throttles seen."""

    async def leave_rate(self, holder: str) -> None:
        """A holder makes no more calls."""

    async def lease_slots(
        self, holder: str, held: int, want: int, max_wait: float
    ) -> tuple[int, int]:
        """Lease session slots: (granted, excess to give back)."""

    async def renew(self, holder: str, held: int) -> int:
        """Renew (or shrink) a holding; return the excess to give back."""

    async def leave(self, holder: str, held: int) -> None:
        """A holder closes, still using ``held`` slots."""

    async def status(self) -> dict[str, Any]:
        """A snapshot of the shared state."""


class Outage:
    """Backs off between failed calls and tells when an outage has lasted too long."""

    def __init__(
        self,
        timeout: float,
        *,
        initial: float = 0.05,
        maximum: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = anyio.sleep,
    ) -> None:
        self.timeout = timeout
        self.initial = initial
        self.maximum = maximum
        self._clock = clock
        self._sleep = sleep
        self._since: float | None = None
        self._delay = initial

    @property
    def down(self) -> bool:
        """Whether the last call failed."""
        return self._since is not None

    def ok(self) -> None:
        """A call succeeded: the outage (if any) is over."""
        if self._since is not None:
            logger.info("shared limits reachable again")
        self._since = None
        self._delay = self.initial

    async def failed(self, exc: BaseException) -> bool:
        """A call failed: wait a jittered, growing delay; True once down > ``timeout``."""
        now = self._clock()
        if self._since is None:
            self._since = now
            logger.warning("shared limits unreachable, retrying: %s", exc)
        delay, self._delay = self._delay, min(self.maximum, self._delay * 2)
        await self._sleep(delay * random.uniform(0.5, 1.0))
        return self._clock() - self._since > self.timeout
