"""Token fidelity on real chat templates: proxy mode against linear history, per template.

For each template (real tokenizers and chat templates, built offline from llama.cpp's vocab
files and mistral-common's Tekken vocabulary: ``tests/gateway/template_fixtures.py``) the
stand-in policy serves the model (it renders the template as vLLM does and answers in the
template's own syntax: reasoning, tool calls, stop tokens). A tool-calling agent on the real
OpenAI SDK runs ``--turns`` turns (``--turns - 1`` tool calls, then the answer), keeping each
answer's content and tool calls but not its reasoning, as agents do. The gateway runs as its
own process (``agentcore-rl gateway``, proxy mode or ``--history linear``), so its CPU is
read from /proc.

Per template and mode (JSON on stdout):

- ``segments_per_rollout``: training sequences per rollout (``build_trajectory``);
- ``forks``: requests that did not extend the session's history (linear: rendered afresh;
  proxy: prompts that did not start with the previous prompt + completion);
- ``training_tokens_per_rollout``: the sum of the segments' lengths (what a trainer
  computes over);
- ``exact``: the share of calls whose prompt ids are what the server was fed and whose
  completion ids and logprobs are what it generated, and of trajectories whose every mask-1
  token is a served token with its logprob;
- ``gw_cpu_ms_per_call``: the gateway process's CPU per call (rendering included in linear),
  after one rollout that is not counted (first uses: the template's compilation); the two
  modes' rollouts run at the same time, so both gateways are read under the same load.

Targets: linear 1 segment per rollout where the history only grows; training tokens per
rollout <= 0.3x proxy mode's on the thinking templates at 10 turns; 100% exact in both; at
120 turns, linear's CPU per call <= 1.2x proxy mode's (and <= 2x its own at 10 turns).

Run: ``python benchmarks/templates.py [--templates qwen3,llama3.1] [--rollouts 4] [--turns 10]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script: make `benchmarks` and `tests` importable
    sys.path.insert(0, str(ROOT))

from agentcore_rl.local.background import BackgroundServer  # noqa: E402
from agentcore_rl.local.policy import ScriptedPolicy, Serving, TemplateVoice  # noqa: E402
from agentcore_rl.trace import SessionTrace, load_trace  # noqa: E402
from benchmarks.gateway import child, cpu_seconds, free_port, wait_ready  # noqa: E402
from tests.gateway.template_fixtures import FIXTURES, fixture_dir  # noqa: E402
from tests.gateway.template_rig import (  # noqa: E402
    agent,
    exactness,
    trained_tokens_exact,
    trajectory_of,
)

TOKEN = "bench-admin-token"


@contextlib.asynccontextmanager
async def started(
    name: str, history: str, a: argparse.Namespace, upstream: str
) -> AsyncIterator[tuple[str, int]]:
    """The gateway in ``history`` mode as its own process, warmed up: -> (url, pid)."""
    fixture = FIXTURES[name]
    port = free_port()
    argv = [sys.executable, "-m", "agentcore_rl.gateway", "--upstream", upstream + "/v1"]
    argv += ["--port", str(port), "--admin-token", TOKEN, "--history", history]
    if history == "linear":
        argv += ["--tokenizer", str(fixture_dir(name)), "--tool-call-parser", fixture.tool_parser]
        if fixture.reasoning_parser:
            argv += ["--reasoning-parser", fixture.reasoning_parser]
    url = f"http://127.0.0.1:{port}"
    with child(argv) as gw:
        await wait_ready(f"{url}/health", limit=600)  # importing transformers on a busy machine
        await rollout(url, f"{name}-{history}-warm-up", False, a)  # first uses, not counted
        yield url, gw.pid


async def rollout(url: str, sid: str, stream: bool, a: argparse.Namespace) -> None:
    from openai import AsyncOpenAI

    async with AsyncOpenAI(base_url=f"{url}/sessions/{sid}/v1", api_key="x", max_retries=0) as llm:
        await agent(llm, stream=stream, max_turns=a.turns + 2)


async def finished(url: str, sids: list[str], policy: ScriptedPolicy) -> dict[str, Any]:
    """The traces' figures (see the module doc)."""
    traces: list[SessionTrace] = []
    headers = {"X-Admin-Token": TOKEN}
    async with httpx.AsyncClient(base_url=url, timeout=60, headers=headers) as http:
        for sid in sids:
            reply = await http.post(f"/admin/sessions/{sid}/finish")
            reply.raise_for_status()
            traces.append(load_trace(reply.content))
    calls = sum(len(t.records) for t in traces)
    exact_calls = 0
    exact_trajectories = 0
    segments = tokens = forks = 0
    for trace in traces:
        good, _ = exactness(trace, policy)
        exact_calls += good
        trajectory = trajectory_of(trace)
        exact_trajectories += trained_tokens_exact(trajectory, trace)
        segments += len(trajectory.segments)
        forks += trajectory.splits
        tokens += sum(len(s) for s in trajectory.segments)
    n = len(traces)
    return {
        "rollouts": n,
        "calls_per_rollout": calls / n,
        "segments_per_rollout": segments / n,
        "forks": forks,
        "training_tokens_per_rollout": round(tokens / n, 1),
        "exact_calls": f"{exact_calls}/{calls}",
        "exact_trajectories": f"{exact_trajectories}/{n}",
        "exact": exact_calls == calls and exact_trajectories == n,
    }


