"""Benchmark weight updates under load: ``paused("hold")`` against ``paused("suspend")``.

``--sessions`` agent sessions (the OpenAI SDK, through the gateway in linear mode) ask, one
after another, for long completions on the stand-in policy (a real Qwen2.5 tokenizer, paced at
``--token-rate`` tokens per second per request; lengths drawn from a long tail between
``--min-tokens`` and ``--max-tokens``), while a trainer loop pauses the gateway every
``--every`` seconds, "pushes" weights for ``--push`` seconds (``/update_weight_version`` on
the stand-in, then a wait), sets the next policy version and resumes. Both modes run in one
process, one after the other, on the same workload, after a run without updates. One JSON
document:

- ``pause_to_push_s``: p50/p99/max time from the pause's start to "safe to push" (the pause
  returned): the longest generation in flight under ``hold``, the upstream's pause under
  ``suspend`` (target <= 0.1 s whatever the generation length);
- ``lost_per_update_s``: generation time lost per update, per session: the tokens the first
  ``--duration`` seconds made fewer than the same workload without updates (``none``, run
  first in the same process), at that run's token rate, over the updates and the sessions;
- ``tokens_discarded``: tokens the stand-in made that no record holds (target 0);
- ``agent_errors``: calls that failed at the agent (target 0), and ``agent_error_kinds`` what
  they saw;
- ``exact``: ``share``, the share of recorded tokens whose version is the version of the
  weights that sampled them (``unknown``: the share recorded as unknown, -1), and
  ``mismatched``, records whose ids or versions differ from what the upstream made;
- ``straddled_calls``: calls an update came in the middle of.

``--history proxy`` serves the calls in proxy mode instead, ``--stream`` streams them.
``--vllm URL`` runs the same, small (``--sessions 4``), against a real vLLM started with
``VLLM_SERVER_DEV_MODE=1`` and ``--enable-scale-out`` serving the model in ``--model-dir`` (its
tokenizer renders); there the truth is vLLM's: ``tokens_discarded`` from its
``vllm:generation_tokens_total``, and with ``--other-model-dir`` (the two models of
``tests/vllm/model.py``) each update reloads the other model, whose tokens' logprobs tell them
apart (about -12 under the first, -14 under the second, with ``min_tokens``): a token's
version is exact when its parity names the model that sampled it.

Example::

    python benchmarks/weight_sync.py                          # 64 sessions, about 2 minutes
    python benchmarks/weight_sync.py --sessions 8 --duration 10 --every 2
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import random
import re
import time
from typing import Any

import httpx
from openai import AsyncOpenAI

from agentcore_rl.cli.summary import percentile
from agentcore_rl.gateway import RolloutGateway
from agentcore_rl.gateway.render.mode import RenderMode
from agentcore_rl.local.background import BackgroundServer
from agentcore_rl.local.policy import ScriptedPolicy, Serving, TemplateVoice

_GENERATED = re.compile(rb"^vllm:generation_tokens_total\{[^}]*\} ([0-9.e+]+)$", re.M)


def _lengths(args: argparse.Namespace, seed: int) -> list[int]:
    """A long tail of completion lengths: most short, a few near ``--max-tokens``."""
    rng = random.Random(seed)
    span = args.max_tokens - args.min_tokens
    return [args.min_tokens + int(span * rng.random() ** 3) for _ in range(10_000)]


async def _vllm_generated(http: httpx.AsyncClient | None) -> float:
    if http is None:
        return 0.0
    metrics = (await http.get("/metrics")).content
    return sum(float(x) for x in _GENERATED.findall(metrics))


async def _made(policy: ScriptedPolicy | None, vllm: httpx.AsyncClient | None) -> float:
    """The tokens the upstream has made so far."""
    return float(policy.tokens_made) if policy is not None else await _vllm_generated(vllm)


async def _reload(control: httpx.AsyncClient, directory: str) -> None:
    """Replace vLLM's weights from ``directory`` and drop its prefix cache."""
    body = {"method": "reload_weights", "kwargs": {"weights_path": directory}}
    (await control.post("/collective_rpc", json=body)).raise_for_status()
    (await control.post("/reset_prefix_cache")).raise_for_status()


