"""Every outcome kind of AsyncRolloutClient against a real agent server and moto S3."""

from __future__ import annotations

import asyncio

import pytest

from agentcore_rl.client import RolloutFuture
from agentcore_rl.errors import (
    AgentUnreachableError,
    ClientClosedError,
    InvalidRolloutConfig,
    InvocationError,
    RolloutError,
    RolloutTimeoutError,
)
from agentcore_rl.local.background import BackgroundServer
from agentcore_rl.protocol import is_acr_session_id
from agentcore_rl.s3 import ResultStore
from agentcore_rl.server import RequestLimits
from tests.client.agents import Recorder, make_agent
from tests.client.conftest import ClientFactory, fast_limits, quick_retries, short_timeouts
from tests.conftest import FAST_RETRY


async def test_result_dict_carries_the_envelope(make_client: ClientFactory, bucket: str) -> None:
    client = make_client()
    fut = await client.invoke({"n": 7}, input_id="q-7")
    assert isinstance(fut, RolloutFuture)
    assert is_acr_session_id(fut.session_id)
    assert fut.result_key == f"exp/q-7/{fut.session_id}.json"
    assert fut.s3_bucket == bucket
    result = await asyncio.wait_for(fut, 10)
    assert result["rewards"] == [1.0]
    assert result["n"] == 7
    assert result["session_id"] == fut.session_id
    assert result["status_code"] == 200
    assert "finished" in repr(fut)
    stats = client.stats
    assert (stats.results, stats.invocations, stats.in_flight) == (1, 1, 0)
    assert stats.stops == 0  # HTTP transport: a finished session holds nothing


async def test_defaults_then_payload_then_overrides_in_rollout_block(
    make_client: ClientFactory, recorder: Recorder, bucket: str
) -> None:
    client = make_client(
        rollout={
            "base_url": "http://policy:9000/v1",
            "model_id": "qwen3",
            "temperature": 0.7,
            "top_p": 0.9,
        }
    )
    await client.rollout(
        {"n": 1, "_rollout": {"top_p": 0.5, "system": "be brief"}},
        input_id="q-1",
        rollout={"temperature": 1.0},
    )
    assert recorder.rollout_blocks == [
        {
            "exp_id": "exp",
            "input_id": "q-1",
            "s3_bucket": bucket,
            "base_url": "http://policy:9000/v1",
            "model_id": "qwen3",
            "temperature": 1.0,
            "top_p": 0.5,
            "system": "be brief",
            # The client's lease, named in every invocation (see test_lease.py).
            "lease": {"s3_bucket": bucket, "key": client._lease.key},  # type: ignore[union-attr]
        }
    ]


async def test_default_input_id_is_fresh_and_time_ordered(make_client: ClientFactory) -> None:
    client = make_client()
    first = await client.invoke({})
    second = await client.invoke({})
    assert first.input_id.isdigit()
    assert first.input_id <= second.input_id
    await asyncio.wait_for(asyncio.gather(first, second), 10)


async def test_handler_exception_is_a_rollout_error(make_client: ClientFactory) -> None:
    client = make_client()
    fut = await client.invoke({"mode": "raise", "n": 3})
    with pytest.raises(RolloutError) as info:
        await asyncio.wait_for(fut, 10)
    assert info.value.session_id == fut.session_id
    assert info.value.status_code == 500
    assert "agent failed on 3" in str(info.value.traceback)
    assert client.stats.rollout_errors == 1


async def test_error_envelope_from_the_handler_is_a_rollout_error(
    make_client: ClientFactory,
) -> None:
    client = make_client()
    with pytest.raises(RolloutError, match="answer unparseable") as info:
        await asyncio.wait_for(client.rollout({"mode": "envelope"}), 10)
    assert info.value.envelope["status_code"] == 422


async def test_timeout_stops_the_session(make_client: ClientFactory, recorder: Recorder) -> None:
    client = make_client(timeouts=short_timeouts(rollout=600))
    fut = await client.invoke({"mode": "hang"}, timeout=0.05)
    with pytest.raises(RolloutTimeoutError) as info:
        await asyncio.wait_for(fut, 10)
    assert isinstance(info.value, TimeoutError)
    assert info.value.session_id == fut.session_id
    await recorder.wait_for(lambda: fut.session_id in recorder.cancelled)
    assert client.stats.timeouts == 1


