"""The leasing logic of the shared limits, pure: no Ray, no asyncio, time passed in.

:class:`RateLedger` leases *shares of the rate* (a process may make ``r`` calls per
second for the next lease period); :class:`SlotLedger` leases session slots to holders
that must renew. The Ray actor is a thin shell over these; tests drive them with plain
numbers for ``now``.

Example::

    rates = RateLedger(LimitsConfig(tps=25, sessions=500), now=0.0)
    lease = rates.lease("worker-1", held=0.0, held_for=0.0, demand=Demand(invoke=25), now=0.0)
    lease.rate        # 25.0: alone, it gets the whole quota
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from agentcore_rl.distributed.config import LimitsConfig

__all__ = ["Demand", "RateLease", "RateLedger", "SlotLedger"]

# A process asking for nothing more than it holds is told to renew at half its lease;
# one refused room asks again when some may have freed, but not more often than this.
_MIN_RENEW = 0.1
# Rates below this (calls per second) are no share at all.
_TINY = 1e-6


@dataclass(frozen=True)
class Demand:
    """Calls per second a process could use, by class: invocations, then stop calls.
    A class with callers waiting for tokens asks for the whole quota.
    """

    invoke: float = 0.0
    stop: float = 0.0

    @property
    def total(self) -> float:
        """Both classes together."""
        return self.invoke + self.stop


@dataclass(frozen=True)
class RateLease:
    """A share: ``rate`` calls per second with a local burst of ``burst`` tokens, for
    ``period`` seconds counted from when the request was sent; ``renew_in``: when to look
    again (sooner when refused: when some room may free up without a call).
    """

    rate: float
    burst: float
    period: float
    renew_in: float
    #: Less than the holder's fair part: room may free up soon.
    refused: bool = False
    #: Tokens the local bucket starts with (the quota's unused burst, once).
    initial: float = 0.0
    #: Another holder has invocations waiting: stop calls here must wait.
    others_invoking: bool = False
    #: Seconds the request waited at the actor before this answer (the period starts
    #: then, for the holder too: its clock adds this to when it sent the request).
    waited: float = 0.0


@dataclass
class _Share:
    demand: Demand
    rate: float = 0.0
    until: float = -math.inf
    # A higher rate granted before a lower one: the holder may use it until it has heard
    # the lower one (it says so in its next request) or until that lease ends.
    old_rate: float = 0.0
    old_until: float = -math.inf
    # The holder's latest request: an earlier one still waiting is answered to nobody.
    seq: int = -1

    def committed(self, now: float) -> float:
        """The most the holder may be using at ``now``."""
        current = self.rate if self.until > now else 0.0
        return max(current, self.old_rate if self.old_until > now else 0.0)

    def held_to(self, held: float) -> None:
        """The holder says it uses at most ``held``: what it has heard binds it."""
        self.rate = min(self.rate, held)
        self.old_rate = min(self.old_rate, held)


def water_fill(capacity: float, demands: dict[str, float]) -> dict[str, float]:
    """Max-min fair split of ``capacity``: nobody gets more than its demand, and what
    the modest ones leave is split evenly among the others."""
    shares: dict[str, float] = {}
    left = max(0.0, capacity)
    ordered = sorted(demands.items(), key=lambda item: item[1])
    for i, (name, want) in enumerate(ordered):
        give = min(max(0.0, want), left / (len(ordered) - i))
        shares[name] = give
        left -= give
    return shares


class RateLedger:
    """The cluster's rate, leased out as shares that sum to at most the current rate.

    Each request names its holder, the rate it uses right now (``held``, lower than its
    last grant once it has heard a lower one or given some back) and for how much longer
    (``held_for``), and its :class:`Demand`. The ledger splits the current rate max-min
    fairly by demand, invocations before stop calls, and answers the holder's part of
    it: at once when that is less than it holds (the higher rate stays counted until the
    holder reports it has heard, or its lease ends), and as far as the others' shares
    leave room when it is more. A holder that stops renewing loses its share when its
    lease ends. The shares' local bursts also sum to at most
    :attr:`LimitsConfig.local_burst_budget`, so the cluster's calls conform to the
    quota's token bucket.

    After an actor restart (``restarted``) the ledger does not know the shares the
    previous incarnation granted: for one lease period nobody gets more than it reports
    holding, and by then every unreported share has lapsed.
    """

    def __init__(self, config: LimitsConfig, now: float, *, restarted: bool = False) -> None:
        self.config = config
        self._hold_until = now + config.lease_period if restarted else now
        self._throttled_rate = config.tps
        self._throttled_at: float | None = None
        self._shares: dict[str, _Share] = {}
        # Holders that left, and when: a request of theirs still waiting is stale.
        self._left: dict[str, float] = {}
        # The runtime's bucket is full before the cluster's first call: the first full
        # grant may start with that burst. Not after a restart (the state is unknown).
        self._initial_burst = 0.0 if restarted else config.local_burst_budget
        self.throttles = 0
        self.grants = 0
        self.lapsed = 0

    def rate(self, now: float) -> float:
        """The current shared rate (lower after a throttle, recovering linearly)."""
        if self._throttled_at is None:
            return self.config.tps
        regained = self.config.recovery * self.config.tps * (now - self._throttled_at)
        rate = self._throttled_rate + regained
        if rate >= self.config.tps:
            self._throttled_at = None
            return self.config.tps
        return rate

    def committed(self, now: float) -> float:
        """The sum of the shares in force."""
        self._sweep(now)
        return sum(share.committed(now) for share in self._shares.values())

    def holding(self, holder: str, now: float) -> float:
        """The share ``holder`` may be using at ``now``."""
        share = self._shares.get(holder)
        return 0.0 if share is None else share.committed(now)

    @property
    def holders(self) -> int:
        """Holders the ledger knows of (with or without a share)."""
        return len(self._shares)

    def _sweep(self, now: float) -> None:
        for name, share in list(self._shares.items()):
            if share.until <= now and share.old_until <= now:
                if share.rate > _TINY:
                    self.lapsed += 1  # it held a share and stopped renewing
                del self._shares[name]

    def _targets(self, now: float) -> dict[str, float]:
        cap = self.config.tps
        invoke = water_fill(
            self.rate(now), {h: min(s.demand.invoke, cap) for h, s in self._shares.items()}
        )
        left = self.rate(now) - sum(invoke.values())
        stop = water_fill(left, {h: min(s.demand.stop, cap) for h, s in self._shares.items()})
        return {h: invoke[h] + stop[h] for h in self._shares}

    def superseded(self, holder: str, seq: int) -> bool:
        """Whether ``holder`` sent a request after its request ``seq`` (which it then
        abandoned: its answer must change nothing)."""
        if holder in self._left:
            return True
        share = self._shares.get(holder)
        return share is not None and share.seq > seq

    def lease(
        self, holder: str, held: float, held_for: float, demand: Demand, now: float, seq: int = 0
    ) -> RateLease:
        """Answer ``holder``'s request number ``seq`` (see the class docstring)."""
        self._sweep(now)
        config = self.config
        share = self._shares.get(holder)
        if share is None:
            share = self._shares[holder] = _Share(demand)
            if held > _TINY and held_for > 0 and now < self._hold_until:
                # Granted by an earlier incarnation of the actor: in force, so counted.
                # (Otherwise a share the ledger forgot has lapsed at the holder too: it
                # ends there no later than here.)
                share.rate, share.until = held, now + held_for
        else:
            share.held_to(max(0.0, held))
        share.demand = demand
        share.seq = max(share.seq, seq)
        current = share.committed(now)
        target = self._targets(now)[holder]
        others = [s.committed(now) for h, s in self._shares.items() if h != holder]
        if target <= current or now < self._hold_until:
            new = min(target, current)
        else:
            room = self.rate(now) - sum(others)
            others_burst = sum(config.local_burst(r) for r in others)
            if others_burst + config.local_burst(_TINY * 2) > config.local_burst_budget + 1e-9:
                burst_room = 0.0
            else:
                burst_room = (config.local_burst_budget - others_burst) / config.burst_seconds
            new = max(current, min(target, room, burst_room))
        if new < _TINY:
            new = 0.0
        if new < current:
            share.old_rate = current
            share.old_until = max(share.until, share.old_until)
        else:
            share.old_rate, share.old_until = 0.0, -math.inf
        share.rate, share.until = new, now + config.lease_period
        self.grants += 1
        half = config.lease_period / 2
        renew_in = half
        if new < target - _TINY:
            # Refused room: ask again when someone's higher rate ends (or the hold does).
            ends = [s.old_until for h, s in self._shares.items() if h != holder]
            ends += [s.until for h, s in self._shares.items() if h != holder and s.rate > 0]
            ends.append(self._hold_until)
            later = [end - now for end in ends if end > now]
            renew_in = min([half, *later])
        refused = new < target - _TINY
        initial = 0.0
        if new > 0 and not refused and self._initial_burst > 0:
            initial = min(self._initial_burst, config.local_burst(new))
            self._initial_burst = 0.0
        others_invoking = any(
            s.demand.invoke >= config.tps - _TINY for h, s in self._shares.items() if h != holder
        )
        return RateLease(
            new,
            config.local_burst(new),
            config.lease_period,
            max(_MIN_RENEW, renew_in),
            refused=refused,
            initial=initial,
            others_invoking=others_invoking,
        )

    def leave(self, holder: str, now: float) -> None:
        """``holder`` has stopped making calls: its share is free at once."""
        self._shares.pop(holder, None)
        self._left[holder] = now
        # A request waits at most a lease period: older departures can be forgotten.
        horizon = now - 2 * self.config.lease_period
        for name, when in list(self._left.items()):
            if when < horizon:
                del self._left[name]

    def on_throttle(self, now: float) -> None:
        """A process was answered "too many requests": cut the shared rate (the shares
        follow as their holders renew)."""
        self.throttles += 1
        if (
            self._throttled_at is not None
            and now - self._throttled_at < self.config.throttle_cooldown
        ):
            return
        self._throttled_rate = max(
            self.config.floor_rate, self.rate(now) * self.config.throttle_factor
        )
        self._throttled_at = now


