"""LimitsActor: the shared limits' state as an async Ray actor (a thin shell over the ledgers).

Rate calls answer at once (a share, possibly none, and when to ask again); slot leases
long-poll up to ``max_wait`` seconds for a grant, so a process waiting for slots costs one
call per grant, not one per poll. The class is plain
Python: ``shared_limits`` wraps it with ``ray.remote``; tests may call it in-process.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import anyio

from agentcore_rl.distributed.config import LimitsConfig
from agentcore_rl.distributed.ledger import Demand, RateLease, RateLedger, SlotLedger

__all__ = ["LimitsActor"]


def _was_restarted() -> bool:
    """Whether Ray is running this actor again after its process died."""
    import ray  # only inside a Ray actor

    with warnings.catch_warnings():
        # Ray's own property reads a deprecated one internally (Ray 2.5x).
        warnings.simplefilter("ignore", DeprecationWarning)
        return bool(ray.get_runtime_context().was_current_actor_reconstructed)


class LimitsActor:
    """One cluster-wide token bucket and session budget (see :mod:`.ledger`).

    ``restarted`` (default: asked from Ray) starts both ledgers conservatively: no grant
    until every lease of the previous incarnation has lapsed or been reported again.

    Example::

        handle = ray.remote(LimitsActor).options(name="acr-math", lifetime="detached",
                                                  max_restarts=-1).remote(config)
    """

    def __init__(
        self,
        config: LimitsConfig,
        *,
        restarted: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.restarted = _was_restarted() if restarted is None else restarted
        self._clock = clock
        now = clock()
        self.rates = RateLedger(config, now, restarted=self.restarted)
        self.slots = SlotLedger(config, now, restarted=self.restarted)
        self._changed: asyncio.Event | None = None
        self.calls = 0

    def __repr__(self) -> str:
        return f"LimitsActor(tps={self.config.tps:g}, sessions={self.config.sessions})"

    def _notify(self) -> None:
        # Waiters hold the event they saw; a fresh one is for the next change.
        if self._changed is not None:
            self._changed.set()
            self._changed = None

    async def _wait_for_change(self, seconds: float) -> None:
        if self._changed is None:
            self._changed = asyncio.Event()
        changed = self._changed
        with anyio.move_on_after(seconds):
            await changed.wait()

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
        """``holder`` uses ``held`` calls/s for ``held_for`` more seconds and could use
        ``demand``; it saw ``throttles`` throttle answers since its last call. Its share,
        as soon as that differs from ``held`` or after ``max_wait`` seconds (the call is
        also the renewal). ``seq`` numbers the holder's requests: one it abandoned for a
        newer one ends without effect."""
        self.calls += 1
        start = self._clock()
        for _ in range(max(0, throttles)):
            self.rates.on_throttle(start)
        self._notify()  # an abandoned request of this holder's must end
        while True:
            now = self._clock()
            if self.rates.superseded(holder, seq):
                return RateLease(0.0, 0.0, 0.0, 0.0)
            lease = self.rates.lease(holder, held, held_for - (now - start), demand, now, seq)
            left = start + max_wait - now
            if abs(lease.rate - held) > 1e-6 or left <= 0:
                self._notify()  # a share lowered or given back may be someone's room
                return dataclasses.replace(lease, waited=now - start)
            # Room may also come without a call (a share lapsing, the restart hold ending).
            await self._wait_for_change(min(left, lease.renew_in) if lease.refused else left)

    async def leave_rate(self, holder: str) -> None:
        """``holder`` makes no more calls: its share is free."""
        self.calls += 1
        self.rates.leave(holder, self._clock())
        self._notify()

    async def lease_slots(
        self, holder: str, held: int, want: int, max_wait: float
    ) -> tuple[int, int]:
        """``holder`` holds ``held`` slots and wants ``want`` more: (granted, excess to
        give back). Waits up to ``max_wait`` for a grant."""
        self.calls += 1
        self.slots.report(holder, held, self._clock())
        ticket = self.slots.enqueue(holder, want)
        deadline = self._clock() + max_wait
        try:
            while True:
                now = self._clock()
                granted = self.slots.grant(ticket, now)
                if granted:
                    return granted, 0
                left = deadline - now
                if left <= 0:
                    return 0, self.slots.excess(holder, now)
                delay = self.slots.delay(ticket, now)
                await self._wait_for_change(left if delay is None else min(left, delay))
        finally:
            self.slots.withdraw(ticket)
            self._notify()

    async def renew(self, holder: str, held: int) -> int:
        """``holder`` is alive and holds ``held`` slots; return how many to give back."""
        self.calls += 1
        now = self._clock()
        before = self.slots.holding(holder)
        self.slots.report(holder, held, now)
        if held < before:
            self._notify()
        return self.slots.excess(holder, now)

    async def leave(self, holder: str, held: int) -> None:
        """``holder`` is closing and still uses ``held`` slots (they lapse unless 0)."""
        self.calls += 1
        self.slots.leave(holder, held, self._clock())
        self._notify()

    async def status(self) -> dict[str, Any]:
        """The configuration and a snapshot of the state (for checks and benchmarks)."""
        now = self._clock()
        return {
            "config": asdict(self.config),
            "restarted": self.restarted,
            "rate": self.rates.rate(now),
            "rate_committed": self.rates.committed(now),
            "rate_holders": self.rates.holders,
            "rate_grants": self.rates.grants,
            "rate_lapsed": self.rates.lapsed,
            "throttles": self.rates.throttles,
            "slots_held": self.slots.held(now),
            "slot_waiting": self.slots.waiting,
            "expired_holders": self.slots.expired_holders,
            "calls": self.calls,
        }