async def run_mode(mode: str, args: argparse.Namespace, tokenizer: str) -> dict[str, Any]:
    policy = None
    if args.vllm:
        upstream_url, root = args.vllm.rstrip("/"), args.vllm.rstrip("/").removesuffix("/v1")
    else:
        policy = ScriptedPolicy(
            TemplateVoice(tokenizer),
            serving=Serving(token_ids="requested", token_rate=args.token_rate),
        )
    render = RenderMode.load(tokenizer) if args.history == "linear" else None
    async with contextlib.AsyncExitStack() as stack:
        if policy is not None:
            served = await stack.enter_async_context(BackgroundServer(policy))
            upstream_url, root = served.url + "/v1", served.url
        gateway = RolloutGateway(upstream_url, render=render, admin_token="bench")
        async with (
            BackgroundServer(gateway) as front,
            httpx.AsyncClient(base_url=root, timeout=60) as control,
        ):
            vllm = control if args.vllm else None
            made_before = await _made(policy, vllm)
            lengths = iter(_lengths(args, 7))
            errors: collections.Counter[str] = collections.Counter()
            calls = 0
            stop_at = time.monotonic() + args.duration
            sids: list[str] = []

            async def session(n: int) -> None:
                nonlocal errors, calls
                sid = f"{mode}-{n}"
                sids.append(sid)
                llm = AsyncOpenAI(
                    base_url=RolloutGateway.session_base_url(front.url, sid),
                    api_key="x",
                    max_retries=0,
                    timeout=600,
                )
                async with llm:
                    while time.monotonic() < stop_at:
                        length = next(lengths)
                        ask = f"Tell me story {n}, part {calls}."  # every prompt its own
                        messages: Any = [{"role": "user", "content": ask}]
                        try:
                            answer = await llm.chat.completions.create(
                                model=args.model,
                                messages=messages,
                                max_tokens=length + 1,
                                extra_body={"min_tokens": length},
                                stream=args.stream,
                            )
                            if args.stream:
                                async for _ in answer:
                                    pass
                        except Exception as exc:  # counted: the agent saw an error
                            errors[f"{type(exc).__name__}: {exc}"[:300]] += 1
                        calls += 1

            pauses: list[float] = []
            updates = 0
            steady: dict[str, float] = {}
            done = asyncio.Event()

            async def trainer() -> None:
                nonlocal updates
                while not done.is_set():
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(done.wait(), args.every)
                    if done.is_set() or mode == "none":
                        continue
                    start = time.monotonic()
                    async with gateway.paused(mode):  # type: ignore[arg-type]
                        pauses.append(time.monotonic() - start)
                        updates += 1
                        version = {"new_version": str(updates)}
                        await control.post("/update_weight_version", json=version)
                        if args.other_model_dir:  # the weight transfer: the other model
                            models = (args.model_dir, args.other_model_dir)
                            await _reload(control, models[updates % 2])
                        else:
                            await asyncio.sleep(args.push)  # the weight transfer
                        gateway.set_policy_version(updates)

            async def steady_state() -> None:  # while every session is still generating
                await asyncio.sleep(args.duration)
                steady.update(tokens=await _made(policy, vllm) - made_before, updates=updates)

            wall0 = time.monotonic()
            pacer = asyncio.ensure_future(trainer())
            meter = asyncio.ensure_future(steady_state())
            await asyncio.gather(*(session(n) for n in range(args.sessions)))
            done.set()
            await pacer
            await meter
            wall = time.monotonic() - wall0
            traces = [await gateway.finish_session(sid) for sid in sids]
            made_after = await _vllm_generated(vllm)
            if args.other_model_dir and updates % 2:
                await _reload(control, args.model_dir)  # the next run's weights
    recorded = sum(len(r.completions[0].token_ids) for t in traces for r in t.records if r.ok)
    if policy is not None:
        made = sum(len(ids) for _, ids, _ in policy.made)
        mismatched, exact, unknown, total = _check(traces, policy.made)
    else:
        made, mismatched = int(made_after - made_before), None
        exact, unknown, total = _by_logprob(traces) if args.other_model_dir else (0, 0, 0)
    return {
        "calls": calls,
        "updates": updates,
        "wall_s": round(wall, 2),
        "pause_to_push_s": {
            "p50": _round(percentile(pauses, 50)),
            "p99": _round(percentile(pauses, 99)),
            "max": _round(max(pauses, default=None)),
        },
        "steady_tokens": int(steady["tokens"]),
        "steady_updates": int(steady["updates"]),
        "tokens_made": made,
        "tokens_recorded": recorded,
        "tokens_discarded": made - recorded,
        "agent_errors": sum(errors.values()),
        "agent_error_kinds": dict(errors),
        "straddled_calls": gateway.stats["straddled_calls"],
        "exact": {
            "checked": sum(len(t.records) for t in traces),
            "mismatched": mismatched,
            "tokens": total,
            "share": round(exact / total, 4) if total else None,
            "unknown": round(unknown / total, 4) if total else None,
        },
    }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def _versions(record: Any) -> list[int]:
    """Each completion token's recorded version."""
    completion = record.completions[0]
    spans = completion.versions or [(0, record.policy_version_start)]
    ends = [at for at, _ in spans[1:]] + [len(completion.token_ids)]
    return [v for (at, v), end in zip(spans, ends, strict=True) for _ in range(end - at)]


