"""A rollout's deadline against what S3 holds: a result written while the client stops the
session at its deadline is the outcome (what is reported and what is in S3 agree), and a
resumed rollout whose deadline has passed is read and stopped, not sent again."""

from __future__ import annotations

import asyncio
import time

import pytest

from agentcore_rl import protocol
from agentcore_rl.errors import RolloutTimeoutError
from agentcore_rl.s3 import ResultStore
from tests.client.agents import Recorder
from tests.client.conftest import ClientFactory


async def test_a_result_written_as_the_deadline_stops_the_session_is_the_outcome(
    make_client: ClientFactory, recorder: Recorder, store: ResultStore
) -> None:
    client = make_client()
    fut = await client.invoke({"mode": "late", "n": 4}, timeout=0.5)
    result = await asyncio.wait_for(fut, 20)  # the stop at the deadline ends the handler
    assert result["n"] == 4
    assert recorder.cancelled == set()  # it returned its result rather than cancelling
    envelope = await store.get_json(fut.s3_bucket, fut.result_key)
    assert envelope is not None
    assert not protocol.is_error_envelope(envelope)
    assert (client.stats.results, client.stats.timeouts, client.stats.stops) == (1, 0, 1)


async def test_a_rollout_stopped_at_its_deadline_times_out(
    make_client: ClientFactory, recorder: Recorder, store: ResultStore
) -> None:
    client = make_client()
    fut = await client.invoke({"mode": "hang", "n": 5}, timeout=0.5)
    with pytest.raises(RolloutTimeoutError, match="was stopped"):
        await asyncio.wait_for(fut, 20)
    assert recorder.cancelled == {fut.session_id}
    envelope = await store.get_json(fut.s3_bucket, fut.result_key)
    assert envelope is not None
    assert envelope["error_type"] == "cancelled"


async def test_a_resumed_rollout_past_its_deadline_is_not_sent_again(
    make_client: ClientFactory, recorder: Recorder
) -> None:
    client = make_client()
    sid = protocol.new_session_id()
    fut = await client.invoke(
        {"n": 6}, session_id=sid, resume=True, started_at=time.time() - 60, timeout=30
    )
    with pytest.raises(RolloutTimeoutError):
        await asyncio.wait_for(fut, 20)
    assert recorder.sessions == []
    assert client.stats.invocations == 0
