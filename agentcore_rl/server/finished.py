"""FinishedRollouts: which rollouts this server finished recently, for a bounded time.

A lost answer makes the client send the same invocation again (same session id, same
result key). While the rollout runs, the runner recognises it; once it has finished, this
memory does, so the handler does not run a second time and rewrite a key the client may
already have read. Entries expire after ``ttl`` seconds (at least AgentCore Runtime's
idle-session timeout, 900 s by default, after which ACR would not route a retry to this
process anyway) and the oldest are dropped beyond ``max_entries``, so memory stays bounded
however many rollouts a long-lived server runs.

Example::

    finished = FinishedRollouts(clock=time.monotonic)
    finished.remember("rollouts", "exp/q-1/sid.json", session_id="sid")
    finished.contains("rollouts", "exp/q-1/sid.json")   # True, for an hour
    finished.keys_of_session("sid")                   # ["exp/q-1/sid.json"]
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Final

__all__ = ["DEFAULT_FINISHED_MAX_ENTRIES", "DEFAULT_FINISHED_TTL", "FinishedRollouts"]

#: Seconds a finished rollout is remembered: four times ACR's default idle timeout (900 s),
#: and the client's default rollout timeout, so a retry or a resume within that hour is
#: answered from memory without an S3 request.
DEFAULT_FINISHED_TTL: Final = 3600.0
#: At most this many are remembered (about 300 bytes each, so some 30 MB at the cap).
DEFAULT_FINISHED_MAX_ENTRIES: Final = 100_000


class FinishedRollouts:
    """A bounded, expiring set of finished ``(bucket, key)`` pairs, indexed by session.

    ``clock`` is monotonic seconds (tests inject a fake). Finishing order is insertion
    order, so expiry and the count cap both drop from the front.
    """

    def __init__(
        self,
        *,
        ttl: float = DEFAULT_FINISHED_TTL,
        max_entries: int = DEFAULT_FINISHED_MAX_ENTRIES,
        clock: Callable[[], float],
    ) -> None:
        if ttl <= 0 or max_entries < 1:
            raise ValueError("need ttl > 0 and max_entries >= 1")
        self.ttl = ttl
        self.max_entries = max_entries
        self._clock = clock
        self._entries: OrderedDict[tuple[str, str], tuple[str, float]] = OrderedDict()
        self._by_session: dict[str, set[tuple[str, str]]] = {}

    def __repr__(self) -> str:
        return f"FinishedRollouts(remembered={len(self._entries)}, ttl={self.ttl})"

    def __len__(self) -> int:
        self._expire()
        return len(self._entries)

    def _drop_oldest(self) -> None:
        pair, (session_id, _) = self._entries.popitem(last=False)
        keys = self._by_session.get(session_id)
        if keys is not None:
            keys.discard(pair)
            if not keys:
                del self._by_session[session_id]

    def _expire(self) -> None:
        cutoff = self._clock() - self.ttl
        while self._entries and next(iter(self._entries.values()))[1] <= cutoff:
            self._drop_oldest()

    def remember(self, bucket: str, key: str, *, session_id: str) -> None:
        """Record that the rollout writing ``s3://bucket/key`` has finished (or is spooled)."""
        pair = (bucket, key)
        self._entries.pop(pair, None)
        self._entries[pair] = (session_id, self._clock())
        self._by_session.setdefault(session_id, set()).add(pair)
        self._expire()
        while len(self._entries) > self.max_entries:
            self._drop_oldest()

    def contains(self, bucket: str, key: str) -> bool:
        """True when that rollout finished within the last ``ttl`` seconds."""
        self._expire()
        return (bucket, key) in self._entries

    def keys_of_session(self, session_id: str) -> list[str]:
        """The result keys of the session's remembered rollouts (empty if none)."""
        self._expire()
        return sorted(key for _, key in self._by_session.get(session_id, ()))
