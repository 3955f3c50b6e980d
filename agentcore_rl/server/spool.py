"""Spool: envelopes that could not be written to S3 wait on local disk and are retried.

When a write to S3 still fails after :class:`~agentcore_rl.s3.ResultStore`'s own retries
(the bucket is missing, credentials expired, S3 is down for minutes), the envelope is
written to a file in the spool directory instead of being dropped. A retry task, in the
task group of whoever owns the spool (the app's lifespan),
retries the spooled files with exponential backoff until they are delivered, and the
server makes one more attempt at shutdown. Files that still cannot be delivered stay on
disk; a server of the same app started later with the same directory picks them up.

Each file names where its envelope was meant to go: the app that spooled it (``owner``)
and the S3 endpoint and region (:func:`s3_destination`). A spool adopts only files of its
own owner and destination; the others are left on disk, untouched and unreported, for
the server they belong to.

Example::

    spool = Spool(store, directory=Path("/var/spool/agent"))
    spool.attach(task_group)    # the retry task runs there
    await spool.add("rollouts", "exp/q-1/sid.json", b'{"status_code": 200}')
    await spool.drain()         # one delivery attempt now; returns how many remain
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import anyio
import anyio.to_thread
from anyio.abc import TaskGroup

from agentcore_rl.s3 import ResultStore

__all__ = [
    "DEFAULT_SPOOL_MAX_RETRY_INTERVAL",
    "DEFAULT_SPOOL_RETRY_INTERVAL",
    "Destination",
    "Spool",
    "s3_destination",
]

logger = logging.getLogger(__name__)

DEFAULT_SPOOL_RETRY_INTERVAL: Final = 5.0
DEFAULT_SPOOL_MAX_RETRY_INTERVAL: Final = 300.0

_SUFFIX: Final = ".json"
# Seconds a write interrupted by cancellation gets to finish before its envelope is spooled.
_CANCELLED_WRITE_TIMEOUT: Final = 10.0


@dataclass(frozen=True)
class Destination:
    """The S3 an envelope was meant for: endpoint URL and region (``None``: AWS's default)."""

    endpoint_url: str | None
    region: str | None


def s3_destination(store: ResultStore, environ: Mapping[str, str] = os.environ) -> Destination:
    """Where ``store`` writes, as its client will resolve it: its own settings, else the
    standard AWS variables as they are now (the client is made at the first write)."""
    endpoint = (
        store.endpoint_url
        or environ.get("AWS_ENDPOINT_URL_S3")
        or environ.get("AWS_ENDPOINT_URL")
        or None
    )
    region = store.region_name or environ.get("AWS_REGION") or environ.get("AWS_DEFAULT_REGION")
    return Destination(endpoint.rstrip("/") if endpoint else None, region or None)


@dataclass(frozen=True)
class _Record:
    bucket: str
    key: str
    body: bytes
    owner: str | None = None
    destination: Destination | None = None


def _write_file(directory: Path, name: str, data: bytes, tmp_suffix: str = ".tmp") -> Path:
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)  # created when first needed
    path = directory / name
    tmp = path.with_suffix(tmp_suffix)
    with tmp.open("wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    # The rename makes the file appear complete or not at all, also across a crash.
    tmp.replace(path)
    return path


def _read_record(path: Path) -> _Record:
    doc = json.loads(path.read_bytes())
    if not isinstance(doc, dict) or not all(
        isinstance(doc.get(k), str) for k in ("bucket", "key", "body")
    ):
        raise ValueError("not a spool record (needs string bucket, key and body)")
    target = doc.get("destination")
    destination = (
        Destination(target.get("endpoint_url"), target.get("region"))
        if isinstance(target, dict)
        else None
    )
    owner = doc.get("owner")
    return _Record(
        doc["bucket"],
        doc["key"],
        doc["body"].encode(),
        owner if isinstance(owner, str) else None,
        destination,
    )


def _log_lost(bucket: str, key: str, exc: OSError, body: bytes) -> None:
    logger.critical(
        "could not spool the result for s3://%s/%s (%s); the envelope follows so it is "
        "not lost: %s",
        bucket,
        key,
        exc,
        body.decode(),
    )


def _quarantine(path: Path) -> Path:
    target = path.with_suffix(".bad")
    path.replace(target)
    return target


class Spool:
    """Envelopes waiting on local disk for S3, retried by a task in its owner's task group.

    ``directory`` defaults to a fresh temporary directory (created on first use); give a
    persistent one so a restarted server delivers what its predecessor could not.
    ``owner`` names the app whose envelopes these are: :meth:`recover` adopts only files
    of the same owner meant for the same S3 (:func:`s3_destination` of ``store``).
    ``retry_interval`` is the first wait before a retry; it doubles after each failed pass
    up to ``max_retry_interval`` and resets after a success. ``on_change`` is called when
    the number of pending files changes (the server reports ``HealthyBusy`` meanwhile).
    Its owner (the app) lends it a task group with :meth:`attach` for the retry task;
    without one, retries happen at :meth:`drain` and :meth:`aclose` only.
    """

    def __init__(
        self,
        store: ResultStore,
        *,
        directory: Path | None = None,
        owner: str | None = None,
        retry_interval: float = DEFAULT_SPOOL_RETRY_INTERVAL,
        max_retry_interval: float = DEFAULT_SPOOL_MAX_RETRY_INTERVAL,
        on_change: Callable[[], None] | None = None,
    ) -> None:
        if retry_interval <= 0 or max_retry_interval < retry_interval:
            raise ValueError("need 0 < retry_interval <= max_retry_interval")
        self._store = store
        self._directory = directory
        self.owner = owner
        self.retry_interval = retry_interval
        self.max_retry_interval = max_retry_interval
        self._on_change = on_change
        self._entries: set[Path] = set()
        # (bucket, key) of each pending file, so a repeated invocation of a spooled
        # rollout is recognised as finished without reading files.
        self._keys: dict[Path, tuple[str, str]] = {}
        self._pairs: Counter[tuple[str, str]] = Counter()
        self._lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self._drained = asyncio.Event()
        self._drained.set()
        self._tasks: TaskGroup | None = None
        self._retrying: anyio.CancelScope | None = None
        self._closed = False

    def __repr__(self) -> str:
        return f"Spool(directory={str(self._directory)!r}, pending={len(self._entries)})"

    @property
    def directory(self) -> Path:
        """The spool directory (a temporary one is created on first access if none was given)."""
        if self._directory is None:
            self._directory = Path(tempfile.mkdtemp(prefix="agentcore-rl-spool-"))
        return self._directory

    def place(self, directory: Path | None, owner: str | None) -> None:
        """Set the directory and owner once they are known (before the spool is used)."""
        if self._entries:
            raise RuntimeError("a spool holding envelopes cannot move")
        self._directory = directory
        self.owner = owner

    @property
    def pending(self) -> int:
        """How many envelopes wait for delivery."""
        return len(self._entries)

    def holds(self, bucket: str, key: str) -> bool:
        """True when an envelope for ``s3://bucket/key`` waits in the spool."""
        return self._pairs[(bucket, key)] > 0

    @property
    def pending_keys(self) -> list[tuple[str, str]]:
        """``(bucket, key)`` of every pending envelope whose file could be read."""
        return list(self._keys.values())

    def _track(self, path: Path, bucket: str, key: str) -> None:
        if path in self._keys:
            return
        self._keys[path] = (bucket, key)
        self._pairs[(bucket, key)] += 1

    def _untrack(self, path: Path) -> None:
        self._entries.discard(path)
        pair = self._keys.pop(path, None)
        if pair is not None:
            self._pairs[pair] -= 1
            if self._pairs[pair] <= 0:
                del self._pairs[pair]

    def attach(self, tasks: TaskGroup | None) -> None:
        """Run the retry task in ``tasks`` (the owner's task group, which must outlive the
        spool's use); ``None`` detaches."""
        self._tasks = tasks
        self._ensure_retrying()

    def _changed(self) -> None:
        if self._entries:
            self._drained.clear()
        else:
            self._drained.set()
        if self._on_change is not None:
            self._on_change()

    def _ensure_retrying(self) -> None:
        if self._closed or not self._entries or self._tasks is None or self._retrying:
            return
        self._retrying = anyio.CancelScope()
        self._tasks.start_soon(self._retry_loop, self._retrying, name="agentcore-rl spool retry")

    async def add(self, bucket: str, key: str, body: bytes) -> Path | None:
        """Keep one envelope for later delivery; return its file (``None`` if even that failed).

        If the disk write fails too, the envelope is logged in full at CRITICAL level, the
        last place it can go.
        """
        destination = s3_destination(self._store)
        record = json.dumps(
            {
                "bucket": bucket,
                "key": key,
                "owner": self.owner,
                "destination": {
                    "endpoint_url": destination.endpoint_url,
                    "region": destination.region,
                },
                "body": body.decode(),
            }
        ).encode()
        name = f"{time.time_ns():020d}-{secrets.token_hex(4)}{_SUFFIX}"
        try:
            try:
                path = await anyio.to_thread.run_sync(_write_file, self.directory, name, record)
            except BaseException as exc:
                if isinstance(exc, Exception):
                    raise
                # Cancelled while the thread writes (the event loop is shutting down): write
                # here instead, so the envelope is kept; the same name replaces the file if
                # the thread got there too. No retry task is started on a closing loop.
                try:
                    # Its own temporary file: the thread may still be writing the other.
                    kept = _write_file(self.directory, name, record, ".tmp-final")
                except OSError as disk_error:
                    _log_lost(bucket, key, disk_error, body)
                    raise exc from None
                self._entries.add(kept)
                self._track(kept, bucket, key)
                self._changed()
                logger.error("SPOOLED result for s3://%s/%s during cancellation", bucket, key)
                raise
        except OSError as exc:
            _log_lost(bucket, key, exc, body)
            return None
        self._entries.add(path)
        self._track(path, bucket, key)
        self._changed()
        logger.error(
            "SPOOLED result for s3://%s/%s to %s; %d envelope(s) now wait for S3 and are "
            "retried every %.3g s or more",
            bucket,
            key,
            path,
            len(self._entries),
            self.retry_interval,
        )
        self._ensure_retrying()
        return path

    async def deliver(self, bucket: str, key: str, body: bytes) -> bool:
        """Write to S3; if that fails, spool. True when S3 has it now, False when spooled."""
        try:
            await self._store.put_bytes(bucket, key, body)
        except Exception as exc:
            logger.error(
                "writing the result to s3://%s/%s failed (%s: %s); spooling it",
                bucket,
                key,
                type(exc).__name__,
                exc,
            )
            await self.add(bucket, key, body)
            return False
        except BaseException:
            # Cancelled mid-write (shutdown, or the event loop itself closing): the envelope
            # exists and delivering it is all that is left, so finish that, then let the
            # cancellation go on.
            with anyio.CancelScope(shield=True):
                await self._finish_cancelled_write(bucket, key, body)
            raise
        return True

    async def _finish_cancelled_write(self, bucket: str, key: str, body: bytes) -> None:
        failure = f"did not finish within {_CANCELLED_WRITE_TIMEOUT:.3g} s"
        with anyio.move_on_after(_CANCELLED_WRITE_TIMEOUT):
            try:
                await self._store.put_bytes(bucket, key, body)
                return
            except Exception as exc:
                failure = f"failed ({type(exc).__name__}: {exc})"
        logger.error(
            "writing the result to s3://%s/%s after a cancellation %s; spooling it",
            bucket,
            key,
            failure,
        )
        await self.add(bucket, key, body)

    async def recover(self) -> int:
        """Adopt the envelope files a previous server of the same owner left in the
        directory for the same S3; return how many. Other files are left alone.
        """
        if self._directory is None or not self._directory.is_dir():
            return 0
        ours = s3_destination(self._store)

        def scan(directory: Path) -> list[tuple[Path, _Record | None]]:
            found: list[tuple[Path, _Record | None]] = []
            for path in sorted(directory.glob(f"*{_SUFFIX}")):
                try:
                    found.append((path, _read_record(path)))
                except FileNotFoundError:
                    continue  # delivered by another server meanwhile
                except (OSError, ValueError):
                    found.append((path, None))
            return found

        new: list[Path] = []
        foreign = 0
        for path, record in await anyio.to_thread.run_sync(scan, self._directory):
            if path in self._entries:
                continue
            if record is None or record.owner != self.owner or record.destination != ours:
                # Another app's, another S3's, or unreadable: not ours to deliver or report.
                foreign += 1
                continue
            self._track(path, record.bucket, record.key)
            new.append(path)
        if foreign:
            logger.debug(
                "spool %s: left %d file(s) of other apps or S3 endpoints alone",
                self._directory,
                foreign,
            )
        if new:
            self._entries.update(new)
            self._changed()
            logger.warning(
                "found %d undelivered envelope(s) in spool %s; delivering them",
                len(new),
                self._directory,
            )
            self._ensure_retrying()
        return len(new)

    def kick(self) -> None:
        """Make the background task retry now instead of waiting out its backoff."""
        self._wake.set()

    async def wait_drained(self) -> None:
        """Wait until nothing is pending (returns at once when the spool is empty)."""
        await self._drained.wait()

    async def drain(self) -> int:
        """Try to deliver every pending envelope once; return how many remain.

        After a failure, the rest of that bucket's files wait for the next pass, so an
        unreachable bucket costs one request per pass, not one per file.
        """
        async with self._lock:
            failed_buckets: set[str] = set()
            for path in sorted(self._entries):
                try:
                    record = await anyio.to_thread.run_sync(_read_record, path)
                except (OSError, ValueError) as exc:
                    await self._set_aside(path, exc)
                    continue
                if record.bucket in failed_buckets:
                    continue
                try:
                    await self._store.put_bytes(record.bucket, record.key, record.body)
                except Exception as exc:
                    failed_buckets.add(record.bucket)
                    logger.warning(
                        "spooled result for s3://%s/%s still cannot be written: %s",
                        record.bucket,
                        record.key,
                        exc,
                    )
                    continue
                with contextlib.suppress(FileNotFoundError):
                    await anyio.to_thread.run_sync(path.unlink)
                self._untrack(path)
                self._changed()
                logger.warning(
                    "delivered spooled result s3://%s/%s; %d still pending",
                    record.bucket,
                    record.key,
                    len(self._entries),
                )
            return len(self._entries)

    async def _set_aside(self, path: Path, exc: Exception) -> None:
        try:
            target = await anyio.to_thread.run_sync(_quarantine, path)
        except OSError:
            target = path
        self._untrack(path)
        self._changed()
        logger.error(
            "spool file %s is unreadable (%s); left at %s for inspection", path, exc, target
        )

    async def _retry_loop(self, scope: anyio.CancelScope) -> None:
        try:
            with scope:
                delay = self.retry_interval
                while self._entries and not self._closed:
                    with anyio.move_on_after(delay):
                        await self._wake.wait()
                    self._wake.clear()
                    before = len(self._entries)
                    remaining = await self.drain()
                    if remaining < before:
                        delay = self.retry_interval
                    else:
                        delay = min(delay * 2, self.max_retry_interval)
        finally:
            if self._retrying is scope:
                self._retrying = None

    async def aclose(self, *, final_drain: bool = True) -> int:
        """Stop retrying in the background, try once more, and return how many remain.

        Idempotent. What remains stays on disk and is logged loudly.
        """
        self._closed = True
        if self._retrying is not None:
            self._retrying.cancel()  # its task ends in its owner's task group
        remaining = await self.drain() if final_drain and self._entries else len(self._entries)
        if remaining:
            logger.critical(
                "%d result envelope(s) could not be written to S3 and remain in %s; a server "
                "of the same app started with that spool directory delivers them",
                remaining,
                self.directory,
            )
        return remaining
