"""LeaseWatcher: cancel the rollouts of clients that are gone.

Each invocation of a client with a lease names it (``_rollout.lease``, see
:mod:`agentcore_rl.client.liveness`). Every ``lease_interval`` seconds the watcher reads each
distinct lease its running rollouts name (one GET per lease) and cancels, with a
``cancelled`` envelope saying why, the rollouts of a lease that has lapsed.

A lease has lapsed when its ``seq`` has not changed for a whole renewal period plus one
interval and its ``renewed_at`` (the client's clock) is ``ttl`` seconds old by this
server's clock, or, whatever the clocks say, when its ``seq`` has not changed for ``ttl``
seconds of this server's own time. So a live client is never cancelled for a skewed clock
(its ``seq`` keeps changing), and a dead one is cancelled about ``ttl`` seconds after its
last renewal (at most ``ttl`` plus two intervals if the clocks disagree).

A read that fails (S3 down, throttled) or finds no object is not a lapse: it counts as a
renewal, so an outage never cancels anything; a client that died during one is cancelled
``ttl`` after S3 answers again.

Example::

    watcher = LeaseWatcher(store, runner, FaultChecks(lease_interval=5.0))
    tasks.start_soon(watcher.run, name="lease watcher")
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Final

import anyio

from agentcore_rl import protocol
from agentcore_rl.errors import BucketNotAllowedError, InvalidPayloadError, StorageError
from agentcore_rl.s3 import ResultStore
from agentcore_rl.server.faults import FaultChecks
from agentcore_rl.server.runner import RolloutJob, RolloutRunner

__all__ = ["LeaseWatcher", "check_lease_reference", "lease_of"]

logger = logging.getLogger(__name__)

#: Lease reads in flight at once.
_READERS: Final = 16

LeaseRef = tuple[str, str]  # (bucket, key)


def lease_of(job: RolloutJob) -> LeaseRef | None:
    """The lease a running rollout's invocation named, if any (checked on acceptance)."""
    config = job.context.rollout
    if config is None or protocol.LEASE not in config.extra:
        return None
    try:
        return protocol.parse_lease_reference(config.extra[protocol.LEASE])
    except InvalidPayloadError:
        return None


@dataclass
class _Lease:
    seq: object  # as read: compared for change only
    changed_at: float  # this server's monotonic time the change was seen
    renewed_at: float | None = None  # the client's epoch time of that renewal
    ttl: float | None = None
    renew: float = 0.0


def _parse(raw: bytes) -> dict[str, Any] | None:
    try:
        body = json.loads(raw)
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) and value > 0 else None


class LeaseWatcher:
    """Reads the leases of running rollouts and cancels those whose lease lapsed.

    ``cancelled`` counts the rollouts it cancelled, ``reads`` the lease GETs.
    """

    def __init__(
        self,
        store: ResultStore,
        runner: RolloutRunner,
        config: FaultChecks,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.store = store
        self.runner = runner
        self.config = config
        self._clock, self._wall, self._sleep = clock, wall, sleep
        self._leases: dict[LeaseRef, _Lease] = {}
        self.cancelled = 0
        self.reads = 0

    def __repr__(self) -> str:
        return f"LeaseWatcher(leases={len(self._leases)}, cancelled={self.cancelled})"

    async def run(self) -> None:
        """Check every ``lease_interval`` seconds until cancelled (the app's task group
        owns it)."""
        if not self.config.check_leases:
            return
        while True:
            await self._sleep(self.config.lease_interval)
            await self.check()

    async def check(self) -> int:
        """One round: read each lease named by a running rollout; cancel the rollouts of
        lapsed ones. Returns how many rollouts it cancelled."""
        by_lease: dict[LeaseRef, list[RolloutJob]] = {}
        for job in self.runner.jobs:
            ref = lease_of(job)
            if ref is not None and job.cancel_reason is None:
                by_lease.setdefault(ref, []).append(job)
        for gone in self._leases.keys() - by_lease.keys():
            del self._leases[gone]
        if not by_lease:
            return 0
        limiter = anyio.CapacityLimiter(_READERS)
        async with anyio.create_task_group() as tg:
            for ref in by_lease:
                tg.start_soon(self._read, ref, limiter)
        cancelled = 0
        for ref, jobs in by_lease.items():
            reason = self._lapsed(ref)
            if reason is not None:
                cancelled += self._cancel(ref, jobs, reason)
        self.cancelled += cancelled
        return cancelled

    async def _read(self, ref: LeaseRef, limiter: anyio.CapacityLimiter) -> None:
        async with limiter:
            self.reads += 1
            try:
                raw = await self.store.get_bytes(*ref)
            except StorageError as exc:
                logger.debug("lease s3://%s/%s unreadable (%s): not a lapse", *ref, exc.code)
                raw = None
        now = self._clock()
        body = None if raw is None else _parse(raw)
        lease = self._leases.get(ref)
        seq = None if body is None else body.get(protocol.LEASE_SEQ)
        if body is None or seq is None:
            # Unreadable, missing or not a lease: no news is counted as a renewal.
            if lease is None:
                self._leases[ref] = _Lease(seq=None, changed_at=now)
            else:
                lease.changed_at = now
            return
        if lease is None:
            lease = self._leases[ref] = _Lease(seq=seq, changed_at=now)
        elif seq != lease.seq:
            lease.seq, lease.changed_at = seq, now
        lease.renewed_at = _number(body.get(protocol.LEASE_RENEWED_AT))
        lease.ttl = _number(body.get(protocol.LEASE_TTL))
        lease.renew = _number(body.get(protocol.LEASE_RENEW)) or 0.0

    def _lapsed(self, ref: LeaseRef) -> str | None:
        lease = self._leases.get(ref)
        if lease is None or lease.ttl is None:
            return None
        unchanged = self._clock() - lease.changed_at
        if unchanged >= lease.ttl:
            return protocol.LEASE_LAPSED_REASON.format(ttl=lease.ttl)
        # A renewal is due every `renew` seconds and seen within one interval: a lease
        # unchanged for longer is not being renewed; its own stamp says for how long.
        if (
            unchanged > lease.renew + self.config.lease_interval
            and lease.renewed_at is not None
            and self._wall() - lease.renewed_at >= lease.ttl
        ):
            return protocol.LEASE_LAPSED_REASON.format(ttl=lease.ttl)
        return None

    def _cancel(self, ref: LeaseRef, jobs: Iterable[RolloutJob], reason: str) -> int:
        count = sum(1 for job in jobs if job.cancel(reason))
        if count:
            logger.warning(
                "cancelling %d rollout(s): the lease s3://%s/%s of their client lapsed",
                count,
                *ref,
            )
        return count


def check_lease_reference(
    config: protocol.RolloutConfig, allowed_buckets: frozenset[str] | None
) -> None:
    """Refuse an invocation whose ``_rollout.lease`` is not a lease reference (400) or
    names a bucket outside the allow-list (403): the server reads what it names."""
    if protocol.LEASE not in config.extra:
        return
    bucket, _ = protocol.parse_lease_reference(config.extra[protocol.LEASE])
    if allowed_buckets is not None and bucket not in allowed_buckets:
        refusal = BucketNotAllowedError(bucket, allowed_buckets)
        refusal.field = f"{protocol.ROLLOUT_FIELD}.{protocol.LEASE}.{protocol.S3_BUCKET}"
        raise refusal
