"""Liveness: GET /sessions/{id} and the status control request over /invocations."""

from __future__ import annotations

from typing import Any

import httpx

from agentcore_rl import protocol
from agentcore_rl.s3 import ResultStore
from agentcore_rl.server.options import ShutdownConfig

from .helpers import (
    SESSION,
    HeldRollout,
    accept,
    rollout_app,
    served,
    session_headers,
    settle,
)

KEY = f"exp/q-1/{SESSION}.json"


async def control(http: httpx.AsyncClient, session_id: str = SESSION) -> dict[str, Any]:
    response = await http.post(
        "/invocations", json=protocol.status_request(), headers=session_headers(session_id)
    )
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


async def status(http: httpx.AsyncClient, session_id: str = SESSION) -> dict[str, Any]:
    response = await http.get(f"/sessions/{session_id}")
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


async def test_unknown_running_finished(store: ResultStore, bucket: str) -> None:
    held = HeldRollout()
    app = rollout_app(store, held.solve)
    async with served(app) as http:
        unknown = {"session_id": SESSION, "state": "unknown", "result_keys": []}
        assert await status(http) == unknown
        assert await control(http) == unknown
        await accept(http, bucket)
        await held.wait_entered()
        running = {"session_id": SESSION, "state": "running", "result_keys": [KEY]}
        assert await status(http) == running
        assert await control(http) == running  # answered at once, the handler still held
        held.release.set()
        await settle(app)
        finished = {"session_id": SESSION, "state": "finished", "result_keys": [KEY]}
        assert await status(http) == finished
        assert await control(http) == finished
    assert app.runner.active == 0


async def test_restarted_server_does_not_know_the_session(store: ResultStore, bucket: str) -> None:
    held = HeldRollout()
    first = rollout_app(store, held.solve, shutdown=ShutdownConfig(grace=0))
    async with served(first) as http:
        await accept(http, bucket)
        await held.wait_entered()
    # The process that held the session is gone; its successor has never seen it, so the
    # client can end that rollout in its own error instead of waiting for its timeout.
    async with served(rollout_app(store, held.solve)) as http:
        assert (await control(http))["state"] == "unknown"
        assert (await status(http))["state"] == "unknown"


async def test_control_request_never_runs_the_handler(store: ResultStore) -> None:
    calls: list[dict[str, Any]] = []

    async def solve(payload: dict[str, Any]) -> dict[str, Any]:
        calls.append(payload)
        return {}

    app = rollout_app(store, solve)
    async with served(app) as http:
        await control(http)
        await control(http, "other-" + "b" * 40)
        await settle(app)
    assert calls == []


async def test_malformed_control_requests(store: ResultStore) -> None:
    app = rollout_app(store, HeldRollout().solve)
    field = protocol.CONTROL_FIELD
    cases = [
        ({field: {"op": "status"}, "prompt": "x"}, "only _agentcore_rl_control", field),
        ({field: "status"}, 'must be {"op": <operation>}', field),
        ({field: {"op": "status", "x": 1}}, 'must be {"op": <operation>}', field),
        ({field: {"op": "reboot"}}, "unknown control operation 'reboot'", f"{field}.op"),
    ]
    async with served(app) as http:
        for payload, fragment, where in cases:
            response = await http.post("/invocations", json=payload)
            assert response.status_code == 400, response.text
            assert fragment in response.json()["error"]
            assert response.json()["field"] == where
        bad = await http.get("/sessions/a..b")
        assert bad.status_code == 400
    assert app.runner.active == 0
