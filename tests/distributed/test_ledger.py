"""The leasing logic without Ray: time is a number the test passes in."""

from __future__ import annotations

import random

import pytest

from agentcore_rl.distributed.config import LimitsConfig
from agentcore_rl.distributed.ledger import (
    Demand,
    RateLease,
    RateLedger,
    SlotLedger,
    water_fill,
)
from agentcore_rl.errors import ConfigurationError
from tests.distributed.conformance import violations

CONFIG = LimitsConfig(tps=25, sessions=10, slot_ttl=6.0)
ALL = Demand(invoke=25.0)


def test_local_bursts_leave_room_for_latency() -> None:
    assert CONFIG.local_burst_budget == pytest.approx(25 - 25 * 0.2)
    assert CONFIG.local_burst(5.0) == pytest.approx(4.0)
    assert CONFIG.local_burst(0.5) == 1.0  # a bucket must hold a whole token
    with pytest.raises(ConfigurationError, match="latency_margin"):
        LimitsConfig(tps=25, sessions=1, latency_margin=1.0)
    with pytest.raises(ConfigurationError, match="sessions"):
        LimitsConfig(tps=25, sessions=0)


def test_water_fill_is_max_min_fair() -> None:
    assert water_fill(25, {"a": 25, "b": 25}) == {"a": 12.5, "b": 12.5}
    assert water_fill(25, {"a": 2, "b": 25, "c": 25}) == {"a": 2, "b": 11.5, "c": 11.5}
    assert water_fill(25, {}) == {}


def test_a_lone_process_gets_the_whole_rate_then_shares_it() -> None:
    ledger = RateLedger(CONFIG, now=0.0)
    a = ledger.lease("a", held=0, held_for=0, demand=ALL, now=0.0)
    assert a.rate == 25
    assert a.burst == pytest.approx(20)
    assert a.renew_in == CONFIG.lease_period / 2
    b = ledger.lease("b", held=0, held_for=0, demand=ALL, now=0.5)
    assert b.rate == 0  # a holds it all until it hears that it holds less
    assert b.renew_in < CONFIG.lease_period
    a = ledger.lease("a", held=25, held_for=3.5, demand=ALL, now=2.0)
    assert a.rate == 12.5
    assert ledger.committed(2.0) == 25  # the 25 stays counted until a says it heard
    assert ledger.lease("b", held=0, held_for=0, demand=ALL, now=2.1).rate == 0
    ledger.lease("a", held=12.5, held_for=3.9, demand=ALL, now=2.2)
    assert ledger.lease("b", held=0, held_for=0, demand=ALL, now=2.3).rate == 12.5
    assert ledger.committed(2.3) == 25


def test_a_higher_rate_not_acknowledged_ends_with_its_lease() -> None:
    ledger = RateLedger(CONFIG, now=0.0)
    ledger.lease("a", held=0, held_for=0, demand=ALL, now=0.0)
    ledger.lease("b", held=0, held_for=0, demand=ALL, now=0.1)
    assert ledger.lease("a", held=25, held_for=2, demand=ALL, now=2.0).rate == 12.5
    # a never calls again (its answer was lost, then it died): its 25 held until 4.0.
    assert ledger.lease("b", held=0, held_for=0, demand=ALL, now=3.9).rate == 0
    assert ledger.lease("b", held=0, held_for=0, demand=ALL, now=4.0).rate == 12.5


def test_unused_rate_given_back_is_free_at_once() -> None:
    ledger = RateLedger(CONFIG, now=0.0)
    ledger.lease("a", held=0, held_for=0, demand=ALL, now=0.0)
    assert ledger.lease("b", held=0, held_for=0, demand=ALL, now=0.1).rate == 0
    # a's work dried up: it drops to what it uses before it asks.
    assert ledger.lease("a", held=3, held_for=3, demand=Demand(invoke=3), now=1.0).rate == 3
    assert ledger.lease("b", held=0, held_for=0, demand=ALL, now=1.1).rate == 22


