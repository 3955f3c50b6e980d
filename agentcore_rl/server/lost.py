"""Reporting the rollouts a dead predecessor left running ("agent lost" envelopes).

At startup the app takes over the run ledgers of dead processes on its spool directory
(:mod:`agentcore_rl.server.ledger`); for each rollout they list, this writes an
``agent_lost`` envelope (which clients retry in a new session), unless the key holds an
envelope already or this process runs, finished or spooled that rollout itself. A
restarted agent with the same disk so reports its predecessor's crash within a second
instead of waiting for the clients' liveness probes.

Example::

    reporter = LostRolloutReporter(store=store, spool=spool, settled=app.settled_here)
    await reporter.report(ledger.claim_orphans())
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Collection
from typing import Final

import anyio

from agentcore_rl.s3 import ResultStore
from agentcore_rl.server.envelopes import lost_envelope_bytes
from agentcore_rl.server.ledger import LedgerEntry, OrphanLedger
from agentcore_rl.server.spool import Spool

__all__ = ["LostRolloutReporter"]

logger = logging.getLogger("agentcore_rl.server")

# Lost envelopes written at once (each a HEAD, then a PUT).
_LOST_WRITERS: Final = 16


class LostRolloutReporter:
    """Writes the ``agent_lost`` envelopes of dead processes' ledgers, once.

    ``settled(bucket, key)`` says whether this process runs, finished or spooled that
    rollout (then it is not lost); ``allowed_buckets`` (``None``: any) limits where an
    envelope may go; ``on_reported(bucket, key, session_id)`` is told of each one written.
    :meth:`cancel` stops a report under way (the ledgers not reported stay for a later
    server); :attr:`done` is set when the report ended either way.
    """

    def __init__(
        self,
        *,
        store: ResultStore,
        spool: Spool,
        settled: Callable[[str, str], bool],
        on_reported: Callable[[str, str, str], None] | None = None,
        allowed_buckets: Collection[str] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._spool = spool
        self._settled = settled
        self._on_reported = on_reported
        self._allowed = allowed_buckets
        self._clock = clock
        self._scope: anyio.CancelScope | None = None
        self._cancelled = False
        #: Set once the report ended (all written, or cancelled), or when there was none.
        self.done = asyncio.Event()

    def cancel(self) -> None:
        """Stop reporting (at shutdown: the store is about to close)."""
        self._cancelled = True
        if self._scope is not None:
            self._scope.cancel()

    async def report(self, orphans: list[OrphanLedger]) -> None:
        """Report every orphan ledger's rollouts, then delete the ledgers."""
        limiter = anyio.CapacityLimiter(_LOST_WRITERS)
        # Made here, not in __init__: a cancel scope needs a running event loop.
        self._scope = anyio.CancelScope()
        if self._cancelled:
            self._scope.cancel()
        try:
            with self._scope:
                for orphan in orphans:
                    await self._report_ledger(orphan, limiter)
        finally:
            for orphan in orphans:
                orphan.abandon()  # not reported (shut down first): a later server will
            self.done.set()

    async def _report_ledger(self, orphan: OrphanLedger, limiter: anyio.CapacityLimiter) -> None:
        reported: list[bool] = []

        async def one(entry: LedgerEntry) -> None:
            async with limiter:
                reported.append(await self._report_one(entry, orphan.pid))

        async with anyio.create_task_group() as writers:
            for entry in orphan.entries:
                writers.start_soon(one, entry)
        orphan.release()
        if orphan.entries:
            logger.warning(
                "agent process %s died with %d rollout(s) running; wrote %d 'agent lost' "
                "envelope(s) (the others had an envelope already)",
                orphan.pid,
                len(orphan.entries),
                sum(reported),
            )

    async def _report_one(self, entry: LedgerEntry, pid: int | None) -> bool:
        bucket, key = entry.bucket, entry.key
        if self._allowed is not None and bucket not in self._allowed:
            return False
        if self._settled(bucket, key):
            return False
        try:
            found = await self._store.head(bucket, key)
        except Exception as exc:
            # Unknown: write it (spooled if S3 is down). Its writer is dead, so the only
            # envelope that could be there is one it sent just before dying.
            logger.warning("could not check s3://%s/%s for an envelope: %s", bucket, key, exc)
            found = False
        # Checked again after the wait: a repeat invocation may have started it here.
        if found or self._settled(bucket, key):
            return False
        body = lost_envelope_bytes(entry, finished_at=self._clock(), pid=pid)
        await self._spool.deliver(bucket, key, body)
        if self._on_reported is not None:
            self._on_reported(bucket, key, entry.session_id)
        return True
