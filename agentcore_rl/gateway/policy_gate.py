"""Policy versions and weight-sync pauses: which calls may start, and when all have drained.

While paused, new calls either wait (``hold``) until the pause ends, or are refused
(``reject``: the gateway answers 429 with ``Retry-After``); calls already running finish.
``pause()`` returns once none is running, so the trainer can swap weights safely.

Example::

    gate = PolicyGate()
    await gate.pause("hold")       # returns when in-flight calls have drained
    gate.version = 8
    gate.resume()
"""

from __future__ import annotations

from typing import Final, Literal

import anyio

__all__ = ["PauseMode", "PolicyGate", "Rejected"]

PauseMode = Literal["hold", "reject"]
_MODES: Final = ("hold", "reject")


class Rejected(Exception):
    """A call arrived during a ``reject`` pause; retry after ``retry_after`` seconds."""

    def __init__(self, retry_after: float) -> None:
        super().__init__(f"the gateway is paused for a weight update; retry in {retry_after}s")
        self.retry_after = retry_after


class PolicyGate:
    """The current policy version, the pause state and the count of calls in flight."""

    def __init__(self, *, version: int = 0, retry_after: float = 1.0) -> None:
        self.version = version
        self.retry_after = retry_after
        self.in_flight = 0
        self._mode: PauseMode | None = None
        self._resumed = anyio.Event()
        self._resumed.set()
        self._drained: anyio.Event | None = None

    @property
    def paused(self) -> PauseMode | None:
        """The pause mode, or None when calls flow."""
        return self._mode

    async def enter(self) -> int:
        """Admit one call (waiting out a ``hold`` pause); -> the version it starts under."""
        while self._mode is not None:
            if self._mode == "reject":
                raise Rejected(self.retry_after)
            await self._resumed.wait()
        self.in_flight += 1
        return self.version

    def exit(self) -> None:
        """One admitted call has ended (its record is committed)."""
        self.in_flight -= 1
        if self.in_flight == 0 and self._drained is not None:
            self._drained.set()

    async def pause(self, mode: PauseMode = "hold") -> None:
        """Stop admitting calls, then wait until none is running."""
        if mode not in _MODES:
            raise ValueError(f"pause mode must be one of {_MODES}, got {mode!r}")
        if self._mode is not None:
            raise RuntimeError("the gateway is already paused")
        self._mode = mode
        self._resumed = anyio.Event()
        try:
            while self.in_flight:
                self._drained = anyio.Event()
                await self._drained.wait()
        except BaseException:
            self.resume()  # a cancelled pause must not leave the gateway stuck
            raise
        finally:
            self._drained = None

    def resume(self) -> None:
        """Admit calls again; held ones proceed."""
        self._mode = None
        self._resumed.set()
