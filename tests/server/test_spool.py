"""S3 writes: transient errors retried; lasting failures spooled to disk, then delivered."""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
import uuid
from pathlib import Path
from typing import Any

import anyio
import pytest

from agentcore_rl import protocol
from agentcore_rl.errors import ConfigurationError
from agentcore_rl.local.background import BackgroundServer
from agentcore_rl.s3 import ResultStore
from agentcore_rl.server import AgentCoreRLApp, FaultChecks
from agentcore_rl.server.options import SpoolConfig, default_spool_dir
from agentcore_rl.server.spool import Spool

from ..conftest import FAST_RETRY
from .flaky_s3 import FlakyS3
from .helpers import (
    SESSION,
    accept,
    drained,
    read_envelope,
    rollout_app,
    run_to_end,
    served,
    settle,
)

KEY = f"exp/q-1/{SESSION}.json"


def spool_files(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.json"))


def read_record(path: Path) -> dict[str, Any]:
    record: dict[str, Any] = json.loads(path.read_text())
    return record


#: These tests need writes that fail after acceptance (a bucket deleted meanwhile); a
#: missing bucket at acceptance is refused (tests/server/test_bucket_check.py).
UNCHECKED = FaultChecks(check_buckets=False)


def fresh_bucket() -> str:
    return f"late-{uuid.uuid4().hex[:12]}"


async def solve(payload: dict[str, Any]) -> dict[str, Any]:
    return {"rewards": [1.0]}


async def test_transient_s3_errors_are_retried(s3_endpoint: str, bucket: str) -> None:
    flaky = FlakyS3(s3_endpoint, fail_puts=2)
    async with BackgroundServer(flaky) as front:
        store = ResultStore(endpoint_url=front.url, retry=FAST_RETRY)  # 3 attempts
        # No heartbeat: the PUTs counted are the envelope's.
        app = rollout_app(store, solve, faults=FaultChecks(heartbeat_interval=None))
        async with served(app) as http:
            await accept(http, bucket)
            await settle(app)
            assert app.spool.pending == 0
            assert flaky.failed == 2
            assert store.request_counts["PutObject"] == 3
            envelope = await store.get_json(bucket, KEY)
        await store.aclose()
    await flaky.aclose()
    assert envelope is not None
    assert envelope["rewards"] == [1.0]


async def test_spooled_then_delivered_when_bucket_appears(
    store: ResultStore, tmp_path: Path
) -> None:
    bucket = fresh_bucket()  # not created yet: every write fails with NoSuchBucket
    app = rollout_app(
        store, solve, spool=SpoolConfig(directory=tmp_path, retry_interval=0.02), faults=UNCHECKED
    )
    async with served(app) as http:
        await accept(http, bucket)
        await settle(app)
        assert app.spool.pending == 1
        (spooled,) = spool_files(tmp_path)
        record = read_record(spooled)
        assert (record["bucket"], record["key"]) == (bucket, KEY)
        assert json.loads(record["body"])["rewards"] == [1.0]
        # Undelivered results keep the session alive.
        assert (await http.get("/ping")).json()["status"] == "HealthyBusy"

        await store.ensure_bucket(bucket)
        await drained(app.spool)
        envelope = await read_envelope(store, bucket, KEY)
        assert envelope[protocol.STATUS_CODE] == 200
        assert spool_files(tmp_path) == []
        assert (await http.get("/ping")).json()["status"] == "Healthy"


async def test_spool_survives_a_restart(store: ResultStore, tmp_path: Path) -> None:
    bucket = fresh_bucket()
    first = rollout_app(
        store, solve, spool=SpoolConfig(directory=tmp_path, retry_interval=60), faults=UNCHECKED
    )
    await run_to_end(first, bucket)
    # The shutdown tried once more, failed, and left the envelope on disk.
    assert first.spool.pending == 1
    assert len(spool_files(tmp_path)) == 1

    await store.ensure_bucket(bucket)
    second = rollout_app(store, solve, spool=SpoolConfig(directory=tmp_path, retry_interval=0.02))
    async with second:
        assert second.spool.pending == 1
        await drained(second.spool)
    assert await store.head(bucket, KEY)
    assert spool_files(tmp_path) == []


async def test_shutdown_drains_spool(store: ResultStore, tmp_path: Path) -> None:
    bucket = fresh_bucket()
    app = rollout_app(
        store, solve, spool=SpoolConfig(directory=tmp_path, retry_interval=60), faults=UNCHECKED
    )
    async with served(app) as http:
        await accept(http, bucket)
        await settle(app)
        assert app.spool.pending == 1
        await store.ensure_bucket(bucket)  # the retry task waits 60 s; shutdown must not
    assert app.spool.pending == 0
    assert await store.head(bucket, KEY)


async def test_an_unreadable_spool_file_is_left_alone(store: ResultStore, tmp_path: Path) -> None:
    # Whose it is cannot be told: not this app's to deliver, move or report.
    (tmp_path / "00000000000000000001-bad.json").write_text("{not json")
    app = AgentCoreRLApp(store=store, spool=SpoolConfig(directory=tmp_path))
    async with app:
        assert app.spool.pending == 0
    assert (tmp_path / "00000000000000000001-bad.json").read_text() == "{not json"


async def test_default_spool_is_delivered_by_the_next_instance(
    store: ResultStore, tmp_path: Path
) -> None:
    # No spool_dir anywhere: the default must be the same directory for the next process.
    bucket = fresh_bucket()
    first = rollout_app(store, solve, spool=SpoolConfig(retry_interval=60), faults=UNCHECKED)
    base = tmp_path / "xdg-state" / "agentcore-rl" / "spool"
    assert first.spool.directory == base / "tests.server.test_spool.solve"
    await run_to_end(first, bucket)
    assert first.spool.pending == 1

    await store.ensure_bucket(bucket)
    # A long retry interval: only the startup drain can deliver within the wait below.
    second = rollout_app(store, solve, spool=SpoolConfig(retry_interval=60))
    assert second.spool.directory == first.spool.directory
    async with second:
        await drained(second.spool)
    assert (await read_envelope(store, bucket, KEY))[protocol.STATUS_CODE] == 200
    assert spool_files(second.spool.directory) == []


def test_named_agents_keep_their_default_spools_apart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = tmp_path / "xdg-state" / "agentcore-rl" / "spool"
    math = AgentCoreRLApp(spool=SpoolConfig(app_name="math"))
    assert math.spool.directory == base / "math"
    math.rollout_entrypoint(lambda payload: {})
    assert not base.exists()  # building and registering an agent (its import) writes nothing
    assert AgentCoreRLApp(spool=SpoolConfig(app_name="code")).spool.directory == base / "code"
    monkeypatch.setenv("AGENTCORE_RL_APP_NAME", "math")
    assert AgentCoreRLApp().spool.directory == base / "math"  # a restart finds it
    with pytest.raises(ConfigurationError, match="app name"):
        AgentCoreRLApp(spool=SpoolConfig(app_name="../up"))


def test_default_spool_dir_falls_back_to_tmp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocked = tmp_path / "not-a-dir"
    blocked.write_text("a file where the state directory would go")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    chosen = default_spool_dir({"XDG_STATE_HOME": str(blocked)})
    assert chosen == tmp_path / "tmp" / f"agentcore-rl-spool-{os.getuid()}"
    assert not chosen.exists()  # created by the spool's first write
    assert default_spool_dir({"XDG_STATE_HOME": str(tmp_path / "s")}) == (
        tmp_path / "s" / "agentcore-rl" / "spool"
    )


async def test_the_spool_retries_in_its_owners_task_group(
    store: ResultStore, tmp_path: Path
) -> None:
    bucket = fresh_bucket()
    before = asyncio.all_tasks()
    async with anyio.create_task_group() as tasks:
        spool = Spool(store, retry_interval=0.02)
        spool.place(tmp_path, owner=None)
        spool.attach(tasks)
        assert not await spool.deliver(bucket, KEY, b'{"status_code": 200}')
        assert spool.pending == 1
        await store.ensure_bucket(bucket)
        spool.kick()
        await drained(spool)
        await spool.aclose()
        spool.attach(None)
    assert asyncio.all_tasks() <= before
    assert await store.head(bucket, KEY)


async def test_the_spool_directory_is_made_private_on_first_write(
    store: ResultStore, tmp_path: Path
) -> None:
    directory = tmp_path / "state" / "spool" / "math"
    spool = Spool(store)
    spool.place(directory, owner="math")
    assert not directory.exists()
    assert await spool.add("bucket-x", "exp/q-1/s.json", b"{}", why="a test") is not None
    assert directory.stat().st_mode & 0o777 == 0o700
