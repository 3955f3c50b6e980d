"""Overload: while the event loop runs behind, invocations are refused at once with 503
and Retry-After (the client's cue to pause), never left to queue or be reset."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import anyio
import pytest

from agentcore_rl.s3 import ResultStore
from agentcore_rl.server import FaultChecks, SpoolConfig
from agentcore_rl.server.overload import LoopLag
from tests.server.helpers import (
    FakeClock,
    rollout_app,
    rollout_payload,
    served,
    session_headers,
    settle,
)


async def test_loop_lag_past_the_threshold_is_overload() -> None:
    clock = FakeClock(0.0)
    late = [2.5, 0.5, 2.5, 3.0, 0.25]  # how much longer than asked each sleep takes

    async def sleep(seconds: float) -> None:
        clock.advance(seconds + late.pop(0))
        await anyio.lowlevel.checkpoint()

    lag = LoopLag(1.0, interval=0.25, clock=clock, sleep=sleep)
    seen = [(await lag.measure(), lag.overloaded) for _ in range(5)]
    # One late wake-up (a blocking call) is not overload; two in a row are.
    assert seen == [(2.5, False), (0.5, False), (2.5, False), (3.0, True), (0.25, False)]
    assert not LoopLag(None).overloaded


async def test_a_blocked_loop_is_named_once_with_the_way_out(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A blocking call in an async handler serialises the rollouts: said once, at WARNING."""
    clock = FakeClock(0.0)

    async def sleep(seconds: float) -> None:
        clock.advance(seconds + 6.5)  # a 6.5 s time.sleep() in a handler
        await anyio.lowlevel.checkpoint()

    lag = LoopLag(1.0, interval=0.25, clock=clock, sleep=sleep)
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            await lag.measure()
    told = [r.getMessage() for r in caplog.records if "blocked" in r.getMessage()]
    assert len(told) == 1
    assert "event loop blocked for 6.50 s" in told[0]
    assert "asyncio.to_thread" in told[0]


class ScriptedLag:
    """The lag monitor's sleep: each wake-up is as late as the test says, when it says."""

    def __init__(self) -> None:
        self.clock = FakeClock(0.0)
        self.lateness: asyncio.Queue[float] = asyncio.Queue()

    async def sleep(self, seconds: float) -> None:
        late = await self.lateness.get()
        self.clock.advance(seconds + late)
        self.lateness.task_done()

    async def wake(self, *lateness: float) -> None:
        for late in lateness:
            self.lateness.put_nowait(late)
        await self.lateness.join()


async def test_overloaded_server_answers_503_with_retry_after(
    store: ResultStore, bucket: str, tmp_path: Any
) -> None:
    runs: list[str] = []

    async def handler(payload: dict[str, Any]) -> dict[str, Any]:
        runs.append("ran")
        return {"rewards": [1.0]}

    lag = ScriptedLag()
    faults = FaultChecks(overload_lag=1.0, check_leases=False)
    app = rollout_app(store, handler, spool=SpoolConfig(directory=tmp_path), faults=faults)
    app.overload = LoopLag(1.0, clock=lag.clock, sleep=lag.sleep)
    async with served(app) as http:
        await lag.wake(3.0, 3.0)  # the loop three seconds behind, twice in a row
        response = await http.post(
            "/invocations", json=rollout_payload(bucket), headers=session_headers()
        )
        assert response.status_code == 503
        assert response.headers["Retry-After"] == "1"
        assert "overloaded" in response.json()["error"]
        assert (await http.get("/ping")).status_code == 200  # health is still answered
        await lag.wake(0.0)
        response = await http.post(
            "/invocations", json=rollout_payload(bucket), headers=session_headers()
        )
        assert response.status_code == 200
        await settle(app)
    assert runs == ["ran"]
    assert app.overload.refused == 1
