"""The client's life: opened by ``async with`` or by its first rollout, closed once for
good; its background work owned by its task group; pluggable limiters."""

from __future__ import annotations

import asyncio

import pytest

from agentcore_rl.client import (
    AsyncRolloutClient,
    ClientState,
    Priority,
    RateLimiter,
    SessionLimiter,
    TokenBucket,
)
from agentcore_rl.errors import ClientClosedError
from agentcore_rl.ratelimit import LocalSessionLimiter
from tests.client.agents import Recorder
from tests.client.conftest import ClientFactory


def state(client: AsyncRolloutClient) -> ClientState:
    # A call, not the property: mypy would keep the narrowed state across awaits.
    return client.state


async def test_async_with_opens_and_closes(make_client: ClientFactory, recorder: Recorder) -> None:
    client = make_client()
    assert state(client) is ClientState.UNOPENED
    async with client as entered:
        assert entered is client
        assert state(client) is ClientState.OPENED
        result = await asyncio.wait_for(await client.invoke({"n": 1}), 10)
        assert result["n"] == 1
    assert state(client) is ClientState.CLOSED


async def test_the_first_rollout_opens_a_client_used_without_async_with(
    make_client: ClientFactory,
) -> None:
    client = make_client()
    await asyncio.wait_for(await client.invoke({"n": 1}), 10)
    assert state(client) is ClientState.OPENED
    await client.aclose()
    assert state(client) is ClientState.CLOSED


async def test_aclose_inside_async_with_ends_the_work_not_the_block(
    make_client: ClientFactory, recorder: Recorder
) -> None:
    client = make_client()
    async with client:
        fut = await client.invoke({"mode": "hang"})
        await client.aclose()
        assert isinstance(fut.exception(), ClientClosedError)
        await recorder.wait_for(lambda: recorder.cancelled == {fut.session_id})
        reached = True  # closing did not cancel the caller's own block
    assert reached


async def test_a_closed_client_refuses_every_use(make_client: ClientFactory) -> None:
    client = make_client()
    await client.aclose()
    await client.aclose()  # idempotent
    with pytest.raises(ClientClosedError):
        await client.invoke({"n": 1})
    with pytest.raises(ClientClosedError):
        client.run_batch([{}])
    with pytest.raises(ClientClosedError):
        await client.attach(session_id="s" * 40, result_key="exp/q/x.json")
    with pytest.raises(ClientClosedError):
        async with client:
            pass


class CountingLimiters:
    """A rate limiter and a session limiter of the caller's own (the protocols' shape)."""

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.successes = 0

    async def acquire(self, priority: int = Priority.INVOKE) -> None:
        self.tokens.append(priority)

    def on_throttle(self) -> None:
        raise AssertionError("no throttling in this test")

    def on_success(self) -> None:
        self.successes += 1


class CountingSlots:
    def __init__(self) -> None:
        self.held = 0
        self.most_held = 0
        self._inner = LocalSessionLimiter(2)

    async def acquire(self) -> None:
        await self._inner.acquire()
        self.held += 1
        self.most_held = max(self.most_held, self.held)

    def release(self) -> None:
        self.held -= 1
        self._inner.release()


async def test_limiters_of_the_callers_own_are_used(
    make_client: ClientFactory, recorder: Recorder
) -> None:
    rate, slots = CountingLimiters(), CountingSlots()
    assert isinstance(rate, RateLimiter)
    assert isinstance(slots, SessionLimiter)
    assert isinstance(TokenBucket(), RateLimiter)
    assert isinstance(LocalSessionLimiter(1), SessionLimiter)
    client = make_client(rate_limiter=rate, session_limiter=slots, stop_finished_sessions=True)
    assert client.rate_limiter is rate
    items = [item async for item in client.run_batch([{"n": i} for i in range(5)])]
    assert all(item.success for item in items)
    await client.aclose()  # drains the background stops
    assert client.stats.stops == 5
    assert rate.tokens.count(Priority.INVOKE) == 5
    assert rate.tokens.count(Priority.STOP) == 5
    assert rate.successes == 10  # five invocations and five stops
    assert (slots.held, slots.most_held) == (0, 2)