async def test_client_default_timeout(make_client: ClientFactory) -> None:
    client = make_client(timeouts=short_timeouts(rollout=0.05))
    with pytest.raises(RolloutTimeoutError):
        await asyncio.wait_for(client.rollout({"mode": "hang"}), 10)


async def test_bad_override_is_refused_before_sending(
    make_client: ClientFactory, recorder: Recorder
) -> None:
    client = make_client()
    with pytest.raises(InvalidRolloutConfig, match="base_url must be a string"):
        await client.invoke({}, rollout={"base_url": 5})
    with pytest.raises(InvalidRolloutConfig, match="input_id"):
        await client.invoke({}, input_id="../etc")
    assert client.stats.invocations == 0
    assert client.stats.in_flight == 0


async def test_refused_invocation_fails_at_once_with_the_servers_message(
    make_client: ClientFactory, s3_endpoint: str, recorder: Recorder
) -> None:
    store = ResultStore(endpoint_url=s3_endpoint, retry=FAST_RETRY)
    app = make_agent(store, recorder, limits=RequestLimits(allowed_buckets=["only-this-bucket"]))
    async with BackgroundServer(app) as server:
        client = make_client(agent_url=server.url)
        with pytest.raises(InvocationError, match=r"HTTP 403.*allow-list") as info:
            await client.invoke({"n": 1})
        assert info.value.status_code == 403
        assert client.stats.invocations == 1  # not retried
        assert client.stats.in_flight == 0
    await store.aclose()


async def test_unreachable_agent_fails_in_one_session_with_nothing_to_stop(
    make_client: ClientFactory,
) -> None:
    # Connection refused: the quick retries run out (3 attempts, well within the window),
    # then AgentUnreachableError; no new session, no stop, nothing reported unstopped.
    client = make_client(agent_url="http://127.0.0.1:9", retries=quick_retries(rollouts=2))
    with pytest.raises(AgentUnreachableError, match="no connection to the agent") as info:
        await client.invoke({"n": 1})
    assert info.value.session_id is not None
    await client.aclose()
    stats = client.stats
    assert (stats.invocations, stats.retries, stats.invocation_errors) == (3, 2, 1)
    assert (stats.rollout_retries, stats.stops, stats.stop_failures) == (0, 0, 0)
    assert stats.in_flight == 0
    assert client.unstopped_sessions == []


async def test_cancel_releases_the_slot_and_stops_the_session(
    make_client: ClientFactory, recorder: Recorder
) -> None:
    client = make_client(limits=fast_limits(max_concurrent_sessions=1))
    fut = await client.invoke({"mode": "hang"})
    await recorder.wait_for(lambda: fut.session_id in recorder.sessions)
    fut.cancel()
    await recorder.wait_for(lambda: fut.session_id in recorder.cancelled)
    # the only slot is free again
    assert (await asyncio.wait_for(client.rollout({"n": 2}), 10))["n"] == 2
    assert client.stats.cancelled == 1
    assert client.stats.stops == 1


async def test_close_ends_pending_rollouts_and_stops_sessions(
    make_client: ClientFactory, recorder: Recorder
) -> None:
    client = make_client()
    futs = [await client.invoke({"mode": "hang"}) for _ in range(3)]
    await recorder.wait_for(lambda: len(recorder.sessions) == 3)
    await client.aclose()
    for fut in futs:
        with pytest.raises(ClientClosedError):
            fut.result()
    assert recorder.cancelled == {f.session_id for f in futs}
    await client.aclose()  # idempotent
    with pytest.raises(ClientClosedError):
        await client.invoke({})


async def test_close_wakes_callers_waiting_for_a_slot(
    make_client: ClientFactory, recorder: Recorder
) -> None:
    client = make_client(limits=fast_limits(max_concurrent_sessions=1))
    await client.invoke({"mode": "hang"})
    waiting = asyncio.create_task(client.invoke({"n": 2}))
    await recorder.wait_for(lambda: len(recorder.sessions) == 1)
    await client.aclose()
    with pytest.raises(ClientClosedError):
        await asyncio.wait_for(waiting, 5)


async def test_stop_finished_sessions_on_request(make_client: ClientFactory) -> None:
    client = make_client(stop_finished_sessions=True)
    await asyncio.wait_for(client.rollout({"n": 1}), 10)
    await client.aclose()  # drains the background stop
    assert client.stats.stops == 1