async def run_template(name: str, a: argparse.Namespace) -> dict[str, Any]:
    fixture = FIXTURES[name]
    policy = ScriptedPolicy(
        TemplateVoice(
            str(fixture_dir(name)),
            tool_call_parser=fixture.tool_parser,
            reasoning_parser=fixture.reasoning_parser,
            tool_rounds=a.turns - 1,
        ),
        serving=Serving(token_ids="requested", keep_answers=1_000_000),
    )
    out: dict[str, Any] = {
        "template": fixture.template,
        "tool_call_parser": fixture.tool_parser,
        "reasoning_parser": fixture.reasoning_parser,
        "thinking": fixture.thinking,
    }
    modes = ("proxy", "linear")
    async with BackgroundServer(policy) as upstream, contextlib.AsyncExitStack() as stack:
        gateways = [
            await stack.enter_async_context(started(name, m, a, upstream.url)) for m in modes
        ]
        # both modes' rollouts at once: each gateway's CPU is read over the same minutes
        cpu0 = [cpu_seconds(pid) for _, pid in gateways]
        for start in range(0, a.rollouts, a.concurrency):
            batch = range(start, min(a.rollouts, start + a.concurrency))
            await asyncio.gather(
                *(
                    rollout(url, f"{name}-{mode}-{i}", i % 2 == 1, a)
                    for i in batch
                    for mode, (url, _) in zip(modes, gateways, strict=True)
                )
            )
        cpu = [cpu_seconds(pid) - c for (_, pid), c in zip(gateways, cpu0, strict=True)]
        for mode, (url, _), seconds in zip(modes, gateways, cpu, strict=True):
            sids = [f"{name}-{mode}-{i}" for i in range(a.rollouts)]
            out[mode] = figures = await finished(url, sids, policy)
            calls = figures["calls_per_rollout"] * figures["rollouts"]
            figures["gw_cpu_ms_per_call"] = round(seconds * 1000 / max(1, calls), 2)
    proxy, linear = out["proxy"], out["linear"]
    out["tokens_linear_over_proxy"] = round(
        linear["training_tokens_per_rollout"] / proxy["training_tokens_per_rollout"], 3
    )
    out["cpu_linear_over_proxy"] = round(
        linear["gw_cpu_ms_per_call"] / max(proxy["gw_cpu_ms_per_call"], 1e-9), 2
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--templates", default=",".join(FIXTURES))
    parser.add_argument("--rollouts", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--turns", type=int, default=10)
    a = parser.parse_args()
    names = [n for n in a.templates.split(",") if n]
    for name in names:
        if name not in FIXTURES:
            parser.error(f"unknown template {name!r}; choose from {sorted(FIXTURES)}")
    results = {}
    for name in names:
        results[name] = asyncio.run(run_template(name, a))
    targets = {
        "linear_one_segment": all(
            r["linear"]["segments_per_rollout"] == 1 for r in results.values()
        ),
        "thinking_tokens_at_most_0.3x": all(
            r["tokens_linear_over_proxy"] <= 0.3 for r in results.values() if r["thinking"]
        ),
        "all_exact": all(r["proxy"]["exact"] and r["linear"]["exact"] for r in results.values()),
        "linear_cpu_at_most_1.2x_proxy": all(
            r["cpu_linear_over_proxy"] <= 1.2 for r in results.values()
        ),
    }
    json.dump(
        {"turns": a.turns, "load": os.getloadavg(), "results": results, "targets": targets},
        sys.stdout,
        indent=1,
    )
    print()


if __name__ == "__main__":
    main()
