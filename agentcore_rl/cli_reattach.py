"""Re-attach to rollouts an earlier run left in flight: await their result keys in S3.

``agentcore-rl eval --resume`` uses this for the rollouts its journal shows as started but
unfinished. Nothing is invoked again: the agent is (or was) still running them, and each
result appears under its known key. Polling is bounded: every key has a deadline (its
start time plus the eval timeout), the wait between rounds grows from ``initial`` to
``maximum`` seconds, and all keys are checked concurrently in each round.

Example::

    async for entry, envelope in await_existing_results(store, entries, deadlines):
        ...   # envelope is None when the deadline passed without a result
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any

from agentcore_rl.errors import StorageError
from agentcore_rl.eval_journal import JournalEntry
from agentcore_rl.s3 import ResultStore

__all__ = ["await_existing_results"]

logger = logging.getLogger(__name__)


async def await_existing_results(
    store: ResultStore,
    entries: Sequence[JournalEntry],
    deadlines: Mapping[str, float],
    *,
    initial: float = 0.25,
    maximum: float = 2.0,
    clock: Callable[[], float] | None = None,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> AsyncIterator[tuple[JournalEntry, dict[str, Any] | None]]:
    """Yield ``(entry, envelope)`` as each result appears, or ``(entry, None)`` once its
    deadline (in ``clock`` time, keyed by input id) has passed without one.

    Each key is read at least once, even when its deadline is already over. An S3 error
    (:class:`~agentcore_rl.errors.StorageError`, after the store's retries) is logged and
    the key asked again next round, until its deadline.

    Example::

        deadlines = {e.input_id: loop.time() + 60 for e in entries}
        async for entry, envelope in await_existing_results(store, entries, deadlines):
            print(entry.input_id, "found" if envelope else "gave up")
    """
    now = clock or asyncio.get_running_loop().time
    pending = {entry.input_id: entry for entry in entries}
    delay = initial
    while pending:
        batch = list(pending.values())
        envelopes = await asyncio.gather(
            *(store.get_json(entry.s3_bucket, entry.result_key) for entry in batch),
            return_exceptions=True,
        )
        for entry, envelope in zip(batch, envelopes, strict=True):
            if isinstance(envelope, StorageError):
                # Transient or not, the deadline bounds how long we keep asking.
                logger.warning("re-attaching %s: %s", entry.result_key, envelope)
            elif isinstance(envelope, BaseException):
                raise envelope
            elif envelope is not None:
                del pending[entry.input_id]
                yield entry, envelope
        current = now()
        for entry in [e for e in pending.values() if deadlines[e.input_id] <= current]:
            del pending[entry.input_id]
            yield entry, None
        if pending:
            next_deadline = min(deadlines[e.input_id] for e in pending.values())
            await sleep(max(0.0, min(delay, next_deadline - now())))
            delay = min(maximum, delay * 1.5)
