"""``agentcore-rl report``: a finished run as ONE self-contained HTML file that opens
offline (clusters without internet), so charts are inline SVG drawn at build time."""

from __future__ import annotations

import io
import json
from collections import defaultdict
from collections.abc import Sequence
from itertools import accumulate
from pathlib import Path
from typing import Any, Final

from agentcore_rl.cli.cost import Prices
from agentcore_rl.cli.show import Rollout, RunData, load_run, token_runs

__all__ = ["build_report"]

_PALETTE: Final = ("#1f6feb", "#d97706")


def _svg(figure: Any) -> str:
    buffer = io.StringIO()
    figure.savefig(buffer, format="svg", bbox_inches="tight")
    text = buffer.getvalue()
    return text[text.index("<svg") :]  # inline: no XML prolog or doctype


def _charts(views: Sequence[dict[str, Any]]) -> list[tuple[str, str]]:
    # lazy: the report extra; Agg draws without a display
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    matplotlib.rcParams.update({"svg.fonttype": "none", "font.size": 9, "svg.hashsalt": "r"})
    charts: list[tuple[str, str]] = []

    def chart(title: str, xlabel: str, ylabel: str, draw: Any) -> None:
        figure = Figure(figsize=(5.2, 2.6))
        axes = figure.add_subplot()
        for number, view in enumerate(views):
            draw(axes, view["s"], dict(color=_PALETTE[number % 2], label=view["name"]))
        axes.set(xlabel=xlabel, ylabel=ylabel)
        if len(views) > 1 and axes.get_legend_handles_labels()[0]:
            axes.legend()
        charts.append((title, _svg(figure)))

    def hist(key: str) -> Any:
        def draw(ax: Any, s: dict[str, Any], style: dict[str, Any]) -> None:
            if s[key]:
                ax.hist(s[key], bins=20, alpha=0.6, **style)
            else:
                ax.text(0.5, 0.5, "not measured", ha="center", transform=ax.transAxes)

        return draw

    def over_time(ax: Any, s: dict[str, Any], style: dict[str, Any]) -> None:
        spans = s["spans"]
        t0 = min((a for a, _ in spans), default=0.0)
        events = sorted([(a - t0, 1) for a, _ in spans] + [(b - t0, -1) for _, b in spans])
        xs, ys = [0.0] + [t for t, _ in events], [0, *accumulate(e for _, e in events)]
        ax.step(xs, ys, where="post", **style)
        ends = sorted(b - t0 for _, b in spans)
        ax.plot(ends, range(1, len(ends) + 1), linestyle=":", color=style["color"])

    chart("Reward", "reward", "rollouts", hist("rewards"))
    chart("Latency", "seconds (whole input, retries included)", "inputs", hist("latencies"))
    title = "Concurrency (line) and rollouts finished (dotted) over time"
    chart(title, "seconds", "rollouts", over_time)
    chart("Cost per rollout (estimate)", "micro-USD", "rollouts", hist("costs"))
    return charts


def _num(v: float | None, d: int) -> str:
    return "-" if v is None else f"{v:.{d}f}"


def _usd(v: float | None) -> str:
    return "-" if v is None else f"${v:.4f}" if v >= 0.01 else f"{v * 1e6:.3g} µUSD"


def _texts(rollouts: Sequence[Rollout], tokenizer: str | None) -> dict[int, str]:
    """Each token id's text, once for the whole page: the trace's own texts (a segment's
    ``tokens``), else the tokenizer's, decoded one by one; none: the page shows ids."""
    segments = [s for r in rollouts for s in r.segments]
    texts = {
        t: x for s in segments for t, x in zip(s["token_ids"], s.get("tokens") or (), strict=False)
    }
    if tokenizer is not None:
        # lazy: the render extra
        from transformers import AutoTokenizer

        decoder = AutoTokenizer.from_pretrained(tokenizer)
        ids = {t for s in segments for t in s["token_ids"]} - texts.keys()
        texts.update((t, decoder.decode([t])) for t in ids)
    return texts


def _message(m: dict[str, Any]) -> list[Any]:
    content, fns = (
        m.get("content") or "",
        [c.get("function") or {} for c in m.get("tool_calls") or []],
    )
    text = content if isinstance(content, str) else json.dumps(content)
    return [m.get("role"), text, [f"{f.get('name')}({f.get('arguments', '')})" for f in fns]]


