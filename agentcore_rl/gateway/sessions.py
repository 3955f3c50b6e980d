"""The gateway's sessions in memory, and where expired ones go (a pluggable sink).

A session is opened by the client (``open_session``: exp_id, input_id, sampling
overrides) or implicitly by its first call. It is released when the client finishes it;
one idle for longer than the TTL is persisted to the sink and dropped from memory, never
silently: without a sink the loss is logged and counted, and finishing it later raises
:class:`TraceLostError`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import anyio

from agentcore_rl.gateway.record import CallRecord, SessionTrace, dump_trace, load_trace

__all__ = ["DirectorySink", "Session", "TraceSink"]


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

    def __repr__(self) -> str:
        return f"DirectorySink({str(self.root)!r})"

    def _path(self, session_id: str) -> Path:
        if not session_id or "/" in session_id or session_id.startswith("."):
            raise ValueError(f"not a session id: {session_id!r}")  # never a path outside root
        return self.root / f"{session_id}.trace.json.gz"

    async def save(self, trace: SessionTrace) -> None:
        blob = dump_trace(trace)
        path = self._path(trace.session_id)

        def write() -> None:
            self.root.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_bytes(blob)
            os.replace(tmp, path)  # readers never see half a file

        await anyio.to_thread.run_sync(write)

    async def load(self, session_id: str) -> SessionTrace | None:
        path = self._path(session_id)

        def read() -> bytes | None:
            try:
                return path.read_bytes()
            except FileNotFoundError:
                return None

        blob = await anyio.to_thread.run_sync(read)
        return None if blob is None else load_trace(blob)


@dataclass(slots=True, eq=False)
class Session:
    """One session's metadata and records so far."""

    session_id: str
    exp_id: str | None = None
    input_id: str | None = None
    sampling: dict[str, Any] | None = None
    opened: bool = False  # by the client (not implicitly by a call)
    records: list[CallRecord] = field(default_factory=list)
    next_index: int = 0
    last_seen: float = 0.0
    in_flight: int = 0
    idle: anyio.Event | None = None  # set when in_flight drops to 0 while someone waits
    # the rendering mode's linear history (render/linear.py), made on the first call
    render: Any = None

    def call_started(self, now: float) -> int:
        """Count a call in; -> its index in the session."""
        self.last_seen = now
        self.in_flight += 1
        index = self.next_index
        self.next_index += 1
        return index

    def call_ended(self, record: CallRecord, now: float) -> None:
        """Commit ``record`` (in index order) and count the call out."""
        records = self.records
        if records and records[-1].index > record.index:  # concurrent calls end out of order
            pos = len(records)
            while pos and records[pos - 1].index > record.index:
                pos -= 1
            records.insert(pos, record)
        else:
            records.append(record)
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
