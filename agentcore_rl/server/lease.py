"""Liveness both ways, the agent's side: :class:`LeaseWatcher` cancels the rollouts of
clients whose lease (``_rollout.lease``) lapsed; :class:`Heartbeat` is the process's own
proof of life to its clients.

A lease lapses when its ``seq`` is unchanged for ``ttl`` of this server's time, or for a
renewal period plus an interval while its ``renewed_at`` is ``ttl`` old: a skewed clock never
cancels a live client. An unreadable lease counts as renewed, so an S3 outage cancels
nothing. docs/failure-model.md has the full rule.
"""

from __future__ import annotations

import asyncio
import logging
import math
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Final

import anyio

from agentcore_rl import protocol
from agentcore_rl.errors import StorageError
from agentcore_rl.s3 import ResultStore
from agentcore_rl.server.options import FaultChecks
from agentcore_rl.server.runner import RolloutJob, RolloutRunner
from agentcore_rl.server.spool import Spool

__all__ = ["Heartbeat", "LeaseWatcher"]

logger = logging.getLogger(__name__)

#: Lease reads in flight at once.
_READERS: Final = 16

LeaseRef = tuple[str, str]  # (bucket, key)


@dataclass
class _Lease:
    seq: object  # as read: compared for change only
    changed_at: float  # this server's monotonic time the change was seen
    renewed_at: float | None = None  # the client's epoch time of that renewal
    ttl: float | None = None
    renew: float = 0.0


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) and value > 0 else None


class LeaseWatcher:
    """Reads the leases of running rollouts and cancels those whose lease lapsed."""

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

    async def run(self) -> None:
        """Check every ``lease_interval`` seconds until cancelled."""
        if not self.config.check_leases:
            return
        while True:
            await self._sleep(self.config.lease_interval)
            await self.check()

    async def check(self) -> int:
        """One round, one GET per lease; return how many rollouts it cancelled."""
        by_lease: dict[LeaseRef, list[RolloutJob]] = {}
        for job in self.runner.jobs:
            config = job.context.rollout
            if config is not None and protocol.LEASE in config.extra and job.cancel_reason is None:
                ref = protocol.parse_lease_reference(config.extra[protocol.LEASE])
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
            lease = self._leases.get(ref)
            if lease is None or lease.ttl is None or not self._lapsed(lease, lease.ttl):
                continue
            reason = protocol.LEASE_LAPSED_REASON.format(ttl=lease.ttl)
            count = sum(1 for job in jobs if job.cancel(reason))
            if count:
                logger.warning(
                    "cancelling %d rollout(s): the lease s3://%s/%s of their client lapsed",
                    count,
                    *ref,
                )
            cancelled += count
        self.cancelled += cancelled
        return cancelled

    async def _read(self, ref: LeaseRef, limiter: anyio.CapacityLimiter) -> None:
        async with limiter:
            self.reads += 1
            try:
                body = await self.store.get_json(*ref)
            except StorageError as exc:
                logger.debug("lease s3://%s/%s unreadable (%s): not a lapse", *ref, exc.code)
                body = None
        now = self._clock()
        seq = None if body is None else body.get(protocol.LEASE_SEQ)
        lease = self._leases.setdefault(ref, _Lease(seq=seq, changed_at=now))
        if body is None or seq is None:
            lease.changed_at = now  # no news is a renewal
            return
        if seq != lease.seq:
            lease.seq, lease.changed_at = seq, now
        lease.renewed_at = _number(body.get(protocol.LEASE_RENEWED_AT))
        lease.ttl = _number(body.get(protocol.LEASE_TTL))
        lease.renew = _number(body.get(protocol.LEASE_RENEW)) or 0.0

    def _lapsed(self, lease: _Lease, ttl: float) -> bool:
        unchanged = self._clock() - lease.changed_at
        # Unchanged past renew + interval: not being renewed; its stamp says how long.
        return unchanged >= ttl or (
            unchanged > lease.renew + self.config.lease_interval
            and lease.renewed_at is not None
            and self._wall() - lease.renewed_at >= ttl
        )


class Heartbeat:
    """One object per (bucket, experiment) this process has rollouts of, running or
    spooled (``{exp_id}/.heartbeats/{process_id}.json``), rewritten every ``interval``
    seconds and deleted when none is left; a new one is written at once. Clients judge the
    sessions this process accepted by it (:data:`protocol.HEARTBEAT_MISSES`), so a crash
    costs no invocation to find. A write that fails is logged and tried at the next beat.
    """

    def __init__(self, store: ResultStore, runner: RolloutRunner, spool: Spool, interval: float):
        self.store, self.runner, self.spool, self.interval = store, runner, spool, interval
        self.process_id = secrets.token_hex(12)
        self.running = False
        self.seq = 0
        self._written: set[LeaseRef] = set()
        self._wake = asyncio.Event()
        self._closing = False
        self._closed = asyncio.Event()

    def reference(self, config: protocol.RolloutConfig) -> dict[str, object] | None:
        """The answer's ``heartbeat`` for a rollout just accepted (``None`` while not
        beating); its object is written at once if it is new."""
        if not self.running:
            return None
        key = protocol.heartbeat_key(config.exp_id, self.process_id)
        if (config.s3_bucket, key) not in self._written:
            self._wake.set()
        return {protocol.LEASE_KEY: key, protocol.HEARTBEAT_INTERVAL: self.interval}

    def _targets(self) -> set[LeaseRef]:
        held = [job.target for job in self.runner.jobs] + self.spool.targets
        return {
            (bucket, protocol.heartbeat_key(key.partition("/")[0], self.process_id))
            for bucket, key in (t for t in held if t is not None)
        }

    async def run(self) -> None:
        """Beat until cancelled or closed: every object each ``interval``, a new one at once."""
        self.running = True
        next_all = 0.0
        try:
            while True:
                closing = self._closing
                targets = set() if closing else self._targets()
                full = closing or time.monotonic() >= next_all
                if full:
                    next_all = time.monotonic() + self.interval
                self._wake.clear()
                self.seq += 1
                async with anyio.create_task_group() as tg:
                    for ref in targets if full else targets - self._written:
                        tg.start_soon(self._write, ref)
                    for ref in self._written - targets if full else ():
                        tg.start_soon(self._write, ref, False)
                if closing:
                    self._closed.set()
                    return
                with anyio.move_on_after(max(0.0, next_all - time.monotonic())):
                    await self._wake.wait()
        finally:
            self.running = False

    async def aclose(self) -> None:
        """Stop beating and delete the objects: a process shutting down holds no rollout."""
        self._closing, running = True, self.running
        self._wake.set()
        with anyio.move_on_after(10):
            await (self._closed.wait() if running else self.run())

    async def _write(self, ref: LeaseRef, alive: bool = True) -> None:
        body = {"process_id": self.process_id, protocol.LEASE_SEQ: self.seq}
        body.update({"written_at": time.time(), protocol.HEARTBEAT_INTERVAL: self.interval})
        try:
            if alive:
                await self.store.put_json(*ref, body)
                self._written.add(ref)
            else:
                await self.store.delete(*ref)
                self._written.discard(ref)
        except Exception as exc:  # S3 or a closed store: tried again at the next beat
            logger.warning("heartbeat s3://%s/%s not written: %s", *ref, exc)