def _page(r: Rollout) -> dict[str, Any]:
    """What a rollout's page shows, as data its script renders (escaped by textContent)."""
    segments = []
    for number, seg in enumerate(r.segments, 1):
        runs, adv = token_runs(seg), seg.get("advantage")
        versions = sorted({v for part in runs for v in part["versions"]})
        head = f"segment {number} of {len(r.segments)}: {len(seg['token_ids'])} tokens, "
        head += f"{sum(seg.get('loss_mask') or [])} generated (loss mask 1)"
        head += f", calls {', '.join(map(str, seg['calls']))}" if seg.get("calls") else ""
        head += f", advantage {adv:.3f}" if isinstance(adv, int | float) else ""
        head += f", policy versions {', '.join(map(str, versions))}" if versions else ""
        parts = [
            [1, [[t, round(lp, 4), v] for t, lp, v in part["tokens"]]] if part["mask"] else
            [0, part["ids"]] for part in runs
        ]  # fmt: skip
        segments.append({"head": head, "runs": parts})
    kind, reason = r.failure
    cost = defaultdict(lambda: "-", {k: v for k, v in r.cost.items() if v is not None})
    return {
        "key": r.key,
        "outcome": r.outcome,
        "head": f"reward {_num(r.reward, 3)} · {_num(r.elapsed, 2)} s · session {r.session_id}"
        f" · cost (estimate) {_usd(r.cost.get('usd'))}: "
        + "runtime {runtime_s} s, CPU {cpu_s} s, peak memory {peak_memory_gb} GB, "
        "tokens {prompt_tokens} in / {completion_tokens} out".format_map(cost),
        "failure": f"{kind}: {reason}" if kind else "",
        "messages": [_message(m) for m in r.messages if isinstance(m, dict)],
        "segments": segments,
        "traceback": r.traceback or "",
        "envelope": json.loads(r.envelope_text),  # the script indents it: a smaller page
    }


def _metrics(run: RunData) -> dict[str, float]:
    """The mean of each number (or flag) the agents returned in ``metrics``, over the done
    rollouts that have it; a rollout's own values are in its envelope."""
    values: dict[str, list[float]] = {}
    for r in run.rollouts:
        found = (r.envelope or {}).get("metrics") if r.outcome == "done" else None
        for name, value in found.items() if isinstance(found, dict) else ():
            if isinstance(value, int | float):
                values.setdefault(str(name), []).append(float(value))
    return {name: sum(v) / len(v) for name, v in sorted(values.items())}


def _groups(run: RunData) -> list[dict[str, Any]]:
    """A group run's prompts: rewards, pass@1 / pass@k, uniform, why dropped."""
    return [
        {
            **record,
            "uniform": len(set(record.get("rewards") or ())) == 1,
            "k": record.get("n") or len(record.get("rewards") or ()),
        }
        for record in run.records
        if isinstance(record.get("members"), list)
    ]


def _view(run: RunData) -> dict[str, Any]:
    # The experiment id names the run (every envelope carries it); else the file's name.
    exp_ids = (r.envelope.get("exp_id") for r in run.rollouts if r.envelope)
    name = next((e for e in exp_ids if isinstance(e, str) and e), run.path.stem)
    return {
        "name": name,
        "path": run.path,
        "s": run.summary(),
        "rollouts": run.rollouts,
        "metrics": _metrics(run),
        "groups": _groups(run),
    }


def _by_input(run: RunData) -> dict[str, float | None]:
    """Each input's mean reward (over a group's members; a failure counts as none)."""
    rewards: dict[str, list[float]] = {}
    for r in run.rollouts:
        rewards.setdefault(r.input_id, [])
        if r.reward is not None and r.outcome == "done":
            rewards[r.input_id].append(r.reward)
    return {k: sum(v) / len(v) if v else None for k, v in rewards.items()}


def build_report(
    path: Path,
    *,
    compare: Path | None = None,
    prices: Prices | None = None,
    tokenizer: str | None = None,
) -> str:
    """The report of the run in ``path`` (and ``compare``, side by side) as HTML text;
    ``tokenizer``, a Hugging Face tokenizer directory, shows token ids as text."""
    # lazy: the report extra
    import jinja2

    runs = [load_run(path, prices)] + ([load_run(compare, prices)] if compare else [])
    views = [_view(run) for run in runs]
    if len(views) > 1 and views[0]["name"] == views[1]["name"]:
        views[1]["name"] += " (compared)"
    rows = []
    if compare:
        a, b = (_by_input(run) for run in runs)
        for input_id in sorted(a.keys() | b.keys()):
            x, y = a.get(input_id), b.get(input_id)
            diff = None if x is None or y is None else y - x
            rows.append({"input_id": input_id, "a": x, "b": y, "d": diff})
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("agentcore_rl.cli", "templates"),
        autoescape=True,
        trim_blocks=True,
    )
    env.policies["json.dumps_kwargs"] = {"separators": (",", ":")}  # tojson escapes < > &
    env.globals.update(num=_num, usd=_usd)
    return env.get_template("report.html.j2").render(
        run=views[0],
        other=views[1] if compare else None,
        charts=_charts(views),
        compare=rows,
        prices=(prices or Prices()).describe(),
        data={
            "texts": _texts(views[0]["rollouts"], tokenizer),
            "pages": [_page(r) for r in views[0]["rollouts"]],
        },
    )
