"""The core path: rollouts written to S3, ping transitions, handler shapes, stop, plain."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from agentcore_rl import protocol
from agentcore_rl.s3 import ResultStore
from agentcore_rl.server import AgentCoreRLApp, RequestContext

from .helpers import (
    SESSION,
    FakeClock,
    HeldRollout,
    accept,
    read_envelope,
    rollout_app,
    rollout_payload,
    run_to_end,
    served,
    session_headers,
    settle,
)


async def test_rollout_writes_envelope(store: ResultStore, bucket: str) -> None:
    clock = FakeClock()
    app = AgentCoreRLApp(store=store)
    app.clock = clock

    @app.rollout_entrypoint
    async def solve(payload: dict[str, Any], context: RequestContext) -> dict[str, Any]:
        return {"rewards": [1.0], "seen_session": context.session_id}

    async with served(app) as http:
        payload = rollout_payload(bucket)
        response = await http.post("/invocations", json=payload, headers=session_headers())
        assert response.status_code == 200
        key = f"exp/q-1/{SESSION}.json"
        answer, beat = response.json(), app.heartbeat
        assert beat is not None
        heartbeat = {"key": f"exp/.heartbeats/{beat.process_id}.json", "interval": 5.0}
        assert answer.pop("heartbeat") == heartbeat
        assert answer == {"status": "processing", "s3_bucket": bucket, "result_key": key}
        await settle(app)
    envelope = await store.get_json(bucket, key)
    assert envelope is not None
    assert envelope["rewards"] == [1.0]
    assert envelope["seen_session"] == SESSION
    assert envelope[protocol.STATUS_CODE] == 200
    assert envelope[protocol.STOP_REASON] == "end_turn"
    assert envelope[protocol.INPUT_ID] == "q-1"
    assert envelope[protocol.S3_BUCKET] == bucket
    assert envelope[protocol.RESULT_KEY] == key
    assert envelope[protocol.SESSION_ID] == SESSION
    assert envelope[protocol.PAYLOAD] == payload
    assert envelope[protocol.STARTED_AT] == clock.now
    assert envelope[protocol.FINISHED_AT] == clock.now


async def test_handler_may_set_status_code_and_stop_reason(store: ResultStore, bucket: str) -> None:
    def solve(payload: dict[str, Any]) -> dict[str, Any]:
        return {"rewards": [0.0], "status_code": 206, "stop_reason": "max_turns"}

    await run_to_end(rollout_app(store, solve), bucket)
    envelope = await read_envelope(store, bucket, f"exp/q-1/{SESSION}.json")
    assert (envelope["status_code"], envelope["stop_reason"]) == (206, "max_turns")


async def test_fresh_session_id_without_header(store: ResultStore, bucket: str) -> None:
    app = AgentCoreRLApp(store=store)
    seen: list[str] = []

    @app.rollout_entrypoint
    async def solve(payload: dict[str, Any], context: RequestContext) -> dict[str, Any]:
        seen.append(context.session_id)
        return {}

    async with served(app) as http:
        response = await http.post("/invocations", json=rollout_payload(bucket))
        assert response.status_code == 200
        await settle(app)
    (session_id,) = seen
    assert protocol.is_acr_session_id(session_id)
    assert response.json()["result_key"] == f"exp/q-1/{session_id}.json"
    assert await store.head(bucket, f"exp/q-1/{session_id}.json")


async def test_ping_transitions_with_changing_time(store: ResultStore, bucket: str) -> None:
    clock = FakeClock()
    held = HeldRollout()
    app = rollout_app(store, held.solve)
    app.clock = clock

    async with served(app) as http:
        first = (await http.get("/ping")).json()
        assert first == {"status": "Healthy", "time_of_last_update": int(clock.now)}

        clock.advance(10)
        await accept(http, bucket)
        await held.wait_entered()
        busy = (await http.get("/ping")).json()
        assert busy == {"status": "HealthyBusy", "time_of_last_update": int(clock.now)}
        assert busy["time_of_last_update"] != first["time_of_last_update"]

        clock.advance(10)
        assert (await http.get("/ping")).json() == busy  # no change, no new time

        held.release.set()
        await settle(app)
        idle = (await http.get("/ping")).json()
        assert idle == {"status": "Healthy", "time_of_last_update": int(clock.now)}
        assert idle["time_of_last_update"] != busy["time_of_last_update"]


@pytest.mark.parametrize("kind", ["async", "sync"])
@pytest.mark.parametrize("with_context", [True, False])
async def test_handler_shapes(
    store: ResultStore, bucket: str, kind: str, with_context: bool
) -> None:
    app = AgentCoreRLApp(store=store)
    calls: list[tuple[str, RequestContext | None]] = []

    def record(payload: dict[str, Any], context: RequestContext | None) -> dict[str, Any]:
        calls.append((threading.current_thread().name, context))
        return {"rewards": [len(payload["prompt"])]}

    handler: Any
    if kind == "async" and with_context:

        async def handler(payload: dict[str, Any], context: RequestContext) -> dict[str, Any]:
            return record(payload, context)

    elif kind == "async":

        async def handler(payload: dict[str, Any]) -> dict[str, Any]:
            return record(payload, None)

    elif with_context:

        def handler(payload: dict[str, Any], context: RequestContext) -> dict[str, Any]:
            return record(payload, context)

    else:

        def handler(payload: dict[str, Any]) -> dict[str, Any]:
            return record(payload, None)

    app.rollout_entrypoint(handler)
    async with served(app) as http:
        headers = {**session_headers(), protocol.REQUEST_ID_HEADER: "req-7", "X-Extra": "yes"}
        response = await http.post("/invocations", json=rollout_payload(bucket), headers=headers)
        assert response.status_code == 200
        await settle(app)
    envelope = await store.get_json(bucket, f"exp/q-1/{SESSION}.json")
    assert envelope is not None
    assert envelope["rewards"] == [4]
    ((thread_name, context),) = calls
    assert (thread_name == threading.main_thread().name) == (kind == "async")
    if with_context:
        assert context is not None
        assert context.session_id == SESSION
        assert context.request_id == "req-7"
        assert context.headers["x-extra"] == "yes"
        assert context.rollout is not None
        assert context.rollout.s3_bucket == bucket
    else:
        assert context is None


async def test_stop_session_cancels_and_writes_envelope(
    store: ResultStore, bucket: str, caplog: pytest.LogCaptureFixture
) -> None:
    app = AgentCoreRLApp(store=store)
    entered = asyncio.Event()

    @app.rollout_entrypoint
    async def solve(payload: dict[str, Any]) -> dict[str, Any]:
        entered.set()
        await asyncio.Event().wait()  # runs until stopped
        raise AssertionError("unreachable")

    async with served(app) as http:
        await accept(http, bucket)
        await asyncio.wait_for(entered.wait(), 5)
        stop = await http.post(f"/sessions/{SESSION}/stop")
        assert stop.status_code == 200
        assert stop.json() == {"session_id": SESSION, "stopped": True}
        # The stop answer comes after the envelope is written.
        envelope = await store.get_json(bucket, f"exp/q-1/{SESSION}.json")
        assert envelope is not None
        assert envelope[protocol.STATUS_CODE] == 500
        assert envelope[protocol.ERROR_TYPE] == protocol.ERROR_CANCELLED
        assert envelope[protocol.STOP_REASON] == "the session was stopped"
        # Said once: "(cancelled: the session was stopped)", not "cancelled: cancelled: ...".
        assert "cancelled: the session was stopped" in caplog.text
        assert "cancelled: cancelled" not in caplog.text
        again = await http.post(f"/sessions/{SESSION}/stop")
        assert again.json() == {"session_id": SESSION, "stopped": False}
        assert (await http.get("/ping")).json()["status"] == "Healthy"


async def test_stop_blocking_sync_handler(store: ResultStore, bucket: str) -> None:
    app = AgentCoreRLApp(store=store)
    entered = threading.Event()
    release = threading.Event()

    @app.rollout_entrypoint
    def solve(payload: dict[str, Any]) -> dict[str, Any]:
        entered.set()
        release.wait(30)
        return {"rewards": [1.0]}

    try:
        async with served(app) as http:
            await accept(http, bucket)
            assert await asyncio.to_thread(entered.wait, 5)
            stop = await http.post(f"/sessions/{SESSION}/stop")
            assert stop.json() == {"session_id": SESSION, "stopped": True}
        envelope = await store.get_json(bucket, f"exp/q-1/{SESSION}.json")
        assert envelope is not None
        assert envelope[protocol.ERROR_TYPE] == protocol.ERROR_CANCELLED
    finally:
        release.set()


async def test_stop_unknown_session_and_bad_id(store: ResultStore) -> None:
    app = AgentCoreRLApp(store=store)

    @app.rollout_entrypoint
    async def solve(payload: dict[str, Any]) -> dict[str, Any]:
        return {}

    async with served(app) as http:
        response = await http.post("/sessions/nobody-here/stop")
        assert response.status_code == 200
        assert response.json() == {"session_id": "nobody-here", "stopped": False}
        bad = await http.post("/sessions/bad..id/stop")
        assert bad.status_code == 400
        assert bad.json()["field"] == "session_id"
        assert "letters, digits and hyphens" in bad.json()["error"]


async def test_plain_entrypoint(store: ResultStore) -> None:
    app = AgentCoreRLApp(store=store)

    @app.entrypoint
    async def echo(payload: dict[str, Any], context: RequestContext) -> dict[str, Any]:
        if payload.get("fail"):
            raise ValueError("asked to fail")
        if payload.get("nan"):
            return {"x": float("nan")}
        return {"echo": payload, "session": context.session_id}

    async with served(app) as http:
        ok = await http.post("/invocations", json={"a": 1}, headers=session_headers())
        assert ok.status_code == 200
        assert ok.json() == {"echo": {"a": 1}, "session": SESSION}
        failed = await http.post("/invocations", json={"fail": True})
        assert failed.status_code == 500
        assert failed.json() == {"error": "asked to fail", "field": None}
        nan = await http.post("/invocations", json={"nan": True})
        assert nan.status_code == 500
        assert "not JSON-serialisable" in nan.json()["error"]


async def test_plain_sync_entrypoint_without_context(store: ResultStore) -> None:
    app = AgentCoreRLApp(store=store)

    @app.entrypoint
    def double(payload: dict[str, Any]) -> int:
        return int(payload["n"]) * 2

    async with served(app) as http:
        response = await http.post("/invocations", json={"n": 21})
        assert response.status_code == 200
        assert response.json() == 42
