"""The leasing logic without Ray: time is a number the test passes in."""

from __future__ import annotations

import random

import pytest

from agentcore_rl.client.bucket import Priority
from agentcore_rl.distributed.config import LimitsConfig
from agentcore_rl.distributed.ledger import SlotLedger, TokenGrant, TokenLedger
from agentcore_rl.errors import ConfigurationError
from tests.distributed.conformance import violations

CONFIG = LimitsConfig(tps=25, sessions=10, slot_ttl=6.0)


def test_capacity_leaves_room_for_tokens_in_flight() -> None:
    assert CONFIG.capacity == pytest.approx(25 - 25 * 0.4)
    with pytest.raises(ConfigurationError, match="token_ttl"):
        LimitsConfig(tps=25, sessions=1, token_ttl=1.0)
    with pytest.raises(ConfigurationError, match="sessions"):
        LimitsConfig(tps=25, sessions=0)


def test_a_grant_is_a_batch_from_the_head_request() -> None:
    ledger = TokenLedger(CONFIG, now=0.0)
    first = ledger.enqueue(want=10)
    second = ledger.enqueue(want=10)
    assert ledger.grant(second, now=0.0) is None  # not the head
    assert ledger.grant(first, now=0.0) == TokenGrant(10, CONFIG.token_ttl)
    # 5 left: the next head waits for a batch (min(want, 12 = 0.5 s at 25/s)).
    assert ledger.grant(second, now=0.0) is None
    delay = ledger.delay(second, now=0.0)
    assert delay is not None
    assert delay == pytest.approx(5 / 25)
    assert ledger.grant(second, now=delay) == TokenGrant(10, CONFIG.token_ttl)


def test_invocations_are_served_before_stop_calls_across_processes() -> None:
    ledger = TokenLedger(CONFIG, now=0.0)
    drain = ledger.enqueue(want=15)
    assert ledger.grant(drain, now=0.0) is not None
    stop = ledger.enqueue(want=5, priority=Priority.STOP, now=0.0)
    invoke = ledger.enqueue(want=5, priority=Priority.INVOKE, now=0.9)
    assert ledger.delay(stop, now=0.9) is None
    assert ledger.grant(stop, now=1.0) is None
    assert ledger.grant(invoke, now=1.0) == TokenGrant(5, CONFIG.token_ttl)
    # Stops wait until invocations have been quiet for a batch window.
    assert ledger.grant(stop, now=1.0) is None
    assert ledger.delay(stop, now=1.0) == pytest.approx(0.4)
    assert ledger.grant(stop, now=1.4) == TokenGrant(5, CONFIG.token_ttl)


def test_returned_tokens_keep_their_expiry() -> None:
    ledger = TokenLedger(CONFIG, now=0.0)
    ticket = ledger.enqueue(want=15)
    assert ledger.grant(ticket, now=0.0) == TokenGrant(15, 0.4)
    ledger.give_back(4, ttl_left=0.1, now=0.3)
    ticket = ledger.enqueue(want=4)
    grant = ledger.grant(ticket, now=0.35)
    assert grant is not None
    assert grant.count == 4
    assert grant.ttl == pytest.approx(0.05)  # still due at 0.4, whoever holds them
    ledger.give_back(3, ttl_left=0.1, now=1.0)
    ticket = ledger.enqueue(want=3)
    assert ledger.delay(ticket, now=1.2) == pytest.approx(3 / 25 - 0.0, abs=0.3)
    grant = ledger.grant(ticket, now=1.2)
    assert grant is None or grant.ttl == pytest.approx(0.4)  # expired ones are gone


def test_a_throttle_anywhere_halves_the_shared_rate_then_it_recovers() -> None:
    ledger = TokenLedger(CONFIG, now=0.0)
    ledger.on_throttle(now=10.0)
    assert ledger.rate(10.0) == pytest.approx(12.5)
    ledger.on_throttle(now=10.5)  # the same event, seen by another call
    assert ledger.rate(10.5) == pytest.approx(12.5 + 0.05 * 25 * 0.5)
    ledger.on_throttle(now=12.0)
    assert ledger.rate(12.0) < 12.5
    assert ledger.rate(100.0) == 25
    assert ledger.throttles == 3


def test_after_a_restart_nothing_is_granted_until_old_leases_lapsed() -> None:
    ledger = TokenLedger(CONFIG, now=50.0, restarted=True)
    ticket = ledger.enqueue(want=5)
    assert ledger.grant(ticket, now=50.0) is None
    assert ledger.delay(ticket, now=50.0) == pytest.approx(CONFIG.token_ttl)
    assert ledger.rate(50.0) == pytest.approx(12.5)  # starts as after a throttle
    assert ledger.grant(ticket, now=50.3) is None
    assert ledger.grant(ticket, now=50.0 + CONFIG.token_ttl + 5 / 12.5 + 0.01) is not None


@pytest.mark.parametrize("seed", range(8))
def test_calls_from_leased_tokens_conform_to_the_quota(seed: int) -> None:
    """Processes that pause (so the runtime's bucket fills up) then lease greedily, spend
    each grant at once at a random point of its life (right before expiry is the worst
    case), give some back, see throttles: the calls never exceed a tps/burst token
    bucket, the runtime's own limiter."""
    rng = random.Random(seed)
    ledger = TokenLedger(CONFIG, now=0.0)
    calls: list[float] = []
    tickets: list[int | None] = [None] * 4
    step = 0.005
    for tick in range(6000):  # 30 s
        now = tick * step
        busy = (now % 3.0) < 1.8  # then 1.2 s of silence
        for i, ticket in enumerate(tickets):
            if ticket is None:
                if busy:
                    tickets[i] = ledger.enqueue(rng.randint(1, 16), rng.choice([0, 10]), now)
                continue
            grant = ledger.grant(ticket, now)
            if grant is None:
                continue
            tickets[i] = None
            spend = grant.count
            if rng.random() < 0.2 and grant.count > 1:  # give some back, half-way
                back = rng.randint(1, grant.count - 1)
                ledger.give_back(back, grant.ttl / 2, now + grant.ttl / 2)
                spend -= back
            spent_at = now + rng.choice([0.0, rng.uniform(0, grant.ttl), grant.ttl * 0.999])
            calls.extend([spent_at] * spend)
        if tick in (2000, 2100, 4000):  # throttles at 10 s, 10.5 s and 20 s
            ledger.on_throttle(now)
    assert len(calls) > 25 * 30 * 0.4
    assert violations(calls, rate=25, burst=25) == 0


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
