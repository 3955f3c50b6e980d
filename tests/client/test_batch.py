"""run_batch: one item per payload in completion order, never raising for one rollout,
and stopping live sessions when the caller leaves early."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest

from agentcore_rl.client import BatchItem
from agentcore_rl.errors import (
    ClientClosedError,
    InvalidRolloutConfig,
    RolloutError,
    RolloutTimeoutError,
)
from tests.client.agents import Recorder
from tests.client.conftest import ClientFactory, fast_limits


async def collect(batch: Any) -> list[BatchItem]:
    async def run() -> list[BatchItem]:
        return [item async for item in batch]

    return await asyncio.wait_for(run(), 10)


async def test_every_payload_gets_one_item(make_client: ClientFactory, recorder: Recorder) -> None:
    client = make_client(limits=fast_limits(max_concurrent_sessions=2))
    payloads: list[Any] = [
        {"n": 0},
        {"mode": "raise"},
        {"mode": "envelope"},
        {"mode": "hang"},
        {"_rollout": {"input_id": "../bad"}},
        {"n": 5, "_rollout": {"input_id": "mine"}},
    ]
    # The timeout only has to outlast the quick rollouts, with room for a loaded CI machine.
    items = await collect(client.run_batch(payloads, timeout=2.0, rollout={"temperature": 0.3}))
    by_index = {item.index: item for item in items}
    assert sorted(by_index) == list(range(6))
    assert by_index[0].success
    assert by_index[0].result is not None
    assert by_index[0].result["n"] == 0
    assert by_index[0].input_id == "000000"
    assert by_index[0].elapsed > 0
    assert isinstance(by_index[1].error, RolloutError)
    assert isinstance(by_index[2].error, RolloutError)
    assert isinstance(by_index[3].error, RolloutTimeoutError)
    assert isinstance(by_index[4].error, InvalidRolloutConfig)
    assert by_index[4].session_id is None
    assert by_index[5].input_id == "mine"
    assert all(block["temperature"] == 0.3 for block in recorder.rollout_blocks)
    assert recorder.max_running <= 2
    await recorder.wait_for(lambda: by_index[3].session_id in recorder.cancelled)
    assert "BatchItem(index=0, ok" in repr(by_index[0])


async def test_items_come_in_completion_order(
    make_client: ClientFactory, recorder: Recorder
) -> None:
    client = make_client()
    batch = client.run_batch([{"mode": "gate", "n": 0}, {"n": 1}])
    first = await asyncio.wait_for(batch.__anext__(), 10)
    assert first.index == 1
    recorder.open_gate()
    second = await asyncio.wait_for(batch.__anext__(), 10)
    assert second.index == 0
    with pytest.raises(StopAsyncIteration):
        await asyncio.wait_for(batch.__anext__(), 10)


async def test_early_break_stops_every_live_session(
    make_client: ClientFactory, recorder: Recorder
) -> None:
    client = make_client(limits=fast_limits(max_concurrent_sessions=4))
    payloads = [{"n": 0}] + [{"mode": "hang"} for _ in range(9)]
    async with contextlib.aclosing(client.run_batch(payloads)) as batch:
        async for item in batch:
            assert item.success
            first = item.session_id
            await recorder.wait_for(lambda: recorder.running == 4)
            break
    started = set(recorder.sessions) - {first}
    assert len(started) == 4
    await recorder.wait_for(lambda: recorder.cancelled == started)
    assert client.in_flight == 0
    assert len(recorder.sessions) == 5  # nothing new started after the break


async def test_dropping_the_iterator_after_break_also_stops_sessions(
    make_client: ClientFactory, recorder: Recorder
) -> None:
    client = make_client(limits=fast_limits(max_concurrent_sessions=3))
    payloads = [{"n": 0}] + [{"mode": "hang"} for _ in range(5)]
    async for item in client.run_batch(payloads):
        first = item.session_id
        await recorder.wait_for(lambda: recorder.running == 3)
        break
    hanging = set(recorder.sessions) - {first}
    await recorder.wait_for(lambda: recorder.cancelled == hanging)


async def test_closing_the_client_ends_the_batch(
    make_client: ClientFactory, recorder: Recorder
) -> None:
    client = make_client(limits=fast_limits(max_concurrent_sessions=2))
    batch = client.run_batch([{"mode": "hang"} for _ in range(5)])
    first = asyncio.create_task(batch.__anext__())
    await recorder.wait_for(lambda: recorder.running == 2)
    await client.aclose()
    item = await asyncio.wait_for(first, 5)
    assert isinstance(item.error, ClientClosedError)
    with pytest.raises(ClientClosedError):
        await collect(batch)
    assert recorder.cancelled == set(recorder.sessions)
    with pytest.raises(ClientClosedError):
        client.run_batch([{}])


def _new_client_tasks(before: set[asyncio.Task[Any]]) -> set[str]:
    """Names of the live tasks started since ``before``, but the agent server's own."""

    def code_file(task: asyncio.Task[Any]) -> str:
        code = getattr(task.get_coro(), "cr_code", None)
        return "" if code is None else code.co_filename

    server_side = ("/uvicorn/", "/starlette/", "/agentcore_rl/server/")
    return {
        task.get_name()
        for task in asyncio.all_tasks() - before
        if not task.done() and not any(part in code_file(task) for part in server_side)
    }


async def test_an_abandoned_batch_leaves_no_task_or_session_after_close(
    make_client: ClientFactory, recorder: Recorder
) -> None:
    client = make_client(limits=fast_limits(max_concurrent_sessions=3))
    before = asyncio.all_tasks()  # the client opens its task group on first use
    batch = client.run_batch([{"n": 0}] + [{"mode": "hang"} for _ in range(6)])
    first = await asyncio.wait_for(batch.__anext__(), 10)
    assert first.success
    await recorder.wait_for(lambda: recorder.running == 3)
    # The agent runs a handler before its answer reaches the client: wait for the client to
    # have accepted all three, or a close in between ends the third one while it is still
    # being sent (an item with no session id, which this test does not look at).
    for _ in range(500):  # bounded: the answers are on loopback
        if client.in_flight == 3:
            break
        await asyncio.sleep(0.01)
    # The loop is abandoned here: neither closed nor dropped (``batch`` stays referenced).
    assert {"batch", "completion watcher", "liveness prober"} <= _new_client_tasks(before)
    await client.aclose()
    started = set(recorder.sessions) - {first.session_id}
    assert len(started) == 3
    await recorder.wait_for(lambda: recorder.cancelled == started)
    assert _new_client_tasks(before) == set()
    assert client.in_flight == 0
    # The abandoned loop is not stuck either: the started rollouts' items, then the reason.
    rest: list[BatchItem] = []

    async def read_on() -> None:
        async for item in batch:
            rest.append(item)

    with pytest.raises(ClientClosedError):
        await asyncio.wait_for(read_on(), 10)
    assert {item.session_id for item in rest} == started
    assert all(isinstance(item.error, ClientClosedError) for item in rest)
    assert len(recorder.sessions) == 4  # nothing started after the close
