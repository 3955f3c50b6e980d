"""Trainer-ready data from GRPO groups: rows, files, and the shapes trainers take.

``rows``: groups (or one trajectory) -> :class:`TrainingRow`, fitted to a trainer's lengths,
as JSONL or Parquet. ``formats``: veRL's, slime's and SkyRL's shapes as plain dicts (no
trainer is imported; the adapters that import one are in ``agentcore_rl.integrations``).

Example::

    from agentcore_rl.training import rows_from_groups, to_verl, write_jsonl

    rows = list(rows_from_groups(groups, normalize="mean_std"))
    write_jsonl(rows, "step-12.jsonl")
    outputs = [to_verl(row) for row in rows]
"""

from agentcore_rl.training.formats import (
    DEFAULT_PAD_TOKEN_ID,
    SkyRLGeneratorOutput,
    SlimeSampleFields,
    VerlAgentLoopOutput,
    to_skyrl,
    to_slime,
    to_verl,
)
from agentcore_rl.training.rows import (
    FitReport,
    InvalidTrajectoryError,
    MissingTrajectoryError,
    SegmentLike,
    TrainingRow,
    TrajectoryLike,
    fit_row,
    fit_rows,
    group_rows,
    read_jsonl,
    read_parquet,
    rows_from_groups,
    trajectory_rows,
    write_jsonl,
    write_parquet,
)

__all__ = [
    "DEFAULT_PAD_TOKEN_ID",
    "FitReport",
    "InvalidTrajectoryError",
    "MissingTrajectoryError",
    "SegmentLike",
    "SkyRLGeneratorOutput",
    "SlimeSampleFields",
    "TrainingRow",
    "TrajectoryLike",
    "VerlAgentLoopOutput",
    "fit_row",
    "fit_rows",
    "group_rows",
    "read_jsonl",
    "read_parquet",
    "rows_from_groups",
    "to_skyrl",
    "to_slime",
    "to_verl",
    "trajectory_rows",
    "write_jsonl",
    "write_parquet",
]
