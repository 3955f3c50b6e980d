"""The end-of-run summary of ``demo`` and ``eval``, from the run's files (``show.RunData``).

A group member is correct when its reward is above 0, or at least the run's
``--pass-threshold`` (each group line carries it); pass@k is the unbiased estimator
1 - C(m - c, k) / C(m, k) over a group's m kept members, c correct.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from agentcore_rl.groups import result_reward as reward_of
from agentcore_rl.protocol import is_error_envelope

__all__ = [
    "EvalRun",
    "average",
    "correct",
    "failure_of",
    "group_figures",
    "outcome_of",
    "pass_at_k",
    "percentile",
    "render",
    "reward_of",
]


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0-100) with linear interpolation; ``None`` if empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


#: How much of a failure's message the summary shows (the results file has all of it).
_REASON_CHARS: Final = 90


#: A session id in a message (48 hex digits, or a member's longer one): shown by its start.
_SESSION_ID: Final = re.compile(r"\b([0-9a-f]{8})[0-9a-f-]{24,}\b")


def _short(error: str) -> str:
    # The cause comes after the session id: shorten the id, not the cause.
    line = _SESSION_ID.sub(r"\1...", " ".join(error.split()))
    return line if len(line) <= _REASON_CHARS else line[: _REASON_CHARS - 3] + "..."


def failure_of(record: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """A failure's cause (its failure kind, then its type) and reason; an error envelope's
    ``stop_reason`` tells apart failures the client reports alike."""
    error_type, error = record.get("error_type"), record.get("error")
    envelope = record.get("result")
    if isinstance(envelope, Mapping) and is_error_envelope(envelope):
        reason = envelope.get("stop_reason")
        if isinstance(reason, str) and reason:
            cause = reason.split(":", 1)[0].strip()
            if cause.isidentifier():
                error_type = f"{error_type} ({cause})" if error_type else cause
            error = reason
    kind = record.get("failure_kind")
    return (f"{kind}: {error_type}" if kind and error_type else error_type or kind), error


def outcome_of(line: Mapping[str, Any]) -> str:
    """A results line's outcome, a group member's (``succeeded``...) named as a rollout's."""
    outcome = str(line.get("outcome"))
    return {"succeeded": "done", "timed_out": "timeout"}.get(outcome, outcome)


def average(values: Sequence[float]) -> float | None:
    """The mean, ``None`` if empty."""
    return math.fsum(values) / len(values) if values else None


def _num(value: float | None, fmt: str = ".3f", unit: str = "") -> str:
    return "-" if value is None else f"{value:{fmt}}{unit}"


def _cost_line(cost: Mapping[str, Any]) -> str:
    if cost["usd"] is None:
        return "- (no envelope carried CPU or memory figures; see docs/cli.md)"
    parts = [f"{k[:-4]} {_usd(cost[k])}" for k in ("cpu_usd", "memory_usd", "model_usd") if cost[k]]
    n, where = cost["rollouts"], "; ".join(filter(None, [", ".join(parts), "docs/cli.md"]))
    return f"{_usd(cost['usd'])} for {n} rollout{'s' * (n != 1)} ({where})"


def _group_line(data: Mapping[str, Any]) -> str:
    size, dropped = data["group_size"], data["groups_dropped"]
    drops = ", ".join(f"{n} {reason}" for reason, n in sorted(dropped.items()))
    dropped_text = f"{sum(dropped.values())} dropped" + (f" ({drops})" if drops else "")
    return (
        f"{data['groups_whole']} whole, {dropped_text} | pass@1 {_num(data['pass@1'])} | "
        f"pass@{size} {_num(data[f'pass@{size}'])} | "
        f"reward std {_num(data['reward_std_mean'])} | uniform {data['groups_uniform']}"
    )


def _usd(value: float) -> str:
    return f"${value:.6f}" if value >= 5e-7 else "< $0.000001"


def correct(rewards: Sequence[float], threshold: float | None = None) -> int:
    """How many rewards pass: above 0, or at least ``threshold`` when given."""
    return sum(1 for r in rewards if (r > 0 if threshold is None else r >= threshold))


def pass_at_k(rewards: Sequence[float], k: int, threshold: float | None = None) -> float:
    """The unbiased pass@k of one group's rewards (correct: see :func:`correct`)."""
    m = len(rewards)
    c = correct(rewards, threshold)
    k = min(k, m)
    if m - c < k:
        return 1.0
    return 1.0 - math.comb(m - c, k) / math.comb(m, k)


