"""Admission: the client's concurrency slots, and the callers that closing must interrupt.

A caller waits for a slot (and a token) before its invocation is sent, and holds the slot
until the rollout's outcome. Closing the client cancels every caller still waiting for a
slot or a token, or sending; those callers then see ``ClientClosedError`` rather than a
bare ``CancelledError`` that would look like their own cancellation.

Example::

    admission = Admission(max_concurrent_sessions, bucket)
    await admission.acquire(token=True)      # the caller now owns a slot
    with admission.sending() as task:
        ...                                  # aclose() cancels this and waits for it
    admission.release()                      # once the outcome is known
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any, Final

from agentcore_rl.client.bucket import Priority, TokenBucket
from agentcore_rl.errors import ClientClosedError

__all__ = ["Admission"]

_CLOSED_WHILE_WAITING: Final = "the client was closed while this invocation waited"


class Admission:
    """``slots`` concurrency slots, paced by ``bucket``; knows which tasks to interrupt.

    Example::

        await admission.acquire(token=False)   # attach: a slot, no call to the agent
    """

    def __init__(self, slots: int, bucket: TokenBucket) -> None:
        self.bucket = bucket
        self.closed = False
        self._slots = asyncio.Semaphore(slots)
        self._busy_tasks: set[asyncio.Task[Any]] = set()
        self._closed_by_us: set[asyncio.Task[Any]] = set()
        self._sending = 0
        self._idle = asyncio.Event()
        self._idle.set()

    def __repr__(self) -> str:
        return f"Admission(closed={self.closed}, busy={len(self._busy_tasks)})"

    def check_open(self) -> None:
        """Raise ``ClientClosedError`` once :meth:`close` has run.

        Example::

            admission.check_open()
        """
        if self.closed:
            raise ClientClosedError("the client is closed; create a new one")

    async def acquire(self, *, token: bool) -> None:
        """Wait for a slot, then (if ``token``) an invocation token; the caller owns the slot.

        Example::

            await admission.acquire(token=True)
        """
        self.check_open()
        task = asyncio.current_task()
        assert task is not None
        self._busy_tasks.add(task)
        has_slot = False
        try:
            await self._slots.acquire()
            has_slot = True
            if token:
                await self.bucket.acquire(Priority.INVOKE)
        except asyncio.CancelledError:
            if has_slot:
                self._slots.release()
            self.raise_if_closed_by_us(task)
            raise
        finally:
            self._busy_tasks.discard(task)
        if self.closed:
            self._slots.release()
            raise ClientClosedError(_CLOSED_WHILE_WAITING)

    def release(self) -> None:
        """Give back one slot.

        Example::

            admission.release()
        """
        self._slots.release()

    @contextlib.contextmanager
    def sending(self) -> Iterator[asyncio.Task[Any]]:
        """Mark the current task as sending an invocation (``close`` interrupts it and
        ``wait_idle`` waits for it); yield the task.

        Example::

            with admission.sending() as task:
                await transport.invoke(sid, body)
        """
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
        """Turn :meth:`close`'s cancellation of ``task`` into ``ClientClosedError``.

        Example::

            except asyncio.CancelledError:
                admission.raise_if_closed_by_us(task)
                raise
        """
        if task in self._closed_by_us:
            self._closed_by_us.discard(task)
            uncancel = getattr(task, "uncancel", None)
            if uncancel is not None:  # Python >= 3.11: undo our cancel() for the caller
                uncancel()
            raise ClientClosedError(_CLOSED_WHILE_WAITING)

    def close(self) -> None:
        """Refuse new callers and cancel the waiting and sending ones.

        Example::

            admission.close()
            await admission.wait_idle(30)
        """
        self.closed = True
        for task in list(self._busy_tasks):
            self._closed_by_us.add(task)
            task.cancel()

    async def wait_idle(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds until no invocation is being sent.

        Example::

            await admission.wait_idle(30)
        """
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._idle.wait(), timeout)
