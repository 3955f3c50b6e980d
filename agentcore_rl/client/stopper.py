"""SessionStopper: stop calls in the background, behind every queued invocation.

Stopping a session never delays a result: the outcome is delivered first and the session id
goes into a memory object stream (``schedule`` never blocks, so future callbacks may call
it) that a few workers drain, each taking a low-priority token first. The workers run in
the client's service (:meth:`SessionStopper.run`) and end when it is cancelled.

Example::

    stopper = SessionStopper(transport, bucket, RetryPolicy(), counters)
    service.start_soon(stopper.run, name="session stopper")
    stopper.schedule(fut.session_id)
    with anyio.move_on_after(30):
        await stopper.drain()
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream

from agentcore_rl.client.config import DEFAULT_STOP_WORKERS
from agentcore_rl.client.retry import with_retries
from agentcore_rl.client.stats import ClientCounters
from agentcore_rl.client.transports.base import StopUnsupportedError, Transport
from agentcore_rl.ratelimit import Priority, RateLimiter
from agentcore_rl.retry import RetryPolicy

__all__ = ["SessionStopper"]

logger = logging.getLogger(__name__)


class SessionStopper:
    """A stream of sessions to stop and the workers that stop them.

    ``counters`` gets ``stops``, ``stops_unsupported``, ``stop_failures`` (and the retry
    counters).
    """

    def __init__(
        self,
        transport: Transport,
        limiter: RateLimiter,
        retry: RetryPolicy,
        counters: ClientCounters,
        *,
        workers: int = DEFAULT_STOP_WORKERS,
    ) -> None:
        self.transport = transport
        self.limiter = limiter
        self.retry = retry
        self.counters = counters
        self.workers = workers
        self._send, self._receive = anyio.create_memory_object_stream[str](math.inf)
        self._unfinished = 0  # scheduled and not finished (queued or in progress)
        self._pending: set[str] = set()  # the session ids of those
        #: Sessions whose stop failed or never ran before the client closed: they may
        #: still run on their agents (reported by ``client.unstopped_sessions``).
        self.unstopped: list[str] = []
        self._idle = asyncio.Event()  # asyncio's: clearable, and made before the loop runs
        self._idle.set()

    def __repr__(self) -> str:
        return f"SessionStopper(queued={self.queued}, workers={self.workers})"

    @property
    def queued(self) -> int:
        """Stop calls not finished yet (queued or in progress)."""
        return self._unfinished

    def schedule(self, session_id: str) -> None:
        """Queue a stop call for ``session_id``; never blocks."""
        try:
            self._send.send_nowait(session_id)
        except anyio.ClosedResourceError:
            logger.warning("session %s not stopped: the client is closed", session_id)
            self.unstopped.append(session_id)  # listed, not lost
            return
        self._unfinished += 1
        self._pending.add(session_id)
        self._idle.clear()

    async def run(self) -> None:
        """Stop the scheduled sessions, ``workers`` at a time, until cancelled; then
        refuse new ones (queued stops are dropped, with a warning)."""
        try:
            async with anyio.create_task_group() as tg:
                for n in range(self.workers):
                    tg.start_soon(self._work, self._receive, name=f"session stopper {n}")
        finally:
            self.close()

    def close(self) -> None:
        """Refuse new stops; the queued ones go to ``unstopped``. Idempotent."""
        if self._pending:
            self.unstopped.extend(sorted(self._pending))
            self._pending.clear()
        self._unfinished = 0
        self._idle.set()
        self._send.close()
        self._receive.close()

    async def burst(self, workers: int) -> None:
        """Run ``workers`` extra stop workers until cancelled (a closing client stops its
        sessions as fast as the rate limiter allows, not ``workers`` at a time)."""
        async with anyio.create_task_group() as tg:
            for n in range(workers):
                tg.start_soon(self._work, self._receive, name=f"closing stopper {n}")

    async def _work(self, receive: MemoryObjectReceiveStream[str]) -> None:
        while True:
            # A queued id is taken without a checkpoint (the stop call awaits anyway).
            try:
                session_id = receive.receive_nowait()
            except anyio.WouldBlock:
                try:
                    session_id = await receive.receive()
                except anyio.EndOfStream:
                    return
            except anyio.EndOfStream:
                return
            try:
                if await self._stop(session_id):
                    self._pending.discard(session_id)
            finally:
                self._unfinished = max(0, self._unfinished - 1)  # close() may have zeroed it
                if not self._unfinished:
                    self._idle.set()

    async def _stop(self, session_id: str) -> bool:
        """Stop one session; False when it may still run (the stop failed)."""
        try:
            await self.limiter.acquire(Priority.STOP)
            await with_retries(
                functools.partial(self.transport.stop, session_id),
                retry=self.retry,
                limiter=self.limiter,
                counters=self.counters,
                what=f"stopping session {session_id}",
                priority=Priority.STOP,
            )
        except StopUnsupportedError:
            self.counters.stops_unsupported += 1  # the transport said so once, at INFO
        except Exception as exc:
            self.counters.stop_failures += 1
            self.unstopped.append(session_id)
            self._pending.discard(session_id)
            logger.warning("could not stop session %s: %s", session_id, exc)
            return False
        else:
            self.counters.stops += 1
        return True

    async def drain(self) -> None:
        """Wait until every scheduled stop has finished (the caller bounds the wait)."""
        await self._idle.wait()
