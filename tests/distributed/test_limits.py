"""One process's limiters against the limits actor run in-process (no Ray): batching,
local reuse of slots, cancellation. Every wait here ends without time passing."""

from __future__ import annotations

import anyio
import pytest

from agentcore_rl.distributed import LimitsActor, LimitsConfig, SharedLimits
from agentcore_rl.ratelimit import Priority
from tests.client.fakeclock import settle

CONFIG = LimitsConfig(tps=25, sessions=3, slot_ttl=6.0)


def _limits() -> SharedLimits:
    return SharedLimits(LimitsActor(CONFIG, restarted=False), CONFIG, name="in-process")


async def test_waiting_callers_are_served_from_one_lease_invocations_first() -> None:
    async with _limits() as limits, anyio.create_task_group() as tg:
        got: list[int] = []

        async def call(priority: int) -> None:
            await limits.rate.acquire(priority)
            got.append(priority)

        for i in range(10):
            tg.start_soon(call, Priority.STOP if i < 3 else Priority.INVOKE)
        await settle()
        assert limits.rate.share == CONFIG.tps  # alone: the whole quota
    assert got == [Priority.INVOKE] * 7 + [Priority.STOP] * 3
    assert (limits.rate.stats["tokens_invoke"], limits.rate.stats["tokens_stop"]) == (7, 3)
    # One lease (a share of the rate), not one call per token.
    assert limits.rate.stats["leases"] == 1


async def test_closing_frees_the_share_at_once() -> None:
    actor = LimitsActor(CONFIG, restarted=False)
    async with SharedLimits(actor, CONFIG) as limits:
        await limits.rate.acquire()
        assert actor.rates.committed(0.0) > 0 or actor.rates.holders == 1
    assert actor.rates.holders == 0
    assert (await actor.status())["rate_committed"] == 0


async def test_released_slots_serve_the_next_rollout_here_without_a_call() -> None:
    async with _limits() as limits:
        sessions = limits.sessions
        for _ in range(3):
            await sessions.acquire()
        leases = sessions.stats["leases"]
        assert sessions.held == 3
        async with anyio.create_task_group() as tg:
            tg.start_soon(sessions.acquire)  # over the budget: waits
            await settle()
            assert sessions.in_use == 3
            sessions.release()  # handed straight to the waiter
        assert sessions.in_use == 3
        assert sessions.stats["leases"] == leases


async def test_a_cancelled_slot_wait_takes_no_slot() -> None:
    async with _limits() as limits:
        sessions = limits.sessions
        for _ in range(3):
            await sessions.acquire()
        with anyio.move_on_after(0.05):
            await sessions.acquire()
        sessions.release()
        assert (sessions.in_use, sessions.free) == (2, 1)
        sessions.release()
        sessions.release()
        with pytest.raises(RuntimeError, match="without a matching acquire"):
            sessions.release()


async def test_closing_gives_the_slots_back() -> None:
    actor = LimitsActor(CONFIG, restarted=False)
    async with SharedLimits(actor, CONFIG) as limits:
        await limits.sessions.acquire()
        await limits.sessions.acquire()
        limits.sessions.release()
        assert actor.slots.held(0.0) >= 2
    assert (await actor.status())["slots_held"] == 1  # one still in use: it lapses later


async def test_a_throttle_interrupts_the_waiting_renewal_and_shrinks_the_share() -> None:
    actor = LimitsActor(CONFIG, restarted=False)
    async with SharedLimits(actor, CONFIG) as limits:
        await limits.rate.acquire()
        await settle()
        assert limits.rate.share == CONFIG.tps
        calls = actor.calls
        limits.rate.on_throttle()
        assert limits.rate.share == CONFIG.tps / 2  # at once, before the actor hears
        await settle(50)
        assert actor.rates.throttles == 1
        assert actor.rates.rate(actor._clock()) < CONFIG.tps
        assert actor.calls > calls  # reported at once, not at the next renewal
        assert limits.rate.share < CONFIG.tps * 0.6  # the cut rate, recovering


async def test_a_newcomer_gets_a_share_before_the_holder_s_renewal_is_due() -> None:
    actor = LimitsActor(CONFIG, restarted=False)
    other = SharedLimits(actor, CONFIG)
    async with SharedLimits(actor, CONFIG) as limits, other:
        await limits.rate.acquire()
        await settle()
        assert actor.rates.committed(actor._clock()) == CONFIG.tps
        # Another process wants to invoke: the holder's waiting renewal returns at once
        # with a smaller share, and the holder confirms it, which frees the room.
        async with anyio.create_task_group() as tg:
            tg.start_soon(other.rate.acquire)
            for _ in range(500):  # 5 s at most
                if other.rate.share > 0:
                    break
                await anyio.sleep(0.01)
        assert limits.rate.share + other.rate.share <= CONFIG.tps
