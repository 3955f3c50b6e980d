"""The app mounted under a prefix in another Starlette app, closed by the parent."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Mount, Route

from agentcore_rl import protocol
from agentcore_rl.s3 import ResultStore
from agentcore_rl.server import AgentCoreRLApp
from agentcore_rl.server.options import ShutdownConfig

from .helpers import SESSION, rollout_payload, served, session_headers, settle


def make_agent(store: ResultStore, entered: asyncio.Event) -> AgentCoreRLApp:
    agent = AgentCoreRLApp(store=store, shutdown=ShutdownConfig(grace=0))

    @agent.rollout_entrypoint
    async def solve(payload: dict[str, Any]) -> dict[str, Any]:
        entered.set()
        if payload.get("hold"):
            await asyncio.Event().wait()
        return {"rewards": [1.0]}

    return agent


async def test_mounted_under_prefix(store: ResultStore, bucket: str) -> None:
    entered = asyncio.Event()
    agent = make_agent(store, entered)

    @contextlib.asynccontextmanager
    async def lifespan(parent: Starlette) -> AsyncIterator[None]:
        # A parent's lifespan does not reach mounted apps: close the agent from here.
        async with agent:
            yield

    async def home(request: Any) -> PlainTextResponse:
        return PlainTextResponse("parent")

    parent = Starlette(
        routes=[Route("/", home), Mount("/agents/math", app=agent)], lifespan=lifespan
    )
    async with served(parent) as http:
        assert (await http.get("/")).text == "parent"
        ping = await http.get("/agents/math/ping")
        assert ping.json()["status"] == "Healthy"
        done = await http.post(
            "/agents/math/invocations", json=rollout_payload(bucket), headers=session_headers()
        )
        assert done.status_code == 200
        await settle(agent)
        held = await http.post(
            "/agents/math/invocations",
            json=rollout_payload(bucket, input_id="q-2", hold=True),
            headers=session_headers(),
        )
        assert held.status_code == 200
        await asyncio.wait_for(entered.wait(), 5)
        assert (await http.get("/agents/math/ping")).json()["status"] == "HealthyBusy"
        assert (await http.get("/invocations")).status_code == 404  # only under the prefix
    # The parent's shutdown closed the agent: the held rollout got its envelope.
    assert agent.last_shutdown is not None
    assert agent.last_shutdown.cancelled == 1
    first = await store.get_json(bucket, f"exp/q-1/{SESSION}.json")
    held_envelope = await store.get_json(bucket, f"exp/q-2/{SESSION}.json")
    assert first is not None
    assert first["rewards"] == [1.0]
    assert held_envelope is not None
    assert held_envelope[protocol.ERROR_TYPE] == protocol.ERROR_CANCELLED


async def test_mounted_without_lifespan_then_closed(store: ResultStore, bucket: str) -> None:
    # No lifespan reaches the agent at all: it must work from the first request and
    # close cleanly when told.
    agent = make_agent(store, asyncio.Event())
    parent = Starlette(routes=[Mount("/agent", app=agent)])
    transport = httpx.ASGITransport(app=parent)
    async with httpx.AsyncClient(transport=transport, base_url="http://parent") as http:
        response = await http.post(
            "/agent/invocations", json=rollout_payload(bucket), headers=session_headers()
        )
        assert response.status_code == 200
        assert response.json()["result_key"] == f"exp/q-1/{SESSION}.json"
        await settle(agent)
        stop = await http.post(f"/agent/sessions/{SESSION}/stop")
        assert stop.json() == {"session_id": SESSION, "stopped": False}
    report = await agent.aclose()
    assert report.cancelled == 0
    assert await store.head(bucket, f"exp/q-1/{SESSION}.json")
