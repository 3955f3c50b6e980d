"""A result bucket that cannot be used is refused at once; an S3 outage is not a verdict."""

from __future__ import annotations

import uuid
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from agentcore_rl import protocol
from agentcore_rl.local.background import BackgroundServer
from agentcore_rl.s3 import ResultStore
from agentcore_rl.server import FaultChecks, SpoolConfig
from agentcore_rl.server.buckets import BucketCheck
from tests.conftest import FAST_RETRY
from tests.server.helpers import (
    FakeClock,
    rollout_app,
    rollout_payload,
    served,
    session_headers,
    settle,
)
from tests.server.test_sigterm import free_port

SLOW_DOWN = (
    b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate.</Message></Error>"
)


async def solve(payload: dict[str, Any]) -> dict[str, Any]:
    return {"rewards": [1.0]}


async def throttling_s3(scope: Scope, receive: Receive, send: Send) -> None:
    """An S3 that answers every request with 503 SlowDown."""
    if scope["type"] != "http":
        return
    await Request(scope, receive).body()
    await Response(SLOW_DOWN, status_code=503, media_type="application/xml")(scope, receive, send)


async def test_missing_bucket_is_refused_with_its_name_and_cause(
    store: ResultStore, tmp_path: Any
) -> None:
    clock = FakeClock(0.0)
    bucket = f"late-{uuid.uuid4().hex[:12]}"
    runs: list[str] = []

    async def handler(payload: dict[str, Any]) -> dict[str, Any]:
        runs.append("ran")
        return {"rewards": [1.0]}

    app = rollout_app(
        store,
        handler,
        spool=SpoolConfig(directory=tmp_path),
        # A generous wait: on a loaded machine a slow answer would count as an outage.
        faults=FaultChecks(bucket_miss_ttl=10, bucket_wait=30),
    )
    app.bucket_check = BucketCheck(store, app.bucket_check.config, clock=clock)
    async with served(app) as http:
        for _ in range(2):
            response = await http.post(
                "/invocations", json=rollout_payload(bucket), headers=session_headers()
            )
            assert response.status_code == 400
            body = response.json()
            assert bucket in body["error"]
            assert "NoSuchBucket" in body["error"]
            assert body["field"] == "_rollout.s3_bucket"
        assert app.bucket_check.requests == 1  # the second answer came from memory
        assert runs == []
        assert app.spool.pending == 0
        # Created meanwhile: after the negative answer expires, rollouts are accepted.
        await store.ensure_bucket(bucket)
        clock.advance(10)
        response = await http.post(
            "/invocations", json=rollout_payload(bucket), headers=session_headers()
        )
        assert response.status_code == 200
        await settle(app)
    assert runs == ["ran"]
    assert await store.head(
        bucket, "exp/q-1/" + session_headers()[protocol.SESSION_ID_HEADER] + ".json"
    )


async def test_usable_bucket_is_checked_once(
    store: ResultStore, bucket: str, tmp_path: Any
) -> None:
    app = rollout_app(store, solve, spool=SpoolConfig(directory=tmp_path))
    async with served(app) as http:
        for n in range(3):
            response = await http.post(
                "/invocations",
                json=rollout_payload(bucket, input_id=f"q-{n}"),
                headers=session_headers(),
            )
            assert response.status_code == 200
        await settle(app)
    assert app.bucket_check.requests == 1


async def test_throttling_s3_is_an_outage_not_a_refusal(tmp_path: Any) -> None:
    async with BackgroundServer(throttling_s3) as s3:
        store = ResultStore(endpoint_url=s3.url, retry=FAST_RETRY)
        app = rollout_app(store, solve, spool=SpoolConfig(directory=tmp_path, retry_interval=60))
        async with served(app) as http:
            response = await http.post(
                "/invocations", json=rollout_payload("rollouts"), headers=session_headers()
            )
            assert response.status_code == 200  # accepted: the envelope waits in the spool
            await settle(app)
            assert app.spool.pending == 1
        await store.aclose()


async def test_s3_endpoint_down_is_an_outage_not_a_refusal(tmp_path: Any) -> None:
    store = ResultStore(endpoint_url=f"http://127.0.0.1:{free_port()}", retry=FAST_RETRY)
    app = rollout_app(store, solve, spool=SpoolConfig(directory=tmp_path, retry_interval=60))
    async with served(app) as http:
        response = await http.post(
            "/invocations", json=rollout_payload("rollouts"), headers=session_headers()
        )
        assert response.status_code == 200
        await settle(app)
        assert app.spool.pending == 1
    await store.aclose()