def test_invocations_get_the_rate_before_stop_calls_across_processes() -> None:
    ledger = RateLedger(CONFIG, now=0.0)
    stops = ledger.lease("s", held=0, held_for=0, demand=Demand(stop=25), now=0.0)
    assert stops.rate == 25  # nobody else wants any
    ledger.lease("i", held=0, held_for=0, demand=ALL, now=0.5)
    assert ledger.lease("s", held=25, held_for=3.5, demand=Demand(stop=25), now=2.0).rate == 0
    ledger.lease("s", held=0, held_for=0, demand=Demand(stop=25), now=2.1)
    assert ledger.lease("i", held=0, held_for=0, demand=ALL, now=2.2).rate == 25
    # Invocations that need only part of the rate leave the rest to stop calls.
    ledger.lease("i", held=10, held_for=4, demand=Demand(invoke=10), now=3.0)  # dropped first
    assert ledger.lease("s", held=0, held_for=0, demand=Demand(stop=25), now=3.1).rate == 15


def test_a_silent_holder_s_share_lapses_at_its_lease_end() -> None:
    ledger = RateLedger(CONFIG, now=0.0)
    ledger.lease("dead", held=0, held_for=0, demand=ALL, now=0.0)
    assert ledger.lease("live", held=0, held_for=0, demand=ALL, now=1.0).rate == 0
    assert ledger.lease("live", held=0, held_for=0, demand=ALL, now=4.0).rate == 25
    assert ledger.lapsed == 1
    ledger.leave("live", now=4.0)
    assert ledger.superseded("live", seq=99)  # a request of its still waiting is stale
    assert ledger.committed(4.0) == 0
    assert ledger.lapsed == 1  # leaving is not lapsing


def test_a_throttle_anywhere_shrinks_every_share_then_the_rate_recovers() -> None:
    ledger = RateLedger(CONFIG, now=0.0)
    ledger.on_throttle(now=10.0)
    assert ledger.rate(10.0) == pytest.approx(12.5)
    ledger.on_throttle(now=10.5)  # the same event, seen by another call
    assert ledger.rate(10.5) == pytest.approx(12.5 + 0.05 * 25 * 0.5)
    assert ledger.lease("a", held=0, held_for=0, demand=ALL, now=10.5).rate < 13.2
    assert ledger.rate(100.0) == 25
    assert ledger.throttles == 2


def test_after_a_restart_nobody_grows_until_old_shares_lapsed() -> None:
    ledger = RateLedger(CONFIG, now=50.0, restarted=True)
    # A process still holding 10/s from the previous incarnation keeps it, counted.
    assert ledger.lease("old", held=10, held_for=3, demand=ALL, now=50.1).rate == 10
    new = ledger.lease("new", held=0, held_for=0, demand=ALL, now=50.2)
    assert new.rate == 0
    assert new.renew_in <= CONFIG.lease_period
    assert ledger.committed(50.2) == 10
    later = 50.0 + CONFIG.lease_period
    assert ledger.lease("new", held=0, held_for=0, demand=ALL, now=later).rate == 12.5


class _Process:
    """A process as the limiter behaves, reduced: a local bucket at its share, renewals
    at half the lease (answers arrive a few ticks late), random demand, greedy spending
    (the worst case for the quota)."""

    def __init__(self, name: str, rng: random.Random) -> None:
        self.name, self.rng = name, rng
        self.share = self.burst = self.level = 0.0
        self.until = -1.0
        self.renew_at = 0.0
        self.pending: tuple[float, float, RateLease] | None = None  # (arrives, sent, lease)
        self.busy = True

    def tick(self, ledger: RateLedger, now: float, step: float, calls: list[float]) -> None:
        if now >= self.until:
            self.share = self.burst = self.level = 0.0
        else:
            self.level = min(self.burst, self.level + self.share * step)
        if self.pending is not None and self.pending[0] <= now:
            _, sent, lease = self.pending
            self.pending = None
            self.share, self.burst, self.until = lease.rate, lease.burst, sent + lease.period
            self.level = min(self.level, self.burst)
            self.renew_at = now + lease.renew_in
        if self.pending is None and now >= self.renew_at:
            if self.rng.random() < 0.1:
                self.busy = not self.busy
            demand = Demand(invoke=25.0) if self.busy else Demand(stop=self.rng.uniform(0, 5))
            if demand.total < self.share:  # gives back what it does not use
                self.share = demand.total
                self.burst = CONFIG.local_burst(self.share)
                self.level = min(self.level, self.burst)
            held_for = max(0.0, self.until - now)
            lease = ledger.lease(self.name, self.share, held_for, demand, now)
            self.pending = (now + self.rng.choice([0, 1, 3]) * step, now, lease)
        while self.level >= 1:
            self.level -= 1
            calls.append(now)


