"""A finished run read back from its files, one :class:`Rollout` per rollout, and
``agentcore-rl show`` printing one of them (docs/cli.md)."""

from __future__ import annotations

import json
import math
import statistics
import textwrap
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from itertools import groupby
from pathlib import Path
from typing import Any, Final

from agentcore_rl.cli.cost import Prices, number, price, total, usage_of
from agentcore_rl.cli.journal import iter_lines, rows_path_for, trajectories_path_for
from agentcore_rl.cli.summary import average, failure_of, group_figures, outcome_of, percentile
from agentcore_rl.errors import ConfigurationError

__all__ = ["Rollout", "RunData", "load_run", "render", "token_runs", "write_example"]

_APART: Final = ("messages", "traceback")


@dataclass
class Rollout:
    """One rollout of a run: ``key`` is its input id (``ID#member`` in a group)."""

    key: str
    input_id: str
    outcome: str
    reward: float | None
    elapsed: float | None
    session_id: str | None
    record: Mapping[str, Any]
    envelope: Mapping[str, Any] | None
    segments: list[dict[str, Any]] = field(default_factory=list)
    tokens: Mapping[str, Any] = field(default_factory=dict)
    cost: dict[str, Any] = field(default_factory=dict)

    @property
    def messages(self) -> list[Any]:
        """The transcript: the envelope's ``messages``, else the last model call's."""
        for source in (self.envelope, self.tokens):
            found = (source or {}).get("messages")
            if isinstance(found, list):
                return found
        return []

    @property
    def failure(self) -> tuple[str | None, str | None]:
        """Its error type and reason (``None, None`` for a success)."""
        return (None, None) if self.outcome == "done" else failure_of(self.record)

    @property
    def envelope_text(self) -> str:
        """The envelope as indented JSON, less what is shown apart (transcript, traceback)."""
        shown = {k: v for k, v in (self.envelope or {}).items() if k not in _APART}
        return json.dumps(shown, indent=2, default=str)

    @property
    def traceback(self) -> str | None:
        """The agent's traceback, when it wrote one."""
        found = (self.envelope or {}).get("traceback")
        return found if isinstance(found, str) else None


def _span(rollout: Rollout) -> tuple[float, float] | None:
    """When a rollout ran: as the client saw it, else as its envelope says."""
    record, envelope = rollout.record, rollout.envelope or {}
    end, elapsed = number(record.get("ended_at")), number(record.get("elapsed"))
    if end is not None and elapsed is not None:
        return end - elapsed, end
    start, end = number(envelope.get("started_at")), number(envelope.get("finished_at"))
    return None if start is None or end is None else (start, end)


def _row_segment(row: Mapping[str, Any]) -> dict[str, Any]:
    """A training row as a segment: its prompt (mask 0), then its response."""
    n, mask = len(row.get("prompt_ids") or []), list(row.get("loss_mask") or [])
    segment = {"token_ids": list(row.get("prompt_ids") or []) + list(row.get("response_ids") or [])}
    for key, pad in (("loss_mask", 0), ("logprobs", 0.0), ("policy_versions", -1)):
        segment[key] = [pad] * n + list(row.get(key) or [])
    versions = row.get("policy_versions") or []
    if len(versions) == 1 and len(mask) > 1:  # one version for the row's generated tokens
        segment["policy_versions"] = [-1] * n + [versions[0] if m else -1 for m in mask]
    return {**segment, "advantage": row.get("advantage")}


