"""The completion watcher against moto: LIST vs GET, and real S3 faults (a deleted bucket,
a dead endpoint) that fail only the affected keys and never the watcher."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import boto3
import pytest

from agentcore_rl.client.watcher import CompletionWatcher, WatcherConfig, _Group
from agentcore_rl.errors import RolloutTimeoutError, StorageError
from agentcore_rl.s3 import ResultStore
from tests.client.agents import Recorder
from tests.client.conftest import ClientFactory
from tests.conftest import FAST_RETRY

FAST = WatcherConfig(min_interval=0.01, max_interval=0.02, error_backoff=0.01, error_threshold=2)


class Outcomes:
    """Collects watcher callbacks; ``wait(n)`` waits (bounded) for n of them."""

    def __init__(self) -> None:
        self.items: dict[str, tuple[dict[str, Any] | None, BaseException | None]] = {}
        self._event = asyncio.Event()

    def callback(self, key: str) -> Any:
        def record(envelope: dict[str, Any] | None, error: BaseException | None) -> None:
            self.items[key] = (envelope, error)
            self._event.set()

        return record

    async def wait(self, n: int) -> None:
        async def loop() -> None:
            while len(self.items) < n:
                self._event.clear()
                await self._event.wait()

        await asyncio.wait_for(loop(), 10)


Watching = Callable[..., CompletionWatcher]


@pytest.fixture
async def watching() -> AsyncIterator[Watching]:
    """Makes watchers whose task runs until the test ends (the client's task group's job)."""
    tasks: list[asyncio.Task[None]] = []

    def start(store: ResultStore, config: WatcherConfig = FAST) -> CompletionWatcher:
        watcher = CompletionWatcher(store, config)
        tasks.append(asyncio.create_task(watcher.run()))
        return watcher

    yield start
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


@pytest.fixture
def s3(s3_endpoint: str) -> Any:
    return boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1")


@pytest.fixture
def warnings_seen() -> Iterator[asyncio.Event]:
    """Set when the watcher logs a failed poll."""
    event = asyncio.Event()

    class Handler(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            event.set()

    handler = Handler(logging.WARNING)
    logger = logging.getLogger("agentcore_rl.client")
    logger.addHandler(handler)
    try:
        yield event
    finally:
        logger.removeHandler(handler)


async def test_single_key_is_probed_with_get(
    watching: Watching, store: ResultStore, bucket: str
) -> None:
    watcher = watching(store)
    outcomes = Outcomes()
    watcher.track(bucket, "exp/q-1/s1.json", outcomes.callback("s1"))
    await store.put_json(bucket, "exp/q-1/s1.json", {"rewards": [1]})
    await outcomes.wait(1)
    assert outcomes.items["s1"] == ({"rewards": [1]}, None)
    assert store.request_counts["ListObjectsV2"] == 0
    assert watcher.pending == 0


async def test_many_keys_are_listed(watching: Watching, store: ResultStore, bucket: str) -> None:
    watcher = watching(store)
    outcomes = Outcomes()
    keys = [f"exp/{i:06d}/s{i}.json" for i in range(6)]
    for key in keys:
        watcher.track(bucket, key, outcomes.callback(key))
    await store.put_json(bucket, "exp/000002/nobody-waits.json", {"orphan": True})
    for key in keys:
        await store.put_json(bucket, key, {"key": key})
    await outcomes.wait(6)
    assert all(outcomes.items[k] == ({"key": k}, None) for k in keys)
    assert store.request_counts["ListObjectsV2"] >= 1
    assert store.request_counts["GetObject"] == 6  # no probes: the listing found them


class BuggyStore(ResultStore):
    """The real store, except that reading one key raises what no S3 fault raises (a bug
    in the watcher's own path): the case its round handler exists for."""

    def __init__(self, bad_key: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.bad_key = bad_key

    async def get_json(self, bucket: str, key: str) -> dict[str, Any] | None:
        if key == self.bad_key:
            raise ValueError("a bug in the watcher's own path")
        return await super().get_json(bucket, key)


async def test_a_bug_in_one_fetch_ends_the_round_s_keys_and_the_watcher_goes_on(
    watching: Watching, s3_endpoint: str, bucket: str
) -> None:
    keys = [f"exp/{i:06d}/s{i}.json" for i in range(4)]
    store = BuggyStore(keys[1], endpoint_url=s3_endpoint, retry=FAST_RETRY)
    watcher = watching(store)
    try:
        for key in keys:
            await store.put_json(bucket, key, {"key": key})
        outcomes = Outcomes()
        for key in keys:  # found by one LIST: their GETs go to the fetchers together
            watcher.track(bucket, key, outcomes.callback(key))
        await outcomes.wait(4)
        failed = [k for k in keys if outcomes.items[k][1] is not None]
        assert keys[1] in failed  # never a hang: the bug is every pending key's outcome
        error = outcomes.items[keys[1]][1]
        assert isinstance(error, StorageError)
        assert "the completion watcher failed: ValueError" in str(error)
        later = "exp/000009/s9.json"  # the watcher itself still runs
        await store.put_json(bucket, later, {"key": later})
        watcher.track(bucket, later, outcomes.callback(later))
        await outcomes.wait(5)
        assert outcomes.items[later] == ({"key": later}, None)
    finally:
        await store.aclose()


def test_plan_probes_stragglers_and_lists_the_dense_block() -> None:
    group = _Group("bkt", "exp/")
    for i in range(5000):
        group.remember(f"exp/{i:06d}/done.json")
    straggler = "exp/000010/live.json"
    block = [f"exp/{i:06d}/live.json" for i in range(4990, 5100)]
    for key in [straggler, *block]:
        group.pending[key] = lambda envelope, error: None
    probe, list_from = group.plan()
    assert probe == [straggler]
    assert list_from == block[0]
    # few pending keys among many finished ones: GET each
    group.pending = {straggler: lambda envelope, error: None}
    assert group.plan() == ([straggler], None)


async def test_deleted_bucket_is_an_outage_not_an_outcome(
    watching: Watching, store: ResultStore, bucket: str, s3: Any, warnings_seen: asyncio.Event
) -> None:
    # The results of a bucket deleted and re-created still arrive; its
    # keys stay pending meanwhile and the other bucket's keys are unaffected.
    watcher = watching(store)
    outcomes = Outcomes()
    doomed = "doomed-bucket"
    s3.create_bucket(Bucket=doomed)
    watcher.track(doomed, "exp/000001/a.json", outcomes.callback("a"))
    watcher.track(doomed, "exp/000002/b.json", outcomes.callback("b"))
    watcher.track(bucket, "exp/000003/c.json", outcomes.callback("c"))
    s3.delete_bucket(Bucket=doomed)
    await asyncio.wait_for(warnings_seen.wait(), 10)
    await store.put_json(bucket, "exp/000003/c.json", {"ok": 1})
    await outcomes.wait(1)
    assert outcomes.items == {"c": ({"ok": 1}, None)}
    assert watcher.outages.unreachable
    assert watcher.outages.describe(doomed) is not None
    assert watcher.outages.describe(bucket) is None
    s3.create_bucket(Bucket=doomed)  # back: the spooled results land
    await store.put_json(doomed, "exp/000001/a.json", {"a": 1})
    await store.put_json(doomed, "exp/000002/b.json", {"b": 1})
    await outcomes.wait(3)
    assert outcomes.items["a"] == ({"a": 1}, None)
    assert outcomes.items["b"] == ({"b": 1}, None)
    assert watcher.outages.describe(doomed) is None
    assert watcher.outages.outages == 1


async def test_dead_endpoint_keeps_keys_pending_and_says_so(watching: Watching) -> None:
    dead = ResultStore(endpoint_url="http://127.0.0.1:9", retry=FAST_RETRY)
    watcher = watching(dead)
    outcomes = Outcomes()
    watcher.track("bkt", "exp/000001/a.json", outcomes.callback("a"))
    for _ in range(1000):  # bounded: the first failed poll marks the bucket down
        if watcher.outages.unreachable:
            break
        await asyncio.sleep(0.01)
    assert watcher.outages.unreachable
    assert watcher.outages.describe("bkt") is not None
    assert outcomes.items == {}  # no outcome for an outage
    await dead.aclose()


def test_access_denied_is_final(store: ResultStore, bucket: str) -> None:
    watcher = CompletionWatcher(store, FAST)
    outcomes = Outcomes()
    group = _Group(bucket, "exp/")
    denied = StorageError(
        "denied", operation="GetObject", bucket=bucket, key="k", code="AccessDenied"
    )
    group.pending["k"] = outcomes.callback("k")
    for _ in range(FAST.error_threshold):
        watcher._group_failed(group, denied)
    assert isinstance(outcomes.items["k"][1], StorageError)
    assert not watcher.outages.unreachable


async def test_transient_fault_recovers_without_failing(
    watching: Watching, store: ResultStore, s3: Any, warnings_seen: asyncio.Event
) -> None:
    patient = WatcherConfig(
        min_interval=0.01,
        max_interval=0.02,
        error_backoff=0.01,
        error_backoff_max=0.02,
        error_threshold=1000,
    )
    watcher = watching(store, patient)
    outcomes = Outcomes()
    name = "flaky-bucket"
    keys = [f"exp/{i:06d}/s.json" for i in range(3)]
    for key in keys:
        watcher.track(name, key, outcomes.callback(key))  # the bucket does not exist yet
    await asyncio.wait_for(warnings_seen.wait(), 10)
    s3.create_bucket(Bucket=name)
    for key in keys:
        await store.put_json(name, key, {"key": key})
    await outcomes.wait(3)
    assert all(error is None for _, error in outcomes.items.values())


async def test_client_holds_new_rollouts_during_an_outage_and_times_out_pending_ones(
    make_client: ClientFactory, s3: Any, recorder: Recorder, bucket: str
) -> None:
    # No StorageError for an outage. The pending rollout ends at its own
    # timeout (saying the store was down); a new one waits until the bucket answers.
    s3.create_bucket(Bucket="short-lived")
    client = make_client(
        watcher=WatcherConfig(
            min_interval=0.01, max_interval=0.02, error_backoff=0.01, error_backoff_max=0.02
        )
    )
    # The deadline leaves the watcher (polling every 0.02 s) ample time to see the outage.
    fut = await client.invoke({"mode": "gate"}, rollout={"s3_bucket": "short-lived"}, timeout=3)
    s3.delete_bucket(Bucket="short-lived")
    with pytest.raises(RolloutTimeoutError, match="unreachable"):
        await asyncio.wait_for(fut, 10)
    assert client.stats.storage_errors == 0
    assert client.stats.timeouts == 1
    assert client.stats.store_unreachable
    assert client.stats.store_outages == 1
    held = asyncio.ensure_future(client.rollout({"n": 4}, rollout={"s3_bucket": "short-lived"}))
    await asyncio.sleep(0.1)  # bounded: the rollout must still be held, not sent
    assert not held.done()
    assert client.stats.invocations == 1
    s3.create_bucket(Bucket="short-lived")
    assert (await asyncio.wait_for(held, 10))["n"] == 4
    assert client.stats.store_outages == 1
    assert client.stats.degraded_seconds > 0
    recorder.open_gate()
