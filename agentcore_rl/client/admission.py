"""Admission: the client's concurrency slots, and the callers that closing must interrupt.

A caller waits for a slot (from the session limiter) and a token (from the rate limiter)
before its invocation is sent, and holds the slot until the rollout's outcome. Closing
the client cancels every caller still waiting for a slot or a token, or sending; those
callers then see ``ClientClosedError`` rather than a bare ``CancelledError`` that would
look like their own cancellation.

Example::

    admission = Admission(LocalSessionLimiter(100), bucket)
    await admission.acquire(token=True)      # the caller now owns a slot
    with admission.sending():
        ...                                  # close() cancels this; wait_idle waits for it
    admission.release()                      # once the outcome is known
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Final

from agentcore_rl.errors import ClientClosedError
from agentcore_rl.ratelimit import Priority, RateLimiter
from agentcore_rl.sessionlimit import SessionLimiter

__all__ = ["Admission", "Slot"]

_CLOSED_WHILE_WAITING: Final = "the client was closed while this invocation waited"


@dataclass(eq=False)
class Slot:
    """One admitted rollout's slot; ``handed_over`` once its outcome's callback owns it."""

    handed_over: bool = False


class Admission:
    """Slots from ``sessions``, paced by ``rate``; knows which tasks to interrupt."""

    def __init__(self, sessions: SessionLimiter, rate: RateLimiter) -> None:
        self.sessions = sessions
        self.rate = rate
        self.closed = False
        self._busy_tasks: set[asyncio.Task[Any]] = set()
        self._closed_by_us: set[asyncio.Task[Any]] = set()
        self._sending = 0
        self._idle = asyncio.Event()
        self._idle.set()

    def __repr__(self) -> str:
        return f"Admission(closed={self.closed}, busy={len(self._busy_tasks)})"

    async def acquire(self, *, token: bool, priority: int = Priority.INVOKE) -> None:
        """Wait for a slot, then (if ``token``) a token at ``priority``; the caller owns
        the slot."""
        self._check_open()
        task = asyncio.current_task()
        assert task is not None
        self._busy_tasks.add(task)
        has_slot = False
        try:
            await self.sessions.acquire()
            has_slot = True
            if token:
                await self.rate.acquire(priority)
        except asyncio.CancelledError:
            if has_slot:
                self.sessions.release()
            self.raise_if_closed_by_us(task)
            raise
        except BaseException:
            if has_slot:
                self.sessions.release()
            raise
        finally:
            self._busy_tasks.discard(task)
        if self.closed:
            self.sessions.release()
            raise ClientClosedError(_CLOSED_WHILE_WAITING)

    def _check_open(self) -> None:
        if self.closed:
            raise ClientClosedError("the client is closed; create a new one")

    def release(self) -> None:
        """Give back one slot."""
        self.sessions.release()

    @contextlib.contextmanager
    def sending(self) -> Iterator[asyncio.Task[Any]]:
        """Mark the current task as sending an invocation (``close`` interrupts it and
        ``wait_idle`` waits for it); yield the task."""
        task = asyncio.current_task()
        assert task is not None
        self._busy_tasks.add(task)
        self._sending += 1
        self._idle.clear()
        try:
            yield task
        finally:
            self._busy_tasks.discard(task)
            self._sending -= 1
            if not self._sending:
                self._idle.set()

    def raise_if_closed_by_us(self, task: asyncio.Task[Any]) -> None:
        """Turn :meth:`close`'s cancellation of ``task`` into ``ClientClosedError``."""
        if task in self._closed_by_us:
            self._closed_by_us.discard(task)
            uncancel = getattr(task, "uncancel", None)
            if uncancel is not None:  # Python >= 3.11: undo our cancel() for the caller
                uncancel()
            raise ClientClosedError(_CLOSED_WHILE_WAITING)

    def close(self) -> None:
        """Refuse new callers and interrupt the waiting and sending ones."""
        self.closed = True
        for task in list(self._busy_tasks):
            self._closed_by_us.add(task)
            task.cancel()

    async def wait_idle(self) -> None:
        """Wait until no invocation is being sent (the caller bounds the wait)."""
        await self._idle.wait()
