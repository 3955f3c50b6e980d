"""Benchmark the rollout gateway: what it adds per call over calling the inference server directly.

Runs a fast vLLM-shaped upstream (precomputed answers of ``--tokens`` tokens with their ids and
logprobs, one SSE event per token when streaming) and the gateway (``python -m
agentcore_rl.gateway``) as separate processes on 127.0.0.1, and drives multi-turn agent
sessions from here, each with its own httpx client, every prompt extending the previous turn.
For each mode (``serial`` / ``serial_stream``: one call at a time; ``nonstream`` /
``stream``: ``--sessions`` sessions at once) it runs the same workload direct and through the
gateway and prints one JSON document (``--dialect``: the API the agents call the gateway in;
direct calls are chat completions):

- ``added_ms``: gateway minus direct latency, p50 and p99 (and time to first byte when
  streaming), from separate runs;
- ``gw_cpu_ms_per_call``: the gateway process's CPU (utime+stime from /proc) per call;
- ``calls_per_s``: direct and via the gateway;
- ``rss_mb_per_1k_calls``: the gateway's RSS growth per 1,000 captured calls (sessions are
  finished only at the end, so this is what captured records cost);
- ``capture``: every call's prompt ids, completion ids and logprobs in the finished traces
  equal what the upstream served.

Targets: CPU per call <= 0.25 x the better peer's (peers: 10-15 ms non-streaming,
47-51 ms streaming 200 tokens), added serial p50 <= 1 ms, added TTFB <= 5 ms; RSS per 1,000
captured calls is reported (each record keeps its own request and ids: about 35 MB per 1,000
calls of these sessions; `benchmarks/gateway_memory.py` measures 2,500 live sessions). The
machine is shared: run briefly; compare CPU per call, not calls/s.

Example::

    python benchmarks/gateway.py                                   # 256 sessions x 4 turns
    python benchmarks/gateway.py --sessions 32 --serial-sessions 8 --turns 3
    python benchmarks/gateway.py --dialect messages       # the agents call Anthropic Messages
    python benchmarks/gateway.py --dialect responses      # the agents call OpenAI Responses
    python benchmarks/gateway.py --dialect converse       # the agents call Bedrock Converse
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import zlib
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import httpx

from agentcore_rl.cli.summary import percentile

ADMIN = "bench-admin"
WORDS = [f"w{i}x{(i * 7919) % 997}" for i in range(997)]
_TICK = os.sysconf("SC_CLK_TCK")


# --- the upstream (runs in a child process) -----------------------------------------------------


def word_id(word: str) -> int:
    """The upstream's "tokenizer": one id per word."""
    return zlib.crc32(word.encode()) % 151_000


def prompt_ids(messages: list[dict[str, Any]]) -> list[int]:
    """A chat template of sorts: role marker, one id per word, end marker; then assistant."""
    out: list[int] = []
    for m in messages:
        out.append(151_650 + ("system", "user", "assistant").index(m["role"]))
        out.extend(word_id(w) for w in str(m.get("content") or "").split())
        out.append(151_645)
    out.append(151_652)
    return out


class Answer:
    """One precomputed answer: words, ids, logprobs, and its JSON fragments."""

    def __init__(self, k: int, tokens: int) -> None:
        self.words = [f"a{k}t{j}" for j in range(tokens)]
        self.text = " ".join(self.words)
        self.ids = [word_id(w) for w in self.words]
        self.logprobs = [-((k * 31 + j * 17) % 1000) / 250.0 - 0.001 for j in range(tokens)]
        pieces = [w if j == 0 else " " + w for j, w in enumerate(self.words)]
        entries = [
            {"token": p, "logprob": lp, "bytes": list(p.encode()), "top_logprobs": []}
            for p, lp in zip(pieces, self.logprobs, strict=True)
        ]
        self.choice = json.dumps(
            {
                "index": 0,
                "message": {"role": "assistant", "content": self.text, "tool_calls": []},
                "logprobs": {"content": entries},
                "finish_reason": "stop",
                "stop_reason": None,
                "token_ids": self.ids,
            }
        )
        self.chunks = [
            json.dumps(
                {
                    "index": 0,
                    "delta": {"content": p},
                    "logprobs": {"content": [e]},
                    "finish_reason": "stop" if j == tokens - 1 else None,
                    "token_ids": [self.ids[j]],
                }
            )
            for j, (p, e) in enumerate(zip(pieces, entries, strict=True))
        ]


