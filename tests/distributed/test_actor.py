"""The limits actor's books, called in-process on a virtual clock (no Ray, no waiting)."""

from __future__ import annotations

import anyio
import pytest
from anyio.abc import TaskGroup

from agentcore_rl.distributed import LimitsActor, LimitsConfig, shared_limits
from agentcore_rl.errors import ConfigurationError
from agentcore_rl.ratelimit import Priority
from tests.client.fakeclock import FakeClock, settle

CONFIG = LimitsConfig(tps=10, sessions=2, slot_ttl=6.0)


def _actor() -> tuple[FakeClock, LimitsActor]:
    clock = FakeClock()
    return clock, LimitsActor(CONFIG, clock=clock, sleep=clock.sleep)


async def _fill(actor: LimitsActor, holder: str) -> None:
    """``holder`` takes the whole budget."""
    for held in range(CONFIG.sessions):
        assert await actor.acquire_slot(holder, held, held)


def _wait_for_slot(tg: TaskGroup, actor: LimitsActor, holder: str) -> list[bool]:
    """Ask for a slot in ``tg``; the answer lands in the list returned."""
    granted: list[bool] = []

    async def wait() -> None:
        granted.append(await actor.acquire_slot(holder, 0, 0))

    tg.start_soon(wait)
    return granted


async def test_tokens_start_empty_and_go_by_priority_across_callers() -> None:
    clock, actor = _actor()
    got: list[int] = []

    async def call(priority: int) -> None:
        await actor.acquire_token(priority)
        got.append(priority)

    async with anyio.create_task_group() as tg:
        for priority in (Priority.STOP, Priority.INVOKE, Priority.RETRY):
            tg.start_soon(call, priority)
        await settle()
        assert got == []  # a restart adds no burst to the calls just made
        for _ in range(3):
            clock.advance(0.1)
            await settle()
    assert got == [Priority.RETRY, Priority.INVOKE, Priority.STOP]


async def test_a_throttle_halves_the_shared_rate() -> None:
    _clock, actor = _actor()
    await actor.throttled()
    assert (await actor.status())["rate"] == CONFIG.tps / 2


async def test_slots_wait_for_a_release_from_another_holder() -> None:
    _clock, actor = _actor()
    await _fill(actor, "a")
    async with anyio.create_task_group() as tg:
        granted = _wait_for_slot(tg, actor, "b")
        await settle()
        assert granted == []
        await actor.sync("a", 1, 2)  # a released one
        await settle()
    assert granted == [True]
    assert (await actor.status())["slots_held"] == 2


async def test_a_grant_not_yet_received_counts_as_held() -> None:
    _clock, actor = _actor()
    assert await actor.acquire_slot("a", 0, 0)
    # A report sent before the grant arrived: the grant still counts.
    await actor.sync("a", 0, 0)
    assert (await actor.status())["slots_held"] == 1
    # A holder the actor does not know (it restarted) is taken at its word.
    await actor.sync("b", 1, 7)
    assert (await actor.status())["slots_held"] == 2


async def test_a_silent_holder_s_slots_come_back_after_the_ttl() -> None:
    clock, actor = _actor()
    await _fill(actor, "dead")
    async with anyio.create_task_group() as tg:
        granted = _wait_for_slot(tg, actor, "alive")
        clock.advance(CONFIG.slot_ttl - 0.5)
        await actor.sync("alive", 0, 0)
        assert (await actor.status())["slots_held"] == 2
        clock.advance(1.0)
        status = await actor.status()  # any call notices the lapse
        await settle()
    assert granted == [True]
    assert status["expired_holders"] == 1
    assert (await actor.status())["slots_held"] == 1


async def test_a_restarted_actor_grants_no_slot_until_holders_have_reported() -> None:
    clock, actor = _actor()
    await actor.sync("a", 1, 5)  # had grants before: the actor lost its books
    assert (await actor.status())["restarted"]
    async with anyio.create_task_group() as tg:
        granted = _wait_for_slot(tg, actor, "b")
        await settle()
        assert granted == []  # room for one, but other holders may not have reported yet
        clock.advance(CONFIG.slot_ttl / 2)
        await actor.sync("a", 0, 5)  # any change wakes the waiter (else a recheck does)
        await settle()
    assert granted == [True]


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ConfigurationError, match="sessions"):
        LimitsConfig(tps=10, sessions=0)
    with pytest.raises(ConfigurationError, match="burst"):
        LimitsConfig(tps=10, sessions=2, burst=0.5)
    with pytest.raises(TypeError):
        shared_limits("x", tps=10, sessions=2, lease_period=4)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        LimitsConfig(10, 2)  # type: ignore[call-arg]
