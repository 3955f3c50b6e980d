"""BodyBudget: a cap on the request-body bytes held by all invocations being received.

``max_body_bytes`` bounds one request; eight concurrent 50 MB bodies still take the
process to gigabytes (the bytes, their text, the parsed objects). The budget bounds the
sum: an invocation whose body does not fit in what is left gets ``503`` with
``Retry-After``, a signal to send it again shortly, not a failure. Bytes are held from the
first chunk until the body has been parsed.

Example::

    budget = BodyBudget(256 * 1024 * 1024)
    if budget.try_reserve(len(chunk)):
        ...
        budget.release(len(chunk))
"""

from __future__ import annotations

from typing import Final

__all__ = ["DEFAULT_MAX_INFLIGHT_BODY_BYTES", "BodyBudget"]

#: Body bytes all invocations being received may hold together (room for two bodies of
#: ACR's 100 MB maximum, plus change).
DEFAULT_MAX_INFLIGHT_BODY_BYTES: Final = 256 * 1024 * 1024


class BodyBudget:
    """A byte budget shared by the requests of one server (single event loop, no lock)."""

    def __init__(self, limit: int) -> None:
        if limit <= 0:
            raise ValueError(f"the body budget must be positive, got {limit}")
        self.limit = limit
        self._in_flight = 0

    def __repr__(self) -> str:
        return f"BodyBudget(in_flight={self._in_flight}, limit={self.limit})"

    @property
    def in_flight(self) -> int:
        """Bytes reserved now."""
        return self._in_flight

    def try_reserve(self, size: int) -> bool:
        """Reserve ``size`` bytes if they fit; False (nothing reserved) if not."""
        if self._in_flight + size > self.limit:
            return False
        self._in_flight += size
        return True

    def release(self, size: int) -> None:
        """Give back bytes reserved earlier."""
        self._in_flight = max(0, self._in_flight - size)
