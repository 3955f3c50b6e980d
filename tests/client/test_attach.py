"""``attach``: follow a rollout another client (or an earlier process) started, through the
client's own completion watcher, with the outcome, timeout, stop and slot rules of an
invoked rollout. Real agent server on loopback, moto S3."""

from __future__ import annotations

import asyncio
import time

import pytest

from agentcore_rl.errors import (
    ClientClosedError,
    ConfigurationError,
    InvalidRolloutConfig,
    RolloutTimeoutError,
)
from agentcore_rl.s3 import ResultStore
from tests.client.agents import Recorder
from tests.client.conftest import ClientFactory, fast_limits


async def test_attach_to_a_rollout_started_by_another_client(
    make_client: ClientFactory, recorder: Recorder
) -> None:
    starter, follower = make_client(), make_client()
    started = await starter.invoke({"mode": "gate", "n": 9}, input_id="q-9")
    fut = await follower.attach(session_id=started.session_id, result_key=started.result_key)
    assert (fut.input_id, fut.s3_bucket) == ("q-9", started.s3_bucket)
    assert not fut.done()
    assert follower.in_flight == 1
    recorder.open_gate()
    result = await asyncio.wait_for(fut, 10)
    assert result["n"] == 9
    assert result["session_id"] == started.session_id
    stats = follower.stats
    assert (stats.invocations, stats.results, stats.in_flight) == (0, 1, 0)
    assert recorder.sessions == [started.session_id]  # attaching sent nothing


async def test_attach_times_out_from_started_at_and_stops_the_session(
    make_client: ClientFactory, recorder: Recorder
) -> None:
    starter, follower = make_client(), make_client()
    started = await starter.invoke({"mode": "hang"}, timeout=float("inf"))
    await recorder.wait_for(lambda: started.session_id in recorder.sessions)
    # Started a minute ago with a 30 s budget: the deadline is already over.
    fut = await follower.attach(
        session_id=started.session_id,
        result_key=started.result_key,
        timeout=30,
        started_at=time.time() - 60,
    )
    with pytest.raises(RolloutTimeoutError) as info:
        await asyncio.wait_for(fut, 5)
    assert info.value.session_id == started.session_id
    await recorder.wait_for(lambda: started.session_id in recorder.cancelled)
    assert follower.stats.timeouts == 1
    assert fut.elapsed >= 60


async def test_attach_to_an_existing_result_resolves_at_once(
    make_client: ClientFactory, store: ResultStore, bucket: str
) -> None:
    client = make_client()
    sid = "c" * 40
    key = f"exp/q-1/{sid}.json"
    await store.put_json(bucket, key, {"rewards": [0.5], "status_code": 200})
    # Even past its deadline: a result that is there wins over the timeout.
    fut = await client.attach(session_id=sid, result_key=key, timeout=1, started_at=0.0)
    assert fut.done()
    assert fut.result()["rewards"] == [0.5]


async def test_attach_holds_a_slot_until_the_outcome(
    make_client: ClientFactory, recorder: Recorder
) -> None:
    starter = make_client()
    follower = make_client(limits=fast_limits(max_concurrent_sessions=1))
    started = await starter.invoke({"mode": "gate"})
    fut = await follower.attach(session_id=started.session_id, result_key=started.result_key)
    waiting = asyncio.create_task(follower.invoke({"n": 2}))
    await asyncio.sleep(0)  # let it queue for the slot (no time passes)
    assert recorder.sessions == [started.session_id]
    assert not waiting.done()
    with pytest.raises(ConfigurationError, match="has no outcome yet"):
        await follower.attach(session_id=started.session_id, result_key=started.result_key)
    recorder.open_gate()
    await asyncio.wait_for(fut, 10)
    assert (await asyncio.wait_for(await asyncio.wait_for(waiting, 10), 10))["n"] == 2


async def test_attach_arguments_and_close(make_client: ClientFactory, recorder: Recorder) -> None:
    client = make_client()
    with pytest.raises(InvalidRolloutConfig, match="session_id"):
        await client.attach(session_id="a/b", result_key="exp/q/x.json")
    with pytest.raises(InvalidRolloutConfig, match="result_key"):
        await client.attach(session_id="s-1", result_key="")
    with pytest.raises(InvalidRolloutConfig, match="not a valid S3 bucket"):
        await client.attach(session_id="s-1", result_key="exp/q/s-1.json", s3_bucket="No")
    started = await make_client().invoke({"mode": "hang"}, timeout=float("inf"))
    fut = await client.attach(session_id=started.session_id, result_key=started.result_key)
    await client.aclose()
    with pytest.raises(ClientClosedError):
        fut.result()
    await recorder.wait_for(lambda: started.session_id in recorder.cancelled)
    with pytest.raises(ClientClosedError):
        await client.attach(session_id="s-2", result_key="exp/q/s-2.json")
