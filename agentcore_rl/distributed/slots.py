"""SharedSessionLimiter: one process's share of the cluster's session budget.

Slots are leased from the shared actor in batches. A released slot stays here for the
next local rollout (no actor call), up to ``spare_slots`` idle ones; beyond that, or when
the actor says other processes wait and this one holds more than its fair share, slots
go back. One loop renews the holding every ``slot_ttl / 3`` seconds and reports its
absolute size on every call, so a dead process's slots lapse after ``slot_ttl`` and a
restarted actor relearns who holds what. When renewals have failed for ``slot_ttl`` the
actor may have given the idle slots away: they are dropped and only those in use are
reported again.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable

import anyio
import anyio.abc

from agentcore_rl.distributed.backend import (
    BackendUnavailable,
    LimitsBackend,
    Outage,
    SharedLimitsUnavailableError,
)
from agentcore_rl.distributed.config import LimitsConfig

__all__ = ["SharedSessionLimiter"]


class SharedSessionLimiter:
    """Admits this process's sessions within the cluster's budget (``SessionLimiter`` shape).

    ``holder`` names this process to the actor (default: a fresh uuid).

    Example::

        limiter = SharedSessionLimiter(backend, config)
        async with anyio.create_task_group() as tg:
            tg.start_soon(limiter.run)
            await limiter.acquire()
            limiter.release()
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
        self.holder = holder or f"slots-{uuid.uuid4().hex}"
        self._backend = backend
        self._clock = clock
        self._unavailable_timeout = unavailable_timeout
        self.in_use = 0
        self.free = 0
        self._excess = 0  # slots to give back as they are released
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._wake = asyncio.Event()
        self._confirmed = clock()
        self.running = False
        #: leases, slots_leased, renewals, slots_returned, slots_dropped...
        self.stats: Counter[str] = Counter()

    def __repr__(self) -> str:
        return (
            f"SharedSessionLimiter(in_use={self.in_use}, free={self.free}, "
            f"waiting={len(self._waiters)})"
        )

    @property
    def held(self) -> int:
        """Slots this process holds (in use + idle)."""
        return self.in_use + self.free

    @property
    def actor_calls(self) -> int:
        """Calls this limiter made to the shared actor."""
        return self.stats["leases"] + self.stats["renewals"]

    async def acquire(self) -> None:
        """Wait for a slot and take it; cancelling the wait takes none."""
        if not self.running:
            raise RuntimeError("enter the SharedLimits (async with) before acquiring")
        if self.free and not self._waiters:
            self.free -= 1
            self.in_use += 1
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        self._wake.set()
        try:
            await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                self.release()  # handed a slot as we were cancelled
            elif waiter in self._waiters:
                self._waiters.remove(waiter)
            raise

    def release(self) -> None:
        """Give one slot back (to the next local waiter, or to the pool); never blocks."""
        if self.in_use <= 0:
            raise RuntimeError("release() without a matching acquire()")
        if self._excess:
            self._excess -= 1
            self.in_use -= 1
            self._wake.set()  # report the smaller holding soon
            return
        if self._hand_over():
            return
        # Kept here even beyond the spare ones until the next renewal (which gives the
        # surplus back): a batch's next rollouts reuse them without a call.
        self.in_use -= 1
        self.free += 1

    def _hand_over(self) -> bool:
        """Give a slot already in use here to the next waiter; False if none waits."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return True
        return False

    def _fail_waiters(self, error: BaseException) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_exception(error)

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Lease, renew and give back until cancelled (the owner's task group cancels it)."""
        self.running = True
        task_status.started()
        outage = Outage(
            self._unavailable_timeout,
            maximum=min(2.0, self.config.slot_ttl / 6),
            clock=self._clock,
        )
        renew_every = self.config.slot_ttl / 3
        max_wait = min(2.0, renew_every)
        try:
            while True:
                with anyio.move_on_after(renew_every):
                    await self._wake.wait()
                self._wake.clear()
                try:
                    await self._round(max_wait)
                except BackendUnavailable as exc:
                    if await outage.failed(exc):
                        self._fail_waiters(
                            SharedLimitsUnavailableError(
                                f"the shared limits' actor has been unreachable for over "
                                f"{self._unavailable_timeout:g} s: {exc}"
                            )
                        )
                    self._wake.set()
                    continue
                outage.ok()
        finally:
            self.running = False
            self._fail_waiters(RuntimeError("the shared limits were closed"))

    async def _round(self, max_wait: float) -> None:
        now = self._clock()
        if self.free and now - self._confirmed > self.config.slot_ttl:
            # Unconfirmed for a whole lease: the actor may have handed these out again.
            self.stats["slots_dropped"] += self.free
            self.free = 0
        waiting = sum(1 for w in self._waiters if not w.done())
        sent = now
        if waiting:
            # More than asked for, growing with use (a batch soon wants as many again):
            # the next rollouts then start without a call.
            extra = max(self.config.spare_slots // 2, self.in_use)
            want = min(waiting + extra, self.config.max_slot_batch)
            granted, excess = await self._backend.lease_slots(
                self.holder, self.held, want, max_wait
            )
            self.stats["leases"] += 1
            self.stats["slots_leased"] += granted
            self.in_use += granted
            for _ in range(granted):
                if not self._hand_over():
                    self.in_use -= 1
                    self.free += 1
            if granted < waiting:
                self._wake.set()  # still short: ask again at once (the call long-polled)
        else:
            surplus = max(0, self.free - self.config.spare_slots)
            self.free -= surplus
            self.stats["slots_returned"] += surplus
            excess = await self._backend.renew(self.holder, self.held)
            self.stats["renewals"] += 1
        self._confirmed = sent
        if excess:
            # Idle slots go at once; the rest as rollouts end.
            idle = min(self.free, excess)
            self.free -= idle
            self.stats["slots_returned"] += idle
            self._excess = excess - idle
            if idle:
                self._wake.set()

    async def aclose(self) -> None:
        """Report only the slots still in use (the owner calls this after :meth:`run`)."""
        self.stats["slots_returned"] += self.free
        self.free = 0
        with contextlib.suppress(BackendUnavailable):  # else the holding lapses after slot_ttl
            await self._backend.leave(self.holder, self.in_use)
