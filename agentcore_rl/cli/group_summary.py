"""Group figures for the eval and demo summaries: pass@1, pass@k, spread, drops.

A member counts as correct when its reward is above 0. pass@1 is the mean over whole groups
of the share of correct members; pass@k (k = the group size) the unbiased estimator
1 - C(m - c, k) / C(m, k) over a group's m kept members of which c are correct (with m = k,
1 when any member is correct). Dropped groups are counted by reason, not scored.

Example::

    tally = GroupTally(size=8)
    tally.add_record({"outcome": "done", "rewards": [1.0, 0.0, 0.0, 1.0]})
    print(tally.line())   # "1 whole, 0 dropped | pass@1 0.500 | pass@8 1.000 | ..."
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["GroupTally", "pass_at_k"]


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

        def mean(values: list[float]) -> float | None:
            return math.fsum(values) / len(values) if values else None

        return {
            "group_size": self.size,
            "groups_whole": self.whole,
            "groups_dropped": dict(self.dropped),
            "pass@1": mean(self.pass1),
            f"pass@{self.size}": mean(self.passk),
            "reward_std_mean": mean(self.spreads),
            "groups_uniform": self.uniform,
        }

    def line(self) -> str:
        """One line for the terminal."""
        data = self.as_dict()

        def num(value: float | None) -> str:
            return "-" if value is None else f"{value:.3f}"

        drops = ", ".join(f"{n} {reason}" for reason, n in sorted(self.dropped.items()))
        dropped = f"{sum(self.dropped.values())} dropped" + (f" ({drops})" if drops else "")
        return (
            f"{self.whole} whole, {dropped} | pass@1 {num(data['pass@1'])} | "
            f"pass@{self.size} {num(data[f'pass@{self.size}'])} | "
            f"reward std {num(data['reward_std_mean'])} | uniform {self.uniform}"
        )
