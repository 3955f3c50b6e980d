"""The files of an eval run (docs/cli.md): append-only JSONL flushed line by line, so a
run killed at any moment leaves them readable (a torn last line is cut off)."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Final

from agentcore_rl.errors import ConfigurationError

if TYPE_CHECKING:
    from agentcore_rl.client.group_runner import MemberEnd, MemberStart, ResumedGroup
    from agentcore_rl.trajectory import Trajectory

__all__ = [
    "EvalJournal",
    "JournalEntry",
    "iter_lines",
    "journal_path_for",
    "rows_path_for",
    "trajectories_path_for",
]

_EVENT: Final = "event"
_STARTED: Final = "started"
_ABANDONED: Final = "abandoned"
_UNSTOPPED: Final = "unstopped"
_MEMBER_STARTED: Final = "member_started"
_MEMBER_ENDED: Final = "member_ended"


def journal_path_for(out: Path) -> Path:
    return out.with_name(out.name + ".journal")


def trajectories_path_for(out: Path) -> Path:
    return out.with_name(out.name.removesuffix(".jsonl") + ".trajectories.jsonl")


def rows_path_for(out: Path) -> Path:
    """Where the groups' training rows go."""
    return out.with_name(out.name.removesuffix(".jsonl") + ".groups.jsonl")


@dataclass(frozen=True)
class JournalEntry:
    """One started rollout; ``started_at`` keeps the original deadline on resume."""

    input_id: str
    session_id: str
    s3_bucket: str
    result_key: str
    started_at: float = 0.0


def _rewrite(path: Path, records: list[dict[str, Any]]) -> None:
    """Replace ``path`` with ``records`` atomically (a kill leaves the old or the new file)."""
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record, default=str) + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def iter_lines(path: Path) -> Iterator[dict[str, Any]]:
    """The JSON objects of a JSONL file."""
    with path.open(encoding="utf-8") as handle:
        for line in handle:
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                if isinstance(record, dict):
                    yield record


def _earlier(path: Path, *, resume: bool) -> list[dict[str, Any]]:
    """With ``resume`` the lines already in ``path``; without, it starts empty."""
    if resume and path.exists():
        data = path.read_bytes()
        if data and not data.endswith(b"\n"):  # a torn last line
            with path.open("rb+") as handle:
                handle.truncate(data.rfind(b"\n") + 1)
        return list(iter_lines(path))
    if not resume:
        path.unlink(missing_ok=True)
    return []


def _write(handle: IO[str] | None, record: dict[str, Any]) -> None:
    if handle is None:
        raise RuntimeError("the file is closed")
    # One write call per line, flushed at once: a kill leaves at most one torn line.
    handle.write(json.dumps(record, default=str) + "\n")
    handle.flush()


