"""One process's limiters against the limits actor run in-process (no Ray): batching,
local reuse of slots, cancellation. Every wait here ends without time passing."""

from __future__ import annotations

import anyio
import pytest

from agentcore_rl.client.bucket import Priority
from agentcore_rl.distributed import LimitsActor, LimitsConfig, SharedLimits
from tests.client.fakeclock import settle

CONFIG = LimitsConfig(tps=25, sessions=3, slot_ttl=6.0)


def _limits() -> SharedLimits:
    return SharedLimits(LimitsActor(CONFIG, restarted=False), CONFIG, name="in-process")


async def test_waiting_callers_are_served_by_one_batched_lease() -> None:
    async with _limits() as limits, anyio.create_task_group() as tg:
        got: list[int] = []

        async def call(priority: int) -> None:
            await limits.rate.acquire(priority)
            got.append(priority)

        for i in range(10):
            tg.start_soon(call, Priority.STOP if i < 3 else Priority.INVOKE)
    assert sorted(got) == [Priority.INVOKE] * 7 + [Priority.STOP] * 3
    assert limits.rate.stats["tokens_leased"] == 10
    # One lease per priority class at most, not one per call.
    assert limits.rate.stats["leases"] <= 2


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