@dataclass
class _Holding:
    count: int
    expires_at: float


class SlotLedger:
    """The cluster's session budget, leased to holders (one per process) that renew.

    A holder reports the absolute number of slots it holds on every call, so a lost
    answer or a restarted actor heals at the next call. A holder that stops renewing for
    ``slot_ttl`` seconds (its process died) loses its slots. Requests are served FIFO.
    When others wait, a holder above its fair share is asked to give the excess back.
    After an actor restart (``restarted``) no slot is granted for ``slot_ttl`` seconds,
    time for every live holder to report what it still holds.
    """

    def __init__(self, config: LimitsConfig, now: float, *, restarted: bool = False) -> None:
        self.config = config
        self.budget = config.sessions
        self._recovering_until = now + config.slot_ttl if restarted else now
        self._holders: dict[str, _Holding] = {}
        self._queue: list[tuple[int, str, int]] = []  # (ticket, holder, want), FIFO
        self._tickets = itertools.count()
        self.expired_holders = 0

    def held(self, now: float) -> int:
        """Slots held by live holders."""
        self.sweep(now)
        return sum(h.count for h in self._holders.values())

    def holding(self, holder: str) -> int:
        """What ``holder`` holds as far as the ledger knows."""
        found = self._holders.get(holder)
        return 0 if found is None else found.count

    @property
    def waiting(self) -> int:
        """How many lease requests are queued."""
        return len(self._queue)

    def sweep(self, now: float) -> None:
        """Take back the slots of holders that stopped renewing."""
        for name, holding in list(self._holders.items()):
            if holding.expires_at <= now:
                del self._holders[name]
                self.expired_holders += 1

    def report(self, holder: str, held: int, now: float) -> None:
        """``holder`` is alive and holds ``held`` slots (0: none, forget it)."""
        if held <= 0:
            self._holders.pop(holder, None)
        else:
            self._holders[holder] = _Holding(held, now + self.config.slot_ttl)

    def enqueue(self, holder: str, want: int) -> int:
        """Queue ``holder``'s request for up to ``want`` more slots; return its ticket."""
        ticket = next(self._tickets)
        self._queue.append((ticket, holder, max(1, want)))
        return ticket

    def withdraw(self, ticket: int) -> None:
        """Forget a request."""
        self._queue = [entry for entry in self._queue if entry[0] != ticket]

    def leave(self, holder: str, held: int, now: float) -> None:
        """``holder`` is closing: drop its pending requests (a grant still on its way
        would go to nobody) and keep only the ``held`` slots still in use."""
        self._queue = [entry for entry in self._queue if entry[1] != holder]
        self.report(holder, held, now)

    def grant(self, ticket: int, now: float) -> int:
        """Slots granted to the head request ``ticket`` now (0: not yet)."""
        if not self._queue or self._queue[0][0] != ticket or now < self._recovering_until:
            return 0
        free = self.budget - self.held(now)
        if free <= 0:
            return 0
        _, holder, want = self._queue.pop(0)
        count = min(want, free, self.config.max_slot_batch)
        self.report(holder, self.holding(holder) + count, now)
        return count

    def delay(self, ticket: int, now: float) -> float | None:
        """Seconds until a grant could happen without any call (a lease lapsing, the
        recovery ending); ``None``: only a call can change it."""
        if not self._queue or self._queue[0][0] != ticket:
            return None
        if now < self._recovering_until:
            return self._recovering_until - now
        self.sweep(now)
        if not self._holders:
            return None
        return max(0.0, min(h.expires_at for h in self._holders.values()) - now)

    def excess(self, holder: str, now: float) -> int:
        """How many slots ``holder`` should give back: its count above a fair share while
        another holder waits (0 when nobody else does)."""
        others = {name for _, name, _ in self._queue if name != holder}
        if not others:
            return 0
        self.sweep(now)
        clients = set(self._holders) | others | {holder}
        fair = math.ceil(self.budget / len(clients))
        return max(0, self.holding(holder) - fair)
