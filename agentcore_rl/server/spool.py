"""Spool: envelopes S3 refused (after the store's retries) wait on local disk, retried.

What is left at shutdown stays for a later server of the same app and directory. Each file
names its ``owner`` app and :func:`s3_destination`; a spool adopts only its own files.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import time
from pathlib import Path
from typing import Any, Final

import anyio
import anyio.to_thread
from anyio.abc import TaskGroup

from agentcore_rl.s3 import ResultStore

__all__ = ["Spool", "s3_destination"]

logger = logging.getLogger(__name__)

_SUFFIX: Final = ".json"
_CANCELLED_WRITE_TIMEOUT: Final = 10.0


def s3_destination(store: ResultStore) -> dict[str, str | None]:
    """Where ``store`` writes (``endpoint_url``, ``region``), resolved as its client will."""
    env = os.environ
    endpoint = store.endpoint_url or env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
    region = store.region_name or env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
    return {"endpoint_url": endpoint.rstrip("/") if endpoint else None, "region": region or None}


def _write_file(directory: Path, name: str, data: bytes, tmp_suffix: str = ".tmp") -> Path:
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = directory / name
    tmp = path.with_suffix(tmp_suffix)
    with tmp.open("wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    # Atomic, also across a crash.
    tmp.replace(path)
    return path


def _read_record(path: Path) -> dict[str, Any]:
    doc = json.loads(path.read_bytes())
    if not isinstance(doc, dict) or not all(
        isinstance(doc.get(k), str) for k in ("bucket", "key", "body")
    ):
        raise ValueError("not a spool record (needs string bucket, key and body)")
    return doc


def _log_lost(bucket: str, key: str, exc: OSError, body: bytes) -> None:
    logger.critical(
        "could not spool the result for s3://%s/%s (%s); the envelope follows so it is "
        "not lost: %s",
        bucket,
        key,
        exc,
        body.decode(),
    )


class Spool:
    """Envelopes waiting on local disk for S3, retried with doubling backoff.

    Its directory (set by :meth:`place` before the first envelope) persists: a restarted
    server delivers what its predecessor could not. Without a task group from
    :meth:`attach`, retries happen at :meth:`drain` and :meth:`aclose` only.
    """

    def __init__(
        self,
        store: ResultStore,
        *,
        retry_interval: float = 5.0,
        max_retry_interval: float = 300.0,
    ) -> None:
        self._store = store
        self.directory: Path | None = None
        self.owner: str | None = None
        self.retry_interval = retry_interval
        self.max_retry_interval = max_retry_interval
        # (bucket, key) per file: a repeated invocation is recognised without reading files.
        self._entries: dict[Path, tuple[str, str]] = {}
        self._lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self._tasks: TaskGroup | None = None
        self._retrying: anyio.CancelScope | None = None
        self._closed = False

    def place(self, directory: Path | None, owner: str | None) -> None:
        """Set the directory and owner once they are known (before the spool is used)."""
        if self._entries:
            raise RuntimeError("a spool holding envelopes cannot move")
        self.directory = directory
        self.owner = owner

    @property
    def pending(self) -> int:
        return len(self._entries)

    def holds(self, bucket: str, key: str) -> bool:
        return (bucket, key) in self._entries.values()

    @property
    def targets(self) -> list[tuple[str, str]]:
        """``(bucket, key)`` of every envelope held."""
        return list(self._entries.values())

    def attach(self, tasks: TaskGroup | None) -> None:
        """Run the retry task in ``tasks``, which must outlive the spool; ``None`` detaches."""
        self._tasks = tasks
        self._ensure_retrying()

    def _ensure_retrying(self) -> None:
        if self._closed or not self._entries or self._tasks is None or self._retrying:
            return
        self._retrying = anyio.CancelScope()
        self._tasks.start_soon(self._retry_loop, self._retrying, name="agentcore-rl spool retry")

    async def add(self, bucket: str, key: str, body: bytes, *, why: str) -> Path | None:
        """Keep an envelope for later delivery; return its file, or None if even that failed
        (the envelope is then logged in full at CRITICAL)."""
        destination = s3_destination(self._store)
        record = {"bucket": bucket, "key": key, "owner": self.owner, "destination": destination}
        data = json.dumps({**record, "body": body.decode()}).encode()
        name = f"{time.time_ns():020d}-{secrets.token_hex(4)}{_SUFFIX}"
        directory = self.directory
        assert directory is not None, "a spool is placed before its first envelope"
        try:
            path = await anyio.to_thread.run_sync(_write_file, directory, name, data)
        except OSError as exc:
            _log_lost(bucket, key, exc, body)
            return None
        except asyncio.CancelledError as cancel:
            # The loop is closing mid-write: write here, via a temp file of our own as the
            # thread may still be writing.
            try:
                kept = _write_file(directory, name, data, ".tmp-final")
            except OSError as disk_error:
                _log_lost(bucket, key, disk_error, body)
                raise cancel from None
            self._entries[kept] = (bucket, key)
            logger.error("SPOOLED result for s3://%s/%s during cancellation", bucket, key)
            raise
        self._entries[path] = (bucket, key)
        logger.error(
            "SPOOLED result for s3://%s/%s (%s) to %s; %d envelope(s) now wait for S3 and "
            "are retried every %.3g s or more",
            bucket,
            key,
            why,
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
            await self.add(bucket, key, body, why=f"{type(exc).__name__}: {exc}")
            return False
        except BaseException:
            # Cancelled mid-write: finish delivering, then let the cancellation go on.
            with anyio.CancelScope(shield=True):
                await self._finish_cancelled_write(bucket, key, body)
            raise
        return True

    async def _finish_cancelled_write(self, bucket: str, key: str, body: bytes) -> None:
        why = f"a write after a cancellation did not finish in {_CANCELLED_WRITE_TIMEOUT:.3g} s"
        with anyio.move_on_after(_CANCELLED_WRITE_TIMEOUT):
            try:
                await self._store.put_bytes(bucket, key, body)
                return
            except Exception as exc:
                why = f"a write after a cancellation failed: {type(exc).__name__}: {exc}"
        await self.add(bucket, key, body, why=why)

    async def recover(self) -> list[tuple[str, str]]:
        """Adopt files a previous server of this owner left for this S3; return their
        ``(bucket, key)``."""
        directory = self.directory
        if directory is None or not directory.is_dir():
            return []
        ours = s3_destination(self._store)

        def scan() -> dict[Path, tuple[str, str]]:
            found: dict[Path, tuple[str, str]] = {}
            for path in sorted(directory.glob(f"*{_SUFFIX}")):
                try:
                    doc = _read_record(path)
                except (OSError, ValueError):
                    continue  # unreadable, or delivered by another server meanwhile
                if doc.get("owner") == self.owner and doc.get("destination") == ours:
                    found[path] = (doc["bucket"], doc["key"])
            return found

        new = {
            path: pair
            for path, pair in (await anyio.to_thread.run_sync(scan)).items()
            if path not in self._entries
        }
        if new:
            self._entries.update(new)
            logger.warning(
                "found %d undelivered envelope(s) in spool %s; delivering them",
                len(new),
                directory,
            )
            self._ensure_retrying()
        return list(new.values())

    def kick(self) -> None:
        """Retry now instead of waiting out the backoff."""
        self._wake.set()

    async def drain(self) -> int:
        """Try every pending envelope once; return how many remain.

        A bucket that fails is skipped for the rest of the pass (one request, not one per file).
        """
        async with self._lock:
            failed_buckets: set[str] = set()
            for path in sorted(self._entries):
                try:
                    doc = await anyio.to_thread.run_sync(_read_record, path)
                except (OSError, ValueError) as exc:  # set aside, for a person to look at
                    kept = path
                    with contextlib.suppress(OSError):
                        kept = await anyio.to_thread.run_sync(
                            path.replace, path.with_suffix(".bad")
                        )
                    del self._entries[path]
                    logger.error("spool file %s is unreadable (%s); left at %s", path, exc, kept)
                    continue
                bucket, key = doc["bucket"], doc["key"]
                if bucket in failed_buckets:
                    continue
                try:
                    await self._store.put_bytes(bucket, key, doc["body"].encode())
                except Exception as exc:
                    failed_buckets.add(bucket)
                    logger.warning(
                        "spooled result for s3://%s/%s still cannot be written: %s",
                        bucket,
                        key,
                        exc,
                    )
                    continue
                with contextlib.suppress(FileNotFoundError):
                    await anyio.to_thread.run_sync(path.unlink)
                del self._entries[path]
                logger.warning(
                    "delivered spooled result s3://%s/%s; %d still pending",
                    bucket,
                    key,
                    len(self._entries),
                )
            return len(self._entries)

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

    async def aclose(self) -> int:
        """Stop retrying, try once more, return how many remain on disk. Idempotent."""
        self._closed = True
        if self._retrying is not None:
            self._retrying.cancel()
        remaining = await self.drain() if self._entries else 0
        if remaining:
            logger.critical(
                "%d result envelope(s) could not be written to S3 and remain in %s; a server "
                "of the same app started with that spool directory delivers them",
                remaining,
                self.directory,
            )
        return remaining
