"""Nothing is lost when an app is served on one event loop after another (Starlette's
TestClient without ``with`` runs every request on a new loop), and every S3 client the app
creates is closed. Real moto S3 throughout; the loops are TestClient's own."""

from __future__ import annotations

import asyncio
import gc
import logging
import socket
import warnings
from typing import Any

import pytest
from starlette.testclient import TestClient

from agentcore_rl.s3 import ResultStore
from agentcore_rl.server import AgentCoreRLApp
from agentcore_rl.server.options import SpoolConfig
from tests.conftest import FAST_RETRY
from tests.server.helpers import rollout_payload, session_headers


def _session(n: int) -> str:
    return f"loop-{n}-" + "b" * 40


def _read(endpoint: str, bucket: str, key: str) -> dict[str, Any] | None:
    async def read() -> dict[str, Any] | None:
        async with ResultStore(endpoint_url=endpoint, retry=FAST_RETRY) as reader:
            return await reader.get_json(bucket, key)

    return asyncio.run(read())


def _make_bucket(endpoint: str, name: str) -> None:
    async def make() -> None:
        async with ResultStore(endpoint_url=endpoint, retry=FAST_RETRY) as maker:
            await maker.ensure_bucket(name)

    asyncio.run(make())


def _unclosed(records: list[logging.LogRecord], caught: list[warnings.WarningMessage]) -> list[str]:
    found = [r.getMessage() for r in records if "Unclosed" in r.getMessage()]
    return found + [str(w.message) for w in caught if "Unclosed" in str(w.message)]


@pytest.mark.parametrize("sync_handler", [False, True])
def test_every_envelope_is_written_when_each_request_runs_on_a_new_loop(
    s3_endpoint: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    sync_handler: bool,
) -> None:
    bucket = f"loops-{int(sync_handler)}"
    _make_bucket(s3_endpoint, bucket)
    # The app makes its own store, as a user's app does; the endpoint comes from the env.
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3_endpoint)
    app = AgentCoreRLApp()

    def solve_sync(payload: dict[str, Any]) -> dict[str, Any]:
        return {"rewards": [float(payload["n"])]}

    async def solve_async(payload: dict[str, Any]) -> dict[str, Any]:
        return {"rewards": [float(payload["n"])]}

    app.rollout_entrypoint(solve_sync if sync_handler else solve_async)
    client = TestClient(app)  # no ``with``: no lifespan, a new event loop per request
    keys = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in range(3):
            response = client.post(
                "/invocations",
                json=rollout_payload(bucket, input_id=f"q-{n}", n=n),
                headers=session_headers(_session(n)),
            )
            assert response.status_code == 200
            keys.append(response.json()["result_key"])
        gc.collect()
    for n, key in enumerate(keys):
        envelope = _read(s3_endpoint, bucket, key)
        assert envelope is not None, f"envelope {n} was lost"
        if envelope["status_code"] == 200:
            assert envelope["rewards"] == [float(n)]
        else:
            # A sync handler's thread may still run when TestClient closes the request's
            # loop: the rollout is then cancelled, and says so in its envelope.
            assert sync_handler
            assert envelope["error_type"] == "cancelled"
            assert "event loop is shutting down" in envelope["stop_reason"]
    assert app.spool.pending == 0
    assert _unclosed(caplog.records, caught) == []


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_failing_write_on_a_later_loop_is_spooled_and_logged(
    s3_endpoint: str, caplog: pytest.LogCaptureFixture, tmp_path: Any
) -> None:
    _make_bucket(s3_endpoint, "loops-fail")
    # Nothing listens on the store's port: every write fails to connect.
    store = ResultStore(endpoint_url=f"http://127.0.0.1:{_closed_port()}", retry=FAST_RETRY)
    app = AgentCoreRLApp(store=store, spool=SpoolConfig(directory=tmp_path / "spool"))
    app.rollout_entrypoint(lambda payload: {"rewards": [1.0]})
    caplog.set_level(logging.ERROR, logger="agentcore_rl")
    client = TestClient(app)
    for n in range(2):
        response = client.post(
            "/invocations",
            json=rollout_payload("loops-fail", input_id=f"q-{n}"),
            headers=session_headers(_session(n)),
        )
        assert response.status_code == 200
    assert app.spool.pending == 2
    assert len(list((tmp_path / "spool").glob("*.json"))) == 2
    spooled = [r.getMessage() for r in caplog.records if "SPOOLED" in r.getMessage()]
    assert len(spooled) == 2
    assert all("loops-fail" in m for m in spooled)
    asyncio.run(store.aclose())


def test_one_store_serves_several_loops_and_closes_every_client(
    s3_endpoint: str, caplog: pytest.LogCaptureFixture
) -> None:
    _make_bucket(s3_endpoint, "loops-store")
    store = ResultStore(endpoint_url=s3_endpoint, retry=FAST_RETRY)

    async def put(n: int) -> None:
        await store.put_json("loops-store", f"k/{n}.json", {"n": n})

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in range(3):
            asyncio.run(put(n))  # each run closes its loop, and with it that loop's client
        asyncio.run(store.aclose())
        gc.collect()
    assert [_read(s3_endpoint, "loops-store", f"k/{n}.json") for n in range(3)] == [
        {"n": 0},
        {"n": 1},
        {"n": 2},
    ]
    assert store.request_counts["PutObject"] == 3
    assert _unclosed(caplog.records, caught) == []
