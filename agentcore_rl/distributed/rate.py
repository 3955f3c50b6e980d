"""SharedRateLimiter: one process's share of the cluster's rate, spent by a local bucket.

The process leases a share of the shared rate (``r`` calls per second for the next lease
period) and makes its own tokens at ``r`` with a local token bucket, so no call waits for
the actor and no token expires unused: a share only lapses when its process stops
renewing. It renews at half the lease period, reporting what it uses and what it could
use (its :class:`~.ledger.Demand`: a class with callers starved of tokens asks for the
whole quota, others for their recent use plus a quarter); the actor rebalances the
shares by demand at each renewal. Use it does not need goes back at the next renewal.

Priorities: invocations before stop calls, and a stop call waits until invocations have
been quiet for :data:`STOP_QUIET` seconds (the batch feeder takes tokens one by one,
sending between two; stops must not take the token its next invocation needs). Across
the cluster the actor serves invocation demand before stop demand.

A throttle answer cuts this process's share at once (multiplicatively, throttles within
the cooldown are one) and is reported to the actor right away, which cuts the shared rate
so every share shrinks as it is renewed.

The loops run in :meth:`SharedRateLimiter.run`, owned by :class:`~.limits.SharedLimits`.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import math
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

import anyio
import anyio.abc

from agentcore_rl.distributed.backend import (
    BackendUnavailable,
    LimitsBackend,
    Outage,
    SharedLimitsUnavailableError,
)
from agentcore_rl.distributed.config import LimitsConfig
from agentcore_rl.distributed.ledger import Demand, RateLease
from agentcore_rl.ratelimit import Priority

__all__ = ["STOP_QUIET", "SharedRateLimiter"]

#: A stop call waits until no invocation asked for a token for this many seconds.
STOP_QUIET: Final = 0.5
# A class whose callers were starved of tokens this recently is backlogged: it asks for
# the whole quota.
_BACKLOG_WINDOW: Final = 1.0
# Demand headroom over recent use, so a growing process gets a growing share.
_HEADROOM: Final = 1.25
# Float refills land a hair below a whole token after waiting exactly the deficit.
_EPSILON: Final = 1e-9


def _priority_class(priority: int) -> int:
    """Two classes: invocations, and stop calls (and anything less urgent)."""
    return Priority.INVOKE if priority < Priority.STOP else Priority.STOP


@dataclass(order=True)
class _Waiter:
    priority: int
    seq: int
    granted: asyncio.Future[None] = field(compare=False)


class SharedRateLimiter:
    """Paces this process's calls within its share of the cluster's rate
    (``RateLimiter`` shape).

    ``backend`` is the shared actor; ``holder`` names this process to it (default: a
    fresh uuid); ``clock`` is monotonic seconds in this process. Waiters fail with
    ``SharedLimitsUnavailableError`` after the actor has been unreachable for
    ``unavailable_timeout`` seconds (the share lapses at its lease's end before that).

    Example::

        limiter = SharedRateLimiter(backend, config)
        async with anyio.create_task_group() as tg:
            tg.start_soon(limiter.run)
            await limiter.acquire()
    """

    def __init__(
        self,
        backend: LimitsBackend,
        config: LimitsConfig,
        *,
        holder: str | None = None,
        unavailable_timeout: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.holder = holder or f"rate-{uuid.uuid4().hex}"
        self._backend = backend
        self._clock = clock
        self._unavailable_timeout = unavailable_timeout
        now = clock()
        # The local bucket: the share, its burst, its tokens, until when it holds.
        self.share = 0.0
        self._burst = 0.0
        self._level = 0.0
        self._until = -math.inf
        self._last = now
        self._waiters: list[_Waiter] = []
        self._seq = itertools.count()
        self._changed = asyncio.Event()  # wakes the pacer
        self._renew = asyncio.Event()  # wakes the lease loop
        self._requests = itertools.count()
        self._active_since = now
        self._invoked_at = -math.inf
        classes = (int(Priority.INVOKE), int(Priority.STOP))
        self._starved_at: dict[int, float] = dict.fromkeys(classes, -math.inf)
        # When tokens were taken lately, by class: recent use is demand.
        self._used: dict[int, deque[float]] = {cls: deque() for cls in classes}
        self._throttled_at = -math.inf
        self._throttles_pending = 0
        # From the last lease: another process has invocations waiting (stops wait too).
        self._others_invoking = False
        # Whether the last request said this process's invocations were backlogged.
        self._reported_backlog = False
        self.running = False
        #: leases, empty_leases, lapses, throttles, tokens_invoke, tokens_stop...
        self.stats: Counter[str] = Counter()

    def __repr__(self) -> str:
        return f"SharedRateLimiter(share={self.share:g}, waiting={len(self._waiters)})"

    @property
    def actor_calls(self) -> int:
        """Calls this limiter made to the shared actor."""
        return self.stats["leases"] + self.stats["leaves"]

    @property
    def tokens(self) -> float:
        """Tokens in the local bucket now."""
        self._refill(self._clock())
        return self._level

    # --- the local bucket ----------------------------------------------------------------

    def _refill(self, now: float) -> None:
        if now >= self._until:
            if self.share > 0:
                self.stats["lapses"] += 1
            self.share = self._burst = self._level = 0.0
        elif now > self._last:
            self._level = min(self._burst, self._level + (now - self._last) * self.share)
        self._last = now

    def _set_share(self, rate: float, burst: float, until: float) -> None:
        self.share, self._burst, self._until = rate, burst, until
        self._level = min(self._level, burst)

    def _may_take(self, priority: int, now: float) -> bool:
        if self._level < 1 - _EPSILON:
            return False
        if priority < Priority.STOP:
            return True
        return not self._others_invoking and now - self._invoked_at >= STOP_QUIET

    def _backlogged(self, cls: int, now: float) -> bool:
        return now - self._starved_at[cls] < _BACKLOG_WINDOW

    def _take(self, priority: int, now: float) -> None:
        self._level -= 1
        cls = _priority_class(priority)
        self._used[cls].append(now)
        self.stats["tokens_invoke" if cls == Priority.INVOKE else "tokens_stop"] += 1

    def _dispatch(self, now: float) -> None:
        self._refill(now)
        while self._waiters:
            head = self._waiters[0]
            if head.granted.done():  # failed by an outage, or cancelled
                heapq.heappop(self._waiters)
                continue
            if not self._may_take(head.priority, now):
                cls = _priority_class(head.priority)
                self._starved_at[cls] = now
                if cls == Priority.INVOKE and not self._reported_backlog:
                    self._renew.set()  # the actor must hear of it: others may hold room
                return
            heapq.heappop(self._waiters)
            self._take(head.priority, now)
            head.granted.set_result(None)

    def _next_wake(self, now: float) -> float | None:
        """Seconds until the head waiter could be served without news; None: only news
        (a waiter, a lease) can change that."""
        pending = [w for w in self._waiters if not w.granted.done()]
        if not pending or self.share <= 0:
            return None
        head = min(pending)
        delay = max(0.0, (1 - self._level) / self.share)
        if head.priority >= Priority.STOP:
            delay = max(delay, self._invoked_at + STOP_QUIET - now)
        return min(delay, max(0.0, self._until - now))

    async def acquire(self, priority: int = Priority.INVOKE) -> None:
        """Wait for a token; lower ``priority`` values first, FIFO within one."""
        if not self.running:
            raise RuntimeError("enter the SharedLimits (async with) before acquiring")
        now = self._clock()
        if priority < Priority.STOP:
            self._invoked_at = now
        if not self._waiters:
            self._refill(now)
            if self._may_take(priority, now):
                self._take(priority, now)
                return
        waiter = _Waiter(int(priority), next(self._seq), asyncio.get_running_loop().create_future())
        heapq.heappush(self._waiters, waiter)
        if self.share <= 0:  # no share (yet, or any more): ask for one now
            self._renew.set()
        self._changed.set()
        try:
            await waiter.granted
        except BaseException:
            if waiter.granted.done() and not waiter.granted.cancelled():
                if waiter.granted.exception() is None:
                    # Handed a token as we were cancelled: it is the next waiter's.
                    self._level = min(self._burst, self._level + 1)
                    self._changed.set()
            elif waiter in self._waiters:
                self._waiters.remove(waiter)
                heapq.heapify(self._waiters)
            raise

    def on_throttle(self) -> None:
        """A call here was throttled: cut this share and empty the bucket at once, and
        tell the cluster (every share shrinks).
        """
        now = self._clock()
        self.stats["throttles"] += 1
        self._refill(now)
        self._level = 0.0
        if now - self._throttled_at >= self.config.throttle_cooldown:
            self._throttled_at = now
            rate = self.share * self.config.throttle_factor
            self._set_share(rate, self.config.local_burst(rate), self._until)
        self._throttles_pending += 1
        self._renew.set()

    def on_success(self) -> None:
        """Nothing to do: the shared rate recovers with time."""

    # --- leasing -----------------------------------------------------------------------------

    def _demand(self, now: float) -> Demand:
        """What this process could use: all of it for a backlogged class; nothing for
        invocations quiet for :data:`STOP_QUIET` (a finished batch); else the use of the
        last half lease plus headroom."""
        window = self.config.lease_period / 2
        # Use is measured over the time there was a share, at most half a lease.
        span = max(0.1, min(window, now - self._active_since))
        wants: dict[int, float] = {}
        for cls, used in self._used.items():
            while used and used[0] <= now - window:
                used.popleft()
            if self._backlogged(cls, now):
                wants[cls] = self.config.tps
            elif cls == Priority.INVOKE and now - self._invoked_at >= STOP_QUIET:
                wants[cls] = 0.0
            else:
                wants[cls] = min(self.config.tps, len(used) / span * _HEADROOM)
        return Demand(invoke=wants[Priority.INVOKE], stop=wants[Priority.STOP])

    def _wants_lease(self) -> bool:
        return self.share > 0 or any(not w.granted.done() for w in self._waiters)

    def _news(self, now: float) -> bool:
        """Whether the actor's view of this process is out of date in a way that matters
        now: throttles to report, or invocations that started or stopped waiting."""
        backlogged = self._backlogged(Priority.INVOKE, now)
        return bool(self._throttles_pending) or backlogged != self._reported_backlog

    async def _lease_once(self, outage: Outage) -> None:
        now = self._clock()
        self._dispatch(now)  # marks starvation up to now
        demand = self._demand(now)
        if demand.total < self.share:
            # Give back what is not used: we stop using it before asking, so the actor
            # can hand it out the moment it reads this request.
            rate = demand.total
            self._set_share(rate, self.config.local_burst(rate), self._until)
        self._reported_backlog = demand.invoke >= self.config.tps
        held_for = max(0.0, self._until - now) if self.share > 0 else 0.0
        # The call waits at the actor until the share changes, and is the renewal: it
        # comes back in time to renew the share held (with a margin for the answer).
        margin = self.config.lease_period / 4
        max_wait = max(0.0, held_for - margin) if self.share > 0 else 3 * margin
        throttles, self._throttles_pending = self._throttles_pending, 0
        try:
            lease: RateLease = await self._backend.lease_rate(
                self.holder, self.share, held_for, demand, throttles, max_wait, next(self._requests)
            )
        except BackendUnavailable as exc:
            self._throttles_pending += throttles
            if await outage.failed(exc):
                self._fail_waiters(
                    SharedLimitsUnavailableError(
                        f"the shared limits' actor has been unreachable for over "
                        f"{self._unavailable_timeout:g} s: {exc}"
                    )
                )
            return
        except BaseException:  # interrupted by news: the next request reports them too
            self._throttles_pending += throttles
            raise
        outage.ok()
        self.stats["leases"] += 1
        if throttles:
            self.stats["throttle_reports"] += 1
        got = self._clock()
        self._refill(got)
        self._others_invoking = lease.others_invoking
        if lease.rate > 0:
            # Counted from the sending plus the wait the actor measured: it ends no
            # later than the actor's (the request's trip there is not counted),
            # whatever the clocks of the two hosts.
            if self.share <= 0:
                self._active_since = got
            self._set_share(lease.rate, lease.burst, now + lease.waited + lease.period)
            self._level = min(self._burst, self._level + lease.initial)
        else:
            self.stats["empty_leases"] += 1
            self._set_share(0.0, 0.0, -math.inf)
            self._level = 0.0
        self._changed.set()

    async def _interrupt_on_news(self, scope: anyio.CancelScope) -> None:
        """Cancel the waiting lease call when there is news for the actor."""
        while True:
            now = self._clock()
            if self._news(now):
                scope.cancel()
                return
            self._renew.clear()
            wake = None
            if self._reported_backlog:  # when the backlog here would end
                wake = self._starved_at[Priority.INVOKE] + _BACKLOG_WINDOW - now
            with anyio.move_on_after(math.inf if wake is None else max(0.0, wake)):
                await self._renew.wait()

    async def _lease_loop(self) -> None:
        """Keep one lease call waiting at the actor while there is a share to renew or
        callers waiting; interrupt and resend it when there is news."""
        outage = Outage(self._unavailable_timeout, clock=self._clock)
        while True:
            now = self._clock()
            if self._wants_lease() or self._news(now):
                async with anyio.create_task_group() as tg:

                    async def call() -> None:
                        await self._lease_once(outage)
                        tg.cancel_scope.cancel()

                    tg.start_soon(call)
                    tg.start_soon(self._interrupt_on_news, tg.cancel_scope)
                continue
            self._renew.clear()
            wake = None
            if self._reported_backlog:
                wake = self._starved_at[Priority.INVOKE] + _BACKLOG_WINDOW - now
            with anyio.move_on_after(math.inf if wake is None else max(0.0, wake)):
                await self._renew.wait()  # nothing held, nobody waiting: no calls

    async def _pace(self) -> None:
        while True:
            self._changed.clear()
            now = self._clock()
            self._dispatch(now)
            delay = self._next_wake(now)
            if delay is None:
                await self._changed.wait()
            else:
                with anyio.move_on_after(delay):
                    await self._changed.wait()

    def _fail_waiters(self, error: BaseException) -> None:
        for waiter in self._waiters:
            if not waiter.granted.done():
                waiter.granted.set_exception(error)
        self._waiters.clear()

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Run the lease and pacing loops until cancelled (the owner's task group does)."""
        self.running = True
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._lease_loop)
                tg.start_soon(self._pace)
                task_status.started()
        finally:
            self.running = False
            self._fail_waiters(RuntimeError("the shared limits were closed"))

    async def aclose(self) -> None:
        """Free the share at once (the owner calls this after stopping :meth:`run`)."""
        self._set_share(0.0, 0.0, -math.inf)
        self._level = 0.0
        self.stats["leaves"] += 1
        with contextlib.suppress(BackendUnavailable):  # else it lapses at its lease's end
            await self._backend.leave_rate(self.holder)
