"""The results file of ``agentcore-rl eval`` and the journal that makes ``--resume`` work.

Two append-only JSONL files, flushed line by line so that a run killed at any moment (even
with SIGKILL) leaves them readable:

- ``results.jsonl``: one line per outcome (done, failed or timed out), the run's product;
- ``results.jsonl.journal``: one line per started rollout (input id, session id, bucket,
  result key, start time), written just *before* its invocation is sent, and one line per
  rollout this run stopped itself (Ctrl-C), which a resumed run starts again.

On ``--resume`` an input with a line in the results file is skipped, unless that line is a
retryable failure (``"retryable": true``: a crashed or unreachable agent, a server shutdown):
such lines are removed from the results file (rewritten atomically) and the input runs
again, so every input still has at most one line. Sessions the previous run could not stop
when it closed (``unstopped`` journal lines) are stopped by the resumed run. An input that
the journal shows as started but that has no outcome was in flight when the previous run
died: it is resumed by its session id and result key (its result collected from S3, or
the invocation sent again with the same session id, which an agent still running it does
not start twice), never started under a new session. A torn last line (the process died
mid-write) is cut off before appending.

Example::

    journal = EvalJournal.open(Path("results.jsonl"), resume=True)
    try:
        journal.record_started(JournalEntry("q-1", sid, "rollouts", key))
        journal.record_outcome({"input_id": "q-1", "outcome": "done", ...})
    finally:
        journal.close()
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any, Final

from agentcore_rl.errors import ConfigurationError

__all__ = ["EvalJournal", "JournalEntry", "journal_path_for"]

_EVENT: Final = "event"
_STARTED: Final = "started"
_ABANDONED: Final = "abandoned"
_UNSTOPPED: Final = "unstopped"


def journal_path_for(out: Path) -> Path:
    """Where the journal of a results file lives: next to it, ``.journal`` appended."""
    return out.with_name(out.name + ".journal")


@dataclass(frozen=True)
class JournalEntry:
    """One started rollout: enough to find its result in S3 later.

    ``started_at`` (epoch seconds) lets a resumed run keep the original deadline.
    """

    input_id: str
    session_id: str
    s3_bucket: str
    result_key: str
    started_at: float = 0.0


def _cut_torn_tail(path: Path) -> None:
    """Drop a last line without its newline: the writer died in the middle of it."""
    with path.open("rb+") as handle:
        handle.seek(0, os.SEEK_END)
        size = handle.tell()
        if size == 0:
            return
        handle.seek(size - 1)
        if handle.read(1) == b"\n":
            return
        data = path.read_bytes()
        handle.truncate(data.rfind(b"\n") + 1)


def _rewrite(path: Path, records: list[dict[str, Any]]) -> None:
    """Replace ``path`` with ``records`` atomically (a kill leaves the old or the new file)."""
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record, default=str) + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def _read_lines(path: Path) -> list[dict[str, Any]]:
    records = []
    with path.open(encoding="utf-8") as handle:
        for line in handle:
            try:
                record = json.loads(line)
            except ValueError:
                continue  # a torn line, cut off before we append
            if isinstance(record, dict):
                records.append(record)
    return records


@dataclass
class EvalJournal:
    """The open results file and journal of one eval run.

    ``finished`` maps input ids to their outcome lines from earlier runs; ``in_flight``
    maps input ids to rollouts an earlier run started but never saw finish.
    """

    out: Path
    finished: dict[str, dict[str, Any]] = field(default_factory=dict)
    in_flight: dict[str, JournalEntry] = field(default_factory=dict)
    unstopped: list[str] = field(default_factory=list)
    retrying: set[str] = field(default_factory=set)
    #: Every journal line an earlier run wrote, in order (group members are journaled as
    #: events of their own, read by :mod:`agentcore_rl.cli.group_eval`).
    events: list[dict[str, Any]] = field(default_factory=list)
    _results: IO[str] | None = None
    _journal: IO[str] | None = None

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
    def open(cls, out: Path, *, resume: bool) -> EvalJournal:
        """Open (or create) the files; with ``resume`` read what an earlier run left.

        Without ``resume`` an existing non-empty results file is an error, so that a
        finished evaluation is never overwritten by accident.
        """
        journal_path = journal_path_for(out)
        cls.check(out, resume=resume)
        self = cls(out)
        if resume:
            for path in (out, journal_path):
                if path.exists():
                    _cut_torn_tail(path)
            if out.exists():
                records = _read_lines(out)
                for record in records:
                    input_id = record.get("input_id")
                    if isinstance(input_id, str):
                        self.finished[input_id] = record
                self.retrying = {i for i, r in self.finished.items() if r.get("retryable")}
                if self.retrying:
                    _rewrite(out, [r for r in records if r.get("input_id") not in self.retrying])
                    for input_id in self.retrying:
                        del self.finished[input_id]
            if journal_path.exists():
                for record in _read_lines(journal_path):
                    self.events.append(record)
                    self._replay(record)
        else:
            journal_path.unlink(missing_ok=True)
        self._results = out.open("a", encoding="utf-8")
        self._journal = journal_path.open("a", encoding="utf-8")
        for input_id in sorted(self.retrying):
            # Its failed session is over: a later resume starts it afresh, never re-attaches.
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
        if record.get(_EVENT) not in (None, _STARTED, _ABANDONED):
            return  # another kind of line (a group member's)
        if record.get(_EVENT) == _ABANDONED:
            self.in_flight.pop(input_id, None)
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
        # The latest start wins: an input run again after its earlier session was stopped.
        self.in_flight[input_id] = entry

    def record_started(self, entry: JournalEntry) -> None:
        """Append one started rollout to the journal and flush it."""
        self._write(self._journal, {_EVENT: _STARTED, **asdict(entry)})

    def record_abandoned(self, input_id: str) -> None:
        """Note that a started rollout was stopped by this run (Ctrl-C): a resumed run
        starts it again rather than waiting for a result that will not come.
        """
        self._write(self._journal, {_EVENT: _ABANDONED, "input_id": input_id})

    def record_unstopped(self, session_ids: list[str]) -> None:
        """Note sessions the client could not stop when it closed: ``--resume`` stops them."""
        if session_ids:
            self._write(self._journal, {_EVENT: _UNSTOPPED, "session_ids": list(session_ids)})

    def record_event(self, record: dict[str, Any]) -> None:
        """Append one journal line of another kind (it must carry ``event``) and flush it."""
        if not isinstance(record.get(_EVENT), str) or record[_EVENT] in (_STARTED, _ABANDONED):
            raise ValueError("an event record needs its own string 'event'")
        self._write(self._journal, record)

    def record_outcome(self, record: dict[str, Any]) -> None:
        """Append one outcome line (must carry ``input_id``) and flush it."""
        if not isinstance(record.get("input_id"), str):
            raise ValueError("an outcome record needs a string input_id")
        self._write(self._results, record)
        self.finished[record["input_id"]] = record
        self.in_flight.pop(record["input_id"], None)

    def _write(self, handle: IO[str] | None, record: dict[str, Any]) -> None:
        if handle is None:
            raise RuntimeError("the journal is closed")
        # One write call per line, flushed at once: a kill leaves at most one torn line.
        handle.write(json.dumps(record, default=str) + "\n")
        handle.flush()

    def close(self) -> None:
        """Close both files. Idempotent."""
        for handle in (self._results, self._journal):
            if handle is not None:
                handle.close()
        self._results = self._journal = None
