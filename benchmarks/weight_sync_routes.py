"""What proxy mode pays for every token's exact version: a chat call through the gateway on
vLLM's scale-out routes (``/v1/chat/completions/render``, ``/inference/v1/generate``,
``/v1/chat/completions/derender``, which give each token's weight version) against the same
call through the gateway on vLLM's chat route (what proxy mode does where the routes are off).

Against a real vLLM >= 0.32 started with ``--enable-scale-out`` (and the tool parser of
``tests/vllm/conftest.py``): the gateway runs in a process of its own (its CPU read from
``/proc``), once per way, ``--calls`` calls with the math agent's tool offered, ``--concurrency``
at a time, streamed with ``--stream``. One JSON document: per way, upstream calls per agent call
(a stream's: render, generate, then one derender per chunk the agent got), latency p50/p99,
wall time, the gateway's CPU per call, and ``same_answer``: the share of calls whose message
(content, reasoning, tool calls) equals the chat route's for the same seed.

Example::

    python benchmarks/weight_sync_routes.py --vllm http://127.0.0.1:8000/v1 --calls 200
    python benchmarks/weight_sync_routes.py --vllm http://127.0.0.1:8000/v1 --stream --min-tokens 64
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx

from agentcore_rl.cli.summary import percentile

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

# The gateway, on the chat route when told (as where vLLM has no scale-out routes).
_GATEWAY = """
import sys, uvicorn
from agentcore_rl.gateway import RolloutGateway
url, port, way = sys.argv[1], int(sys.argv[2]), sys.argv[3]
gateway = RolloutGateway(url)
if way == "chat_route":
    gateway.backend.sources[url] = "gateway"
uvicorn.run(gateway, host="127.0.0.1", port=port, log_level="warning")
"""


def _body(args: argparse.Namespace, n: int) -> dict[str, Any]:
    return {
        "model": args.model,
        "messages": [{"role": "user", "content": f"Tell me story {n}."}],
        "tools": _TOOLS,
        "max_tokens": args.tokens,
        "min_tokens": args.min_tokens,
        "seed": n,
        "logprobs": True,
        "stream": args.stream,
    }


def _cpu(pid: int) -> float:
    """A process's CPU seconds so far (user + system)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextlib.asynccontextmanager
async def _gateway(args: argparse.Namespace, way: str) -> AsyncIterator[tuple[str, int]]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _GATEWAY, args.vllm, str(port), way
    )
    url = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient() as http:
            for _ in range(200):
                with contextlib.suppress(httpx.HTTPError):
                    if (await http.get(url + "/health")).status_code == 200:
                        break
                await asyncio.sleep(0.1)
        yield url, process.pid
    finally:
        process.terminate()
        await process.wait()


async def _call(http: httpx.AsyncClient, url: str, body: dict[str, Any]) -> tuple[Any, int]:
    """One agent call -> (its message, the chunks it came in: 1 when whole)."""
    if not body["stream"]:
        answer = await http.post(url, json=body)
        answer.raise_for_status()
        return answer.json()["choices"][0]["message"], 1
    message: dict[str, Any] = {"content": "", "reasoning": "", "tool_calls": {}}
    chunks = 0
    async with http.stream("POST", url, json=body) as answer:
        answer.raise_for_status()
        async for line in answer.aiter_lines():
            if not line.startswith("data: {"):
                continue
            for choice in json.loads(line[6:]).get("choices") or ():
                chunks += 1
                delta = choice.get("delta") or {}
                message["content"] += delta.get("content") or ""
                message["reasoning"] += delta.get("reasoning") or ""
                for call in delta.get("tool_calls") or ():
                    slot = message["tool_calls"].setdefault(call["index"], {"function": {}})
                    function = call.get("function") or {}
                    slot["function"]["name"] = function.get("name") or slot["function"].get("name")
                    arguments = slot["function"].get("arguments", "")
                    slot["function"]["arguments"] = arguments + (function.get("arguments") or "")
    message["tool_calls"] = [message["tool_calls"][i] for i in sorted(message["tool_calls"])]
    return message, chunks


async def _run(way: str, args: argparse.Namespace) -> tuple[dict[str, Any], list[Any]]:
    latencies: list[float] = []
    messages: list[Any] = [None] * args.calls
    chunks: list[int] = []
    gate = asyncio.Semaphore(args.concurrency)
    async with _gateway(args, way) as (url, pid), httpx.AsyncClient(timeout=600) as http:

        async def one(n: int) -> None:
            async with gate:
                started = time.perf_counter()
                target = f"{url}/sessions/bench-{n}/v1/chat/completions"
                messages[n], count = await _call(http, target, _body(args, n))
                latencies.append(time.perf_counter() - started)
                chunks.append(count)

        cpu, wall = _cpu(pid), time.perf_counter()
        await asyncio.gather(*(one(n) for n in range(args.calls)))
        cpu, wall = _cpu(pid) - cpu, time.perf_counter() - wall
    calls = 1.0 if way == "chat_route" else 2 + sum(chunks) / len(chunks)
    return {
        "upstream_calls_per_call": round(calls, 2),
        "latency_s": {
            "p50": round(percentile(latencies, 50) or 0, 4),
            "p99": round(percentile(latencies, 99) or 0, 4),
        },
        "wall_s": round(wall, 2),
        "gateway_cpu_ms_per_call": round(cpu / args.calls * 1000, 3),
    }, messages


def _gist(message: Any) -> dict[str, Any]:
    """A message's content, reasoning and tool calls (their random ids left out)."""
    calls = [{"function": c["function"]} for c in message.get("tool_calls") or ()]
    return {
        "content": message.get("content") or None,
        "reasoning": message.get("reasoning") or None,
        "tool_calls": calls or None,
    }


async def main(args: argparse.Namespace) -> None:
    chat, by_chat = await _run("chat_route", args)
    scale_out, by_scale_out = await _run("scale_out", args)
    pairs = zip(by_chat, by_scale_out, strict=True)
    same = sum(_gist(a) == _gist(b) for a, b in pairs)
    scale_out["same_answer"] = round(same / args.calls, 4)
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
    parser.add_argument("--min-tokens", type=int, default=0, help="min_tokens per call")
    parser.add_argument("--stream", action="store_true", help="the agents stream their calls")
    return parser.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(parse()))
