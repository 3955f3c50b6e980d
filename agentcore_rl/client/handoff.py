"""Handing work from one task to a few long-lived worker tasks, one item at a time.

The client's hot paths hand every rollout to a worker (a batch's senders). A task per
item costs a spawn, a first step and a done callback; anyio's memory streams cost a
checkpoint, an event and a receiver record per wait. A :class:`Handoff` is a deque and
the futures of the workers waiting on it: ``put`` never waits and gives the item straight
to a waiting worker, ``get`` returns at once while items are queued, else waits on one
plain future. Closing it lets the workers drain what is queued, then ``get`` returns
``None``.

Example::

    handoff: Handoff[int] = Handoff()
    handoff.put(1)
    handoff.close()
    assert await handoff.get() == 1 and await handoff.get() is None
"""

from __future__ import annotations

import asyncio
import collections
from typing import Generic, TypeVar

__all__ = ["Handoff"]

T = TypeVar("T")


class Handoff(Generic[T]):
    """A queue from one producer to worker tasks (same event loop), see the module text."""

    __slots__ = ("_closed", "_items", "_waiters")

    def __init__(self) -> None:
        self._items: collections.deque[T] = collections.deque()
        self._waiters: collections.deque[asyncio.Future[T | None]] = collections.deque()
        self._closed = False

    def __repr__(self) -> str:
        return f"Handoff(queued={len(self._items)}, idle={self.idle}, closed={self._closed})"

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    @property
    def queued(self) -> int:
        """Items waiting for a worker."""
        return len(self._items)

    @property
    def idle(self) -> int:
        """Workers waiting in ``get`` now."""
        return sum(1 for waiter in self._waiters if not waiter.done())

    def put(self, item: T) -> None:
        """Give ``item`` to a waiting worker, or queue it."""
        if self._closed:
            raise RuntimeError("put() on a closed Handoff")
        waiters = self._waiters
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(item)
                return
        self._items.append(item)

    def close(self) -> None:
        """No more items: waiting workers get ``None`` (after the queue drains, so do the
        others). Idempotent."""
        self._closed = True
        waiters, self._waiters = self._waiters, collections.deque()
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def drain(self) -> list[T]:
        """Take every queued item (what no worker will get, e.g. after a cancellation)."""
        items = list(self._items)
        self._items.clear()
        return items

    async def get(self) -> T | None:
        """The next item, or ``None`` once closed and empty."""
        if self._items:
            return self._items.popleft()
        if self._closed:
            return None
        waiter: asyncio.Future[T | None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            return await waiter
        except asyncio.CancelledError:
            # Handed an item as this worker was cancelled: the item goes back first.
            if waiter.done() and not waiter.cancelled():
                item = waiter.result()
                if item is not None:
                    self._items.appendleft(item)
            raise
