"""Caller-chosen session ids: ``invoke(..., session_id=...)`` on a real agent server."""

from __future__ import annotations

import asyncio

import pytest

from agentcore_rl import protocol
from agentcore_rl.client import AwsConfig
from agentcore_rl.errors import ConfigurationError, InvalidRolloutConfig
from agentcore_rl.local.runtime import DEFAULT_AGENT_RUNTIME_ARN
from tests.client.agents import Recorder
from tests.client.conftest import ClientFactory, fast_limits


async def test_the_chosen_session_id_runs_the_rollout_and_names_the_key(
    make_client: ClientFactory, recorder: Recorder
) -> None:
    client = make_client()
    sid = protocol.new_session_id()
    fut = await client.invoke({"n": 3}, input_id="q-3", session_id=sid)
    assert fut.session_id == sid
    assert fut.result_key == f"exp/q-3/{sid}.json"
    result = await asyncio.wait_for(fut, 10)
    assert result["session_id"] == sid
    assert recorder.sessions == [sid]
    # A short id is fine over HTTP (only AgentCore Runtime needs 33+ characters).
    assert (await asyncio.wait_for(client.rollout({"n": 4}, session_id="local-1"), 10))["n"] == 4


async def test_bad_or_busy_session_ids_are_refused_before_sending(
    make_client: ClientFactory, recorder: Recorder
) -> None:
    client = make_client(limits=fast_limits(max_concurrent_sessions=2))
    with pytest.raises(InvalidRolloutConfig, match="session_id 'a/b' must be letters"):
        await client.invoke({}, session_id="a/b")
    with pytest.raises(InvalidRolloutConfig, match="non-empty string"):
        await client.invoke({}, session_id="")
    busy = await client.invoke({"mode": "hang"}, session_id="busy-1")
    with pytest.raises(ConfigurationError, match="has no outcome yet"):
        await client.invoke({}, session_id="busy-1")
    assert client.stats.invocations == 1
    # The refused calls gave their slots back: the second slot is still free.
    assert (await asyncio.wait_for(client.rollout({"n": 5}), 10))["n"] == 5
    busy.cancel()
    await recorder.wait_for(lambda: "busy-1" in recorder.cancelled)


async def test_acr_needs_acr_session_ids(make_client: ClientFactory) -> None:
    client = make_client(
        agent_url=None,
        agent_runtime_arn=DEFAULT_AGENT_RUNTIME_ARN,
        aws=AwsConfig(endpoint_url="http://127.0.0.1:9"),  # never reached: refused first
    )
    with pytest.raises(InvalidRolloutConfig, match="AgentCore Runtime needs 33-256"):
        await client.invoke({}, session_id="too-short")
    assert client.stats.invocations == 0
