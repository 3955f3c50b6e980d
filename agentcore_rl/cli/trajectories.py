"""The trajectories file of ``agentcore-rl eval --gateway-url``: one JSON line per rollout.

Written beside the results file (``results.jsonl`` -> ``results.trajectories.jsonl``),
appended and flushed line by line like the results file. A line is a
:meth:`~agentcore_rl.trajectory.Trajectory.to_json` plus ``tokens_captured``; a rollout's
line is written after its results line, once. So a run killed in between leaves a done
rollout without its line: ``--resume`` finds those and builds them from the traces kept in
S3 beside the results (session ids already in the file are never written twice).

Example::

    trajectories = TrajectoryFile.open(Path("results.jsonl"), resume=False)
    trajectories.write(build_trajectory(trace, reward=1.0), tokens_captured=512)
    trajectories.close()
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from agentcore_rl.cli.journal import _cut_torn_tail, _read_lines

if TYPE_CHECKING:
    from agentcore_rl.trajectory import Trajectory

__all__ = ["TrajectoryFile", "rows_path_for", "trajectories_path_for"]


def trajectories_path_for(out: Path) -> Path:
    """Where the trajectories of a results file go: ``results.jsonl`` ->
    ``results.trajectories.jsonl``."""
    return out.with_name(out.name.removesuffix(".jsonl") + ".trajectories.jsonl")


def rows_path_for(out: Path) -> Path:
    """Where the groups' training rows of a results file go: ``results.jsonl`` ->
    ``results.groups.jsonl``."""
    return out.with_name(out.name.removesuffix(".jsonl") + ".groups.jsonl")


@dataclass
class TrajectoryFile:
    """The open trajectories file; ``sessions`` holds the session ids it has lines for."""

    path: Path
    sessions: set[str] = field(default_factory=set)
    _handle: IO[str] | None = None

    @classmethod
    def open(cls, out: Path, *, resume: bool) -> TrajectoryFile:
        """Open (or create) the file beside ``out``; with ``resume`` keep what is there."""
        path = trajectories_path_for(out)
        self = cls(path)
        if resume and path.exists():
            _cut_torn_tail(path)
            for record in _read_lines(path):
                sid = record.get("session_id")
                if isinstance(sid, str):
                    self.sessions.add(sid)
        elif not resume:
            path.unlink(missing_ok=True)
        self._handle = path.open("a", encoding="utf-8")
        return self

    def has(self, session_id: str) -> bool:
        """Whether the file already has the trajectory of ``session_id``."""
        return session_id in self.sessions

    def write(self, trajectory: Trajectory, *, tokens_captured: int, **extra: Any) -> bool:
        """Append one trajectory (and flush); False when its session already has a line."""
        if self._handle is None:
            raise RuntimeError("the trajectories file is closed")
        if trajectory.session_id in self.sessions:
            return False
        line = {**trajectory.to_json(), "tokens_captured": tokens_captured, **extra}
        self._handle.write(json.dumps(line) + "\n")
        self._handle.flush()
        self.sessions.add(trajectory.session_id)
        return True

    def close(self) -> None:
        """Close the file. Idempotent."""
        if self._handle is not None:
            self._handle.close()
            self._handle = None
