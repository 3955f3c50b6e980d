"""Closing does not wait for the agents' envelope writes: stop calls are
sent as fast as the rate limiter allows and bounded, and what could not be stopped in
time is data (``client.unstopped_sessions``), not only a warning."""

from __future__ import annotations

import asyncio

from agentcore_rl.client import Limits
from agentcore_rl.client.transports.http import HttpTransport
from tests.client.agents import Recorder
from tests.client.conftest import ClientFactory, fast_limits, short_timeouts


async def test_close_stops_every_session_without_waiting_for_the_agent(
    make_client: ClientFactory, recorder: Recorder
) -> None:
    # Each agent takes until the gate opens to cancel (its stop route waits for that).
    client = make_client(timeouts=short_timeouts(close=10.0), limits=fast_limits())
    assert isinstance(client.transport, HttpTransport)
    client.transport.stop_answer_timeout = 0.05
    futures = [await client.invoke({"mode": "stubborn", "n": n}) for n in range(20)]
    await recorder.wait_for(lambda: recorder.running == 20)
    await asyncio.wait_for(client.aclose(), 10)
    assert recorder.cancelled == {f.session_id for f in futures}
    assert client.unstopped_sessions == []
    assert client.stats.stops == 20
    recorder.open_gate()


async def test_sessions_not_stopped_in_time_are_reported(
    make_client: ClientFactory, recorder: Recorder
) -> None:
    client = make_client(timeouts=short_timeouts(close=0.05), limits=Limits(tps=1.0, burst=1.0))
    futures = [await client.invoke({"mode": "gate", "n": n}) for n in range(3)]
    await client.aclose()
    unstopped = set(client.unstopped_sessions)
    assert unstopped  # the token bucket allows about one stop within 0.05 s
    assert unstopped <= {f.session_id for f in futures}
    assert client.stats.unstopped == len(unstopped)
    recorder.open_gate()
