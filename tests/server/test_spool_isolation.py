"""A spooled envelope belongs to its app and its S3: delivered only there, reported only there."""

from __future__ import annotations

import json
import logging
import socket
from pathlib import Path
from typing import Any

import pytest

from agentcore_rl.s3 import ResultStore
from agentcore_rl.server import FaultChecks
from agentcore_rl.server.options import SpoolConfig

from ..conftest import FAST_RETRY
from .helpers import SESSION, rollout_app, run_to_end

KEY = f"exp/q-1/{SESSION}.json"


async def solve(payload: dict[str, Any]) -> dict[str, Any]:
    return {"rewards": [1.0]}


async def other_agent(payload: dict[str, Any]) -> dict[str, Any]:
    return {"rewards": [0.0]}


def closed_port_url() -> str:
    """A loopback URL nothing listens on: every connection is refused at once."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def spool_files(directory: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(directory.glob("*.json"))}


async def spool_one_for_another_s3(tmp_path: Path, bucket: str) -> dict[str, bytes]:
    """The same agent, pointed at an S3 that is down, spools its envelope in tmp_path."""
    elsewhere = ResultStore(endpoint_url=closed_port_url(), retry=FAST_RETRY)
    try:
        first = rollout_app(
            elsewhere, solve, spool=SpoolConfig(directory=tmp_path, retry_interval=60)
        )
        await run_to_end(first, bucket)
        assert first.spool.pending == 1
    finally:
        await elsewhere.aclose()
    files = spool_files(tmp_path)
    record = json.loads(next(iter(files.values())))
    assert record["destination"]["endpoint_url"] == elsewhere.endpoint_url
    assert record["owner"] == "tests.server.test_spool_isolation.solve"
    return files


async def test_an_envelope_for_another_s3_is_not_delivered_here(
    store: ResultStore, bucket: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    files = await spool_one_for_another_s3(tmp_path, bucket)
    caplog.clear()
    # The same app, sharing the directory on purpose, but writing to this S3 (moto).
    second = rollout_app(store, solve, spool=SpoolConfig(directory=tmp_path, retry_interval=60))
    with caplog.at_level(logging.INFO):
        async with second:
            assert second.spool.pending == 0
    assert not await store.head(bucket, KEY)
    assert spool_files(tmp_path) == files  # left for the server it belongs to
    assert "could not be written" not in caplog.text
    assert "undelivered" not in caplog.text


async def test_another_apps_envelope_is_not_delivered_by_this_one(
    store: ResultStore, bucket: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Written for this very S3, but by another agent: not this one's to deliver.
    first = rollout_app(
        store,
        solve,
        spool=SpoolConfig(directory=tmp_path, retry_interval=60),
        faults=FaultChecks(check_buckets=False),  # the bucket goes missing after acceptance
    )
    await run_to_end(first, f"{bucket}-missing")  # no such bucket: spooled
    files = spool_files(tmp_path)
    assert len(files) == 1
    caplog.clear()
    other = rollout_app(
        store, other_agent, spool=SpoolConfig(directory=tmp_path, retry_interval=60)
    )
    with caplog.at_level(logging.INFO):
        async with other:
            assert other.spool.pending == 0
    assert spool_files(tmp_path) == files
    assert "could not be written" not in caplog.text


async def test_two_agents_by_default_keep_their_spools_apart(tmp_path: Path) -> None:
    one = rollout_app(ResultStore(), solve)
    two = rollout_app(ResultStore(), other_agent)
    assert one.spool.directory is not None
    assert two.spool.directory is not None
    assert one.spool.directory != two.spool.directory
    assert one.spool.directory.parent == two.spool.directory.parent
