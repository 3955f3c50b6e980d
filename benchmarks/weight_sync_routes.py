"""What proxy mode would pay to get vLLM's per-token weight versions: one chat call
(``/v1/chat/completions`` with ``return_token_ids``, what proxy mode sends) against the three
calls of vLLM's scale-out routes (``/v1/chat/completions/render``, ``/inference/v1/generate``,
``/v1/chat/completions/derender``), which return the versions.

Against a real vLLM >= 0.32 started with ``--enable-scale-out`` (and the tool parser of
``tests/vllm/conftest.py``), ``--calls`` calls each way, ``--concurrency`` at a time, through
the gateway's own client (:class:`UpstreamPool`, the gateway's JSON). One JSON document: per
way, upstream calls per agent call, latency p50/p99, the client's CPU seconds per call (what
the gateway would spend), and ``same_answer``: the share of calls whose derendered message
equals the chat route's for the same seed (``same_but_end_text``: equal once the text of the
end token, which vLLM 0.32's derender leaves at the end of ``content``, is dropped).

Example::

    python benchmarks/weight_sync_routes.py --vllm http://127.0.0.1:8000/v1 --calls 200
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any

from agentcore_rl.cli.summary import percentile
from agentcore_rl.gateway.jsonio import dumps, loads
from agentcore_rl.gateway.upstream import UpstreamPool

_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression.",
            "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
        },
    }
]


def _body(args: argparse.Namespace, n: int) -> dict[str, Any]:
    return {
        "model": args.model,
        "messages": [{"role": "user", "content": f"Tell me story {n}."}],
        "tools": _TOOLS,
        "max_tokens": args.tokens,
        "seed": n,
        "logprobs": True,
    }


async def _post(pool: UpstreamPool, path: str, body: Any) -> Any:
    status, content = await pool.fetch(pool.target(path, root=True), dumps(body))
    if status != 200:
        raise RuntimeError(f"{path}: HTTP {status}: {content[:300]!r}")
    return loads(content)


async def _chat(pool: UpstreamPool, body: dict[str, Any]) -> Any:
    answer = await _post(pool, "/v1/chat/completions", {**body, "return_token_ids": True})
    return answer["choices"][0]["message"]


async def _scale_out(pool: UpstreamPool, body: dict[str, Any]) -> Any:
    request = await _post(pool, "/v1/chat/completions/render", body)
    request.update(return_token_ids=True)
    request["sampling_params"]["logprobs"] = 0
    generated = await _post(pool, "/inference/v1/generate", request)
    assert generated["choices"][0]["weight_versions"]  # what proxy mode would gain
    derender = {
        "generate_response": generated,
        "prompt_token_ids": request["token_ids"],
        "prompt_tokens": len(request["token_ids"]),
        "chat_request": body,
    }
    answer = await _post(pool, "/v1/chat/completions/derender", derender)
    return answer["choices"][0]["message"]


async def _run(way: Any, args: argparse.Namespace) -> tuple[dict[str, Any], list[Any]]:
    pool = UpstreamPool(args.vllm)
    latencies: list[float] = []
    messages: list[Any] = [None] * args.calls
    gate = asyncio.Semaphore(args.concurrency)

    async def one(n: int) -> None:
        async with gate:
            started = time.perf_counter()
            messages[n] = await way(pool, _body(args, n))
            latencies.append(time.perf_counter() - started)

    cpu, wall = time.process_time(), time.perf_counter()
    try:
        await asyncio.gather(*(one(n) for n in range(args.calls)))
    finally:
        await pool.aclose()
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    return {
        "upstream_calls_per_call": 1 if way is _chat else 3,
        "latency_s": {
            "p50": round(percentile(latencies, 50) or 0, 4),
            "p99": round(percentile(latencies, 99) or 0, 4),
        },
        "wall_s": round(wall, 2),
        "client_cpu_ms_per_call": round(cpu / args.calls * 1000, 3),
    }, messages


def _gist(message: Any) -> dict[str, Any]:
    """A message's content, reasoning and tool calls (their random ids left out)."""
    for call in message.get("tool_calls") or ():
        call.pop("id", None)
    return {k: message.get(k) or None for k in ("content", "tool_calls", "reasoning")}


def _same(a: Any, b: Any, *, end: str = "") -> bool:
    mine = _gist(b)
    mine["content"] = (mine["content"] or "").removesuffix(end) or None
    return _gist(a) == mine


async def main(args: argparse.Namespace) -> None:
    chat, by_chat = await _run(_chat, args)
    scale_out, by_scale_out = await _run(_scale_out, args)
    pairs = list(zip(by_chat, by_scale_out, strict=True))
    same = sum(_same(a, b) for a, b in pairs)
    scale_out["same_answer"] = round(same / args.calls, 4)
    same = sum(_same(a, b, end=args.end_text) for a, b in pairs)
    scale_out["same_but_end_text"] = round(same / args.calls, 4)
    report = {
        "benchmark": "weight_sync_routes",
        "config": vars(args),
        "chat_route": chat,
        "render_generate_derender": scale_out,
    }
    print(json.dumps(report, indent=1))


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--vllm", required=True, help="the vLLM's OpenAI base URL")
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64, help="max_tokens per call")
    parser.add_argument("--end-text", default="<|im_end|>", help="the end token's text")
    return parser.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(parse()))
