"""SharedRateLimiter: one process's view of the cluster's token bucket.

Tokens are leased from the shared actor in batches and kept in a local stock, each batch
with its expiry; local waiters take them by priority (stop calls after invocations). One
lease call per priority class is in flight at a time, sized to the local waiters or to a
batch that doubles while every leased token gets spent and halves when some lapse
(whichever is more), so a busy process pays one actor call per batch, never one per
call. Throttles are reported to the actor (the cluster's rate drops) and empty the local
stock. Leftover tokens lapse, or are given back when the limits close.

The loops run in :meth:`SharedRateLimiter.run`, owned by :class:`~.limits.SharedLimits`.

Example::

    async with shared_limits("acr-math", tps=25, sessions=500) as limits:
        await limits.rate.acquire()                    # satisfies the RateLimiter protocol
        await limits.rate.acquire(Priority.STOP)
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import anyio
import anyio.abc

from agentcore_rl.client.bucket import Priority
from agentcore_rl.distributed.backend import (
    BackendUnavailable,
    LimitsBackend,
    Outage,
    SharedLimitsUnavailableError,
)
from agentcore_rl.distributed.config import LimitsConfig

__all__ = ["SharedRateLimiter"]

# Lease requests long-poll the actor at most this long, so an abandoned request is short.
_MAX_WAIT = 2.0


def _priority_class(priority: int) -> int:
    """Lease requests come in two classes: invocations, and stop calls (and below)."""
    return Priority.INVOKE if priority < Priority.STOP else Priority.STOP


@dataclass(order=True)
class _Waiter:
    priority: int
    seq: int
    # Resolves with the expiry of the token handed over.
    granted: asyncio.Future[float] = field(compare=False)


class SharedRateLimiter:
    """Paces this process's calls within the cluster's shared rate (``RateLimiter`` shape).

    ``backend`` is the shared actor; ``clock`` is monotonic seconds in this process.
    Waiters fail with ``SharedLimitsUnavailableError`` after the actor has been
    unreachable for ``unavailable_timeout`` seconds.

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
        unavailable_timeout: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = anyio.sleep,
    ) -> None:
        self.config = config
        self._backend = backend
        self._clock = clock
        self._sleep = sleep
        self._unavailable_timeout = unavailable_timeout
        # (expires_at, count, class that leased them), soonest first
        self._stock: list[tuple[float, int, int]] = []
        self._waiters: list[_Waiter] = []
        self._seq = itertools.count()
        self._demand: dict[int, asyncio.Event] = {
            cls: asyncio.Event() for cls in (Priority.INVOKE, Priority.STOP)
        }
        self._in_flight: dict[int, int] = dict.fromkeys(self._demand, 0)
        # Per class: the lease batch size, and tokens of its leases that lapsed unused.
        self._batch: dict[int, int] = dict.fromkeys(self._demand, 1)
        self._lapsed: dict[int, int] = dict.fromkeys(self._demand, 0)
        self._throttle_reported = asyncio.Event()
        self._reserved = asyncio.Event()
        self._throttles_pending = 0
        self.running = False
        #: leases (empty_leases, by priority), tokens_leased, tokens_expired, returns...
        self.stats: Counter[str] = Counter()

    def __repr__(self) -> str:
        return f"SharedRateLimiter(stock={self.stock}, waiting={len(self._waiters)})"

    @property
    def stock(self) -> int:
        """Unexpired leased tokens held here."""
        self._expire(self._clock())
        return sum(n for _, n, _ in self._stock)

    @property
    def actor_calls(self) -> int:
        """Calls this limiter made to the shared actor."""
        return self.stats["leases"] + self.stats["returns"] + self.stats["throttle_reports"]

    def _expire(self, now: float) -> None:
        while self._stock and self._stock[0][0] <= now:
            _, count, cls = heapq.heappop(self._stock)
            self.stats["tokens_expired"] += count
            self._lapsed[cls] += count

    def _take(self, now: float, priority: int = Priority.INVOKE) -> float | None:
        """Take the soonest-expiring token ``priority`` may use; its expiry, or None.

        Tokens leased for invocations serve a stop call only in the last half of their
        life: a caller that takes tokens one by one (the batch feeder) is not waiting
        between two takes, and stops must not take what its next invocation needs.
        """
        self._expire(now)
        cls = _priority_class(priority)
        usable = [
            i
            for i, (expires, _, leased_for) in enumerate(self._stock)
            if leased_for >= cls or expires - now < self.config.token_ttl / 2
        ]
        if not usable:
            return None
        i = min(usable, key=lambda j: self._stock[j][0])
        expires, count, leased_for = self._stock[i]
        if count > 1:
            self._stock[i] = (expires, count - 1, leased_for)
        else:
            self._stock[i] = self._stock[-1]
            self._stock.pop()
            heapq.heapify(self._stock)
        return expires

    def _dispatch(self) -> None:
        now = self._clock()
        while self._waiters:
            if self._waiters[0].granted.done():  # failed by an outage; already gone
                heapq.heappop(self._waiters)
                continue
            expires = self._take(now, self._waiters[0].priority)
            if expires is None:
                if self._stock:  # kept for invocations: usable by stops at half-life
                    self._reserved.set()
                return
            heapq.heappop(self._waiters).granted.set_result(expires)

    async def acquire(self, priority: int = Priority.INVOKE) -> None:
        """Wait for a token; lower ``priority`` values first, FIFO within one.

        Example::

            await limiter.acquire(Priority.STOP)
        """
        if not self.running:
            raise RuntimeError("enter the SharedLimits (async with) before acquiring")
        if not self._waiters and self._take(self._clock(), priority) is not None:
            return
        waiter = _Waiter(int(priority), next(self._seq), asyncio.get_running_loop().create_future())
        heapq.heappush(self._waiters, waiter)
        self._demand[_priority_class(waiter.priority)].set()
        try:
            await waiter.granted
        except BaseException:
            if waiter.granted.done() and not waiter.granted.cancelled():
                if waiter.granted.exception() is None:
                    # Handed a token as we were cancelled: it is the next waiter's.
                    heapq.heappush(self._stock, (waiter.granted.result(), 1, Priority.STOP))
                    self._dispatch()
            elif waiter in self._waiters:
                self._waiters.remove(waiter)
                heapq.heapify(self._waiters)
            raise

    def on_throttle(self) -> None:
        """A call here was throttled: drop the local stock and tell the cluster.

        Example::

            except ThrottlingError:
                limiter.on_throttle()
        """
        self.stats["throttles"] += 1
        self.stats["tokens_dropped"] += sum(n for _, n, _ in self._stock)
        self._stock.clear()
        self._throttles_pending += 1
        self._throttle_reported.set()

    def on_success(self) -> None:
        """Nothing to do: the shared rate recovers with time."""

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Run the lease loops until cancelled (the owner's task group cancels it)."""
        self.running = True
        try:
            async with anyio.create_task_group() as tg:
                for cls in self._demand:
                    tg.start_soon(self._lease_loop, cls)
                tg.start_soon(self._report_loop)
                tg.start_soon(self._half_life_loop)
                task_status.started()
        finally:
            self.running = False
            self._fail_waiters(RuntimeError("the shared limits were closed"))

    def _wanted(self, cls: int) -> int:
        """Tokens class ``cls`` should ask for: its waiters and the more urgent ones (the
        stock and the more urgent classes' requests on their way serve those first)."""
        if not any(
            _priority_class(w.priority) == cls and not w.granted.done() for w in self._waiters
        ):
            return 0
        ahead = sum(
            1 for w in self._waiters if _priority_class(w.priority) <= cls and not w.granted.done()
        )
        coming = sum(n for c, n in self._in_flight.items() if c < cls)
        return max(ahead - self.stock - coming, self._next_batch(cls))

    def _next_batch(self, cls: int) -> int:
        """The batch size for class ``cls``'s next lease, adapted like a TCP window.

        A caller that takes tokens one by one (the batch feeder does) never has more than
        one waiter, so waiters alone would make every lease one token. If every token of
        the last leases was spent, ask for twice as many; if some lapsed unused, half.
        """
        if self._lapsed[cls]:
            self._batch[cls] = max(1, self._batch[cls] // 2)
        else:
            self._batch[cls] = min(self.config.max_token_batch, self._batch[cls] * 2)
        self._lapsed[cls] = 0
        return self._batch[cls]

    def _fail_waiters(self, error: BaseException) -> None:
        for waiter in self._waiters:
            if not waiter.granted.done():
                waiter.granted.set_exception(error)
        self._waiters.clear()

    async def _lease_loop(self, cls: int) -> None:
        demand = self._demand[cls]
        outage = Outage(self._unavailable_timeout, clock=self._clock)
        while True:
            await demand.wait()
            want = self._wanted(cls)
            if want <= 0:
                demand.clear()
                continue
            sent = self._clock()
            want = min(want, self.config.max_token_batch)
            self._in_flight[cls] = want
            try:
                grant = await self._backend.lease_tokens(want, cls, _MAX_WAIT)
            except BackendUnavailable as exc:
                if await outage.failed(exc):
                    self._fail_waiters(
                        SharedLimitsUnavailableError(
                            f"the shared limits' actor has been unreachable for over "
                            f"{self._unavailable_timeout:g} s: {exc}"
                        )
                    )
                continue
            finally:
                self._in_flight[cls] = 0
            outage.ok()
            self.stats["leases"] += 1
            self.stats[f"leases_priority_{cls}"] += 1
            if not grant.count:
                self.stats["empty_leases"] += 1
            else:
                # The grant happened after sent + waited (the request's trip there is not
                # counted): an expiry that errs early, whatever the clocks of the hosts.
                heapq.heappush(self._stock, (sent + grant.waited + grant.ttl, grant.count, cls))
                self.stats["tokens_leased"] += grant.count
                self._dispatch()
            if self._waiters:
                for event in self._demand.values():  # a less urgent class may be short now
                    event.set()

    async def _give_back(self) -> None:
        now = self._clock()
        self._expire(now)
        if not self._stock:
            return
        count = sum(n for _, n, _ in self._stock)
        ttl_left = self._stock[0][0] - now
        self._stock.clear()
        self.stats["returns"] += 1
        self.stats["tokens_returned"] += count
        with contextlib.suppress(BackendUnavailable):  # else they lapse within ttl_left
            await self._backend.return_tokens(count, ttl_left)

    async def _half_life_loop(self) -> None:
        """Hand stops the invocation tokens no invocation took in the first half of their
        life (without this they would lapse unused)."""
        while True:
            await self._reserved.wait()
            self._reserved.clear()
            usable_at = [
                expires - self.config.token_ttl / 2
                for expires, _, leased_for in self._stock
                if leased_for < Priority.STOP
            ]
            if usable_at:
                await self._sleep(max(0.0, min(usable_at) - self._clock()))
                self._dispatch()

    async def _report_loop(self) -> None:
        outage = Outage(self._unavailable_timeout, clock=self._clock)
        while True:
            await self._throttle_reported.wait()
            self._throttle_reported.clear()
            count, self._throttles_pending = self._throttles_pending, 0
            try:
                await self._backend.report_throttle(count)
            except BackendUnavailable as exc:
                self._throttles_pending += count
                self._throttle_reported.set()
                await outage.failed(exc)
                continue
            outage.ok()
            self.stats["throttle_reports"] += 1

    async def aclose(self) -> None:
        """Give back the leftover tokens (the owner calls this after stopping :meth:`run`)."""
        await self._give_back()
