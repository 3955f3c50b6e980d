"""Shared pieces of the server tests: a fake clock, payload builders, a served app."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import anyio
import httpx

from agentcore_rl import protocol
from agentcore_rl.local.background import BackgroundServer
from agentcore_rl.s3 import ResultStore
from agentcore_rl.server import AgentCoreRLApp
from agentcore_rl.server.spool import Spool, s3_destination

SESSION = "session-" + "a" * 40


class FakeClock:
    """Epoch seconds that move only when a test says so."""

    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def spool_record(
    store: ResultStore, bucket: str, key: str, body: str, *, owner: str | None
) -> dict[str, Any]:
    """A spool file's content as ``owner`` writes it for ``store``'s S3."""
    return {
        "bucket": bucket,
        "key": key,
        "owner": owner,
        "destination": s3_destination(store),
        "body": body,
    }


def rollout_payload(
    bucket: str, *, exp_id: str = "exp", input_id: str = "q-1", **extra: Any
) -> dict[str, Any]:
    return {
        "prompt": "2+2?",
        **extra,
        protocol.ROLLOUT_FIELD: {
            protocol.EXP_ID: exp_id,
            protocol.INPUT_ID: input_id,
            protocol.S3_BUCKET: bucket,
        },
    }


def session_headers(session_id: str = SESSION) -> dict[str, str]:
    return {protocol.SESSION_ID_HEADER: session_id}


async def settle(app: AgentCoreRLApp, within: float = 5.0) -> None:
    """Wait until every accepted rollout has delivered its envelope."""
    assert await app.runner.wait(app.runner.jobs, within=within), "rollouts did not finish"


async def drained(spool: Spool, within: float = 5.0) -> None:
    """Wait until the spool has delivered everything it holds."""
    for _ in range(int(within / 0.01)):
        if not spool.pending:
            return
        await anyio.sleep(0.01)
    raise AssertionError("the spool did not drain")


@contextlib.asynccontextmanager
async def served(app: Any) -> AsyncIterator[httpx.AsyncClient]:
    """The app under real uvicorn on loopback, with an HTTP client pointed at it."""
    async with (
        BackgroundServer(app) as server,
        httpx.AsyncClient(base_url=server.url, timeout=10) as http,
    ):
        yield http


def rollout_app(store: ResultStore, handler: Any, **options: Any) -> AgentCoreRLApp:
    """An app on ``store`` (with ``options``) whose rollout entrypoint is ``handler``."""
    app = AgentCoreRLApp(store=store, **options)
    app.rollout_entrypoint(handler)
    return app


async def accept(http: httpx.AsyncClient, bucket: str, **payload: Any) -> httpx.Response:
    """POST one rollout for ``bucket`` in the test session; assert it was accepted."""
    response = await http.post(
        "/invocations", json=rollout_payload(bucket, **payload), headers=session_headers()
    )
    assert response.status_code == 200
    return response


async def run_to_end(app: AgentCoreRLApp, bucket: str) -> httpx.Response:
    """Serve ``app``, have it accept one rollout, wait for it to finish, then shut down."""
    async with served(app) as http:
        response = await accept(http, bucket)
        await settle(app)
    return response


async def read_envelope(store: ResultStore, bucket: str, key: str) -> dict[str, Any]:
    """The envelope stored at ``key``; asserts there is one."""
    envelope = await store.get_json(bucket, key)
    assert envelope is not None
    return envelope


class HeldRollout:
    """A rollout handler that says when it has started and returns only when released."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

    async def solve(self, payload: dict[str, Any]) -> dict[str, Any]:
        self.entered.set()
        await self.release.wait()
        return {"rewards": [1.0]}

    async def wait_entered(self) -> None:
        await asyncio.wait_for(self.entered.wait(), 5)
