"""The lean AWS path (the default) and the generic one (``lean=False``) give the same
outcomes: the same rollouts through the local runtime and moto end the same way."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from agentcore_rl.client import AsyncRolloutClient
from agentcore_rl.errors import InvocationError, RolloutError, StorageError
from agentcore_rl.local.background import BackgroundServer
from agentcore_rl.local.runtime import DEFAULT_AGENT_RUNTIME_ARN, LocalAgentCoreRuntime
from agentcore_rl.s3 import ResultStore
from tests.client.conftest import FAST_WATCH, QUICK_RETRY
from tests.conftest import FAST_RETRY, fill_bucket


@pytest.fixture
async def runtime(agent_url: str) -> AsyncIterator[tuple[LocalAgentCoreRuntime, str]]:
    local = LocalAgentCoreRuntime({DEFAULT_AGENT_RUNTIME_ARN: [agent_url]}, tps=None)
    async with BackgroundServer(local) as server:
        yield local, server.url


def _outcome(value: object) -> tuple[str, Any]:
    """What a rollout ended as, without the parts that differ per run (ids, times)."""
    if isinstance(value, RolloutError):
        return ("RolloutError", None)
    if isinstance(value, InvocationError):
        return (type(value).__name__, value.status_code)
    if isinstance(value, BaseException):
        return (type(value).__name__, None)
    assert isinstance(value, dict)
    return ("result", value.get("n"))


async def _run(lean: bool, endpoint: str, s3_endpoint: str, bucket: str) -> dict[str, Any]:
    client = AsyncRolloutClient(
        agent_runtime_arn=DEFAULT_AGENT_RUNTIME_ARN,
        endpoint_url=endpoint,
        s3_endpoint_url=s3_endpoint,
        s3_bucket=bucket,
        exp_id=f"parity-{'lean' if lean else 'generic'}",
        tps_limit=1000.0,
        watcher=FAST_WATCH,
        retry=QUICK_RETRY,
        close_timeout=5.0,
        lean=lean,
    )
    async with client:
        payloads: list[dict[str, Any]] = [
            {"n": 1},
            {"n": 2, "mode": "raise"},
            {"n": 3},
            {"_rollout": {"unserialisable": float("nan")}},  # refused by the agent: 400
        ]
        outcomes: list[object] = list(
            await asyncio.wait_for(
                asyncio.gather(*(client.rollout(p) for p in payloads), return_exceptions=True),
                20,
            )
        )
        missing = await asyncio.wait_for(
            client.attach(session_id="s" * 40, result_key="parity/none/x.json", timeout=0.2),
            10,
        )
        (never,) = await asyncio.gather(missing, return_exceptions=True)
        outcomes.append(never)
    stats = client.stats
    return {
        "outcomes": [_outcome(o) for o in outcomes],
        "invocations": stats.invocations,
        "stops": stats.stops,
        "results": stats.results,
        "rollout_errors": stats.rollout_errors,
        "timeouts": stats.timeouts,
    }


async def test_lean_and_generic_clients_end_rollouts_the_same_way(
    runtime: tuple[LocalAgentCoreRuntime, str], s3_endpoint: str, bucket: str
) -> None:
    local, endpoint = runtime
    lean = await _run(True, endpoint, s3_endpoint, bucket)
    stops_after_lean = local.counts["StopRuntimeSession"]
    generic = await _run(False, endpoint, s3_endpoint, bucket)
    assert lean == generic
    assert lean["outcomes"] == [
        ("result", 1),
        ("RolloutError", None),
        ("result", 3),
        ("InvocationError", 400),
        ("RolloutTimeoutError", None),
    ]
    assert local.counts["StopRuntimeSession"] == 2 * stops_after_lean


async def test_store_reads_are_the_same_on_both_paths(
    s3_endpoint: str, bucket: str, store: ResultStore
) -> None:
    fill_bucket(bucket, {f"par/{i:05d}.json": b'{"i": %d}' % i for i in range(1003)})
    await store.put_bytes(bucket, "par/odd key+&<x>.json", b"{}")
    await store.put_bytes(bucket, "par/list.json", b"[1]")
    for lean in (True, False):
        async with ResultStore(endpoint_url=s3_endpoint, retry=FAST_RETRY, lean=lean) as reader:
            assert await reader.get_json(bucket, "par/00007.json") == {"i": 7}
            assert await reader.get_json(bucket, "par/odd key+&<x>.json") == {}
            assert await reader.get_json(bucket, "par/missing.json") is None
            keys = await reader.list_keys(bucket, "par/")
            assert keys == sorted(keys)
            assert len(keys) == 1005
            assert "par/odd key+&<x>.json" in keys
            assert await reader.list_keys(bucket, "par/", start_after="par/01001.json") == [
                "par/01002.json",
                "par/list.json",
                "par/odd key+&<x>.json",
            ]
            assert reader.request_counts["ListObjectsV2"] == 3
            with pytest.raises(StorageError, match="not an object"):
                await reader.get_json(bucket, "par/list.json")
            for read in (
                reader.get_json("no-such-bucket-here", "k.json"),
                reader.list_keys("no-such-bucket-here", "p/"),
            ):
                with pytest.raises(StorageError) as info:
                    await read
                assert info.value.code == "NoSuchBucket"
        dead = ResultStore(endpoint_url="http://127.0.0.1:9", retry=FAST_RETRY, lean=lean)
        async with dead:
            with pytest.raises(StorageError, match="EndpointConnectionError"):
                await dead.get_json("bkt", "k.json")
            assert dead.request_counts["GetObject"] == FAST_RETRY.attempts