@dataclass
class EvalJournal:
    """The open results file, journal and (with a gateway) trajectories file of one eval run,
    with what earlier runs left (``finished``, ``in_flight``, unfinished ``groups``, the
    sessions with a trajectory line as ``traced``). It is the client's journal of group
    members too."""

    out: Path
    finished: dict[str, dict[str, Any]] = field(default_factory=dict)
    in_flight: dict[str, JournalEntry] = field(default_factory=dict)
    unstopped: list[str] = field(default_factory=list)
    retrying: set[str] = field(default_factory=set)
    groups: dict[str, ResumedGroup] = field(default_factory=dict)
    trajectories: Path | None = None
    traced: set[str] = field(default_factory=set)
    _results: IO[str] | None = None
    _journal: IO[str] | None = None
    _trajectories: IO[str] | None = None

    @classmethod
    def check(cls, out: Path, *, resume: bool) -> None:
        """Raise the ``ConfigurationError`` :meth:`open` would for ``out``, touching nothing."""
        if out.exists() and out.stat().st_size > 0 and not resume:
            raise ConfigurationError(
                f"{out} already exists; pass --resume to continue that run or choose another --out"
            )
        if out.parent and not out.parent.exists():
            raise ConfigurationError(f"the directory of --out does not exist: {out.parent}")

    @classmethod
    def open(cls, out: Path, *, resume: bool, trajectories: bool = False) -> EvalJournal:
        """Open (or create) the files; with ``resume`` read what an earlier run left."""
        cls.check(out, resume=resume)
        self = cls(out)
        if trajectories:
            self.trajectories = trajectories_path_for(out)
            traced = _earlier(self.trajectories, resume=resume)
            self.traced = {r["session_id"] for r in traced if isinstance(r.get("session_id"), str)}
            self._trajectories = self.trajectories.open("a", encoding="utf-8")
        records = _earlier(out, resume=resume)
        events = _earlier(journal_path_for(out), resume=resume)
        for record in records:
            if isinstance(record.get("input_id"), str):
                self.finished[record["input_id"]] = record
        self.retrying = {i for i, r in self.finished.items() if r.get("retryable")}
        if self.retrying:
            _rewrite(out, [r for r in records if r.get("input_id") not in self.retrying])
            for input_id in self.retrying:
                del self.finished[input_id]
        for record in events:
            self._replay(record)
        self._results = out.open("a", encoding="utf-8")
        self._journal = journal_path_for(out).open("a", encoding="utf-8")
        for input_id in sorted(self.retrying):
            # Its session is over: a later resume starts afresh, never re-attaches.
            self.in_flight.pop(input_id, None)
            self.record_abandoned(input_id)
        return self

    def _replay(self, record: dict[str, Any]) -> None:
        if record.get(_EVENT) == _UNSTOPPED:
            ids = record.get("session_ids")
            if isinstance(ids, list):
                self.unstopped.extend(str(sid) for sid in ids)
            return
        input_id = record.get("input_id")
        if not isinstance(input_id, str) or input_id in self.finished:
            return
        if record.get(_EVENT) in (_MEMBER_STARTED, _MEMBER_ENDED):
            with contextlib.suppress(KeyError, TypeError, ValueError):  # else it runs again
                self._replay_member(input_id, record)
            return
        if record.get(_EVENT) == _ABANDONED:
            self.in_flight.pop(input_id, None)
        if record.get(_EVENT) not in (None, _STARTED):
            return
        try:
            entry = JournalEntry(
                input_id,
                str(record["session_id"]),
                str(record["s3_bucket"]),
                str(record["result_key"]),
                float(record.get("started_at", 0.0)),
            )
        except (KeyError, TypeError, ValueError):
            return
        # The latest start wins (a rerun after a stop).
        self.in_flight[input_id] = entry

    def _replay_member(self, input_id: str, record: dict[str, Any]) -> None:
        # lazy: the client extra (commands check --out without it)
        from agentcore_rl.client.group_runner import MemberEnd, MemberStart, ResumedGroup

        group = self.groups.setdefault(input_id, ResumedGroup())
        sid = str(record["session_id"])
        if record[_EVENT] == _MEMBER_STARTED:
            where = (str(record["s3_bucket"]), str(record["result_key"]))
            group.started[sid] = MemberStart(input_id, sid, *where, float(record["started_at"]))
        else:
            reward = None if record.get("reward") is None else float(record["reward"])
            end = MemberEnd(
                input_id,
                sid,
                record["kind"],
                reward=reward,
                error=record.get("error"),
                failure_kind=record.get("failure_kind"),
            )
            group.ended.append(end)

    def record_started(self, entry: JournalEntry) -> None:
        """Append one started rollout to the journal."""
        _write(self._journal, {_EVENT: _STARTED, **asdict(entry)})

    def record_abandoned(self, input_id: str) -> None:
        """Note that this run stopped a started rollout (Ctrl-C): a resumed run reruns it."""
        _write(self._journal, {_EVENT: _ABANDONED, "input_id": input_id})

    def record_unstopped(self, session_ids: list[str]) -> None:
        """Note sessions the client could not stop when it closed: ``--resume`` stops them."""
        if session_ids:
            _write(self._journal, {_EVENT: _UNSTOPPED, "session_ids": list(session_ids)})

    def member_started(self, start: MemberStart) -> None:
        """Journal a group member's attempt before it is invoked (the client calls this)."""
        _write(self._journal, {_EVENT: _MEMBER_STARTED, **asdict(start)})

    def member_ended(self, end: MemberEnd) -> None:
        """Journal how a group member's attempt ended (the client calls this)."""
        fields = ("input_id", "session_id", "kind", "reward", "error", "failure_kind")
        _write(self._journal, {_EVENT: _MEMBER_ENDED, **{f: getattr(end, f) for f in fields}})

    def record_outcome(self, record: dict[str, Any]) -> None:
        """Append one outcome line to the results file."""
        _write(self._results, record)
        self.finished[record["input_id"]] = record
        self.in_flight.pop(record["input_id"], None)

    def record_trajectory(
        self, trajectory: Trajectory, *, tokens_captured: int, **extra: Any
    ) -> None:
        """Append one trajectory, unless its session already has a line."""
        if trajectory.session_id not in self.traced:
            line = {**trajectory.to_json(), "tokens_captured": tokens_captured, **extra}
            _write(self._trajectories, line)
            self.traced.add(trajectory.session_id)

    def close(self) -> None:
        """Close the files. Idempotent."""
        for handle in (self._results, self._journal, self._trajectories):
            if handle is not None:
                handle.close()
        self._results = self._journal = self._trajectories = None
