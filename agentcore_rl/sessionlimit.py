"""Concurrency limiting of rollouts: the SessionLimiter protocol and its local version.

A rollout client holds one slot of its :class:`SessionLimiter` from the moment it admits
a rollout until that rollout's outcome, so at most that many sessions run at once. Any
object with the two methods can stand in (e.g. one shared by a cluster of clients).
"""

from __future__ import annotations

import asyncio
from typing import Protocol, runtime_checkable

from agentcore_rl.errors import ConfigurationError

__all__ = ["LocalSessionLimiter", "SessionLimiter"]


@runtime_checkable
class SessionLimiter(Protocol):
    """What a rollout client needs from a concurrency limit (``session_limiter=``).

    ``acquire`` waits for a free slot; cancelling the wait takes none. ``release`` gives
    one back; it must not block, as outcomes (future callbacks) call it.

    Example::

        class SharedSlots:                         # e.g. backed by a cluster-wide actor
            async def acquire(self) -> None: ...
            def release(self) -> None: ...

        AsyncRolloutClient(..., session_limiter=SharedSlots())
    """

    async def acquire(self) -> None:
        """Wait for a free slot and take it."""

    def release(self) -> None:
        """Give one slot back, without blocking."""


class LocalSessionLimiter:
    """``slots`` slots in this process (an asyncio semaphore): the client's default.

    Example::

        AsyncRolloutClient(..., session_limiter=LocalSessionLimiter(64))
    """

    def __init__(self, slots: int) -> None:
        if not isinstance(slots, int) or isinstance(slots, bool) or slots < 1:
            raise ConfigurationError(f"a session limit must be an int >= 1, got {slots!r}")
        self.slots = slots
        self._semaphore = asyncio.Semaphore(slots)

    def __repr__(self) -> str:
        return f"LocalSessionLimiter(slots={self.slots})"

    async def acquire(self) -> None:
        """Wait for a free slot and take it."""
        await self._semaphore.acquire()

    def release(self) -> None:
        """Give one slot back."""
        self._semaphore.release()
