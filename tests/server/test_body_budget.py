"""Memory: a total budget for request bodies being received (503 + Retry-After beyond
it), and a digest in the envelope instead of a copy of a large payload."""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from agentcore_rl import protocol
from agentcore_rl.errors import ConfigurationError
from agentcore_rl.s3 import ResultStore
from agentcore_rl.server import AgentCoreRLApp
from agentcore_rl.server.options import RequestLimits

from .helpers import SESSION, read_envelope, rollout_payload, served, session_headers, settle

KEY = f"exp/q-1/{SESSION}.json"


async def solve(payload: dict[str, Any]) -> dict[str, Any]:
    return {"rewards": [1.0]}


async def wait_in_flight(app: AgentCoreRLApp, at_least: int) -> None:
    for _ in range(500):  # bounded: the server reads the first chunk within a few loops
        if app.body_budget.in_flight >= at_least:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"the server never held {at_least} body bytes")


async def test_bodies_beyond_the_budget_get_503(store: ResultStore, bucket: str) -> None:
    app = AgentCoreRLApp(
        store=store, limits=RequestLimits(max_body_bytes=8_000, max_inflight_body_bytes=10_000)
    )
    app.rollout_entrypoint(solve)
    gate = asyncio.Event()
    first_half = json.dumps(rollout_payload(bucket, filler="x" * 6_000))[:-1].encode()

    async def slow_body() -> AsyncIterator[bytes]:
        yield first_half  # chunked: reserved as it arrives
        await gate.wait()
        yield b"}"

    async with served(app) as http:
        slow = asyncio.create_task(
            http.post("/invocations", content=slow_body(), headers=session_headers())
        )
        await wait_in_flight(app, len(first_half))
        other = rollout_payload(bucket, input_id="q-2", filler="y" * 6_000)
        refused = await http.post("/invocations", json=other)
        assert refused.status_code == 503, refused.text
        assert refused.headers["retry-after"] == "1"
        assert "max_inflight_body_bytes" in refused.json()["error"]
        gate.set()
        assert (await slow).status_code == 200
        assert app.body_budget.in_flight == 0  # released once parsed
        assert (await http.post("/invocations", json=other)).status_code == 200
        await settle(app)


async def test_refused_and_broken_bodies_give_their_bytes_back(store: ResultStore) -> None:
    app = AgentCoreRLApp(
        store=store, limits=RequestLimits(max_body_bytes=1_000, max_inflight_body_bytes=1_000)
    )
    app.rollout_entrypoint(solve)
    async with served(app) as http:
        assert (await http.post("/invocations", content=b"x" * 2_000)).status_code == 413
        assert (await http.post("/invocations", content=b"{oops")).status_code == 400
        assert app.body_budget.in_flight == 0


def test_budget_must_hold_the_largest_body(store: ResultStore) -> None:
    with pytest.raises(ConfigurationError, match="max_inflight_body_bytes"):
        AgentCoreRLApp(
            store=store, limits=RequestLimits(max_body_bytes=100, max_inflight_body_bytes=99)
        )


async def test_large_payload_stored_as_digest(store: ResultStore, bucket: str) -> None:
    app = AgentCoreRLApp(store=store, limits=RequestLimits(envelope_payload_max_bytes=500))
    app.rollout_entrypoint(solve)
    big = json.dumps(rollout_payload(bucket, document="z" * 5_000)).encode()
    small = rollout_payload(bucket, input_id="q-2")
    async with served(app) as http:
        headers = {**session_headers(), "content-type": "application/json"}
        assert (await http.post("/invocations", content=big, headers=headers)).status_code == 200
        assert (await http.post("/invocations", json=small, headers=headers)).status_code == 200
        await settle(app)
    envelope = await read_envelope(store, bucket, KEY)
    assert envelope[protocol.PAYLOAD] == {
        "payload_sha256": hashlib.sha256(big).hexdigest(),
        "payload_bytes": len(big),
        "_rollout": json.loads(big)["_rollout"],
    }
    assert envelope["rewards"] == [1.0]
    kept = await read_envelope(store, bucket, f"exp/q-2/{SESSION}.json")
    assert kept[protocol.PAYLOAD] == small