@pytest.mark.parametrize("seed", range(6))
def test_calls_made_from_shares_conform_to_the_quota(seed: int) -> None:
    """Processes with shifting demand, late answers, a dead one and throttles: their
    calls never exceed the runtime's tps/burst token bucket."""
    rng = random.Random(seed)
    ledger = RateLedger(CONFIG, now=0.0)
    processes = [_Process(f"p{i}", rng) for i in range(4)]
    calls: list[float] = []
    step = 0.01
    for tick in range(3000):  # 30 s
        now = tick * step
        for process in processes:
            if process.name == "p3" and now > 12.0:
                continue  # died at 12 s
            process.tick(ledger, now, step, calls)
        if tick in (1000, 1050, 2000):
            ledger.on_throttle(now)
    assert len(calls) > 25 * 30 * 0.5
    assert violations(calls, rate=25, burst=CONFIG.local_burst_budget) == 0


def test_slots_never_exceed_the_budget_and_dead_holders_lapse() -> None:
    slots = SlotLedger(CONFIG, now=0.0)
    a = slots.enqueue("a", want=8)
    assert slots.grant(a, now=0.0) == 8
    b = slots.enqueue("b", want=8)
    assert slots.grant(b, now=0.0) == 2
    c = slots.enqueue("c", want=1)
    assert slots.grant(c, now=1.0) == 0
    assert slots.excess("a", now=1.0) == 8 - 4  # c waits: fair share is ceil(10 / 3)
    assert slots.delay(c, now=1.0) == pytest.approx(5.0)  # when a lease could lapse
    slots.report("b", held=2, now=5.0)  # b renews, a went silent
    assert slots.grant(c, now=6.5) == 1
    assert slots.held(6.5) == 3
    assert slots.expired_holders == 1


def test_after_a_restart_slots_wait_for_holders_to_report() -> None:
    slots = SlotLedger(CONFIG, now=0.0, restarted=True)
    waiting = slots.enqueue("new", want=10)
    slots.report("old", held=9, now=1.0)  # still running 9 sessions from before
    assert slots.grant(waiting, now=1.0) == 0
    assert slots.delay(waiting, now=1.0) == pytest.approx(5.0)
    slots.report("old", held=9, now=5.0)
    assert slots.grant(waiting, now=6.0) == 1
    # A holder that comes back with more than is free is believed (those sessions run);
    # nothing more is granted until the cluster is back under the budget.
    slots.report("late", held=3, now=6.0)
    again = slots.enqueue("new", want=1)
    assert slots.grant(again, now=6.0) == 0
    assert slots.held(6.0) == 13


def test_a_leaving_holder_gets_no_late_grant() -> None:
    slots = SlotLedger(CONFIG, now=0.0)
    blocker = slots.enqueue("a", want=10)
    assert slots.grant(blocker, now=0.0) == 10
    pending = slots.enqueue("b", want=4)  # b's long-poll is on its way when b closes
    slots.leave("b", held=0, now=1.0)
    slots.report("a", held=0, now=1.0)
    assert slots.grant(pending, now=1.0) == 0
    assert slots.held(1.0) == 0