def answer_index(messages: list[dict[str, Any]], variants: int) -> int:
    """Which precomputed answer a request gets: a hash of its first user message and turn."""
    first = next(m["content"] for m in messages if m["role"] == "user")
    turn = sum(1 for m in messages if m["role"] == "assistant")
    return zlib.crc32(f"{first[:40]}:{turn}".encode()) % variants


def upstream_app(tokens: int, variants: int) -> Any:
    """A vLLM >= 0.10.2-shaped chat server (return_token_ids, logprobs, SSE)."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response, StreamingResponse
    from starlette.routing import Route

    answers = [Answer(k, tokens) for k in range(variants)]

    async def chat(request: Request) -> Response:
        body = json.loads(await request.body())
        messages = body["messages"]
        ids = prompt_ids(messages)
        a = answers[answer_index(messages, variants)]
        with_ids = bool(body.get("return_token_ids"))
        head = '{"id":"c","object":"chat.completion","created":0,"model":"m"'
        ptok = ',"prompt_token_ids":' + json.dumps(ids) if with_ids else ""
        if not body.get("stream"):
            usage = {"prompt_tokens": len(ids), "completion_tokens": tokens}
            text = f'{head},"choices":[{a.choice}],"usage":{json.dumps(usage)}{ptok}}}'
            return Response(text, media_type="application/json")

        async def events() -> AsyncIterator[str]:
            role = '{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}'
            yield f'data: {head},"choices":[{role}]{ptok}}}\n\n'
            for chunk in a.chunks:
                yield f'data: {head},"choices":[{chunk}]}}\n\n'
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    async def health(request: Request) -> Response:
        return Response(b"")

    return Starlette(
        routes=[
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/health", health, methods=["GET"]),
        ]
    )


# --- processes and /proc ------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


@contextlib.contextmanager
def child(argv: list[str]) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL)
    try:
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


async def wait_ready(url: str, limit: float = 60.0) -> None:
    deadline = time.monotonic() + limit
    async with httpx.AsyncClient() as http:
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if (await http.get(url, timeout=2)).status_code == 200:
                    return
            await asyncio.sleep(0.1)
    raise TimeoutError(f"{url} not ready in {limit} s")


# --- the agents ---------------------------------------------------------------------------------


def sse_data(raw: bytes) -> Iterator[Any]:
    """The JSON ``data:`` of each SSE event (chat's, and those under an ``event:`` line)."""
    for event in raw.split(b"\n\n"):
        for line in event.split(b"\n"):
            if line.startswith(b"data: {"):
                yield json.loads(line[6:])


def event_stream_data(raw: bytes) -> Iterator[Any]:
    """Each AWS event-stream message's JSON payload (Converse's), its ``:event-type`` as
    ``event``; read by botocore's parser."""
    from botocore.eventstream import EventStreamBuffer

    buffer = EventStreamBuffer()
    buffer.add_data(raw)
    messages: list[Any] = list(buffer)
    for message in messages:
        yield {"event": message.headers[":event-type"], **json.loads(message.payload)}


class AgentDialect:
    """How an agent of one API asks (its route under the session's root, its body for a chat
    conversation) and reads the answer's text, whole or streamed (``stream_route``: a route
    of its own for a stream, as Converse's, rather than ``"stream": true`` in the body)."""

    def __init__(
        self,
        route: str,
        body: Callable[[list[dict[str, Any]], int], dict[str, Any]],
        whole: Callable[[Any], str],
        piece: Callable[[Any], str | None],
        stream_route: str | None = None,
        events: Callable[[bytes], Iterator[Any]] = sse_data,
    ) -> None:
        self.route, self.body, self.whole, self.piece = route, body, whole, piece
        self.stream_route, self.events = stream_route, events

    def streamed(self, raw: bytes) -> str:
        return "".join(self.piece(data) or "" for data in self.events(raw))


DIALECTS = {
    "chat": AgentDialect(
        "v1/chat/completions",
        lambda messages, tokens: {"model": "m", "messages": messages, "max_tokens": tokens},
        lambda data: data["choices"][0]["message"]["content"],
        lambda data: data["choices"][0]["delta"].get("content") if data["choices"] else None,
    ),
    "messages": AgentDialect(  # Anthropic: the system prompt on top, text blocks back
        "v1/messages",
        lambda messages, tokens: {
            "model": "m",
            "max_tokens": tokens,
            "system": messages[0]["content"],
            "messages": messages[1:],
        },
        lambda data: data["content"][0]["text"],
        lambda data: data["delta"].get("text") if data["type"] == "content_block_delta" else None,
    ),
    "responses": AgentDialect(  # OpenAI Responses: instructions, input items, output items
        "v1/responses",
        lambda messages, tokens: {
            "model": "m",
            "max_output_tokens": tokens,
            "instructions": messages[0]["content"],
            "input": messages[1:],
        },
        lambda data: "".join(
            part["text"]
            for item in data["output"]
            if item["type"] == "message"
            for part in item["content"]
        ),
        lambda data: data["delta"] if data["type"] == "response.output_text.delta" else None,
    ),
    "converse": AgentDialect(  # Bedrock: system and text blocks, the stream its own route
        "model/m/converse",
        lambda messages, tokens: {
            "system": [{"text": messages[0]["content"]}],
            "messages": [
                {"role": m["role"], "content": [{"text": m["content"]}]} for m in messages[1:]
            ],
            "inferenceConfig": {"maxTokens": tokens},
        },
        lambda data: data["output"]["message"]["content"][0]["text"],
        lambda data: data["delta"].get("text") if data["event"] == "contentBlockDelta" else None,
        stream_route="model/m/converse-stream",
        events=event_stream_data,
    ),
}


def text(seed: int, n: int) -> str:
    return " ".join(WORDS[(seed * 7919 + j * 31) % len(WORDS)] for j in range(n))


class Phase:
    def __init__(self) -> None:
        self.latency: list[float] = []
        self.ttfb: list[float] = []
        self.errors: list[str] = []
        self.contents: dict[str, list[str]] = {}


async def session(
    base: str,
    headers: dict[str, str],
    sid: str,
    i: int,
    a: argparse.Namespace,
    ph: Phase,
    *,
    stream: bool,
    direct: bool,
) -> None:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": text(1, a.system_words)},
        {"role": "user", "content": f"[{sid}] " + text(i * 13 + 1, a.user_words)},
    ]
    dialect = DIALECTS["chat" if direct else a.dialect]  # the upstream speaks chat
    async with httpx.AsyncClient(base_url=base, headers=headers, timeout=300) as http:
        for turn in range(a.turns):
            body = dialect.body(messages, a.tokens)
            if direct:  # the upstream does the same work as behind the gateway
                body.update(logprobs=True, return_token_ids=True)
            t0 = time.perf_counter()
            try:
                if stream:
                    route = dialect.stream_route or dialect.route
                    if dialect.stream_route is None:
                        body["stream"] = True
                    first, parts = None, []
                    async with http.stream("POST", route, json=body) as r:
                        async for piece in r.aiter_bytes():
                            first = first or time.perf_counter()
                            parts.append(piece)
                    raw = b"".join(parts)
                    if r.status_code != 200:
                        raise RuntimeError(f"HTTP {r.status_code}: {raw[:200]!r}")
                    content = dialect.streamed(raw)
                    ph.ttfb.append((first or time.perf_counter()) - t0)
                else:
                    r = await http.post(dialect.route, json=body)
                    if r.status_code != 200:
                        raise RuntimeError(f"HTTP {r.status_code}: {r.text[:200]}")
                    content = dialect.whole(r.json())
            except Exception as exc:
                ph.errors.append(f"{sid} turn {turn}: {type(exc).__name__}: {exc}"[:300])
                return
            ph.latency.append(time.perf_counter() - t0)
            ph.contents.setdefault(sid, []).append(content)
            messages = [
                *messages,
                {"role": "assistant", "content": content},
                {"role": "user", "content": text(i * 13 + turn + 2, a.user_words)},
            ]


