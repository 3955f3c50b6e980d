"""The end-of-run summary of ``demo`` and ``eval``, tallied as outcomes arrive.

A group member is correct when its reward is above 0; pass@k is the unbiased estimator
1 - C(m - c, k) / C(m, k) over a group's m kept members, c correct.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from agentcore_rl.cli import cost as _cost
from agentcore_rl.groups import result_reward as reward_of

if TYPE_CHECKING:
    from agentcore_rl.trajectory import Trajectory

__all__ = [
    "OUTCOMES",
    "GroupTally",
    "RunSummary",
    "outcome_of",
    "pass_at_k",
    "percentile",
    "reward_of",
]

#: The outcome kinds a rollout can end in, as written to the results file.
OUTCOMES: Final = ("done", "failed", "timeout")


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0-100) with linear interpolation; ``None`` if empty."""
    if not 0 <= q <= 100:
        raise ValueError(f"q must be between 0 and 100, got {q}")
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


#: How much of a failure's message the summary shows (the results file has all of it).
_REASON_CHARS: Final = 90


def _short(error: str) -> str:
    line = " ".join(error.split())
    return line if len(line) <= _REASON_CHARS else line[: _REASON_CHARS - 3] + "..."


def failure_of(record: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """A failure's kind and reason; the envelope's ``stop_reason`` tells apart failures the
    client reports alike."""
    error_type, error = record.get("error_type"), record.get("error")
    envelope = record.get("result")
    if isinstance(envelope, Mapping):
        reason = envelope.get("stop_reason")
        if isinstance(reason, str) and reason:
            cause = reason.split(":", 1)[0].strip()
            if cause.isidentifier():
                error_type = f"{error_type} ({cause})" if error_type else cause
            return error_type, reason
    return error_type, error


def outcome_of(line: Mapping[str, Any]) -> str:
    """A results line's outcome, a group member's (``succeeded``...) named as a rollout's."""
    outcome = str(line.get("outcome"))
    return {"succeeded": "done", "timed_out": "timeout"}.get(outcome, outcome)


def _mean(values: Sequence[float]) -> float | None:
    return math.fsum(values) / len(values) if values else None


def _num(value: float | None, fmt: str = ".3f", unit: str = "") -> str:
    return "-" if value is None else f"{value:{fmt}}{unit}"


def _cost_line(cost: Mapping[str, Any]) -> str:
    if cost["usd"] is None:
        return "- (no envelope carried CPU or memory figures; see docs/cli.md)"
    parts = [f"{k[:-4]} {_usd(cost[k])}" for k in ("cpu_usd", "memory_usd", "model_usd") if cost[k]]
    return f"{_usd(cost['usd'])} for {cost['rollouts']} rollouts ({', '.join(parts)}; docs/cli.md)"


def _usd(value: float) -> str:
    return f"${value:.6f}" if value >= 5e-7 else "< $0.000001"


def pass_at_k(rewards: Sequence[float], k: int) -> float:
    """The unbiased pass@k of one group's rewards (correct: reward > 0)."""
    m = len(rewards)
    c = sum(1 for r in rewards if r > 0)
    if m == 0:
        return 0.0
    k = min(k, m)
    if m - c < k:
        return 1.0
    return 1.0 - math.comb(m - c, k) / math.comb(m, k)


@dataclass
class GroupTally:
    """Running group figures of one run (see the module docstring)."""

    size: int
    whole: int = 0
    dropped: Counter[str] = field(default_factory=Counter)
    pass1: list[float] = field(default_factory=list)
    passk: list[float] = field(default_factory=list)
    spreads: list[float] = field(default_factory=list)
    uniform: int = 0

    def add_record(self, record: Mapping[str, Any]) -> None:
        """Count one group line of the results file (``outcome`` done or dropped)."""
        if record.get("outcome") != "done":
            self.dropped[str(record.get("reason") or "failed")] += 1
            return
        rewards = [float(r) for r in record.get("rewards") or ()]
        self.whole += 1
        if not rewards:
            return
        self.pass1.append(sum(1 for r in rewards if r > 0) / len(rewards))
        self.passk.append(pass_at_k(rewards, self.size))
        mean = math.fsum(rewards) / len(rewards)
        self.spreads.append(math.sqrt(math.fsum((r - mean) ** 2 for r in rewards) / len(rewards)))
        self.uniform += len(set(rewards)) <= 1

    def as_dict(self) -> dict[str, Any]:
        """The figures as plain numbers."""
        return {
            "group_size": self.size,
            "groups_whole": self.whole,
            "groups_dropped": dict(self.dropped),
            "pass@1": _mean(self.pass1),
            f"pass@{self.size}": _mean(self.passk),
            "reward_std_mean": _mean(self.spreads),
            "groups_uniform": self.uniform,
        }

    def line(self) -> str:
        """One line for the terminal."""
        num, data = _num, self.as_dict()
        drops = ", ".join(f"{n} {reason}" for reason, n in sorted(self.dropped.items()))
        dropped = f"{sum(self.dropped.values())} dropped" + (f" ({drops})" if drops else "")
        return (
            f"{self.whole} whole, {dropped} | pass@1 {num(data['pass@1'])} | "
            f"pass@{self.size} {num(data[f'pass@{self.size}'])} | "
            f"reward std {num(data['reward_std_mean'])} | uniform {self.uniform}"
        )


@dataclass
class RunSummary:
    """Running tallies of a run (``resumed``: outcomes an earlier run had written)."""

    counts: Counter[str] = field(default_factory=Counter)
    latencies: list[float] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    resumed: int = 0
    reattached: int = 0
    retried: int = 0
    trajectories: int = 0
    tokens_captured: list[int] = field(default_factory=list)
    merges: int = 0
    splits: int = 0
    trajectories_missing: int = 0
    groups: GroupTally | None = None
    errors: Counter[str] = field(default_factory=Counter)
    reasons: dict[str, str] = field(default_factory=dict)
    # Each outcome's cost estimate, and the tokens of each trajectory's training segments.
    costs: list[Mapping[str, Any]] = field(default_factory=list)
    segment_tokens: list[int] = field(default_factory=list)

    def add(
        self,
        outcome: str,
        *,
        elapsed: float | None,
        reward: float | None = None,
        error_type: str | None = None,
        error: str | None = None,
        cost: Mapping[str, Any] | None = None,
    ) -> None:
        """Record one outcome; the first ``error`` of each type is kept as its reason."""
        if outcome not in OUTCOMES:
            raise ValueError(f"unknown outcome {outcome!r}; expected one of {OUTCOMES}")
        self.counts[outcome] += 1
        if elapsed is not None:
            self.latencies.append(elapsed)
        if reward is not None:
            self.rewards.append(reward)
        if cost is not None:
            self.costs.append(cost)
        if outcome != "done":
            kind = error_type or ("RolloutTimeoutError" if outcome == "timeout" else "error")
            self.errors[kind] += 1
            if error and kind not in self.reasons:
                self.reasons[kind] = _short(error)

    def add_trajectory(self, trajectory: Trajectory, tokens_captured: int) -> None:
        """Count one written trajectory (its captured tokens, merges and splits)."""
        self.trajectories += 1
        self.tokens_captured.append(tokens_captured)
        self.segment_tokens.append(sum(len(s) for s in trajectory.segments))
        self.merges += trajectory.merges
        self.splits += trajectory.splits

    def replay(self, records: Iterable[Mapping[str, Any]]) -> None:
        """Tally a whole results file again (after ``--resume``: cover the whole run)."""
        self.counts, self.latencies, self.rewards, self.costs = Counter(), [], [], []
        self.errors, self.reasons = Counter(), {}
        for record in records:
            for line in record.get("members") or [record]:  # a group's members
                outcome = outcome_of(line)
                if outcome not in OUTCOMES:
                    continue
                error_type, error = failure_of(line)
                self.add(
                    outcome,
                    elapsed=line.get("elapsed"),
                    reward=line.get("reward"),
                    error_type=error_type,
                    error=error,
                    cost=line.get("cost"),
                )

    @property
    def total(self) -> int:
        """Outcomes recorded in this run."""
        return sum(self.counts.values())

    @property
    def mean_reward(self) -> float | None:
        """Mean of the rewards seen, ``None`` before the first."""
        return _mean(self.rewards)

    def as_dict(self, *, wall_seconds: float, s3_requests: int | None = None) -> dict[str, Any]:
        """The summary as plain numbers (for JSON output and tests)."""
        total = self.total
        return {
            "total": total,
            "done": self.counts["done"],
            "failed": self.counts["failed"],
            "timed_out": self.counts["timeout"],
            "resumed": self.resumed,
            "reattached": self.reattached,
            "retried": self.retried,
            "mean_reward": self.mean_reward,
            "latency_p50": percentile(self.latencies, 50),
            "latency_p95": percentile(self.latencies, 95),
            "wall_seconds": wall_seconds,
            "throughput": total / wall_seconds if wall_seconds > 0 else None,
            "s3_requests_per_rollout": (
                s3_requests / total if s3_requests is not None and total else None
            ),
            "trajectories": self.trajectories,
            "tokens_per_rollout": _mean(self.tokens_captured),
            "segment_tokens_per_rollout": _mean(self.segment_tokens),
            "cost": _cost.total(self.costs),
            "merges": self.merges,
            "splits": self.splits,
            "trajectories_missing": self.trajectories_missing,
            "groups": None if self.groups is None else self.groups.as_dict(),
            "errors": dict(self.errors),
        }

    def render(self, *, wall_seconds: float, s3_requests: int | None = None) -> str:
        """A small aligned table for the terminal."""
        data = self.as_dict(wall_seconds=wall_seconds, s3_requests=s3_requests)
        num, mean = _num, self.mean_reward
        reward = f"{mean:.3f} ({len(self.rewards)} finished)" if mean is not None else None
        rows = [
            ("rollouts", f"{data['total']}"),
            ("  done", f"{data['done']}"),
            ("  failed", f"{data['failed']}"),
            ("  timed out", f"{data['timed_out']}"),
        ]
        for kind, count in self.errors.most_common():
            reason = self.reasons.get(kind)
            rows.append((f"    {kind}", f"{count}" + (f"  ({reason})" if reason else "")))
        if self.resumed:
            rows.append(("already in results (resumed)", f"{self.resumed}"))
        if self.reattached:
            rows.append(("re-attached in-flight rollouts", f"{self.reattached}"))
        rows += [
            ("mean reward", reward or "- (no finished rollout with a reward)"),
            ("latency p50", num(data["latency_p50"], ".2f", " s")),
            ("latency p95", num(data["latency_p95"], ".2f", " s")),
            ("wall time", num(wall_seconds, ".1f", " s")),
            ("throughput", num(data["throughput"], ".1f", " rollouts/s")),
            ("S3 requests per rollout", num(data["s3_requests_per_rollout"], ".2f")),
        ]
        if self.trajectories or self.trajectories_missing:
            rows += [
                ("trajectories", f"{self.trajectories}"),
                # Tokens the model server processed vs the training sequences' tokens.
                ("tokens per rollout, all calls", num(data["tokens_per_rollout"], ".1f")),
                ("tokens per rollout, training", num(data["segment_tokens_per_rollout"], ".1f")),
                ("segment merges / splits", f"{self.merges} / {self.splits}"),
            ]
        if self.trajectories_missing:
            rows.append(("done without a trace in S3", f"{self.trajectories_missing}"))
        if self.groups is not None:
            rows.append((f"groups of {self.groups.size}", self.groups.line()))
        if self.costs:
            rows.append(("cost (estimate)", _cost_line(data["cost"])))
        width = max(len(label) for label, _ in rows)
        return "\n".join(f"{label:<{width}}  {value}" for label, value in rows)
