"""An agent URL nobody listens on: a short bounded retry, then a final error; nothing to
stop, nothing reported as still running, and the client closes at once."""

from __future__ import annotations

import asyncio
import logging

import pytest

from agentcore_rl.client import LivenessConfig, Retries, RetryPolicy
from agentcore_rl.errors import AgentUnreachableError
from tests.client.conftest import ClientFactory, quick_retries
from tests.server.test_sigterm import free_port


class SteppedTime:
    """Monotonic time that moves only by the retries' own waits (no real sleeping)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    async def sleep(self, delay: float) -> None:
        self.now += delay
        await asyncio.sleep(0)


async def test_refused_connection_ends_after_the_window_without_stops(
    make_client: ClientFactory, caplog: pytest.LogCaptureFixture
) -> None:
    time = SteppedTime()
    # Many attempts allowed, backoff 0.5, 1, 2, 4 s...: the window (3 s) ends it first.
    retry = RetryPolicy(attempts=20, initial=0.5, maximum=10.0, jitter=0.0, sleep=time.sleep)
    client = make_client(
        agent_url=f"http://127.0.0.1:{free_port()}",
        retries=Retries(call=retry, rollouts=2),
        liveness=LivenessConfig(unreachable_after=3.0, lease=None),
    )
    client._rollouts.calls.clock = time  # the window's clock: retries advance it, not real time
    with caplog.at_level(logging.WARNING), pytest.raises(AgentUnreachableError) as info:
        await client.invoke({"n": 1})
    assert "nothing was started" in str(info.value)
    # Attempts at 0, 0.5, 1.5 and 3.5 s of retry time: the fourth is past the window.
    assert time.now == 3.5
    await client.aclose()
    stats = client.stats
    assert stats.invocations == 4
    assert stats.rollout_retries == 0  # a new session would meet the same closed port
    assert (stats.stops, stats.stop_failures, stats.unstopped) == (0, 0, 0)
    assert client.unstopped_sessions == []
    assert not [r for r in caplog.records if "could not be stopped" in r.getMessage()]


async def test_a_refused_session_moves_to_a_live_url(
    make_client: ClientFactory, agent_url: str
) -> None:
    # Nothing started on the dead server, so the same session may go to the live one.
    dead = f"http://127.0.0.1:{free_port()}"
    client = make_client(agent_url=[dead, agent_url], retries=quick_retries(rollouts=0))
    futures = [await client.invoke({"n": n}) for n in range(6)]
    results = await asyncio.wait_for(asyncio.gather(*futures), 20)
    assert [r["n"] for r in results] == list(range(6))
    assert client.stats.rollout_retries == 0