@dataclass
class RunData:
    """A run's rollouts and the raw lines; :meth:`summary` has the figures."""

    path: Path
    records: list[dict[str, Any]]
    rollouts: list[Rollout]
    group_size: int | None = None

    def find(self, key: str) -> Rollout:
        """The rollout ``key`` names (an input id, ``ID#member`` or a session id)."""
        for found in [r for r in self.rollouts if key in (r.key, r.session_id, r.input_id)]:
            return found
        known = ", ".join(r.key for r in self.rollouts[:5])
        raise ConfigurationError(f"{self.path} has no rollout {key!r} (it has e.g. {known})")

    def summary(self) -> dict[str, Any]:
        """The run's figures, every one from the files."""
        rollouts = self.rollouts
        rewards = [r.reward for r in rollouts if r.outcome == "done" and r.reward is not None]
        # 95 % confidence, normal approximation
        half = 1.96 * statistics.stdev(rewards) / len(rewards) ** 0.5 if len(rewards) > 1 else None
        latencies = [v for r in self.records if (v := number(r.get("elapsed"))) is not None]
        spans = [span for span in (_span(r) for r in rollouts) if span is not None]
        wall = max(b for _, b in spans) - min(a for a, _ in spans) if spans else None
        failures: dict[str, dict[str, Any]] = {}  # by cause: a count and the first example
        for r in (r for r in rollouts if r.outcome in ("failed", "timeout")):
            kind, reason = r.failure
            kind = kind or ("RolloutTimeoutError" if r.outcome == "timeout" else "error")
            first = {"count": 0, "reason": reason, "traceback": r.traceback}
            failures.setdefault(kind, first)["count"] += 1
        kinds = Counter(
            str(r.record.get("failure_kind") or r.outcome)
            for r in rollouts
            if r.outcome in ("failed", "timeout")
        )
        traced = [r.tokens for r in rollouts if r.tokens]  # the trajectories file's lines
        counts = {k: sum(r.outcome == k for r in rollouts) for k in ("done", "failed", "timeout")}
        return {
            "rollouts": len(rollouts),
            **counts,
            "mean_reward": average(rewards),
            "reward_ci95": half,
            "latency_p50": percentile(latencies, 50),
            "latency_p95": percentile(latencies, 95),
            "latency_max": max(latencies) if latencies else None,
            "wall_seconds": wall,
            "throughput": len(spans) / wall if wall else None,
            "retries": sum(max(0, int(r.get("attempts") or 1) - 1) for r in self.records),
            "lost": sum(int(r.get("losses") or 0) for r in self.records),
            "reattached": sum(bool(r.get("reattached")) for r in self.records),
            "failures": failures,
            "failure_kinds": dict(kinds),
            "groups": group_figures(self.group_size, self.records) if self.group_size else None,
            "cost": total(r.cost for r in rollouts),
            "trajectories": len(traced),
            # Tokens the model server processed vs the training sequences' tokens.
            "tokens_per_rollout": average([t.get("tokens_captured") or 0 for t in traced]),
            "segment_tokens_per_rollout": average(
                [
                    sum(len(s.get("token_ids") or ()) for s in t.get("segments") or ())
                    for t in traced
                ]
            ),
            "merges": sum(int(t.get("merges") or 0) for t in traced),
            "splits": sum(int(t.get("splits") or 0) for t in traced),
            "spans": spans,  # what the charts draw
            "rewards": rewards,
            "latencies": latencies,
            "costs": [r.cost["usd"] * 1e6 for r in rollouts if r.cost.get("usd") is not None],
        }


def _index(path: Path, key: str) -> dict[str, list[dict[str, Any]]]:
    found: dict[str, list[dict[str, Any]]] = {}
    if path.exists():
        for line in iter_lines(path):
            found.setdefault(str(line.get(key)), []).append(line)
    return found


def load_run(path: Path, prices: Prices | None = None, *, partial: bool = False) -> RunData:
    """Read a results file and the files beside it (costs re-priced at ``prices`` if given);
    ``partial``: a run interrupted before its first line is an empty one."""
    if not path.is_file() and not partial:
        raise ConfigurationError(f"no results file at {path}")
    records = list(iter_lines(path)) if path.is_file() else []
    if not records and not partial:
        raise ConfigurationError(f"{path} has no results lines")
    trajectories = _index(trajectories_path_for(path), "session_id")
    rows = _index(rows_path_for(path), "session_id")
    rollouts: list[Rollout] = []
    group_size = None
    for record in records:
        members = record.get("members")
        if isinstance(members, list):  # a group line: one rollout per member
            group_size = group_size or int(record.get("n") or len(members) or 1)
            items = [
                (f"{record['input_id']}#{m.get('index')}", m, m.get("result"))
                for m in members + list(record.get("discarded") or [])
            ]
        else:
            items = [(str(record.get("input_id")), record, record.get("result"))]
        for key, line, envelope in items:
            sid = line.get("session_id")
            tokens = (trajectories.get(str(sid)) or [{}])[0]
            segments = list(tokens.get("segments") or []) or [
                _row_segment(row) for row in rows.get(str(sid), [])
            ]
            rollout = Rollout(
                key=key,
                input_id=str(record.get("input_id")),
                outcome=outcome_of(line),
                reward=line.get("reward"),
                elapsed=line.get("elapsed"),
                session_id=sid if isinstance(sid, str) else None,
                record=line,
                envelope=envelope if isinstance(envelope, Mapping) else None,
                segments=segments,
                tokens=tokens,
            )
            if prices is None and isinstance(line.get("cost"), dict):
                rollout.cost = line["cost"]  # as the run priced it
            else:
                usage = usage_of({"result": rollout.envelope}, tokens)
                rollout.cost = price(usage, prices or Prices())
            rollouts.append(rollout)
    return RunData(path, records, rollouts, group_size)


_IDS_SHOWN: Final = 16
_CODES: Final = {"head": "1", "generated": "32", "prompt": "2", "error": "31", "role": "36"}


