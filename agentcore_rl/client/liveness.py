"""Crash detection both ways (docs/client.md, "Crash detection" and "The lease"): the one
crash detector (:class:`LivenessProber`), and :class:`ClientLease`, the client's proof of
life that agent servers read (:mod:`agentcore_rl.server.lease`).

A session whose agent named its heartbeat is judged by it, read from S3 (one LIST per
experiment however many sessions); the others (servers that do not heartbeat) are probed.
On HTTP, one lost session makes its server's older probed sessions suspects, probed next.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Final, Protocol

import anyio

from agentcore_rl import protocol
from agentcore_rl.client.outcomes import ClientStats
from agentcore_rl.client.transports.transport import RetryableError
from agentcore_rl.errors import (
    AgentLostError,
    ConfigurationError,
    InvalidPayloadError,
    StorageError,
)
from agentcore_rl.keywords import check_numbers
from agentcore_rl.ratelimit import Priority, RateLimiter
from agentcore_rl.s3 import ResultStore

__all__ = [
    "DEFAULT_LIVENESS",
    "ClientLease",
    "LivenessConfig",
    "LivenessProber",
    "StatusTransport",
]

logger = logging.getLogger(__name__)


class StatusTransport(Protocol):
    async def status(self, session_id: str) -> protocol.SessionState: ...


@dataclass(frozen=True, kw_only=True)
class LivenessConfig:
    """How the client and its agents tell that the other is gone.

    ``max_rate``: probes per second at most (the share of the TPS budget crash detection
    may take); ``escalate_after``: seconds a probe waits behind invocations before it
    queues among them (``None``: always behind). A crash is seen within about
    ``probe_after + probe_interval`` seconds while fewer than ``max_rate * probe_interval``
    sessions are pending; beyond that, detection slows rather than the probes growing.
    ``lost_after``: seconds a session's agent may stay unreachable to its probes
    (connection refused, a 424 or 5xx) before the session counts as lost, as an
    ``unknown`` answer does at once: long enough for a restart, short against a timeout.

    ``unreachable_after``: seconds of failed connection attempts (nothing listens, a
    wrong URL) before an invocation ends in
    :class:`~agentcore_rl.errors.AgentUnreachableError`: an agent that is down stays down
    longer than a retry can wait out, and a typo in a URL is never cured. ``lease``: the
    client keeps a lease (one small S3 object, rewritten every ``lease_renew`` seconds)
    and names it in every invocation; agent servers cancel the rollouts of a lease not
    renewed for ``lease`` seconds, so a crashed trainer leaves nothing running for long
    (``None``: no lease). ``lease_id``: renew an existing lease (a process taking over
    rollouts an earlier one started), else a new one per client.

    Example::

        AsyncRolloutClient(..., liveness=LivenessConfig(probe_after=30, max_rate=1))
    """

    probe_after: float = 10.0
    probe_interval: float = 5.0
    max_rate: float = 2.0
    escalate_after: float | None = 3.0
    enabled: bool = True
    lost_after: float = 60.0
    unreachable_after: float = 3.0
    lease: float | None = 180.0
    lease_renew: float = 30.0
    lease_id: str | None = None

    def __post_init__(self) -> None:
        check_numbers(self, "probe_interval", "max_rate", "lease_renew", above=0)
        check_numbers(self, "probe_after", "lost_after", "unreachable_after", at_least=0)
        check_numbers(self, "escalate_after", at_least=0, optional=True)
        if self.lease is not None and not self.lease >= 2 * self.lease_renew:
            raise ConfigurationError(
                f"lease ({self.lease!r}) must be at least twice lease_renew "
                f"({self.lease_renew!r}), or one late renewal would cancel every rollout; "
                "None turns the lease off"
            )
        if self.lease_id is not None:
            try:
                protocol.validate_key_part("lease_id", self.lease_id)
            except InvalidPayloadError as exc:
                raise ConfigurationError(f"LivenessConfig: {exc.message}") from None


DEFAULT_LIVENESS: Final = LivenessConfig()


@dataclass
class _Seen:
    first: float
    probed: float | None = None
    unreachable_since: float | None = None


#: ``(bucket, key, interval)`` of the heartbeat a session's agent process named.
BeatRef = tuple[str, str, float]
#: Lists a heartbeat folder: ``{key: etag}``, ``None`` when S3 did not answer.
BeatReader = Callable[[str, str], Awaitable[dict[str, str] | None]]


class Probed(Protocol):
    """A pending rollout as the prober sees it (the client's rollout tasks)."""

    @property
    def waiting(self) -> bool: ...

    @property
    def beat(self) -> BeatRef | None: ...

    def wake(self, kind: str, value: object) -> None: ...


class LivenessProber:
    """The one crash detector: wakes the tasks of the sessions of ``live`` whose agent is
    gone. A session with a heartbeat is lost once the heartbeat stays unchanged for
    :data:`protocol.HEARTBEAT_MISSES` of its intervals (``read`` lists the heartbeats, every
    half interval; an unanswered listing counts as a change); the others are probed.

    ``counters`` gets ``probes``, ``probe_failures``, ``probes_escalated`` and ``agents_lost``.
    """

    def __init__(
        self,
        transport: StatusTransport,
        limiter: RateLimiter,
        live: Mapping[str, Probed],
        counters: ClientStats,
        *,
        config: LivenessConfig = DEFAULT_LIVENESS,
        clock: Callable[[], float] = time.monotonic,
        read: BeatReader | None = None,
    ) -> None:
        self.transport = transport
        self.limiter = limiter
        self.live = live
        self.counters = counters
        self.config = config
        self.clock = clock
        self.read = read
        # (bucket, key) -> (etag, clock time it was first seen so); folder -> next read.
        self._beats: dict[tuple[str, str], tuple[str, float]] = {}
        self._read_at: dict[tuple[str, str], float] = {}
        # Seconds between rounds: a session is probed at most every probe_interval, and a
        # round a second keeps the first probe within a second of probe_after.
        self.tick = min(1.0, config.probe_interval)
        self._seen: dict[str, _Seen] = {}
        self._credit = 0.0
        # HTTP: server URL -> clock time a session there was found lost.
        self._suspects: dict[str, float] = {}

    async def run(self) -> None:
        if not self.config.enabled:
            return
        while True:
            await asyncio.sleep(self.tick)
            await self.round()

    def _url(self, session_id: str) -> str | None:
        url_for = getattr(self.transport, "url_for", None)
        return str(url_for(session_id)) if callable(url_for) else None

    def due(self) -> list[str]:
        """The sessions to probe now, most overdue first, within the rate budget."""
        cfg = self.config
        now = self.clock()
        for sid in [s for s in self._seen if s not in self.live]:
            del self._seen[sid]
        self._credit = min(self._credit + cfg.max_rate * self.tick, max(1.0, cfg.max_rate))
        candidates: list[tuple[int, float, str]] = []
        for sid, rollout in self.live.items():
            if not rollout.waiting or rollout.beat is not None:
                continue
            seen = self._seen.get(sid)
            if seen is None:
                self._seen[sid] = _Seen(first=now)
                continue
            suspect_at = self._suspects.get(self._url(sid) or "") if self._suspects else None
            if (
                suspect_at is not None
                and seen.first < suspect_at
                and (seen.probed is None or seen.probed < suspect_at)
            ):
                candidates.append((0, seen.first, sid))  # its server lost a session
                continue
            if now - seen.first < cfg.probe_after:
                continue
            if seen.probed is not None and now - seen.probed < cfg.probe_interval:
                continue
            # Oldest unconfirmed first: last answered probe, else first sight.
            candidates.append((1, seen.probed if seen.probed is not None else seen.first, sid))
        budget = int(self._credit)
        chosen = [sid for _, _, sid in heapq.nsmallest(budget, candidates)]
        self._credit -= len(chosen)
        return chosen

    async def round(self) -> None:
        if self.read is not None:
            await self._heartbeats()
        async with anyio.create_task_group() as probes:
            for sid in self.due():
                probes.start_soon(self._probe, sid)

    async def _heartbeats(self) -> None:
        # A new or changed ETag is a beat, and so is a listing S3 did not answer (an outage
        # loses nothing).
        assert self.read is not None
        beating = {sid: r.beat for sid, r in self.live.items() if r.waiting and r.beat}
        folders: dict[tuple[str, str], float] = {}  # (bucket, prefix) -> shortest interval
        for bucket, key, interval in beating.values():
            folder = (bucket, key.rpartition("/")[0] + "/")
            folders[folder] = min(interval, folders.get(folder, interval))
        self._beats = {(b, k): self._beats.get((b, k), ("", 0.0)) for b, k, _ in beating.values()}
        self._read_at = {f: self._read_at.get(f, 0.0) for f in folders}
        for folder, interval in folders.items():
            if self.clock() < self._read_at[folder]:
                continue
            self._read_at[folder] = self.clock() + interval / 2
            listing = await self.read(*folder)
            for (bucket, key), (etag, _) in self._beats.items():
                if (bucket, key.rpartition("/")[0] + "/") == folder:
                    latest = etag if listing is None else listing.get(key, etag)
                    if listing is None or latest != etag:
                        self._beats[bucket, key] = (latest, self.clock())
        now = self.clock()
        for sid, (bucket, key, interval) in beating.items():
            seen = self._seen.setdefault(sid, _Seen(first=now))
            silent = now - max(seen.first, self._beats[bucket, key][1])
            if silent >= protocol.HEARTBEAT_MISSES * interval:
                why = f"heartbeat unchanged for {silent:.1f} s"
                self._lose(sid, f"gone with its agent process (it crashed or restarted: {why})")

    async def _token(self) -> None:
        wait = self.config.escalate_after
        if wait is None:
            await self.limiter.acquire(Priority.PROBE)
            return
        with anyio.move_on_after(wait):
            await self.limiter.acquire(Priority.PROBE)
            return
        self.counters.probes_escalated += 1
        await self.limiter.acquire(Priority.INVOKE)

    async def _probe(self, session_id: str) -> None:
        seen = self._seen.get(session_id)
        if seen is None:
            return
        seen.probed = self.clock()
        await self._token()
        rollout = self.live.get(session_id)
        if rollout is None or not rollout.waiting:
            return
        self.counters.probes += 1
        try:
            state = await self.transport.status(session_id)
        except Exception as exc:
            self.counters.probe_failures += 1
            logger.debug("probing session %s failed: %s", session_id, exc)
            if not isinstance(exc, RetryableError) or exc.throttled:
                return  # busy, or an answer that says nothing of the agent
            now = self.clock()
            if seen.unreachable_since is None:
                seen.unreachable_since = now
            if now - seen.unreachable_since < self.config.lost_after:
                return
            why = f"unreachable for {now - seen.unreachable_since:.0f} s ({exc})"
        else:
            seen.unreachable_since = None
            if state is not protocol.SessionState.UNKNOWN:
                return
            why = "unknown to its agent (it crashed or restarted)"
        url = self._url(session_id)
        if self._lose(session_id, why) and url is not None:
            self._suspects[url] = self.clock()

    def _lose(self, session_id: str, why: str) -> bool:
        rollout = self.live.get(session_id)
        if rollout is None or not rollout.waiting:
            return False
        self.counters.agents_lost += 1
        logger.warning("session %s is lost: %s", session_id, why)
        rollout.wake(
            "lost",
            AgentLostError(
                f"session {session_id} is {why}: no result will come",
                session_id=session_id,
            ),
        )
        return True


class ClientLease:
    """One client's lease (``config.lease`` set): where it lives, and the task renewing it."""

    def __init__(
        self, store: ResultStore, bucket: str, exp_id: str, config: LivenessConfig
    ) -> None:
        assert config.lease is not None
        self.store = store
        self.bucket = bucket
        self.lease_id = config.lease_id or secrets.token_hex(16)
        self.key = protocol.lease_key(exp_id, self.lease_id)
        self.ttl = config.lease
        self.renew = config.lease_renew
        self.seq = 0
        self.failures = 0
        self._failing = False
        #: The ``_rollout.lease`` value of this client's invocations.
        self.reference: dict[str, str] = protocol.lease_reference(bucket, self.key)

    async def renew_once(self) -> bool:
        """False (logged once per run of failures) when S3 refused."""
        try:
            body = protocol.lease_body(
                self.lease_id,
                seq=self.seq + 1,
                renewed_at=time.time(),
                ttl=self.ttl,
                renew=self.renew,
            )
            await self.store.put_json(self.bucket, self.key, body)
        except StorageError as exc:
            self.failures += 1
            if not self._failing:
                self._failing = True
                logger.warning(
                    "could not renew the client's lease s3://%s/%s (%s); retrying every "
                    "%g s. Agents do not count an unreadable lease as lapsed.",
                    self.bucket,
                    self.key,
                    exc.code,
                    self.renew,
                )
            return False
        self.seq += 1
        if self._failing:
            self._failing = False
            logger.info("the client's lease s3://%s/%s is renewed again", self.bucket, self.key)
        return True

    async def run(self) -> None:
        while True:
            await self.renew_once()
            await asyncio.sleep(self.renew)
