"""Handoff: items to waiting workers in order, close after the queue drains, a cancelled
worker's item goes back."""

from __future__ import annotations

import asyncio

import pytest

from agentcore_rl.client.handoff import Handoff


async def test_items_reach_waiting_and_later_workers_in_order_then_none() -> None:
    handoff: Handoff[int] = Handoff()
    first = asyncio.ensure_future(handoff.get())
    await asyncio.sleep(0)
    assert handoff.idle == 1
    handoff.put(1)  # straight to the waiting worker
    handoff.put(2)
    handoff.put(3)
    assert handoff.idle == 0
    assert await first == 1
    handoff.close()
    assert [await handoff.get(), await handoff.get(), await handoff.get()] == [2, 3, None]
    with pytest.raises(RuntimeError, match="closed"):
        handoff.put(4)


async def test_close_wakes_idle_workers_with_none() -> None:
    handoff: Handoff[str] = Handoff()
    waiting = [asyncio.ensure_future(handoff.get()) for _ in range(3)]
    await asyncio.sleep(0)
    handoff.close()
    assert await asyncio.gather(*waiting) == [None, None, None]


async def test_an_item_handed_to_a_cancelled_worker_is_queued_again() -> None:
    handoff: Handoff[str] = Handoff()
    worker = asyncio.ensure_future(handoff.get())
    await asyncio.sleep(0)
    handoff.put("a")  # the worker's future is done...
    worker.cancel()  # ...but the worker is cancelled before it runs again
    with pytest.raises(asyncio.CancelledError):
        await worker
    assert handoff.drain() == ["a"]
