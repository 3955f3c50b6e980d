"""The leasing logic of the shared limits, pure: no Ray, no asyncio, time passed in.

:class:`TokenLedger` leases call tokens in batches that expire; :class:`SlotLedger` leases
session slots to holders that must renew. The Ray actor is a thin shell that waits on
these; tests drive them with plain numbers for ``now``.

Example::

    tokens = TokenLedger(LimitsConfig(tps=25, sessions=500), now=0.0)
    ticket = tokens.enqueue(want=10, priority=Priority.INVOKE)
    grant = tokens.grant(ticket, now=0.5)     # TokenGrant(count=10, ttl=0.4) or None
"""

from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass

from agentcore_rl.client.bucket import Priority
from agentcore_rl.distributed.config import LimitsConfig

__all__ = ["SlotLedger", "TokenGrant", "TokenLedger"]

# Float refills land a hair below a whole token after waiting exactly the deficit.
_EPSILON = 1e-9


@dataclass(frozen=True)
class TokenGrant:
    """``count`` tokens, each valid for one call within ``ttl`` seconds of the grant;
    ``waited``: how long the request waited at the actor before the grant.

    Example::

        TokenGrant(count=8, ttl=0.4)
    """

    count: int
    ttl: float
    waited: float = 0.0


class TokenLedger:
    """The cluster's token bucket, leased out by priority (lower first, then FIFO).

    A grant goes to the head request only, once the bucket holds what it asked for or a
    batch (:meth:`LimitsConfig.batch_target`), so grants are few and large. Returned tokens
    keep the expiry they were leased with, so a token is spent within ``token_ttl`` of
    leaving the bucket whoever spends it. After an actor restart (``restarted``) nothing
    is granted until every earlier lease has expired, the bucket starts empty and the rate
    starts as just after a throttle: the old incarnation's state is unknown.

    Example::

        ledger = TokenLedger(config, now=clock())
        ledger.on_throttle(now=clock())           # any process saw a 429: halve the rate
    """

    def __init__(self, config: LimitsConfig, now: float, *, restarted: bool = False) -> None:
        self.config = config
        self._level = 0.0 if restarted else config.capacity
        self._last = now
        self._hold_until = now + config.token_ttl if restarted else now
        self._throttled_rate = config.tps
        self._throttled_at: float | None = None
        # Returned tokens: [expires_at, count], soonest expiry first.
        self._returned: list[tuple[float, int]] = []
        self._queue: list[tuple[int, int]] = []  # (priority, ticket)
        self._wants: dict[int, int] = {}
        self._tickets = itertools.count()
        # When an invocation last asked: stop calls wait until invocations have been quiet
        # for a batch window (a process asks again a round trip after each grant).
        self._invoked_at = -math.inf
        self.throttles = 0
        self.granted = 0
        self.grants = 0
        if restarted:
            self._cut(now)

    def rate(self, now: float) -> float:
        """The current refill rate (lower after a throttle, recovering linearly)."""
        if self._throttled_at is None:
            return self.config.tps
        regained = self.config.recovery * self.config.tps * (now - self._throttled_at)
        rate = self._throttled_rate + regained
        if rate >= self.config.tps:
            self._throttled_at = None
            return self.config.tps
        return rate

    def _refill(self, now: float) -> None:
        elapsed = now - self._last
        if elapsed > 0:
            self._level = min(self.config.capacity, self._level + elapsed * self.rate(now))
            self._last = now
        while self._returned and self._returned[0][0] <= now:
            heapq.heappop(self._returned)

    def _available(self) -> int:
        return math.floor(self._level + _EPSILON) + sum(n for _, n in self._returned)

    @property
    def waiting(self) -> int:
        """How many lease requests are queued."""
        return len(self._queue)

    def enqueue(self, want: int, priority: int = Priority.INVOKE, now: float = 0.0) -> int:
        """Queue a request for up to ``want`` tokens; return its ticket."""
        ticket = next(self._tickets)
        heapq.heappush(self._queue, (int(priority), ticket))
        self._wants[ticket] = max(1, want)
        if priority < Priority.STOP:
            self._invoked_at = max(self._invoked_at, now)
        return ticket

    def withdraw(self, ticket: int) -> None:
        """Forget a request (granted, timed out or abandoned)."""
        if self._wants.pop(ticket, None) is not None:
            self._queue = [entry for entry in self._queue if entry[1] != ticket]
            heapq.heapify(self._queue)

    def _stops_held(self, now: float) -> float:
        """Seconds stop calls still wait for invocations to go quiet (0: they may go)."""
        if self._queue[0][0] < Priority.STOP:
            return 0.0
        return max(0.0, self._invoked_at + self.config.batch_window - now)

    def _need(self, ticket: int, now: float) -> int:
        return min(self._wants[ticket], self.config.batch_target(self.rate(now)))

    def grant(self, ticket: int, now: float) -> TokenGrant | None:
        """Grant the request ``ticket`` if it is at the head and enough tokens are there."""
        if ticket not in self._wants or self._queue[0][1] != ticket or now < self._hold_until:
            return None
        if self._stops_held(now) > 0:
            return None
        self._refill(now)
        if self._available() < self._need(ticket, now):
            return None
        count = min(self._wants[ticket], self.config.max_token_batch, self._available())
        ttl = self.config.token_ttl
        taken = 0
        while taken < count and self._returned:
            expires, n = heapq.heappop(self._returned)
            use = min(n, count - taken)
            taken += use
            ttl = min(ttl, expires - now)
            if n > use:
                heapq.heappush(self._returned, (expires, n - use))
        self._level -= count - taken
        self.withdraw(ticket)
        self.granted += count
        self.grants += 1
        return TokenGrant(count, ttl)

    def delay(self, ticket: int, now: float) -> float | None:
        """Seconds until ``ticket`` could be granted; ``None``: not before the queue moves."""
        if ticket not in self._wants or self._queue[0][1] != ticket:
            return None
        if now < self._hold_until:
            return self._hold_until - now
        held = self._stops_held(now)
        if held > 0:
            return held
        self._refill(now)
        have = self._level + sum(n for _, n in self._returned)
        return max(0.0, (self._need(ticket, now) - have) / self.rate(now))

    def give_back(self, count: int, ttl_left: float, now: float) -> None:
        """Take back ``count`` unspent tokens that stay valid ``ttl_left`` more seconds."""
        if count > 0 and ttl_left > 0:
            heapq.heappush(self._returned, (now + ttl_left, count))

    def _cut(self, now: float) -> None:
        self._throttled_rate = max(
            self.config.floor_rate, self.rate(now) * self.config.throttle_factor
        )
        self._throttled_at = now

    def on_throttle(self, now: float) -> None:
        """A process was answered "too many requests": cut the rate, empty the bucket."""
        self.throttles += 1
        self._refill(now)
        self._level = min(self._level, 0.0)
        self._returned.clear()
        last = self._throttled_at
        if last is not None and now - last < self.config.throttle_cooldown:
            return
        self._cut(now)


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

    Example::

        slots = SlotLedger(config, now=clock())
        slots.report("worker-1", held=3, now=clock())
        ticket = slots.enqueue("worker-1", want=8)
        granted = slots.grant(ticket, now=clock())    # 0 until slots are free
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
