"""The gateway's sessions: each live session's records so far, the ended ones' ids (closed to
late calls for the session TTL), and where expired sessions' traces go (a :class:`TraceSink`);
the gateway's limits (:class:`GatewayOptions`), which its sessions and its admission read."""

from __future__ import annotations

import bisect
import itertools
import logging
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Protocol

import anyio

from agentcore_rl.edge import Refusal
from agentcore_rl.errors import TraceLostError
from agentcore_rl.gateway.jsonio import Invalid, check_value
from agentcore_rl.keywords import check_numbers, checked_init
from agentcore_rl.trace import CallRecord, SessionTrace, dump_trace, load_trace

__all__ = [
    "DEFAULT_SESSION_TTL",
    "DirectorySink",
    "GatewayOptions",
    "Session",
    "Sessions",
    "TraceSink",
    "check_session_id",
]

log = logging.getLogger("agentcore_rl.gateway")

_SESSION_ID_RE: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,255}")


#: AgentCore Runtime's longest session (8 hours): a session idle this long has ended.
DEFAULT_SESSION_TTL: Final = 8 * 3600.0


@checked_init
@dataclass(frozen=True, kw_only=True)
class GatewayOptions:
    """The gateway's limits: ``session_ttl`` (seconds idle before a session expires, and how
    long an ended session's id refuses late calls), ``require_open`` (refuse calls for sessions
    the trainer did not open), an agent's body (``max_body_bytes``, received within
    ``body_timeout`` seconds), ``finish_wait`` (how long finishing a session waits for its calls
    in flight), ``retry_after`` (what a ``reject`` pause tells agents).

    Example::

        RolloutGateway(url, options=GatewayOptions(session_ttl=3600, require_open=True))
    """

    session_ttl: float = DEFAULT_SESSION_TTL
    require_open: bool = False
    max_body_bytes: int = 32 * 1024 * 1024
    body_timeout: float = 60.0
    finish_wait: float = 30.0
    retry_after: float = 1.0

    def __post_init__(self) -> None:
        check_numbers(self, "session_ttl", "max_body_bytes", "body_timeout", above=0)
        check_numbers(self, "finish_wait", "retry_after", at_least=0)


def check_session_id(sid: object) -> None:
    """Refuse (a 400) a session id that is not 1-256 safe characters."""
    if not isinstance(sid, str) or not _SESSION_ID_RE.fullmatch(sid):
        raise Invalid(
            f"malformed session id {str(sid)[:80]!r}: expected 1-256 characters of letters, "
            "digits and . _ : - (starting with a letter or digit)"
        )


class TraceSink(Protocol):
    """Where traces of expired sessions are persisted (a directory, S3, ...).

    Example::

        class S3Sink:
            async def save(self, trace): await store.put(key_of(trace), dump_trace(trace))
            async def load(self, session_id): ...
    """

    async def save(self, trace: SessionTrace) -> None:
        """Persist ``trace`` durably (raise if that is impossible)."""

    async def load(self, session_id: str) -> SessionTrace | None:
        """The trace saved for ``session_id``, or None."""


class DirectorySink:
    """Expired traces as ``{root}/{session_id}.trace.json.gz`` files.

    Example::

        sink = DirectorySink(tmp_path)
        await sink.save(trace)
        assert (await sink.load(trace.session_id)) is not None
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def _path(self, session_id: str) -> Path:
        if not session_id or "/" in session_id or session_id.startswith("."):
            raise ValueError(f"not a session id: {session_id!r}")  # never a path outside root
        return self.root / f"{session_id}.trace.json.gz"

    async def save(self, trace: SessionTrace) -> None:
        path = anyio.Path(self._path(trace.session_id))
        await path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        await tmp.write_bytes(dump_trace(trace))
        await tmp.replace(path)  # readers never see half a file

    async def load(self, session_id: str) -> SessionTrace | None:
        try:
            blob = await anyio.Path(self._path(session_id)).read_bytes()
        except FileNotFoundError:
            return None
        return load_trace(blob)


@dataclass(slots=True, eq=False)
class Session:
    """One session's metadata and records so far."""

    session_id: str
    exp_id: str | None = None
    input_id: str | None = None
    sampling: dict[str, Any] | None = None
    records: list[CallRecord] = field(default_factory=list)
    next_index: int = 0
    last_seen: float = 0.0
    in_flight: int = 0
    idle: anyio.Event | None = None  # set when in_flight drops to 0 while someone waits
    render: Any = None  # linear mode's LinearHistory (render/linear.py)
    dialect: dict[str, Any] = field(default_factory=dict)  # what a dialect keeps (by its name)

    def call_started(self, now: float) -> int:
        self.last_seen = now
        self.in_flight += 1
        index = self.next_index
        self.next_index += 1
        return index

    def call_ended(self, record: CallRecord, now: float) -> None:
        bisect.insort(self.records, record, key=lambda r: r.index)  # concurrent calls end unordered
        self.last_seen = now
        self.in_flight -= 1
        if self.in_flight == 0 and self.idle is not None:
            self.idle.set()

    def trace(self, gateway_id: str, *, complete: bool = True) -> SessionTrace:
        """The records so far as a :class:`SessionTrace` (sharing the record objects)."""
        return SessionTrace(
            session_id=self.session_id,
            exp_id=self.exp_id,
            input_id=self.input_id,
            records=list(self.records),
            gateway_id=gateway_id,
            complete=complete,
        )