def group_figures(size: int, records: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The group figures of a run's group lines (``outcome`` done, else dropped for its
    ``reason``), as plain numbers (see the module docstring)."""
    dropped: Counter[str] = Counter()
    whole = uniform = 0
    pass1: list[float] = []
    passk: list[float] = []
    spreads: list[float] = []
    for record in records:
        if record.get("outcome") != "done":
            dropped[str(record.get("reason") or "failed")] += 1
            continue
        whole += 1
        rewards = [float(r) for r in record.get("rewards") or ()]
        if rewards:
            threshold = record.get("pass_threshold")
            pass1.append(correct(rewards, threshold) / len(rewards))
            passk.append(pass_at_k(rewards, size, threshold))
            mean = math.fsum(rewards) / len(rewards)
            spreads.append(math.sqrt(math.fsum((r - mean) ** 2 for r in rewards) / len(rewards)))
            uniform += len(set(rewards)) <= 1
    return {
        "group_size": size,
        "groups_whole": whole,
        "groups_dropped": dict(dropped),
        "pass@1": average(pass1),
        f"pass@{size}": average(passk),
        "reward_std_mean": average(spreads),
        "groups_uniform": uniform,
    }


@dataclass
class EvalRun:
    """What a finished (or interrupted) run reports beyond its files' figures."""

    wall_seconds: float = 0.0
    s3_requests: int = 0
    out: Path | None = None
    trajectories: Path | None = None  # the trajectories file, with a gateway
    resumed: int = 0  # inputs an earlier run had finished
    trajectories_missing: int = 0  # done rollouts whose trace an earlier run left unread
    groups: dict[str, Any] | None = None  # the demo's group phase, which writes no file
    ran: int | None = None  # rollouts this run finished (None: all the file has)


def render(s: Mapping[str, Any], run: EvalRun) -> str:
    """The summary of a run, its figures ``s`` read from its files, as a small aligned table."""
    total = s["done"] + s["failed"] + s["timeout"]
    wall = run.wall_seconds
    ran = total if run.ran is None else run.ran  # after --resume: this run's, in its time
    rewards = s["rewards"]
    mean = f"{s['mean_reward']:.3f} ({len(rewards)} finished)" if rewards else None
    rows = [
        ("rollouts", f"{total}"),
        ("  done", f"{s['done']}"),
        ("  failed", f"{s['failed']}"),
        ("  timed out", f"{s['timeout']}"),
    ]
    if s["failure_kinds"]:
        kinds = ", ".join(f"{n} {kind}" for kind, n in sorted(s["failure_kinds"].items()))
        rows.append(("  failures by kind", kinds))
    for kind, failure in sorted(s["failures"].items(), key=lambda item: -item[1]["count"]):
        reason = failure["reason"] and _short(failure["reason"])
        rows.append((f"    {kind}", f"{failure['count']}" + (f"  ({reason})" if reason else "")))
    if run.resumed:
        rows.append(("already in results (resumed)", f"{run.resumed}"))
    if s["reattached"]:
        rows.append(("re-attached in-flight rollouts", f"{s['reattached']}"))
    rows += [
        ("mean reward", mean or "- (no finished rollout with a reward)"),
        ("latency p50", _num(s["latency_p50"], ".2f", " s")),
        ("latency p95", _num(s["latency_p95"], ".2f", " s")),
        ("wall time", _num(wall, ".1f", " s")),
        ("throughput", _num(ran / wall if wall > 0 else None, ".1f", " rollouts/s")),
        ("S3 requests per rollout", _num(run.s3_requests / total if total else None, ".2f")),
    ]
    if s["trajectories"] or run.trajectories_missing:
        rows += [
            ("trajectories", f"{s['trajectories']}"),
            # Tokens the model server processed vs the training sequences' tokens.
            ("tokens per rollout, all calls", _num(s["tokens_per_rollout"], ".1f")),
            ("tokens per rollout, training", _num(s["segment_tokens_per_rollout"], ".1f")),
            ("segment merges / splits", f"{s['merges']} / {s['splits']}"),
        ]
    if run.trajectories_missing:
        rows.append(("done without a trace in S3", f"{run.trajectories_missing}"))
    groups = run.groups if run.groups is not None else s["groups"]
    if groups is not None:
        rows.append((f"groups of {groups['group_size']}", _group_line(groups)))
    if total:
        rows.append(("cost (estimate)", _cost_line(s["cost"])))
    width = max(len(label) for label, _ in rows)
    return "\n".join(f"{label:<{width}}  {value}" for label, value in rows)