async def run_phase(
    url: str, mode: str, sids: list[str], a: argparse.Namespace, *, direct: bool
) -> tuple[Phase, float]:
    ph = Phase()
    stream = mode in ("stream", "serial_stream")

    async def one(i: int, sid: str) -> None:
        base = f"{url}/" if direct else f"{url}/sessions/{sid}/"
        await session(base, {}, sid, i, a, ph, stream=stream, direct=direct)

    t0 = time.perf_counter()
    if mode.startswith("serial"):
        for i, sid in enumerate(sids):
            await one(i, sid)
    else:
        await asyncio.gather(*(one(i, sid) for i, sid in enumerate(sids)))
    return ph, time.perf_counter() - t0


async def check_capture(gw_url: str, sids: list[str], a: argparse.Namespace) -> dict[str, Any]:
    """Finish every session at the gateway; compare each record with what was served."""
    answers = [Answer(k, a.tokens) for k in range(a.variants)]
    expected = matched = 0
    fetch: list[float] = []
    errors: list[str] = []
    async with httpx.AsyncClient(base_url=gw_url, headers={"x-admin-token": ADMIN}) as http:
        for sid in sids:
            t0 = time.perf_counter()
            r = await http.post(f"/admin/sessions/{sid}/finish?format=json")
            fetch.append(time.perf_counter() - t0)
            records = r.json().get("records", []) if r.status_code == 200 else []
            expected += a.turns
            for rec in records:
                if rec["error"]:
                    errors.append(f"{sid} call {rec['index']}: {rec['error']}"[:300])
                    continue
                messages = rec["request"]["messages"]
                served = answers[answer_index(messages, a.variants)]
                (completion,) = rec["completions"]
                matched += (
                    rec["prompt_ids"] == prompt_ids(messages)
                    and completion["token_ids"] == served.ids
                    and completion["logprobs"] == served.logprobs
                )
    return {
        "expected": expected,
        "matched": matched,
        "ok": matched == expected,
        "finish_ms_p50": round(1000 * (percentile(fetch, 50) or 0), 3),
        "failed_records": len(errors),
        "failure_samples": errors[:3],
    }


