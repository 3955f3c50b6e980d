"""Trainer-ready data from GRPO groups: rows, files, and the shapes trainers take.

``rows``: groups -> :class:`TrainingRow` (prompt and response token ids, loss mask,
logprobs, reward, advantage, group id, policy versions, session id). ``files``: JSONL and,
with pyarrow, Parquet. ``formats``: converters to veRL's agent-loop output, slime's
``Sample`` and SkyRL's ``GeneratorOutput`` as plain dicts. No trainer is imported.

Example::

    from agentcore_rl.training import rows_from_groups, to_verl, write_jsonl

    rows = list(rows_from_groups(groups, normalize="mean_std"))
    write_jsonl(rows, "step-12.jsonl")
    outputs = [to_verl(row) for row in rows]
"""

from agentcore_rl.training.files import read_jsonl, read_parquet, write_jsonl, write_parquet
from agentcore_rl.training.formats import (
    SkyRLGeneratorOutput,
    SlimeSampleFields,
    VerlAgentLoopOutput,
    to_skyrl,
    to_slime,
    to_verl,
)
from agentcore_rl.training.rows import (
    InvalidTrajectoryError,
    MissingTrajectoryError,
    SegmentLike,
    TrainingRow,
    TrajectoryLike,
    group_rows,
    rows_from_groups,
)

__all__ = [
    "InvalidTrajectoryError",
    "MissingTrajectoryError",
    "SegmentLike",
    "SkyRLGeneratorOutput",
    "SlimeSampleFields",
    "TrainingRow",
    "TrajectoryLike",
    "VerlAgentLoopOutput",
    "group_rows",
    "read_jsonl",
    "read_parquet",
    "rows_from_groups",
    "to_skyrl",
    "to_slime",
    "to_verl",
    "write_jsonl",
    "write_parquet",
]
