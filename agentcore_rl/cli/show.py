"""``agentcore-rl show RESULTS.jsonl INPUT_ID``: one rollout in the terminal.

Its outcome, reward, time and cost, the transcript as the agent saw it (messages, tool calls,
tool results), the tokens as the trainer will see them (each segment in runs of one loss mask:
prompt and tool tokens ``.``, generated ``#``, with mean logprob and policy versions) and a
failure's traceback. Colour only on a terminal and without ``NO_COLOR``.

Example::

    print(render(load_run(Path("results.jsonl")).find("math-0005"), color=False))
"""

from __future__ import annotations

import math
import textwrap
from itertools import groupby
from pathlib import Path
from typing import Any, Final

from agentcore_rl.cli.runfile import Rollout, load_run
from agentcore_rl.errors import ConfigurationError

__all__ = ["render", "token_runs", "write_example"]

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
    """Each run of one loss mask: ``mask``, ``tokens`` (id, logprob, policy version), ``ids``,
    mean ``logprob`` (generated runs) and policy ``versions``."""
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
    for number, segment in enumerate(rollout.segments, 1):
        mask = segment.get("loss_mask") or []
        head = f"tokens: segment {number} of {len(rollout.segments)}: {len(mask)} tokens, "
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


def write_example(out: Path) -> Path | None:
    """Write a typical rollout of the run in ``out`` for a person to read, as ``show`` prints
    it, to ``NAME.example.txt``: the first that finished having used a tool (most do), else
    the first that finished. ``None`` when none finished."""
    try:
        done = [r for r in load_run(out).rollouts if r.outcome == "done"]
    except ConfigurationError:  # no lines yet (an early Ctrl-C)
        return None
    if not done:
        return None
    tool = next(
        (r for r in done for m in r.messages if isinstance(m, dict) and m.get("role") == "tool"),
        None,
    )
    path = out.with_name(out.name.removesuffix(".jsonl") + ".example.txt")
    path.write_text(render(tool or done[0], color=False) + "\n", encoding="utf-8")
    return path