def _by_logprob(traces: list[Any]) -> tuple[int, int, int]:
    """-> (tokens whose version is exact, unknown, checked) against a real vLLM whose updates
    alternate two models: under ``min_tokens`` an ordinary token's logprob says which sampled
    it (about -12: the first, even versions; -14: the second, odd ones)."""
    exact = unknown = total = 0
    for trace in traces:
        for record in trace.records:
            if not record.ok:
                continue
            forced = int(record.request.get("min_tokens") or 0)  # the end token not allowed
            logprobs = record.completions[0].logprobs.tolist()[:forced]
            for version, lp in zip(_versions(record), logprobs, strict=False):
                total += 1
                unknown += version < 0
                exact += version >= 0 and (version % 2 == 0) == (lp > -13.0)
    return exact, unknown, total


def _check(
    traces: list[Any], made: list[tuple[list[int], list[int], list[str]]]
) -> tuple[int, int, int, int]:
    """-> (records whose completion ids or per-token versions differ from what the stand-in
    made, tokens whose version is exact, unknown, all): its pieces chained, each
    continuation's prompt the last prompt plus the tokens so far."""
    pieces = {tuple(prompt): (ids, versions) for prompt, ids, versions in made}
    bad = exact = unknown = total = 0
    for trace in traces:
        for record in trace.records:
            if not record.ok:  # counted in agent_errors
                continue
            completion = record.completions[0]
            prompt = record.prompt_ids.tolist()
            ids: list[int] = []
            versions: list[int] = []
            want = completion.token_ids.tolist()
            while len(ids) < len(want):
                piece = pieces.get(tuple(prompt + ids))
                if piece is None:
                    break
                ids += piece[0]
                versions += [int(v.split("-")[0]) for v in piece[1]]  # the gateway's labels
            got = _versions(record)
            bad += ids != want or versions != got
            total += len(got)
            unknown += sum(v < 0 for v in got)
            exact += sum(a == b for a, b in zip(versions, got, strict=False))
    return bad, exact, unknown, total


async def main(args: argparse.Namespace) -> None:
    if args.vllm:
        tokenizer = args.model_dir
    else:
        from tests.gateway.template_fixtures import fixture_dir

        tokenizer = str(fixture_dir("qwen2.5"))
    results = {}
    for mode in ("none", "hold", "suspend"):
        results[mode] = await run_mode(mode, args, tokenizer)
    base = results["none"]["steady_tokens"]
    rate = base / args.duration / args.sessions  # tokens/s per session with no update
    for mode in ("hold", "suspend"):
        lost = (base - results[mode]["steady_tokens"]) / rate / args.sessions
        results[mode]["lost_per_update_s"] = round(
            lost / max(results[mode]["steady_updates"], 1), 3
        )
    hold, suspend = results["hold"], results["suspend"]
    report = {
        "benchmark": "weight_sync",
        "upstream": "vllm" if args.vllm else "stand-in",
        "config": {k: v for k, v in vars(args).items() if k != "model_dir"},
        **results,
        "suspend_vs_hold": {
            "pause_to_push_p99": _ratio(
                suspend["pause_to_push_s"]["p99"], hold["pause_to_push_s"]["p99"]
            ),
            "lost_per_update": _ratio(suspend["lost_per_update_s"], hold["lost_per_update_s"]),
        },
    }
    print(json.dumps(report, indent=1))


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else round(a / b, 4)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sessions", type=int, default=64)
    parser.add_argument(
        "--duration", type=float, default=40.0, help="seconds of new calls per mode"
    )
    parser.add_argument("--every", type=float, default=3.0, help="seconds between updates")
    parser.add_argument("--push", type=float, default=0.2, help="seconds a weight push takes")
    parser.add_argument("--token-rate", type=float, default=30.0, help="tokens/s per request")
    parser.add_argument("--min-tokens", type=int, default=100)
    parser.add_argument("--max-tokens", type=int, default=1500)
    parser.add_argument("--vllm", help="a real vLLM's OpenAI base URL instead of the stand-in")
    parser.add_argument("--model-dir", help="with --vllm: the served model's directory")
    parser.add_argument(
        "--other-model-dir", help="with --vllm: a second model each update swaps in (see above)"
    )
    parser.add_argument("--history", choices=("linear", "proxy"), default="linear")
    parser.add_argument("--stream", action="store_true", help="the agents stream their calls")
    parser.add_argument("--model", default="policy", help="the model name to ask for")
    return parser.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(parse()))
