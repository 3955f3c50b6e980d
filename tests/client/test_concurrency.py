"""asyncio combinators, the concurrency bound (measured in the agent) and the token bucket
inside the client."""

from __future__ import annotations

import asyncio
import contextlib

from agentcore_rl.client import TokenBucket
from tests.client.agents import Recorder
from tests.client.conftest import ClientFactory, fast_limits
from tests.client.fakeclock import FakeClock, settle


async def test_gather_wait_as_completed_and_callbacks(
    make_client: ClientFactory, recorder: Recorder
) -> None:
    client = make_client()
    results = await asyncio.wait_for(
        asyncio.gather(*(client.rollout({"n": n}) for n in range(5))), 10
    )
    assert sorted(r["n"] for r in results) == [0, 1, 2, 3, 4]

    futs = [await client.invoke({"n": n}) for n in range(3)]
    seen: list[str] = []
    for fut in futs:
        fut.add_done_callback(lambda f: seen.append(f.session_id))
    done, pending = await asyncio.wait(futs, timeout=10)
    assert (len(done), len(pending)) == (3, 0)

    futs = [await client.invoke({"n": n}) for n in range(3)]
    ns = [(await f)["n"] for f in asyncio.as_completed(futs, timeout=10)]
    assert sorted(ns) == [0, 1, 2]
    await settle()
    assert len(seen) == 3


async def test_gather_with_return_exceptions_mixes_outcomes(make_client: ClientFactory) -> None:
    client = make_client()
    outcomes = await asyncio.wait_for(
        asyncio.gather(
            client.rollout({"n": 1}),
            client.rollout({"mode": "raise"}),
            client.rollout({"mode": "hang"}, timeout=0.05),
            return_exceptions=True,
        ),
        10,
    )
    assert [type(o).__name__ for o in outcomes] == ["dict", "RolloutError", "RolloutTimeoutError"]


async def test_wait_for_timeout_cancels_and_stops_the_session(
    make_client: ClientFactory, recorder: Recorder
) -> None:
    client = make_client()
    fut = await client.invoke({"mode": "hang"})
    await recorder.wait_for(lambda: fut.session_id in recorder.sessions)
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(fut, 0.01)
    assert fut.cancelled()
    await recorder.wait_for(lambda: fut.session_id in recorder.cancelled)
    assert client.in_flight == 0


async def test_cancelling_the_waiting_task_stops_the_session(
    make_client: ClientFactory, recorder: Recorder
) -> None:
    client = make_client()
    task = asyncio.create_task(client.rollout({"mode": "hang"}))
    await recorder.wait_for(lambda: len(recorder.sessions) == 1)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await recorder.wait_for(lambda: recorder.sessions[0] in recorder.cancelled)


async def test_semaphore_bound_is_never_exceeded(
    make_client: ClientFactory, recorder: Recorder
) -> None:
    client = make_client(limits=fast_limits(max_concurrent_sessions=3))
    tasks = [asyncio.create_task(client.rollout({"mode": "gate", "n": n})) for n in range(10)]
    await recorder.wait_for(lambda: recorder.running == 3)
    assert len(recorder.sessions) == 3  # the others wait for a slot
    recorder.open_gate()
    results = await asyncio.wait_for(asyncio.gather(*tasks), 10)
    assert len(results) == 10
    assert recorder.max_running == 3


async def test_invocations_take_tokens_from_the_bucket(
    make_client: ClientFactory, recorder: Recorder
) -> None:
    clock = FakeClock()
    bucket = TokenBucket(10, 2, clock=clock, sleep=clock.sleep)
    client = make_client(rate_limiter=bucket)
    tasks = [asyncio.create_task(client.invoke({"n": n})) for n in range(4)]
    await recorder.wait_for(lambda: len(recorder.sessions) == 2)  # the burst
    assert bucket.waiting == 2
    clock.advance(0.1)
    await recorder.wait_for(lambda: len(recorder.sessions) == 3)
    clock.advance(0.1)
    futs = await asyncio.wait_for(asyncio.gather(*tasks), 10)
    await asyncio.wait_for(asyncio.gather(*futs), 10)
    assert len(recorder.sessions) == 4
