"""The client's two limits: calls per second (:class:`RateLimiter`, :class:`TokenBucket`)
and sessions at once (:class:`SessionLimiter`, :class:`LocalSessionLimiter`).

Any object with a protocol's methods can stand in (``agentcore_rl.distributed`` shares both
across a cluster). docs/client.md ("Pacing") explains the throttle back-off and ``tick``.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Final, Protocol, runtime_checkable

from agentcore_rl.keywords import check_numbers
from agentcore_rl.protocol import DEFAULT_TPS

__all__ = [
    "DEFAULT_PACE_TICK",
    "LocalSessionLimiter",
    "Priority",
    "RateLimiter",
    "SessionLimiter",
    "TokenBucket",
]

#: On a throttle the rate is multiplied by this factor...
_THROTTLE_FACTOR: Final = 0.5
#: ...then regains this fraction of the configured rate per second.
_RECOVERY: Final = 0.05
#: Throttles closer together than this count as one (many calls in flight see the same one).
_THROTTLE_COOLDOWN: Final = 1.0

#: The rollout client's wait grid (``tick``): at 25 TPS, five calls per wakeup.
DEFAULT_PACE_TICK: Final = 0.2

# Float refills land a hair below 1.0 after sleeping exactly the computed deficit.
_EPSILON: Final = 1e-9


class Priority(IntEnum):
    """Queue order of waiters: lower values go first.

    Example::

        await bucket.acquire(priority=Priority.STOP)
    """

    #: A rollout run again after a retryable outcome (a crashed agent): ahead of new
    #: invocations, since it waited its turn once and its loss is why it waits again.
    RETRY = -5
    INVOKE = 0
    #: Liveness probes of long-pending sessions: behind invocations, before stops.
    PROBE = 5
    STOP = 10


@runtime_checkable
class RateLimiter(Protocol):
    """What a rollout client needs from a rate limiter (``rate_limiter=``): ``acquire`` one
    call's permission, lower ``priority`` values first; ``on_throttle`` after a 429 /
    ``ThrottlingException``, ``on_success`` after a call the runtime accepted.

    Example::

        class SharedLimiter:                       # e.g. backed by a cluster-wide actor
            async def acquire(self, priority: int = Priority.INVOKE) -> None: ...
            def on_throttle(self) -> None: ...
            def on_success(self) -> None: ...

        AsyncRolloutClient(..., rate_limiter=SharedLimiter())
    """

    async def acquire(self, priority: int = Priority.INVOKE) -> None: ...

    def on_throttle(self) -> None: ...

    def on_success(self) -> None: ...


@dataclass(order=True)
class _Waiter:
    priority: int
    seq: int
    wake: asyncio.Event = field(compare=False, default_factory=asyncio.Event)


class TokenBucket:
    """An asyncio token bucket with priorities and multiplicative throttle back-off.

    ``rate`` tokens per second, at most ``burst`` stored (the bucket starts full, or with
    ``tokens``). ``clock`` and ``sleep`` are injectable for tests. ``tick`` (seconds,
    0 = exact) is the grid waits end on (docs/client.md).

    Example::

        bucket = TokenBucket(rate=10, burst=5)
        for _ in range(20):
            await bucket.acquire()        # 5 at once, then one every 0.1 s
        bucket.on_throttle()              # now 5 per second, recovering towards 10
        paced = TokenBucket(rate=25, tick=0.2)   # waiters go out five at a time
    """

    def __init__(
        self,
        rate: float = DEFAULT_TPS,
        burst: float | None = None,
        *,
        tick: float = 0.0,
        tokens: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.max_rate, self.burst, self.tick = rate, rate if burst is None else burst, tick
        check_numbers(self, "max_rate", above=0)
        check_numbers(self, "burst", at_least=1)
        check_numbers(self, "tick", at_least=0)
        self.max_rate, self.burst, self.tick = float(rate), float(self.burst), float(tick)
        self._clock = clock
        self._sleep = sleep
        self._tokens = self.burst if tokens is None else min(self.burst, float(tokens))
        self._last = clock()
        # The rate after the last throttle, and when it happened: the current rate is
        # computed from these, so recovery needs no timer task.
        self._throttled_rate = self.max_rate
        self._throttled_at: float | None = None
        self._waiters: list[_Waiter] = []
        self._seq = itertools.count()
        self.throttles = 0

    def __repr__(self) -> str:
        return f"TokenBucket(rate={self.rate:g}, max_rate={self.max_rate:g}, burst={self.burst:g})"

    @property
    def rate(self) -> float:
        """Lower after a throttle."""
        if self._throttled_at is None:
            return self.max_rate
        regained = _RECOVERY * self.max_rate * (self._clock() - self._throttled_at)
        rate = self._throttled_rate + regained
        if rate >= self.max_rate:
            self._throttled_at = None
            return self.max_rate
        return rate

    @property
    def tokens(self) -> float:
        self._refill()
        return self._tokens

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    def _refill(self) -> None:
        now = self._clock()
        elapsed = now - self._last
        if elapsed > 0:
            # The rate of the interval's end: exact while unthrottled, a slight
            # overestimate during recovery, which is the conservative side for nobody.
            self._tokens = min(self.burst, self._tokens + elapsed * self.rate)
            self._last = now

    def try_acquire(self) -> bool:
        """Take a token if one is there and nobody is queued."""
        if self._waiters:
            return False
        self._refill()
        if self._tokens >= 1 - _EPSILON:
            self._tokens -= 1
            return True
        return False

    async def acquire(self, priority: int = Priority.INVOKE) -> None:
        """Lower ``priority`` values are served first, FIFO within one."""
        if self.try_acquire():
            return
        waiter = _Waiter(int(priority), next(self._seq))
        heapq.heappush(self._waiters, waiter)
        try:
            while True:
                if self._waiters[0] is waiter:
                    self._refill()
                    if self._tokens >= 1 - _EPSILON:
                        heapq.heappop(self._waiters)
                        self._tokens -= 1
                        return
                    # Only the head sleeps; if a more urgent waiter arrives meanwhile it
                    # becomes the head, and this one finds that out when it wakes.
                    await self._sleep(self._until_token())
                else:
                    waiter.wake.clear()
                    await waiter.wake.wait()
        except BaseException:
            if waiter in self._waiters:
                self._waiters.remove(waiter)
                heapq.heapify(self._waiters)
            raise
        finally:
            if self._waiters:
                self._waiters[0].wake.set()

    def _until_token(self) -> float:
        rate = self.rate
        delay = (1 - self._tokens) / rate
        # Tokens past the burst are lost: a tick longer than the burst's worth would cut
        # the rate, so the grid is never coarser than that (burst 1: exact waits).
        tick = min(self.tick, (self.burst - 1) / rate)
        if tick > 0:
            at = self._last + delay  # _last is the clock's now: _refill just ran
            # Never before the token (a float hair early would cost a whole extra tick).
            delay = max(delay, math.ceil(at / tick - _EPSILON) * tick - self._last)
        return delay

    def on_throttle(self) -> None:
        """Cut the rate in half and empty the bucket; throttles within a second of the last
        cut are one event."""
        now = self._clock()
        self.throttles += 1
        self._refill()
        self._tokens = min(self._tokens, 0.0)
        if self._throttled_at is not None and now - self._throttled_at < _THROTTLE_COOLDOWN:
            return
        self._throttled_rate = self.rate * _THROTTLE_FACTOR
        self._throttled_at = now

    def on_success(self) -> None:
        """Nothing to do: the rate recovers with time, not with successes."""


@runtime_checkable
class SessionLimiter(Protocol):
    """What a rollout client needs from a concurrency limit (``session_limiter=``):
    cancelling ``acquire`` takes no slot; ``release`` must not block (outcomes call it).

    Example::

        class SharedSlots:                         # e.g. backed by a cluster-wide actor
            async def acquire(self) -> None: ...
            def release(self) -> None: ...

        AsyncRolloutClient(..., session_limiter=SharedSlots())
    """

    async def acquire(self) -> None: ...

    def release(self) -> None: ...


class LocalSessionLimiter:
    """``slots`` slots in this process (an asyncio semaphore): the client's default.

    Example::

        AsyncRolloutClient(..., session_limiter=LocalSessionLimiter(64))
    """

    def __init__(self, slots: int) -> None:
        self.slots = slots
        check_numbers(self, "slots", at_least=1, integer=True)
        self._semaphore = asyncio.Semaphore(slots)

    def __repr__(self) -> str:
        return f"LocalSessionLimiter(slots={self.slots})"

    async def acquire(self) -> None:
        await self._semaphore.acquire()

    def release(self) -> None:
        self._semaphore.release()
