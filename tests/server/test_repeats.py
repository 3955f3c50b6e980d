"""A repeated invocation (same session, same result key) never runs the handler twice:
not while it runs, and a re-send the client marked not after it finished, not after a
restart, not while spooled."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import httpx

from agentcore_rl import protocol
from agentcore_rl.s3 import ResultStore
from agentcore_rl.server import FaultChecks
from agentcore_rl.server.options import SpoolConfig
from agentcore_rl.server.runner import RolloutRunner
from agentcore_rl.server.spool import Spool

from .helpers import (
    SESSION,
    FakeClock,
    HeldRollout,
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


async def resend(http: httpx.AsyncClient, bucket: str, *, marked: bool = True) -> None:
    """Send the test session's rollout again, marked as a repeat as the client does."""
    body = rollout_payload(bucket)
    if marked:
        body[protocol.ROLLOUT_FIELD][protocol.REPEAT] = True
    response = await http.post("/invocations", json=body, headers=session_headers())
    assert response.status_code == 200, response.text


async def test_marked_repeat_after_finish_is_not_run_again(store: ResultStore, bucket: str) -> None:
    handler = Counting()
    app = rollout_app(store, handler.solve)
    async with served(app) as http:
        await accept(http, bucket)
        await settle(app)
        written = await read_envelope(store, bucket, KEY)
        heads = store.request_counts.get("HeadObject", 0)
        await resend(http, bucket)  # the answer to the first was "lost": S3 decides
        await settle(app)
    assert handler.runs == 1
    assert store.request_counts.get("HeadObject", 0) == heads + 1
    assert await read_envelope(store, bucket, KEY) == written


async def test_repeat_while_running_is_recognised(store: ResultStore, bucket: str) -> None:
    held = HeldRollout()
    app = rollout_app(store, held.solve)
    async with served(app) as http:
        await accept(http, bucket)
        await held.wait_entered()
        await accept(http, bucket)  # unmarked: the running job answers, no HEAD
        await resend(http, bucket)
        assert app.runner.active == 1
        held.release.set()
        await settle(app)
    assert store.request_counts.get("HeadObject", 0) == 0


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


async def test_an_unmarked_send_costs_no_head(store: ResultStore, bucket: str) -> None:
    handler = Counting()
    async with served(rollout_app(store, handler.solve)) as http:
        await accept(http, bucket)
    app = rollout_app(store, handler.solve)
    async with served(app) as http:
        await resend(http, bucket, marked=False)
        await settle(app)
    assert handler.runs == 2
    assert store.request_counts.get("HeadObject", 0) == 0


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
        await resend(http, bucket)
        await settle(app)
        assert handler.runs == 1
        assert app.runner.session_state(SESSION)["state"] == "finished"
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
        assert app.runner.session_state(SESSION)["state"] == "finished"
        await resend(http, bucket)
        await settle(app)
        assert later.runs == 0
        await store.ensure_bucket(bucket)
        assert await app.spool.drain() == 0
    assert (await read_envelope(store, bucket, KEY))["run"] == 1


def test_finished_sessions_remembered_are_bounded(store: ResultStore) -> None:
    runner = RolloutRunner(spool=Spool(store), clock=FakeClock(), exists=store.head, remember=2)
    for n in (1, 2, 3):  # over the count: s1 goes
        runner.remember_finished(f"s{n}", f"e/{n}/s{n}.json")
    assert runner.session_state("s1")["state"] == "unknown"
    assert runner.session_state("s3") == {
        "session_id": "s3",
        "state": "finished",
        "result_keys": ["e/3/s3.json"],
    }


def test_status_payload_shape() -> None:
    assert protocol.status_request() == {"_agentcore_rl_control": {"op": "status"}}
