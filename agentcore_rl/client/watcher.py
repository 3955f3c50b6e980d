"""The completion watcher: one task per client that finds every pending result in S3
(docs/client.md, "One watcher for all results"; docs/failure-model.md for S3 failures).

Keys are grouped by experiment prefix; keys seen in listings are remembered, so
stragglers far before a dense block are probed while the block is listed. ``NoSuchBucket``
is an outage too: agents spool and deliver later.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

import anyio

from agentcore_rl._unwrap import unwrap
from agentcore_rl.errors import StorageError
from agentcore_rl.keywords import check_numbers
from agentcore_rl.s3 import ResultStore

__all__ = [
    "FINAL_CODES",
    "CompletionWatcher",
    "StoreOutages",
    "WatcherConfig",
]

logger = logging.getLogger(__name__)

#: Keys per LIST page (S3's maximum and default).
LIST_PAGE_SIZE: Final = 1000
#: S3 error codes that fail the affected keys (after ``error_threshold`` polls): waiting
#: does not cure them. Any other failure is an outage, waited out.
FINAL_CODES: Final = frozenset(
    {"AccessDenied", "AllAccessDisabled", "InvalidAccessKeyId", "SignatureDoesNotMatch"}
)
#: Client CPU of parsing one listed key, in requests: a GET costs about as much as 50 keys
#: of a listing, so re-listing hundreds of finished keys for one straggler is not free.
LISTED_KEY_COST: Final = 0.02

#: ``callback(envelope, None)`` when the result arrived, ``callback(None, error)`` on failure.
Callback = Callable[[dict[str, Any] | None, BaseException | None], None]


@dataclass
class _Down:
    since: float
    probe_key: str
    failures: int = 0
    last_error: str = ""


class StoreOutages:
    """Per-bucket reachability of the result store, as the watcher sees it."""

    def __init__(self) -> None:
        self._down: dict[str, _Down] = {}
        self._back: dict[str, asyncio.Event] = {}
        self._closed_seconds = 0.0
        self.outages = 0

    @property
    def unreachable(self) -> bool:
        return bool(self._down)

    @property
    def degraded_seconds(self) -> float:
        """Seconds spent with at least one bucket down (outages overlapping count per bucket)."""
        now = time.monotonic()
        return self._closed_seconds + sum(now - d.since for d in self._down.values())

    def failed(self, bucket: str, key: str, exc: StorageError) -> None:
        """A request to ``bucket`` failed after its retries: enter (or stay in) an outage."""
        down = self._down.get(bucket)
        if down is None:
            down = self._down[bucket] = _Down(since=time.monotonic(), probe_key=key)
            self.outages += 1
            self._back.setdefault(bucket, asyncio.Event()).clear()
            logger.warning(
                "S3 bucket %s is unreachable (%s): pending rollouts keep waiting within "
                "their timeouts and new invocations to it are held until it answers",
                bucket,
                exc,
            )
        down.failures += 1
        down.last_error = f"{exc.code}: {exc}"

    def succeeded(self, bucket: str) -> None:
        """A request to ``bucket`` succeeded: leave its outage, release held invocations."""
        down = self._down.pop(bucket, None)
        if down is None:
            return
        seconds = time.monotonic() - down.since
        self._closed_seconds += seconds
        self._back[bucket].set()
        logger.warning(
            "S3 bucket %s is reachable again after %.1f s (%d failed polls)",
            bucket,
            seconds,
            down.failures,
        )

    def describe(self, bucket: str) -> str | None:
        down = self._down.get(bucket)
        if down is None:
            return None
        seconds = time.monotonic() - down.since
        return f"s3://{bucket} unreachable for {seconds:.0f} s ({down.last_error})"

    async def wait_reachable(self, bucket: str) -> None:
        if bucket in self._down:
            await self._back[bucket].wait()

    def backoff(self, initial: float, maximum: float) -> float:
        failures = min((d.failures for d in self._down.values()), default=1)
        return min(maximum, initial * 2.0 ** min(failures - 1, 30))

    def probe_targets(self, busy: set[str]) -> list[tuple[str, str]]:
        """(bucket, key) to GET for every down bucket not in ``busy`` (nothing pending
        there, so no poll will notice its return)."""
        return [(b, d.probe_key) for b, d in self._down.items() if b not in busy]


@dataclass(frozen=True, kw_only=True)
class WatcherConfig:
    """How the completion watcher paces itself and copes with S3 errors.

    ``min_interval``..``max_interval``: pause between rounds, growing by half per round
    that found nothing (the longest bounds the detection delay). While a bucket is
    unreachable its polls (each already retried by the ResultStore) wait
    ``error_backoff`` seconds, doubling up to ``error_backoff_max``. ``error_threshold``:
    failed polls of one experiment prefix in a row with an error in :data:`FINAL_CODES`
    (access denied...) before its pending futures fail.

    Example::

        AsyncRolloutClient(..., watcher=WatcherConfig(max_interval=0.5, error_threshold=5))
    """

    min_interval: float = 0.4
    max_interval: float = 0.8
    error_threshold: int = 3
    error_backoff: float = 0.5
    error_backoff_max: float = 10.0

    def __post_init__(self) -> None:
        check_numbers(self, "min_interval", above=0)
        check_numbers(self, "max_interval", at_least=self.min_interval)
        check_numbers(self, "error_threshold", at_least=1, integer=True)


DEFAULT_WATCHER: Final = WatcherConfig()
#: Growth of the pause per round that found nothing; GETs of one round at once.
_BACKOFF: Final = 1.5
_MAX_PARALLEL: Final = 32


@dataclass(eq=False)
class _Group:
    bucket: str
    prefix: str
    pending: dict[str, Callback] = field(default_factory=dict)
    known: list[str] = field(default_factory=list)  # sorted keys seen in listings
    known_set: set[str] = field(default_factory=set)
    failures: int = 0
    retry_at: float = 0.0

    def remember(self, key: str) -> None:
        if key not in self.known_set:
            self.known_set.add(key)
            bisect.insort(self.known, key)

    def plan(self) -> tuple[list[str], str | None]:
        """Split the pending keys into (keys to GET one by one, key to list from).

        Cost of probing the ``i`` smallest keys and listing the rest: ``i`` GETs plus one
        LIST page per 1,000 keys at or after the first listed key (remembered keys plus
        pending ones), plus the CPU of parsing the remembered keys it lists again. A few
        split points on a doubling scale are enough.
        """
        keys = sorted(self.pending)
        n = len(keys)
        best_i, best_cost = n, float(n)  # ties go to probing: a hit costs one request
        i = 0
        while i < n:
            after = len(self.known) - bisect.bisect_left(self.known, keys[i])
            pages = math.ceil((after + n - i) / LIST_PAGE_SIZE)
            cost = i + pages + LISTED_KEY_COST * after
            if cost < best_cost:
                best_i, best_cost = i, cost
            i = 1 if i == 0 else i * 2
        if not self.prefix:  # no shared prefix: a LIST would walk the whole bucket
            best_i = n
        return keys[:best_i], (keys[best_i] if best_i < n else None)


def _just_before(key: str) -> str:
    """A string that sorts immediately before ``key`` (S3's StartAfter is exclusive)."""
    last = key[-1]
    return key[:-1] + chr(ord(last) - 1) if ord(last) > 0 else key[:-1]


def _prefix_of(key: str) -> str:
    head, sep, _ = key.partition("/")
    return head + sep if sep else ""


class CompletionWatcher:
    """Watches S3 for the results of all pending rollouts of one client, in one task
    (:meth:`run`, in its owner's task group).

    Example::

        watcher = CompletionWatcher(store, WatcherConfig(min_interval=0.1))
        task_group.start_soon(watcher.run)
        watcher.track(bucket, key, on_outcome)
        watcher.untrack(bucket, key)      # e.g. the caller cancelled
    """

    def __init__(self, store: ResultStore, config: WatcherConfig = DEFAULT_WATCHER) -> None:
        self.store = store
        self.config = config
        self._groups: dict[tuple[str, str], _Group] = {}
        #: The store's reachability: buckets down, outages, degraded seconds.
        self.outages = StoreOutages()
        self._wakeup = asyncio.Event()
        self.rounds = 0
        self.lists = 0
        self.listed_keys = 0
        self.probes = 0
        self.found = 0

    @property
    def pending(self) -> int:
        return sum(len(g.pending) for g in self._groups.values())

    def track(self, bucket: str, key: str, callback: Callback) -> None:
        """Watch ``s3://bucket/key``; call ``callback`` once with the envelope or an error."""
        gid = (bucket, _prefix_of(key))
        group = self._groups.get(gid)
        if group is None:
            group = self._groups[gid] = _Group(bucket, gid[1])
        group.pending[key] = callback
        self._wakeup.set()

    def untrack(self, bucket: str, key: str) -> None:
        group = self._groups.get((bucket, _prefix_of(key)))
        if group is not None:
            group.pending.pop(key, None)

    async def heartbeats(self, bucket: str, prefix: str) -> dict[str, str] | None:
        """The agents' heartbeats under ``prefix`` as ``{key: etag}`` (one LIST, for the
        crash detector); ``None`` when S3 did not answer (an outage, recorded as such)."""
        self.lists += 1
        try:
            listing = await self.store.list_etags(bucket, prefix)
        except StorageError as exc:
            self.outages.failed(bucket, prefix, exc)
            return None
        self.outages.succeeded(bucket)
        return listing

    async def run(self) -> None:
        cfg = self.config
        interval = cfg.min_interval
        while True:
            if not any(g.pending for g in self._groups.values()) and not self.outages.unreachable:
                self._wakeup.clear()
                await self._wakeup.wait()
                interval = cfg.min_interval
            # Results take at least a moment: sleeping first saves a useless first poll.
            # During an outage the pause backs off instead.
            await asyncio.sleep(
                self.outages.backoff(cfg.error_backoff, cfg.error_backoff_max)
                if self.outages.unreachable
                else interval
            )
            try:
                found = await self._round()
                await self._check_idle_outages()
            except Exception as exc:  # a bug, not S3: fail loudly rather than hang futures
                logger.exception("completion watcher round failed")
                error = unwrap(exc)
                self._fail_all(error if isinstance(error, Exception) else exc)
                found = 0
            interval = cfg.min_interval if found else min(cfg.max_interval, interval * _BACKOFF)

    async def _round(self) -> int:
        self.rounds += 1
        now = time.monotonic()
        due = [g for g in self._groups.values() if g.pending and g.retry_at <= now]
        found = self.found
        if len(due) == 1:  # the usual case (one experiment): no task to spawn
            await self._poll(due[0])
        else:
            async with anyio.create_task_group() as polls:
                for group in due:
                    polls.start_soon(self._poll, group)
        return self.found - found

    async def _poll(self, group: _Group) -> None:
        probe, list_from = group.plan()
        candidates = list(probe)
        if list_from is not None:
            self.lists += 1
            try:
                keys = await self.store.list_keys(
                    group.bucket, group.prefix, start_after=_just_before(list_from)
                )
            except StorageError as exc:
                self._group_failed(group, exc)
                keys = []
            else:
                group.failures = 0
                self.outages.succeeded(group.bucket)
            self.listed_keys += len(keys)
            for key in keys:
                group.remember(key)
                if key in group.pending:
                    candidates.append(key)
        self.probes += len(probe)
        if len(candidates) == 1:
            await self._fetch(group, candidates[0])
            return
        if not candidates:
            return
        # ``_MAX_PARALLEL`` fetchers share the round's keys.
        shared = iter(candidates)

        async def fetcher() -> None:
            for key in shared:
                await self._fetch(group, key)

        async with anyio.create_task_group() as fetchers:
            for _ in range(min(len(candidates), _MAX_PARALLEL)):
                fetchers.start_soon(fetcher)

    async def _fetch(self, group: _Group, key: str) -> None:
        if key not in group.pending:  # untracked meanwhile
            return
        try:
            envelope = await self.store.get_json(group.bucket, key)
        except StorageError as exc:
            if exc.code == "InvalidJSON":  # the result itself is broken: an outcome
                self._deliver(group, key, None, self._persistent(exc, 1))
            elif exc.code in FINAL_CODES:
                self._group_failed(group, exc)
            else:
                self.outages.failed(group.bucket, key, exc)
            return
        group.failures = 0
        self.outages.succeeded(group.bucket)
        if envelope is None:
            return
        group.remember(key)
        self.found += 1
        self._deliver(group, key, envelope, None)

    def _persistent(self, exc: StorageError, count: int) -> StorageError:
        where = f"s3://{exc.bucket}/{exc.key or ''}"
        error = StorageError(
            f"watching {where} failed {count} times in a row ({exc.code}): {exc}; "
            "check the bucket, the credentials and the S3 endpoint",
            operation=exc.operation,
            bucket=exc.bucket,
            key=exc.key,
            code=exc.code,
        )
        error.__cause__ = exc
        return error

    def _group_failed(self, group: _Group, exc: StorageError) -> None:
        cfg = self.config
        group.failures += 1
        delay = min(cfg.error_backoff_max, cfg.error_backoff * 2 ** (group.failures - 1))
        group.retry_at = time.monotonic() + delay
        if exc.code not in FINAL_CODES:
            # An outage: keep the keys pending (the outage tracker logs it once).
            self.outages.failed(group.bucket, group.prefix, exc)
            return
        logger.warning(
            "polling s3://%s/%s failed (%d in a row): %s",
            group.bucket,
            group.prefix,
            group.failures,
            exc,
        )
        if group.failures >= cfg.error_threshold:
            error = self._persistent(exc, group.failures)
            for key in list(group.pending):
                self._deliver(group, key, None, error)
            group.failures = 0
            group.retry_at = 0.0

    async def _check_idle_outages(self) -> None:
        """Ask every down bucket with nothing pending whether it is back: new invocations
        wait for it, so nobody else would."""
        busy = {g.bucket for g in self._groups.values() if g.pending}
        for bucket, key in self.outages.probe_targets(busy):
            try:
                await self.store.get_json(bucket, key)
            except StorageError as exc:
                self.outages.failed(bucket, key, exc)
            else:
                self.outages.succeeded(bucket)

    def _deliver(
        self, group: _Group, key: str, envelope: dict[str, Any] | None, error: BaseException | None
    ) -> None:
        callback = group.pending.pop(key, None)
        if callback is None:
            return
        try:
            callback(envelope, error)
        except Exception:
            logger.exception("completion callback for s3://%s/%s failed", group.bucket, key)

    def _fail_all(self, exc: Exception) -> None:
        for group in self._groups.values():
            for key in list(group.pending):
                error = StorageError(
                    f"the completion watcher failed: {type(exc).__name__}: {exc}",
                    operation="watch",
                    bucket=group.bucket,
                    key=key,
                    code=type(exc).__name__,
                )
                self._deliver(group, key, None, error)
