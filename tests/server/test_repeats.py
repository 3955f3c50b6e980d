"""A repeated invocation (same session, same result key) never runs the handler twice:
not while it runs, not after it finished, not after a restart, not while spooled."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from agentcore_rl import protocol
from agentcore_rl.errors import ConfigurationError
from agentcore_rl.s3 import ResultStore
from agentcore_rl.server import AgentCoreRLApp, FaultChecks
from agentcore_rl.server.config import CheckExisting, RepeatConfig, SpoolConfig
from agentcore_rl.server.finished import FinishedRollouts

from .helpers import (
    SESSION,
    FakeClock,
    accept,
    read_envelope,
    rollout_app,
    rollout_payload,
    served,
    session_headers,
    settle,
)

KEY = f"exp/q-1/{SESSION}.json"


class Counting:
    """A rollout handler that counts its runs."""

    def __init__(self) -> None:
        self.runs = 0

    async def solve(self, payload: dict[str, Any]) -> dict[str, Any]:
        self.runs += 1
        return {"rewards": [1.0], "run": self.runs}


async def test_repeat_after_finish_is_not_run_again(store: ResultStore, bucket: str) -> None:
    handler = Counting()
    app = rollout_app(store, handler.solve, clock=FakeClock())
    async with served(app) as http:
        first = await accept(http, bucket)
        await settle(app)
        written = await read_envelope(store, bucket, KEY)
        heads = store.request_counts.get("HeadObject", 0)
        again = await accept(http, bucket)  # the answer to the first was "lost"
        await settle(app)
    assert again.json() == first.json()
    assert handler.runs == 1
    assert await read_envelope(store, bucket, KEY) == written
    # Answered from memory: no S3 request for the repeat.
    assert store.request_counts.get("HeadObject", 0) == heads


async def resend(http: httpx.AsyncClient, bucket: str, *, marked: bool = True) -> None:
    """Send the test session's rollout again, marked as a repeat as the client does."""
    body = rollout_payload(bucket)
    if marked:
        body[protocol.ROLLOUT_FIELD][protocol.REPEAT] = True
    response = await http.post("/invocations", json=body, headers=session_headers())
    assert response.status_code == 200, response.text


async def test_forgotten_repeat_existing_envelope_wins(store: ResultStore, bucket: str) -> None:
    clock = FakeClock()
    handler = Counting()
    app = rollout_app(store, handler.solve, clock=clock, repeats=RepeatConfig(finished_ttl=60))
    async with served(app) as http:
        await accept(http, bucket)
        await settle(app)
        written = await read_envelope(store, bucket, KEY)
        clock.advance(61)  # past the memory: S3 decides
        assert app.session_state(SESSION)["state"] == "unknown"
        await resend(http, bucket)
        await settle(app)
    assert handler.runs == 1
    assert await read_envelope(store, bucket, KEY) == written


async def test_restarted_server_does_not_rerun(store: ResultStore, bucket: str) -> None:
    first, second = Counting(), Counting()
    async with served(rollout_app(store, first.solve)) as http:
        await accept(http, bucket)
    # A new process (a new app) gets the resume's re-invoke of the same session.
    app = rollout_app(store, second.solve)
    async with served(app) as http:
        await resend(http, bucket)
        await settle(app)
    assert (first.runs, second.runs) == (1, 0)
    assert (await read_envelope(store, bucket, KEY))["run"] == 1


@pytest.mark.parametrize(
    ("mode", "marked", "runs", "heads"),
    [
        ("repeats", False, 2, 0),  # an unmarked first send costs no HEAD
        ("always", False, 1, 1),
        ("never", True, 2, 0),
    ],
)
async def test_check_modes(
    store: ResultStore, bucket: str, mode: CheckExisting, marked: bool, runs: int, heads: int
) -> None:
    handler = Counting()
    async with served(rollout_app(store, handler.solve)) as http:
        await accept(http, bucket)
    app = rollout_app(store, handler.solve, repeats=RepeatConfig(check_existing=mode))
    async with served(app) as http:
        await resend(http, bucket, marked=marked)
        await settle(app)
    assert handler.runs == runs
    assert store.request_counts.get("HeadObject", 0) == heads


def test_check_mode_is_checked(store: ResultStore) -> None:
    with pytest.raises(ConfigurationError, match="check_existing must be"):
        AgentCoreRLApp(store=store, repeats=RepeatConfig(check_existing="sometimes"))  # type: ignore[arg-type]


async def test_spooled_rollout_counts_as_finished(
    s3_endpoint: str, store: ResultStore, tmp_path: Path
) -> None:
    bucket = f"late-{uuid.uuid4().hex[:12]}"  # does not exist yet: the write is spooled
    handler = Counting()
    spool = tmp_path / "spool"
    app = rollout_app(
        store,
        handler.solve,
        spool=SpoolConfig(directory=spool, retry_interval=300),
        faults=FaultChecks(check_buckets=False),  # the bucket goes missing after acceptance
    )
    async with served(app) as http:
        await accept(http, bucket)
        await settle(app)
        assert app.spool.pending == 1
        await accept(http, bucket)
        await settle(app)
        assert handler.runs == 1
        assert app.session_state(SESSION)["state"] == "finished"
    # The next process adopts the spool; the re-invoke finds the rollout there.
    later = Counting()
    app = rollout_app(
        store,
        later.solve,
        spool=SpoolConfig(directory=spool, retry_interval=300),
        faults=FaultChecks(check_buckets=False),
    )
    async with served(app) as http:
        assert app.spool.pending == 1
        assert app.session_state(SESSION)["state"] == "finished"
        await accept(http, bucket)
        await settle(app)
        assert later.runs == 0
        await store.ensure_bucket(bucket)
        assert await app.spool.drain() == 0
    assert (await read_envelope(store, bucket, KEY))["run"] == 1


def test_memory_is_bounded_in_time_and_count() -> None:
    clock = FakeClock()
    finished = FinishedRollouts(ttl=10, max_entries=2, clock=clock)
    finished.remember("b", "e/1/s1.json", session_id="s1")
    clock.advance(5)
    finished.remember("b", "e/2/s2.json", session_id="s2")
    finished.remember("b", "e/3/s3.json", session_id="s3")  # over the count: s1 goes
    assert not finished.contains("b", "e/1/s1.json")
    assert finished.keys_of_session("s1") == []
    assert finished.contains("b", "e/2/s2.json")
    clock.advance(10)  # past the ttl of both
    assert len(finished) == 0
    assert finished.keys_of_session("s3") == []


def test_memory_settings_are_checked(store: ResultStore) -> None:
    with pytest.raises(ConfigurationError, match="finished_ttl"):
        AgentCoreRLApp(store=store, repeats=RepeatConfig(finished_ttl=0))


def test_status_payload_shape() -> None:
    assert protocol.status_request() == {"_agentcore_rl_control": {"op": "status"}}
