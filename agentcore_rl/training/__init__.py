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

from agentcore_rl.training import formats, rows
from agentcore_rl.training.formats import *  # noqa: F403
from agentcore_rl.training.rows import *  # noqa: F403

__all__ = [*formats.__all__, *rows.__all__]