def summary(ph: Phase, wall: float) -> dict[str, Any]:
    def ms(values: list[float], q: float) -> float | None:
        p = percentile(values, q)
        return None if p is None else round(p * 1000, 3)

    out: dict[str, Any] = {
        "calls": len(ph.latency),
        "errors": len(ph.errors),
        "calls_per_s": round(len(ph.latency) / wall, 1) if wall else None,
        "p50_ms": ms(ph.latency, 50),
        "p99_ms": ms(ph.latency, 99),
    }
    if ph.ttfb:
        out["ttfb_p50_ms"] = ms(ph.ttfb, 50)
        out["ttfb_p99_ms"] = ms(ph.ttfb, 99)
    if ph.errors:
        out["error_samples"] = ph.errors[:3]
    return out


def diff(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else round(a - b, 3)


async def main(a: argparse.Namespace) -> dict[str, Any]:
    up_port, gw_port = free_port(), free_port()
    up_url, gw_url = f"http://127.0.0.1:{up_port}", f"http://127.0.0.1:{gw_port}"
    py = sys.executable
    result: dict[str, Any] = {
        "sessions": a.sessions,
        "serial_sessions": a.serial_sessions,
        "turns": a.turns,
        "tokens": a.tokens,
        "dialect": a.dialect,
        "loadavg_start": os.getloadavg(),
        "modes": {},
    }
    upstream_cmd = [py, __file__, "--serve-upstream", str(up_port), "--tokens", str(a.tokens)]
    gateway_cmd = [py, "-m", "agentcore_rl.gateway", "--upstream", f"{up_url}/v1"]
    gateway_cmd += ["--port", str(gw_port), "--admin-token", ADMIN]
    with child(upstream_cmd), child(gateway_cmd) as gw:
        await wait_ready(f"{up_url}/health")
        await wait_ready(f"{gw_url}/health")
        warm = [f"warm-{i}" for i in range(4)]
        for direct in (True, False):
            await run_phase(up_url if direct else gw_url, "nonstream", warm, a, direct=direct)
        await check_capture(gw_url, warm, a)
        rss0, calls, all_sids = rss_mb(gw.pid), 0, []
        for mode in a.modes.split(","):
            n = a.serial_sessions if mode.startswith("serial") else a.sessions
            direct_ph, direct_wall = await run_phase(
                up_url, mode, [f"d-{mode}-{i}" for i in range(n)], a, direct=True
            )
            sids = [f"g-{mode}-{i}" for i in range(n)]
            cpu0 = cpu_seconds(gw.pid)
            gw_ph, gw_wall = await run_phase(gw_url, mode, sids, a, direct=False)
            cpu = cpu_seconds(gw.pid) - cpu0
            all_sids += sids
            calls += len(gw_ph.latency)
            d, g = summary(direct_ph, direct_wall), summary(gw_ph, gw_wall)
            entry: dict[str, Any] = {
                "direct": d,
                "gateway": g,
                "added_ms": {
                    "p50": diff(g["p50_ms"], d["p50_ms"]),
                    "p99": diff(g["p99_ms"], d["p99_ms"]),
                },
                "gw_cpu_ms_per_call": round(cpu * 1000 / max(1, g["calls"]), 3),
            }
            if mode in ("stream", "serial_stream"):
                entry["added_ms"]["ttfb_p50"] = diff(g.get("ttfb_p50_ms"), d.get("ttfb_p50_ms"))
            result["modes"][mode] = entry
        rss1 = rss_mb(gw.pid)
        result["rss_mb_per_1k_calls"] = round((rss1 - rss0) * 1000 / max(1, calls), 3)
        result["gw_rss_mb_end"] = round(rss1, 2)
        result["capture"] = await check_capture(gw_url, all_sids, a)
    result["loadavg_end"] = os.getloadavg()
    return result


def cli() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--sessions", type=int, default=256, help="concurrent sessions (nonstream, stream)"
    )
    p.add_argument("--serial-sessions", type=int, default=16)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--tokens", type=int, default=200, help="completion tokens per answer")
    p.add_argument("--variants", type=int, default=64)
    p.add_argument("--system-words", type=int, default=500)
    p.add_argument("--user-words", type=int, default=100)
    p.add_argument("--modes", default="serial,serial_stream,nonstream,stream")
    p.add_argument(
        "--dialect", choices=sorted(DIALECTS), default="chat", help="the agents' API (gateway)"
    )
    p.add_argument("--serve-upstream", type=int, default=0, help=argparse.SUPPRESS)
    return p.parse_args()


if __name__ == "__main__":
    args = cli()
    if args.serve_upstream:
        import uvicorn

        uvicorn.run(
            upstream_app(args.tokens, args.variants),
            host="127.0.0.1",
            port=args.serve_upstream,
            log_level="warning",
            access_log=False,
            backlog=4096,
        )
    else:
        print(json.dumps(asyncio.run(main(args)), indent=1))