class Sessions:
    """The table of sessions: opened by the trainer or by an agent's first call, finished by
    the trainer, expired (persisted to ``sink`` when there is one) after ``ttl`` seconds idle;
    an ended session's id refuses late calls (410) for ``ttl`` more seconds, then is forgotten.
    ``require_open``: an agent's call for a session not opened is refused (404)."""

    def __init__(
        self,
        gateway_id: str,
        options: GatewayOptions,
        sink: TraceSink | None,
        clock: Callable[[], float],
    ) -> None:
        self.gateway_id, self.ttl, self.sink = gateway_id, options.session_ttl, sink
        self.require_open, self.finish_wait = options.require_open, options.finish_wait
        self._clock = clock
        self.live: dict[str, Session] = {}
        # Ended sessions (finished or expired) -> when, oldest first.
        self.ended: dict[str, float] = {}
        # late_calls: an agent's calls for a session already finished or expired, refused
        names = ("late_calls", "sessions_finished", "sessions_expired", "expired_lost")
        self.counts = dict.fromkeys(names, 0)

    def open(
        self,
        session_id: str,
        exp_id: str | None,
        input_id: str | None,
        sampling: Mapping[str, Any] | None,
    ) -> None:
        check_session_id(session_id)
        for name, value in (("exp_id", exp_id), ("input_id", input_id)):
            if value is not None and not isinstance(value, str):
                raise Invalid(f"{name} must be a string, got {type(value).__name__}")
        check_value([exp_id, input_id], "exp_id and input_id")
        if sampling is not None and not isinstance(sampling, Mapping):
            raise Invalid("sampling must be an object")
        check_value(dict(sampling or {}), "sampling")
        self.ended.pop(session_id, None)  # the trainer's own: a fresh record set
        session = self.live.get(session_id)
        if session is None:
            session = self.live[session_id] = Session(session_id, last_seen=self._clock())
        session.exp_id, session.input_id = exp_id, input_id
        session.sampling = dict(sampling) if sampling else None
        for record in session.records:  # calls that raced ahead of the registration
            record.exp_id, record.input_id = exp_id, input_id

    def peek(self, session_id: str) -> SessionTrace:
        session = self.live.get(session_id)
        if session is None:
            raise TraceLostError(session_id, "this gateway has no live session by that id")
        return session.trace(self.gateway_id, complete=False)

    async def finish(self, session_id: str) -> SessionTrace:
        session = self.live.get(session_id)
        if session is None:
            if self.sink is not None and _SESSION_ID_RE.fullmatch(session_id):
                saved = await self.sink.load(session_id)
                if saved is not None:
                    return saved
            if session_id in self.ended:
                why = "it ended already (finished: its trace was handed out, or expired)"
                raise TraceLostError(session_id, why)
            raise TraceLostError(
                session_id,
                f"gateway {self.gateway_id} has no record of it (it restarted, the session "
                "expired, or the agent's calls never reached this gateway)",
            )
        if session.in_flight:
            session.idle = anyio.Event()
            with anyio.move_on_after(self.finish_wait):
                await session.idle.wait()
            if session.in_flight:
                log.warning(
                    "session %s finished with %d call(s) still running; their records "
                    "will be missing",
                    session_id,
                    session.in_flight,
                )
        self._end(session_id)
        self.counts["sessions_finished"] += 1
        return session.trace(self.gateway_id)

    async def expire_idle(self) -> int:
        now = self._clock()
        forgotten = list(itertools.takewhile(lambda e: now - e[1] > self.ttl, self.ended.items()))
        for sid, _ in forgotten:
            del self.ended[sid]
        stale = [s for s in self.live.values() if s.in_flight == 0 and now - s.last_seen > self.ttl]
        for session in stale:
            trace = session.trace(self.gateway_id, complete=False)
            if self.sink is None:
                self.counts["expired_lost"] += 1
                log.warning(
                    "session %s expired after %.0fs idle with %d record(s) and no sink: "
                    "its trace is dropped (configure a sink to keep it)",
                    session.session_id,
                    self.ttl,
                    len(session.records),
                )
            else:
                try:
                    await self.sink.save(trace)
                except Exception:
                    log.exception("could not persist expired session %s", session.session_id)
                    continue  # kept in memory; the next sweep tries again
            self._end(session.session_id)
            self.counts["sessions_expired"] += 1
        return len(stale)

    def _end(self, sid: str) -> None:
        self.live.pop(sid, None)
        self.ended[sid] = self._clock()

    def admit(self, sid: str) -> Session:
        """The session an agent's admitted call is filed under: opened by its first call,
        refused once finished or expired (a late call: a retry, a stopped agent's next turn)."""
        session = self.live.get(sid)
        if session is not None:
            return session
        if sid in self.ended:
            self.counts["late_calls"] += 1
            why = f"session {sid!r} is finished (or expired): the call is not served"
            raise Refusal(410, why, "session_finished")
        if self.require_open:
            raise Refusal(
                404, f"unknown session {sid!r}: not opened by the client", "unknown_session"
            )
        session = self.live[sid] = Session(sid)
        return session
