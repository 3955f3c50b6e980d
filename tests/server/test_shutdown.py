"""Graceful shutdown: 503 for new work, a grace period, then "cancelled" envelopes."""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

import httpx
import pytest

from agentcore_rl import protocol
from agentcore_rl.s3 import ResultStore
from agentcore_rl.server import AgentCoreRLApp
from agentcore_rl.server.options import ShutdownConfig

from .helpers import (
    SESSION,
    HeldRollout,
    accept,
    read_envelope,
    rollout_app,
    rollout_payload,
    served,
    session_headers,
)

KEY = f"exp/q-1/{SESSION}.json"


async def wait_closing(app: AgentCoreRLApp) -> None:
    for _ in range(1000):
        if app.closing:
            return
        await asyncio.sleep(0)  # a yield to the loop, not a wait
    raise AssertionError("shutdown did not begin")


async def test_running_rollout_finishes_within_grace(store: ResultStore, bucket: str) -> None:
    held = HeldRollout()
    app = rollout_app(store, held.solve, shutdown=ShutdownConfig(grace=30))

    async with served(app) as http:
        await accept(http, bucket)
        await held.wait_entered()
        closing = asyncio.create_task(app.aclose())
        await wait_closing(app)
        refused = await http.post(
            "/invocations", json=rollout_payload(bucket, input_id="q-2"), headers=session_headers()
        )
        assert refused.status_code == 503
        assert "shutting down" in refused.json()["error"]
        assert not closing.done()
        held.release.set()
        report = await asyncio.wait_for(closing, 5)
    assert (report.finished, report.cancelled, report.stuck) == (1, 0, 0)
    envelope = await read_envelope(store, bucket, KEY)
    assert envelope["rewards"] == [1.0]
    assert await store.list_keys(bucket, "") == [KEY]


@pytest.mark.parametrize("kind", ["async", "sync"])
async def test_lifespan_shutdown_cancels_after_grace(
    store: ResultStore, bucket: str, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    app = AgentCoreRLApp(store=store, shutdown=ShutdownConfig(grace=0))
    entered = threading.Event()
    release = threading.Event()

    async def forever_async(payload: dict[str, Any]) -> dict[str, Any]:
        entered.set()
        await asyncio.Event().wait()
        return {}

    def forever_sync(payload: dict[str, Any]) -> dict[str, Any]:
        entered.set()
        release.wait(30)
        return {}

    app.rollout_entrypoint(forever_async if kind == "async" else forever_sync)
    caplog.set_level(logging.INFO, logger="agentcore_rl.server")
    try:
        # Leaving the block runs uvicorn's lifespan shutdown, as SIGTERM does.
        async with served(app) as http:
            await accept(http, bucket)
            assert await asyncio.to_thread(entered.wait, 5)
            assert (await http.get("/ping")).json()["status"] == "HealthyBusy"
    finally:
        release.set()
    assert app.last_shutdown is not None
    assert app.last_shutdown.cancelled == 1
    envelope = await store.get_json(bucket, KEY)
    assert envelope is not None
    assert envelope[protocol.STATUS_CODE] == 500
    assert envelope[protocol.ERROR_TYPE] == protocol.ERROR_CANCELLED
    assert "shutting down" in envelope[protocol.STOP_REASON]
    assert any("1 cancelled" in r.getMessage() for r in caplog.records)


async def test_handler_that_ignores_cancellation(store: ResultStore, bucket: str) -> None:
    app = AgentCoreRLApp(store=store, shutdown=ShutdownConfig(grace=0, cancel_timeout=0.05))
    entered = asyncio.Event()
    stubborn_done = asyncio.Event()

    @app.rollout_entrypoint
    async def stubborn(payload: dict[str, Any]) -> dict[str, Any]:
        entered.set()
        for _ in range(3):  # swallows the first cancellations, then gives up
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                continue
        stubborn_done.set()
        return {"rewards": [1.0]}

    async with served(app) as http:
        await accept(http, bucket)
        await asyncio.wait_for(entered.wait(), 5)
    assert app.last_shutdown is not None
    assert app.last_shutdown.stuck == 1
    envelope = await read_envelope(store, bucket, KEY)
    assert envelope[protocol.ERROR_TYPE] == protocol.ERROR_CANCELLED
    assert "did not stop" in envelope[protocol.STOP_REASON]


async def test_aclose_is_idempotent_and_closes_owned_store(
    s3_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3_endpoint)
    app = AgentCoreRLApp()  # owns its store
    app.rollout_entrypoint(lambda payload: {})
    first = await app.aclose()
    assert await app.aclose() is first
    with pytest.raises(RuntimeError, match="closed"):
        await app.store.head("any-bucket", "key")
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://agent") as http:
        response = await http.post("/invocations", json={})
    assert response.status_code == 503


async def test_borrowed_store_stays_open(store: ResultStore, bucket: str) -> None:
    app = AgentCoreRLApp(store=store)
    await app.aclose()
    assert not await store.head(bucket, "nothing-here")


async def test_closing_the_app_leaves_no_task_behind(store: ResultStore, bucket: str) -> None:
    # Every rollout runs in the task group `async with app` opened; closing ends them all,
    # the one that swallows its first cancellation included.
    app = AgentCoreRLApp(store=store, shutdown=ShutdownConfig(grace=0, cancel_timeout=0.05))
    entered = asyncio.Event()

    @app.rollout_entrypoint
    async def stubborn(payload: dict[str, Any]) -> dict[str, Any]:
        entered.set()
        for _ in range(3):
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                continue
        return {"rewards": [1.0]}

    before = asyncio.all_tasks()
    async with app:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://agent") as http:
            await accept(http, bucket)
        await asyncio.wait_for(entered.wait(), 5)
        assert app.runner.active == 1
    assert asyncio.all_tasks() <= before
    assert app.runner.active == 0
    envelope = await read_envelope(store, bucket, KEY)
    assert envelope[protocol.ERROR_TYPE] == protocol.ERROR_CANCELLED
