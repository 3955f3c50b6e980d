"""StoreOutages: which buckets the completion watcher cannot reach, and since when.

An S3 outage (endpoint down, 5xx, a bucket deleted and re-created) is a degraded state, not
an outcome: the agents spool their results and deliver them when S3 is back, so failing the
pending rollouts would record failures for results that do arrive. The watcher reports every
failed and every successful request here; this object turns them into a state that is
logged once on entering and once on leaving, counted (``outages``, ``degraded_seconds``)
and awaited by the client before it sends new invocations to a bucket that is down.

Example::

    outages = StoreOutages(time.monotonic)
    outages.failed("rollouts", "exp/q-1/sid.json", error)   # logs "unreachable" once
    await outages.wait_reachable("rollouts")                # returns after succeeded(...)
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from agentcore_rl.errors import StorageError

__all__ = ["StoreOutages"]

logger = logging.getLogger(__name__)


@dataclass
class _Down:
    since: float
    probe_key: str
    failures: int = 0
    last_error: str = ""


class StoreOutages:
    """Per-bucket reachability of the result store, as the watcher sees it."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._down: dict[str, _Down] = {}
        self._back: dict[str, asyncio.Event] = {}
        self._closed_seconds = 0.0
        self.outages = 0

    def __repr__(self) -> str:
        return f"StoreOutages(down={sorted(self._down)}, outages={self.outages})"

    @property
    def unreachable(self) -> bool:
        """Whether some bucket is down now."""
        return bool(self._down)

    @property
    def down_buckets(self) -> list[str]:
        """The buckets down now."""
        return sorted(self._down)

    @property
    def degraded_seconds(self) -> float:
        """Seconds spent with at least one bucket down (outages overlapping count per bucket)."""
        now = self._clock()
        return self._closed_seconds + sum(now - d.since for d in self._down.values())

    def failed(self, bucket: str, key: str, exc: StorageError) -> None:
        """A request to ``bucket`` failed after its retries: enter (or stay in) an outage."""
        down = self._down.get(bucket)
        if down is None:
            down = self._down[bucket] = _Down(since=self._clock(), probe_key=key)
            self.outages += 1
            self._back.setdefault(bucket, asyncio.Event()).clear()
            logger.warning(
                "S3 bucket %s is unreachable (%s): pending rollouts keep waiting within "
                "their timeouts and new invocations to it are held until it answers",
                bucket,
                exc,
            )
        down.failures += 1
        down.last_error = f"{exc.code}: {exc}"

    def succeeded(self, bucket: str) -> None:
        """A request to ``bucket`` succeeded: leave its outage, release held invocations."""
        down = self._down.pop(bucket, None)
        if down is None:
            return
        seconds = self._clock() - down.since
        self._closed_seconds += seconds
        self._back[bucket].set()
        logger.warning(
            "S3 bucket %s is reachable again after %.1f s (%d failed polls)",
            bucket,
            seconds,
            down.failures,
        )

    def describe(self, bucket: str) -> str | None:
        """Why ``bucket`` is down, for error messages; ``None`` when it is not."""
        down = self._down.get(bucket)
        if down is None:
            return None
        return (
            f"s3://{bucket} unreachable for {self._clock() - down.since:.0f} s ({down.last_error})"
        )

    async def wait_reachable(self, bucket: str) -> None:
        """Return once ``bucket`` is not down."""
        if bucket in self._down:
            await self._back[bucket].wait()

    def backoff(self, initial: float, maximum: float) -> float:
        """The pause before the next poll while something is down: doubling per failure."""
        failures = min((d.failures for d in self._down.values()), default=1)
        return min(maximum, initial * 2.0 ** min(failures - 1, 30))

    def probe_targets(self, busy: Iterable[str]) -> list[tuple[str, str]]:
        """(bucket, key) to GET for every down bucket not in ``busy`` (nothing pending
        there, so no poll will notice its return)."""
        skip = set(busy)
        return [(b, d.probe_key) for b, d in self._down.items() if b not in skip]
