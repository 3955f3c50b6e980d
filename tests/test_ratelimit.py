"""TokenBucket: rate, burst, priorities, throttling and recovery, on a virtual clock."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import pytest

from agentcore_rl.errors import ConfigurationError
from agentcore_rl.ratelimit import Priority, TokenBucket
from tests.client.fakeclock import FakeClock, settle


def make(rate: float, burst: float, clock: FakeClock, tick: float = 0.0) -> TokenBucket:
    return TokenBucket(rate, burst, tick=tick, clock=clock, sleep=clock.sleep)


async def test_burst_is_available_at_once_then_rate_applies() -> None:
    clock = FakeClock()
    bucket = make(10, 5, clock)
    for _ in range(5):
        assert bucket.try_acquire()
    assert not bucket.try_acquire()
    clock.advance(0.1)
    assert bucket.try_acquire()
    assert not bucket.try_acquire()


async def test_acquire_paces_at_the_rate() -> None:
    clock = FakeClock()
    bucket = make(4, 2, clock)
    done: list[float] = []

    async def take(n: int) -> None:
        for _ in range(n):
            await bucket.acquire()
            done.append(clock.now)

    task = asyncio.create_task(take(10))
    for _ in range(100):  # bounded: each round moves virtual time by 50 ms
        await settle()
        if task.done():
            break
        clock.advance(0.05)
    await task
    start = done[0]
    assert done[:2] == [start, start]  # the burst
    # the other 8 follow at 4 per second: the last one 2 s after the burst
    assert done[-1] - start == pytest.approx(2.0, abs=0.051)
    gaps = [b - a for a, b in itertools.pairwise(done[1:])]
    assert all(g == pytest.approx(0.25, abs=0.051) for g in gaps)


async def test_tick_sends_the_waiters_of_one_tick_together_at_the_same_rate() -> None:
    clock = FakeClock(start=1000.0)
    bucket = make(25, 25, clock, tick=0.2)
    for _ in range(25):  # an empty bucket at 1000.0: each of the 20 takes waits
        assert bucket.try_acquire()
    done: list[float] = []

    async def take(n: int) -> None:
        for _ in range(n):
            await bucket.acquire()
            done.append(round(clock.now, 6))

    tasks = [asyncio.create_task(take(10)) for _ in range(2)]
    for _ in range(200):  # bounded: each round moves virtual time by 10 ms
        await settle()
        if all(t.done() for t in tasks):
            break
        clock.advance(0.01)
    assert all(t.done() for t in tasks)
    # Every wait ended on the 0.2 s grid, five tokens each: still 25 per second.
    ticks = sorted(set(done))
    assert all(abs(t / 0.2 - round(t / 0.2)) < 1e-6 for t in ticks)
    assert [done.count(t) for t in ticks] == [5, 5, 5, 5]
    assert ticks[-1] == pytest.approx(1000.8)


async def test_tick_never_costs_tokens_to_a_small_burst() -> None:
    clock = FakeClock()
    bucket = make(25, 1, clock, tick=0.2)  # a 0.2 s grid would lose 4 of every 5 tokens
    assert bucket.try_acquire()
    done: list[float] = []

    async def take() -> None:
        for _ in range(5):
            await bucket.acquire()
            done.append(clock.now)

    task = asyncio.create_task(take())
    for _ in range(50):  # bounded: 10 ms per round
        await settle()
        if task.done():
            break
        clock.advance(0.01)
    assert task.done()
    assert done[-1] - 1000.0 == pytest.approx(0.2, abs=0.011)  # 25 per second


async def test_burst_never_exceeds_capacity_after_idle() -> None:
    clock = FakeClock()
    bucket = make(10, 3, clock)
    clock.advance(100)
    assert bucket.tokens == 3


@pytest.mark.parametrize(
    ("queued", "served"),
    [
        # Stop calls queue behind invocations queued after them.
        (
            [("stop", Priority.STOP), ("invoke1", Priority.INVOKE), ("invoke2", Priority.INVOKE)],
            ["invoke1", "invoke2", "stop"],
        ),
        # A retry goes before first invocations queued earlier.
        ([("invoke", Priority.INVOKE), ("retry", Priority.RETRY)], ["retry", "invoke"]),
    ],
)
async def test_waiters_are_served_by_priority_then_arrival(
    queued: list[tuple[str, Priority]], served: list[str]
) -> None:
    clock = FakeClock()
    bucket = make(1, 1, clock)
    assert bucket.try_acquire()
    order: list[str] = []

    async def take(name: str, priority: Priority) -> None:
        await bucket.acquire(priority=priority)
        order.append(name)

    tasks = []
    for name, priority in queued:
        tasks.append(asyncio.create_task(take(name, priority)))
        await settle()
    assert bucket.waiting == len(queued)
    assert not bucket.try_acquire()  # queued waiters come first
    for _ in queued:
        clock.advance(1)
        await settle()
    await asyncio.wait_for(asyncio.gather(*tasks), 5)
    assert order == served


async def test_cancelled_waiter_leaves_the_queue() -> None:
    clock = FakeClock()
    bucket = make(1, 1, clock)
    assert bucket.try_acquire()
    first = asyncio.create_task(bucket.acquire())
    await settle()
    second = asyncio.create_task(bucket.acquire())
    await settle()
    first.cancel()
    await settle()
    assert first.cancelled()
    assert bucket.waiting == 1
    clock.advance(1)
    await asyncio.wait_for(second, 5)
    assert bucket.waiting == 0


async def test_throttle_cuts_rate_and_recovers_linearly() -> None:
    clock = FakeClock()
    bucket = make(20, 20, clock)
    assert bucket.rate == 20
    bucket.on_throttle()
    assert bucket.rate == 10
    assert bucket.tokens == 0  # the burst is gone too
    bucket.on_throttle()  # same burst of 429s: counted, not compounded
    assert bucket.rate == 10
    assert bucket.throttles == 2
    clock.advance(2.0)  # regains 5% of 20 per second
    assert bucket.rate == pytest.approx(12)
    bucket.on_throttle()  # a new throttle after the one-second cooldown compounds
    assert bucket.rate == pytest.approx(6)
    clock.advance(100)
    assert bucket.rate == 20


async def test_throttled_rate_paces_waiters() -> None:
    clock = FakeClock()
    bucket = make(10, 1, clock)
    bucket.on_throttle()  # 5 per second (recovering from there)
    task = asyncio.create_task(bucket.acquire())
    await settle()
    assert clock.slept[-1] == pytest.approx(0.2)
    clock.advance(0.2)
    await asyncio.wait_for(task, 5)


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ({"rate": 0}, "rate"),
        ({"rate": 5, "burst": 0.5}, "burst"),
        ({"rate": 5, "tick": -0.1}, "tick"),
    ],
)
def test_bad_arguments_are_refused(args: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        TokenBucket(**args)


def test_repr() -> None:
    assert repr(TokenBucket(25, 50)) == "TokenBucket(rate=25, max_rate=25, burst=50)"
