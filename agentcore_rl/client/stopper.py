"""SessionStopper: stop calls in the background, behind every queued invocation.

Stopping a session never delays a result: the outcome is delivered first and the session id
goes into a queue that a few worker tasks drain, each taking a low-priority token first.

Example::

    stopper = SessionStopper(transport, bucket, RetryConfig(), counters)
    stopper.schedule(fut.session_id)
    await stopper.drain(timeout=30)
    await stopper.aclose()
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections import Counter

from agentcore_rl.client.bucket import Priority, TokenBucket
from agentcore_rl.client.config import DEFAULT_STOP_WORKERS, RetryConfig
from agentcore_rl.client.retry import with_retries
from agentcore_rl.client.transports.base import StopUnsupportedError, Transport

__all__ = ["SessionStopper"]

logger = logging.getLogger(__name__)


class SessionStopper:
    """A queue of sessions to stop and the worker tasks that stop them.

    ``counters`` gets ``stops``, ``stops_unsupported``, ``stop_failures`` (and the retry
    counters).

    Example::

        stopper.schedule(session_id)      # returns at once
    """

    def __init__(
        self,
        transport: Transport,
        bucket: TokenBucket,
        retry: RetryConfig,
        counters: Counter[str],
        *,
        workers: int = DEFAULT_STOP_WORKERS,
    ) -> None:
        self.transport = transport
        self.bucket = bucket
        self.retry = retry
        self.counters = counters
        self.workers = workers
        self._queue: asyncio.Queue[str] = asyncio.Queue()
        self._tasks: set[asyncio.Task[None]] = set()
        self._active = 0
        self._closed = False

    def __repr__(self) -> str:
        return f"SessionStopper(queued={self._queue.qsize()}, workers={len(self._tasks)})"

    @property
    def queued(self) -> int:
        """Stop calls not finished yet (queued or in progress).

        Example::

            print(stopper.queued)
        """
        return self._queue.qsize() + self._active

    def schedule(self, session_id: str) -> None:
        """Queue a stop call for ``session_id``; never blocks.

        Example::

            stopper.schedule(fut.session_id)
        """
        if self._closed:
            logger.warning("session %s not stopped: the client is closed", session_id)
            return
        self._queue.put_nowait(session_id)
        while len(self._tasks) < self.workers:
            task = asyncio.create_task(self._work(), name="agentcore-rl session stopper")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _work(self) -> None:
        while True:
            session_id = await self._queue.get()
            self._active += 1
            try:
                await self.bucket.acquire(Priority.STOP)
                await with_retries(
                    functools.partial(self.transport.stop, session_id),
                    retry=self.retry,
                    bucket=self.bucket,
                    counters=self.counters,
                    what=f"stopping session {session_id}",
                    priority=Priority.STOP,
                )
                self.counters["stops"] += 1
            except StopUnsupportedError:
                self.counters["stops_unsupported"] += 1  # the transport said so once, at INFO
            except Exception as exc:
                self.counters["stop_failures"] += 1
                logger.warning("could not stop session %s: %s", session_id, exc)
            finally:
                self._active -= 1
                self._queue.task_done()

    async def drain(self, timeout: float) -> int:
        """Wait up to ``timeout`` seconds for queued stops; return how many are left.

        Example::

            left = await stopper.drain(30)
        """
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._queue.join(), timeout)
        return self._queue.qsize() + self._active

    async def aclose(self) -> None:
        """Cancel the workers (queued stops are dropped, with a warning). Idempotent.

        Example::

            await stopper.aclose()
        """
        self._closed = True
        left = self.queued
        if left:
            logger.warning("%d session(s) were not stopped before the client closed", left)
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