def _text(message: Any) -> str:
    content = message.get("content") if isinstance(message, dict) else message
    if isinstance(content, list):  # content parts
        content = " ".join(str(p.get("text", p) if isinstance(p, dict) else p) for p in content)
    lines = [] if content in (None, "") else [str(content)]
    for call in (message.get("tool_calls") or []) if isinstance(message, dict) else []:
        fn = call.get("function") or {}
        lines.append(f"-> {fn.get('name')}({fn.get('arguments', '')})")
    return "\n".join(lines)


def token_runs(segment: dict[str, Any]) -> list[dict[str, Any]]:
    """The segment's tokens grouped into runs of one loss mask."""
    ids = segment.get("token_ids") or []
    columns = [
        list(segment.get(key) or []) + [pad] * len(ids)  # a short column reads as padding
        for key, pad in (("loss_mask", 0), ("logprobs", 0.0), ("policy_versions", -1))
    ]
    rows = zip(ids, *columns, strict=False)
    out = []
    for mask, run in groupby(rows, lambda row: row[1]):
        tokens = [(t, lp, v) for t, _, lp, v in run]
        out.append(
            {
                "mask": mask,
                "tokens": tokens,
                "ids": [t for t, _, _ in tokens],
                "logprob": math.fsum(lp for _, lp, _ in tokens) / len(tokens) if mask else None,
                "versions": sorted({v for _, _, v in tokens if v >= 0}),
            }
        )
    return out


def render(rollout: Rollout, *, color: bool) -> str:
    """The rollout as terminal text."""

    def paint(kind: str, text: str) -> str:
        return f"\x1b[{_CODES[kind]}m{text}\x1b[0m" if color else text

    reward = "-" if rollout.reward is None else f"{rollout.reward:g}"
    seconds = rollout.elapsed if rollout.elapsed is not None else rollout.cost.get("runtime_s")
    elapsed = "-" if seconds is None else f"{seconds:.2f} s"
    lines = [
        paint("head", f"{rollout.key}  {rollout.outcome}  reward {reward}  {elapsed}"),
        f"session {rollout.session_id}",
    ]
    cost = {k: "-" if v is None else v for k, v in rollout.cost.items()}  # -: not measured
    usd = cost.get("usd", "-") if cost.get("usd", "-") == "-" else f"${cost['usd']:.6f}"
    lines.append(
        f"cost (estimate) {usd}: runtime {cost.get('runtime_s', '-')} s, CPU "
        f"{cost.get('cpu_s', '-')} s, peak memory {cost.get('peak_memory_gb', '-')} GB, tokens "
        f"{cost.get('prompt_tokens', '-')} in / {cost.get('completion_tokens', '-')} out"
    )
    kind, reason = rollout.failure
    if kind is not None or reason is not None:
        lines.append(paint("error", f"error: {kind}: {reason}"))
    lines += ["", paint("head", "transcript")]
    for message in rollout.messages or [{"role": "(none)", "content": "no transcript recorded"}]:
        role = message.get("role", "?") if isinstance(message, dict) else "?"
        body = textwrap.indent(_text(message) or "(empty)", "    ")
        lines.append(f"  {paint('role', f'[{role}]')}\n{body}")
    for position, segment in enumerate(rollout.segments, 1):
        mask = segment.get("loss_mask") or []
        head = f"tokens: segment {position} of {len(rollout.segments)}: {len(mask)} tokens, "
        lines += ["", paint("head", head + f"{sum(mask)} generated (loss mask 1)")]
        for run in token_runs(segment):
            shown = " ".join(map(str, run["ids"][:_IDS_SHOWN]))
            more = f" ... (+{len(run['ids']) - _IDS_SHOWN})" if len(run["ids"]) > _IDS_SHOWN else ""
            extra = "" if run["logprob"] is None else f"  mean logprob {run['logprob']:.3f}"
            extra += f"  policy v{','.join(map(str, run['versions']))}" if run["versions"] else ""
            label = "# generated" if run["mask"] else ". prompt"
            kind = "generated" if run["mask"] else "prompt"
            lines.append(paint(kind, f"  {label:<11} {len(run['ids']):>5}  {shown}{more}{extra}"))
    if not rollout.segments:
        lines += ["", "tokens: none captured (run through a gateway to capture them)"]
    if rollout.traceback:
        lines += ["", paint("head", "traceback"), rollout.traceback.rstrip()]
    lines += ["", paint("head", "envelope"), rollout.envelope_text]
    return "\n".join(lines)


def write_example(run: RunData) -> Path | None:
    """Write a typical rollout (the first done one using a tool) to ``NAME.example.txt``."""
    done = [r for r in run.rollouts if r.outcome == "done"]
    if not done:
        return None
    tool = next(
        (r for r in done for m in r.messages if isinstance(m, dict) and m.get("role") == "tool"),
        None,
    )
    path = run.path.with_name(run.path.name.removesuffix(".jsonl") + ".example.txt")
    path.write_text(render(tool or done[0], color=False) + "\n", encoding="utf-8")
    return path
