"""Training rows on disk: JSONL always, Parquet when pyarrow is installed.

One JSON object per line in :meth:`TrainingRow.to_dict` layout; Parquet has the same
columns (token ids int64, logprobs float64, so a round trip is exact). pyarrow is imported
only when Parquet is asked for.
"""

from __future__ import annotations

import importlib
import json
import os
from collections.abc import Iterable
from typing import IO, Any

from agentcore_rl.errors import ConfigurationError
from agentcore_rl.training.rows import TrainingRow

__all__ = ["read_jsonl", "read_parquet", "write_jsonl", "write_parquet"]

PathOrFile = str | os.PathLike[str] | IO[str]


def write_jsonl(rows: Iterable[TrainingRow], target: PathOrFile, *, append: bool = False) -> int:
    """Write rows as JSON lines to a path (created, or appended to) or an open text file.

    Returns the number of rows written.

    Example::

        write_jsonl(group_rows(group), "rows.jsonl", append=True)
    """
    if isinstance(target, (str, os.PathLike)):
        with open(target, "a" if append else "w", encoding="utf-8") as file:
            return _write_lines(rows, file)
    return _write_lines(rows, target)


def _write_lines(rows: Iterable[TrainingRow], file: IO[str]) -> int:
    count = 0
    for row in rows:
        file.write(json.dumps(row.to_dict(), separators=(",", ":")))
        file.write("\n")
        count += 1
    return count


def read_jsonl(source: PathOrFile) -> list[TrainingRow]:
    """Read rows written by :func:`write_jsonl` (blank lines are skipped).

    Example::

        rows = read_jsonl("rows.jsonl")
    """
    if isinstance(source, (str, os.PathLike)):
        with open(source, encoding="utf-8") as file:
            return _read_lines(file, str(source))
    return _read_lines(source, getattr(source, "name", "<file>"))


def _read_lines(file: IO[str], name: str) -> list[TrainingRow]:
    rows = []
    for number, line in enumerate(file, start=1):
        if not line.strip():
            continue
        try:
            rows.append(TrainingRow.from_dict(json.loads(line)))
        except (ValueError, TypeError) as exc:
            raise ConfigurationError(f"{name}:{number} is not a training row: {exc}") from exc
    return rows


def _pyarrow() -> Any:
    # import_module keeps pyarrow optional for the type checker as well as at run time.
    try:
        pyarrow = importlib.import_module("pyarrow")
        importlib.import_module("pyarrow.parquet")
    except ImportError as exc:
        raise ConfigurationError(
            "Parquet needs pyarrow, which is not installed: pip install pyarrow "
            "(or write JSONL with write_jsonl)"
        ) from exc
    return pyarrow


def _schema(pa: Any) -> Any:
    return pa.schema(
        [
            ("exp_id", pa.string()),
            ("group_id", pa.string()),
            ("session_id", pa.string()),
            ("member", pa.int64()),
            ("attempt", pa.int64()),
            ("segment", pa.int64()),
            ("num_segments", pa.int64()),
            ("prompt_ids", pa.list_(pa.int64())),
            ("response_ids", pa.list_(pa.int64())),
            ("loss_mask", pa.list_(pa.int8())),
            ("logprobs", pa.list_(pa.float64())),
            ("reward", pa.float64()),
            ("advantage", pa.float64()),
            ("policy_versions", pa.list_(pa.int64())),
            ("response_versions", pa.list_(pa.int64())),
            ("outcome", pa.string()),
            ("zeroed", pa.bool_()),
        ]
    )


def write_parquet(rows: Iterable[TrainingRow], path: str | os.PathLike[str]) -> int:
    """Write rows to one Parquet file (needs pyarrow). Returns the number of rows.

    Example::

        write_parquet(rows_from_groups(groups), "step-12.parquet")
    """
    pa = _pyarrow()
    records = [row.to_dict() for row in rows]
    table = pa.Table.from_pylist(records, schema=_schema(pa))
    pa.parquet.write_table(table, path)
    return len(records)


def read_parquet(path: str | os.PathLike[str]) -> list[TrainingRow]:
    """Read rows written by :func:`write_parquet` (needs pyarrow).

    Example::

        rows = read_parquet("step-12.parquet")
    """
    pa = _pyarrow()
    return [TrainingRow.from_dict(r) for r in pa.parquet.read_table(path).to_pylist()]
