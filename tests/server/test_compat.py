"""Drop-in parity with AWS's BedrockAgentCoreApp and the reference toolkit's rollout server:
the public surface an agent author uses, and ``_rollout`` blocks without S3 fields."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.requests import Request
from starlette.responses import Response

from agentcore_rl import protocol
from agentcore_rl.errors import ConfigurationError
from agentcore_rl.protocol import PingStatus
from agentcore_rl.s3 import ResultStore
from agentcore_rl.server import AgentCoreRLApp, RequestContext, lifecycle
from tests.server.helpers import SESSION, FakeClock, served, session_headers, settle

# --- handlers ------------------------------------------------------------------------------


def test_handlers_main_has_the_functions_name_and_a_payload_context_signature() -> None:
    app = AgentCoreRLApp()

    @app.rollout_entrypoint
    async def my_custom_handler(payload: dict[str, Any]) -> dict[str, Any]:
        """Solve it."""
        return {"rewards": [0.0]}

    main = app.handlers["main"]
    assert main.__name__ == "my_custom_handler"
    assert main.__doc__ == "Solve it."
    assert list(inspect.signature(main).parameters) == ["payload", "context"]


async def test_handlers_main_calls_the_handler_however_it_is_written() -> None:
    app = AgentCoreRLApp()

    @app.entrypoint
    def echo(payload: dict[str, Any]) -> dict[str, Any]:  # sync, payload only
        return {"echo": payload["x"]}

    assert await app.handlers["main"]({"x": 1}, RequestContext(session_id="s-1")) == {"echo": 1}
    assert await app.handlers["main"]({"x": 2}) == {"echo": 2}


def test_an_entrypoint_can_start_the_server_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[dict[str, Any]] = []
    monkeypatch.setattr("uvicorn.run", lambda app, **kw: calls.append(kw))
    app = AgentCoreRLApp()

    @app.entrypoint
    def echo(payload: dict[str, Any]) -> dict[str, Any]:
        return payload

    echo.run(18097)  # type: ignore[attr-defined]
    assert calls[0]["port"] == 18097


# --- run(port, host) -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "kwargs", "port", "host"),
    [
        ((18097,), {}, 18097, "127.0.0.1"),
        ((18097, "127.0.0.2"), {}, 18097, "127.0.0.2"),
        ((), {"port": 18098, "host": "127.0.0.3"}, 18098, "127.0.0.3"),
        ((), {}, protocol.DEFAULT_PORT, "127.0.0.1"),
    ],
)
def test_run_takes_port_then_host_like_the_sdk(
    monkeypatch: pytest.MonkeyPatch,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    port: int,
    host: str,
) -> None:
    calls: list[dict[str, Any]] = []
    monkeypatch.setattr("uvicorn.run", lambda app, **kw: calls.append(kw))
    monkeypatch.setattr(lifecycle, "default_host", lambda: "127.0.0.1")
    AgentCoreRLApp().run(*args, **kwargs)
    assert (calls[0]["port"], calls[0]["host"]) == (port, host)


# --- /ping: forced > custom > automatic --------------------------------------------------------


async def test_ping_precedence_forced_then_custom_then_automatic(store: ResultStore) -> None:
    clock = FakeClock()
    app = AgentCoreRLApp(store=store)
    app.clock = clock
    wanted: list[Any] = [PingStatus.HEALTHY_BUSY]

    @app.ping
    def status() -> Any:
        if wanted[0] is None:
            raise RuntimeError("health probe broke")
        return wanted[0]

    async with served(app) as http:

        async def ping() -> dict[str, Any]:
            body: dict[str, Any] = (await http.get("/ping")).json()
            return body

        assert (await ping())["status"] == "HealthyBusy"
        assert app.get_current_ping_status() is PingStatus.HEALTHY_BUSY
        clock.advance(10)
        wanted[0] = "Healthy"  # a plain string works too
        body = await ping()
        assert body == {"status": "Healthy", "time_of_last_update": int(clock.now)}
        app.force_ping_status(PingStatus.HEALTHY_BUSY)
        assert (await ping())["status"] == "HealthyBusy"
        app.clear_forced_ping_status()
        assert (await ping())["status"] == "Healthy"
        wanted[0] = None  # the custom handler raises: the automatic status is reported
        assert (await ping())["status"] == "Healthy"


async def test_tracked_async_tasks_keep_the_server_busy(store: ResultStore) -> None:
    app = AgentCoreRLApp(store=store)
    task_id = app.add_async_task("indexing", {"file": "data.csv"})
    assert app.get_current_ping_status() is PingStatus.HEALTHY_BUSY
    info = app.get_async_task_info()
    assert info["active_count"] == 1
    assert info["running_jobs"][0]["name"] == "indexing"
    assert app.complete_async_task(task_id)
    assert not app.complete_async_task(task_id)  # unknown now
    assert app.get_current_ping_status() is PingStatus.HEALTHY

    inside = asyncio.Event()
    release = asyncio.Event()

    @app.async_task
    async def reindex(n: int) -> int:
        inside.set()
        await release.wait()
        return n * 2

    assert reindex.__name__ == "reindex"
    results: list[int] = []

    async def run() -> None:
        results.append(await reindex(21))

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(run)
        await asyncio.wait_for(inside.wait(), 5)
        assert app.get_current_ping_status() is PingStatus.HEALTHY_BUSY
        release.set()
    assert results == [42]
    assert app.get_current_ping_status() is PingStatus.HEALTHY


def test_async_task_refuses_sync_functions() -> None:
    app = AgentCoreRLApp()
    with pytest.raises(ConfigurationError, match="async functions"):
        app.async_task(lambda: None)  # type: ignore[type-var]


# --- the request context ---------------------------------------------------------------------


async def test_the_context_has_the_sdks_attributes(store: ResultStore) -> None:
    app = AgentCoreRLApp(store=store)

    @app.entrypoint
    def describe(payload: dict[str, Any], context: RequestContext) -> dict[str, Any]:
        return {
            "session_id": context.session_id,
            "authorization": context.request_headers.get("Authorization"),
            "custom": context.request_headers.get("X-Amzn-Bedrock-AgentCore-Runtime-Custom-Tenant"),
            "path": context.request.url.path,
        }

    headers = {
        **session_headers(),
        "Authorization": "Bearer t",
        "X-Amzn-Bedrock-AgentCore-Runtime-Custom-Tenant": "acme",
    }
    async with served(app) as http:
        response = await http.post("/invocations", json={}, headers=headers)
    assert response.json() == {
        "session_id": SESSION,
        "authorization": "Bearer t",
        "custom": "acme",
        "path": "/invocations",
    }


# --- lifespan and middleware, as BedrockAgentCoreApp takes them ---------------------------------


async def test_a_user_lifespan_runs_inside_the_apps_and_middleware_applies(
    store: ResultStore,
) -> None:
    events: list[str] = []

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        events.append("start")
        yield
        events.append("stop")

    async def tag(request: Request, call_next: RequestResponseEndpoint) -> Response:
        response = await call_next(request)
        response.headers["x-tag"] = "yes"
        return response

    app = AgentCoreRLApp(
        store=store, lifespan=lifespan, middleware=[Middleware(BaseHTTPMiddleware, dispatch=tag)]
    )
    async with served(app) as http:
        assert events == ["start"]
        assert (await http.get("/ping")).headers["x-tag"] == "yes"
    assert events == ["start", "stop"]
    assert app.last_shutdown is not None


# --- _rollout without S3 fields ------------------------------------------------------------------


@pytest.mark.parametrize(
    "block",
    [{}, {"base_url": "http://127.0.0.1:9/v1", "model_id": "m"}, {"temperature": 0.5}],
)
async def test_a_rollout_block_without_s3_fields_runs_without_saving(
    store: ResultStore, bucket: str, caplog: pytest.LogCaptureFixture, block: dict[str, Any]
) -> None:
    app = AgentCoreRLApp(store=store)
    seen: list[dict[str, Any]] = []

    @app.rollout_entrypoint
    async def solve(payload: dict[str, Any], context: RequestContext) -> dict[str, Any]:
        seen.append(payload["_rollout"])
        assert context.rollout is None
        return {"rewards": [1.0]}

    caplog.set_level(logging.INFO, logger="agentcore_rl")
    async with served(app) as http:
        response = await http.post(
            "/invocations", json={"prompt": "hi", "_rollout": block}, headers=session_headers()
        )
        assert response.status_code == 200
        assert response.json() == {"status": "processing"}
        await settle(app)
    assert seen == [block]
    assert store.request_counts["PutObject"] == 0
    assert app.spool.pending == 0
    assert any("names no S3 location" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("missing", ["exp_id", "input_id", "s3_bucket"])
async def test_a_partial_set_of_s3_fields_is_a_400_naming_the_missing_one(
    store: ResultStore, bucket: str, missing: str
) -> None:
    app = AgentCoreRLApp(store=store)
    ran: list[bool] = []

    @app.rollout_entrypoint
    async def solve(payload: dict[str, Any]) -> dict[str, Any]:
        ran.append(True)
        return {"rewards": [1.0]}

    block = {"exp_id": "exp", "input_id": "q-1", "s3_bucket": bucket}
    del block[missing]
    async with served(app) as http:
        response = await http.post(
            "/invocations", json={"prompt": "hi", "_rollout": block}, headers=session_headers()
        )
    assert response.status_code == 400
    body = response.json()
    assert body["field"] == f"_rollout.{missing}"
    assert f"_rollout.{missing} is required" in body["error"]
    assert ran == []


# --- the saved envelope, as the reference toolkit's tests check it (on moto, not a mock) -------


@pytest.mark.parametrize(
    "result",
    [
        {"rewards": [1.0]},
        {"metrics": {"accuracy": 0.95}, "summary": "All passed"},
        {"rollout_data": [{"tokens": [10, 20, 30]}], "rewards": [1.0, 0.5], "agent": "v2"},
    ],
)
async def test_any_result_dict_is_saved_with_the_reference_metadata(
    store: ResultStore, bucket: str, result: dict[str, Any]
) -> None:
    app = AgentCoreRLApp(store=store)

    @app.rollout_entrypoint
    def solve(payload: dict[str, Any]) -> dict[str, Any]:
        return dict(result)

    payload = {
        "prompt": "test",
        "_rollout": {"exp_id": "exp-001", "input_id": "input-001", "s3_bucket": bucket},
    }
    async with served(app) as http:
        response = await http.post("/invocations", json=payload, headers=session_headers())
        answer = response.json()
        assert answer.pop("heartbeat")["key"].startswith("exp-001/.heartbeats/")  # an addition
        assert answer == {
            "status": "processing",
            "s3_bucket": bucket,
            "result_key": f"exp-001/input-001/{SESSION}.json",
        }
        await settle(app)
    envelope = await store.get_json(bucket, f"exp-001/input-001/{SESSION}.json")
    assert envelope is not None
    assert {k: envelope[k] for k in result} == result
    assert envelope["status_code"] == 200
    assert envelope["stop_reason"] == "end_turn"
    assert envelope["input_id"] == "input-001"
    assert envelope["s3_bucket"] == bucket
    assert envelope["result_key"] == f"exp-001/input-001/{SESSION}.json"
    assert envelope["payload"] == payload
