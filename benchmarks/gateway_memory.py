"""Benchmark the rollout gateway's memory under large valid calls.

Runs a minimal vLLM-shaped upstream (one token id per word of every message, plus role
markers; a few answer tokens with logprobs) and the gateway (``python -m
agentcore_rl.gateway``) as separate processes on 127.0.0.1, then drives two workloads
through the gateway, each in its own session:

- ``big``: two calls, each one user message of ``--big-mb`` MB (about one id per 6 bytes:
  5M prompt ids for 30 MB);
- ``many``: one call of ``--many`` small messages (a 23 MB body for 100,000);
- ``sessions``: ``--sessions`` agent sessions of ``--turns`` turns each (a 4 KB system
  prompt, then a 1 KB tool result per turn; every turn resends the whole conversation),
  ``--concurrency`` calls at once, all sessions live until every turn is done; then all are
  finished. ``peak_mb``: the gateway's peak RSS over the idle baseline, ``live_mb`` its RSS
  with every session live, ``after_finish_mb`` once all are finished.

For each call it reads the gateway's ``VmHWM`` (peak RSS, reset before the call through
``/proc/PID/clear_refs``) and ``VmRSS`` (kept after the call), and the same around
finishing the session (``POST /admin/sessions/{sid}/finish``, gzip). Figures are MB beyond
the idle baseline (after a small warm-up call; ``peak_over_start_mb``: beyond the RSS when
the call started), next to the bytes in flight (request plus upstream answer);
``peak_per_in_flight`` is the largest ``peak_over_start_mb`` over them, and ``record_mb``
the session's compact record (its distinct prompt ids and request bodies). ``capture``
checks each finished trace: prompt ids, completion ids, logprobs and the request body equal
what was sent and served.

Example::

    python benchmarks/gateway_memory.py                    # 2 x 30 MB, then 100,000 messages
    python benchmarks/gateway_memory.py --big-mb 5 --many 20000
    python benchmarks/gateway_memory.py --only sessions --sessions 2500 --turns 10
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import os
import sys
import time
import zlib
from array import array
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script: make `benchmarks` importable
    sys.path.insert(0, str(ROOT))

from benchmarks.gateway import child, free_port, wait_ready  # noqa: E402

ADMIN = "bench-admin"
ANSWER_TOKENS = 16


def word_id(word: bytes) -> int:
    """The upstream's "tokenizer": one id per word."""
    return zlib.crc32(word) % 151_000


def prompt_ids(messages: list[dict[str, Any]]) -> array[int]:
    """Role marker, one id per word, end marker per message; then the assistant marker."""
    roles = ("system", "user", "assistant")
    out = array("i")
    for m in messages:
        out.append(151_650 + roles.index(m["role"]))
        out.extend(map(word_id, str(m.get("content") or "").encode().split()))
        out.append(151_645)
    out.append(151_652)
    return out


def answer_ids(n_prompt: int) -> tuple[list[int], list[float]]:
    ids = [(n_prompt * 31 + j * 7) % 151_000 for j in range(ANSWER_TOKENS)]
    return ids, [-0.125 * (j + 1) for j in range(ANSWER_TOKENS)]


def upstream_app() -> Any:
    """A vLLM >= 0.10.2-shaped chat server: ``prompt_token_ids`` at the root, ``token_ids``
    and logprob entries on the choice (non-streaming)."""
    import orjson
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    async def chat(request: Request) -> Response:
        body = orjson.loads(await request.body())
        ids = prompt_ids(body["messages"])
        out, logprobs = answer_ids(len(ids))
        entries = [{"token": f"t{i}", "logprob": lp} for i, lp in zip(out, logprobs, strict=True)]
        answer: dict[str, Any] = {
            "id": "c",
            "object": "chat.completion",
            "created": 0,
            "model": "m",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "ok"},
                    "logprobs": {"content": entries},
                    "finish_reason": "stop",
                    "token_ids": out,
                }
            ],
            "usage": {"prompt_tokens": len(ids), "completion_tokens": len(out)},
        }
        if body.get("return_token_ids"):
            answer["prompt_token_ids"] = ids.tolist()
        return Response(orjson.dumps(answer), media_type="application/json")

    async def health(request: Request) -> Response:
        return Response(b"")

    return Starlette(
        routes=[
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/health", health, methods=["GET"]),
        ]
    )


def status_mb(pid: int) -> dict[str, float]:
    """VmHWM (peak) and VmRSS (now) of ``pid`` in MB."""
    out: dict[str, float] = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(("VmHWM:", "VmRSS:")):
                out[line[:5]] = int(line.split()[1]) / 1024
    return out


def reset_peak(pid: int) -> None:
    with open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current RSS


_BASE = " ".join(f"w{i % 9973:04d}" for i in range(8192))  # words of 5 characters


def words(seed: int, nbytes: int) -> str:
    """About ``nbytes`` of words of 5 characters and a space."""
    if nbytes <= 4096:
        start = (seed * 6) % 4096 // 6 * 6
        return _BASE[start : start + nbytes].strip()
    reps = max(1, nbytes // (len(_BASE) + 1))
    return " ".join([_BASE] * reps)


def response_size(n_ids: int) -> int:
    """Roughly the upstream answer's bytes (ids of 6 digits and a comma)."""
    return n_ids * 7 + 2000


async def settle(http: httpx.AsyncClient, gw: str) -> None:
    """Return once the gateway has done what follows an answer's last byte (compacting the
    record, releasing memory): it answers the next request only after that."""
    await http.get(f"{gw}/health")


async def call_and_measure(
    http: httpx.AsyncClient, gw: str, pid: int, sid: str, body: bytes, base: float
) -> dict[str, Any]:
    reset_peak(pid)
    before = status_mb(pid)["VmRSS"]
    started = time.perf_counter()
    response = await http.post(
        f"{gw}/sessions/{sid}/v1/chat/completions",
        content=body,
        headers={"content-type": "application/json"},
    )
    took = time.perf_counter() - started
    await settle(http, gw)
    after = status_mb(pid)
    return {
        "status": response.status_code,
        "body_mb": round(len(body) / 1e6, 2),
        "seconds": round(took, 2),
        "peak_mb": round(after["VmHWM"] - base, 1),
        "peak_over_start_mb": round(after["VmHWM"] - before, 1),
        "kept_mb": round(after["VmRSS"] - base, 1),
    }


async def finish_and_check(
    http: httpx.AsyncClient, gw: str, pid: int, sid: str, sent: list[bytes], base: float
) -> dict[str, Any]:
    reset_peak(pid)
    response = await http.post(
        f"{gw}/admin/sessions/{sid}/finish", headers={"authorization": f"Bearer {ADMIN}"}
    )
    await settle(http, gw)
    after = status_mb(pid)
    out: dict[str, Any] = {
        "finish_status": response.status_code,
        "finish_peak_mb": round(after["VmHWM"] - base, 1),
        "kept_after_finish_mb": round(after["VmRSS"] - base, 1),
    }
    trace = json.loads(gzip.decompress(response.content))
    records = trace["records"]
    matched = len(records) == len(sent)
    for record, body in zip(records, sent, strict=False):
        request = json.loads(body)
        ids = prompt_ids(request["messages"])
        out_ids, logprobs = answer_ids(len(ids))
        (completion,) = record["completions"]
        matched = matched and (
            record["status"] == 200
            and record["error"] is None
            and record["prompt_ids"] == ids.tolist()
            and completion["token_ids"] == out_ids
            and completion["logprobs"] == logprobs
            and record["request"] == request
        )
    # The session's compact record: its distinct prompt ids (a repeated prompt is kept once)
    # and its request bodies (the same: a repeated body is kept once).
    distinct = {b for b in sent}
    out["record_mb"] = round(
        (4 * len(prompt_ids(json.loads(sent[-1])["messages"])) + sum(map(len, distinct))) / 1e6,
        1,
    )
    out["capture_matched"] = matched
    return out


def session_turn(sid: int, turns: int) -> list[bytes]:
    """The request bodies of one session's turns (each resends the conversation so far)."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": words(sid, 4096)},
        {"role": "user", "content": words(sid + 1, 512)},
    ]
    out = []
    for turn in range(turns):
        out.append(json.dumps({"model": "m", "messages": messages}).encode())
        messages = [
            *messages,
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": words(sid * 31 + turn, 1024)},
        ]
    return out


async def sessions(
    http: httpx.AsyncClient, gw: str, pid: int, a: argparse.Namespace, base: float
) -> dict[str, Any]:
    reset_peak(pid)
    started = time.perf_counter()
    bodies = {s: session_turn(s, a.turns) for s in range(a.sessions)}
    failed = 0
    limit = asyncio.Semaphore(a.concurrency)

    async def call(s: int, turn: int) -> None:
        nonlocal failed
        async with limit:
            response = await http.post(
                f"{gw}/sessions/s{s}/v1/chat/completions",
                content=bodies[s][turn],
                headers={"content-type": "application/json"},
            )
            failed += response.status_code != 200

    for turn in range(a.turns):  # every session's turn t, then turn t+1: all stay live
        await asyncio.gather(*(call(s, turn) for s in range(a.sessions)))
    await settle(http, gw)
    live = status_mb(pid)
    sent = sum(len(b) for turns in bodies.values() for b in turns)
    checked = await finish_and_check(http, gw, pid, "s0", bodies[0], base)
    for s in range(1, a.sessions):
        await http.post(
            f"{gw}/admin/sessions/s{s}/finish", headers={"authorization": f"Bearer {ADMIN}"}
        )
    await settle(http, gw)
    after = status_mb(pid)
    return {
        "sessions": a.sessions,
        "turns": a.turns,
        "failed_calls": failed,
        "request_mb_sent": round(sent / 1e6, 1),
        "seconds": round(time.perf_counter() - started, 1),
        "peak_mb": round(max(live["VmHWM"], after["VmHWM"]) - base, 1),
        "live_mb": round(live["VmRSS"] - base, 1),
        "after_finish_mb": round(after["VmRSS"] - base, 1),
        "capture_matched": checked["capture_matched"],
    }


async def main(a: argparse.Namespace) -> dict[str, Any]:
    up_port, gw_port = free_port(), free_port()
    up_url, gw_url = f"http://127.0.0.1:{up_port}", f"http://127.0.0.1:{gw_port}"
    py = sys.executable
    result: dict[str, Any] = {
        "big_mb": a.big_mb,
        "many": a.many,
        "loadavg_start": os.getloadavg(),
    }
    upstream_cmd = [py, __file__, "--serve-upstream", str(up_port)]
    gateway_cmd = [py, "-m", "agentcore_rl.gateway", "--upstream", f"{up_url}/v1"]
    gateway_cmd += ["--port", str(gw_port), "--admin-token", ADMIN, "--log-level", "warning"]
    big = json.dumps(
        {"model": "m", "messages": [{"role": "user", "content": words(1, int(a.big_mb * 1e6))}]}
    ).encode()
    small = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": words(i, 200)}
        for i in range(a.many)
    ]
    many = json.dumps({"model": "m", "messages": small}).encode()
    timeout = httpx.Timeout(600.0)
    with child(upstream_cmd), child(gateway_cmd) as gw:
        await wait_ready(f"{up_url}/health")
        await wait_ready(f"{gw_url}/health")
        async with httpx.AsyncClient(timeout=timeout) as http:
            warm = json.dumps({"messages": [{"role": "user", "content": "hi"}]}).encode()
            await http.post(f"{gw_url}/sessions/warm/v1/chat/completions", content=warm)
            await http.post(
                f"{gw_url}/admin/sessions/warm/finish", headers={"authorization": f"Bearer {ADMIN}"}
            )
            base = status_mb(gw.pid)["VmRSS"]
            result["idle_rss_mb"] = round(base, 1)
            if a.only in (None, "sessions"):
                result["sessions"] = await sessions(http, gw_url, gw.pid, a, base)
                base = status_mb(gw.pid)["VmRSS"]
            if a.only == "sessions":
                result["loadavg_end"] = os.getloadavg()
                return result
            n_big = len(prompt_ids(json.loads(big)["messages"]))
            calls = []
            for _ in range(2):
                calls.append(await call_and_measure(http, gw_url, gw.pid, "big", big, base))
            in_flight = (len(big) + response_size(n_big)) / 1e6
            result["big"] = {
                "prompt_ids": n_big,
                "in_flight_mb": round(in_flight, 1),
                "calls": calls,
                **await finish_and_check(http, gw_url, gw.pid, "big", [big, big], base),
            }
            base = status_mb(gw.pid)["VmRSS"]
            n_many = len(prompt_ids(small))
            one = await call_and_measure(http, gw_url, gw.pid, "many", many, base)
            result["many"] = {
                "prompt_ids": n_many,
                "in_flight_mb": round((len(many) + response_size(n_many)) / 1e6, 1),
                "calls": [one],
                **await finish_and_check(http, gw_url, gw.pid, "many", [many], base),
            }
            for what in ("big", "many"):
                entry = result[what]
                peak = max(c["peak_over_start_mb"] for c in entry["calls"])
                entry["peak_per_in_flight"] = round(peak / entry["in_flight_mb"], 2)
    result["loadavg_end"] = os.getloadavg()
    return result


def cli() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--big-mb", type=float, default=30.0, help="MB of the one-message calls")
    p.add_argument("--many", type=int, default=100_000, help="messages of the many-message call")
    p.add_argument("--sessions", type=int, default=2500, help="sessions of the sessions workload")
    p.add_argument("--turns", type=int, default=10, help="turns per session")
    p.add_argument("--concurrency", type=int, default=64, help="calls at once (sessions)")
    p.add_argument("--only", choices=["sessions", "calls"], default=None, help="one workload")
    p.add_argument("--serve-upstream", type=int, default=None, help=argparse.SUPPRESS)
    return p.parse_args()


if __name__ == "__main__":
    args = cli()
    if args.serve_upstream is not None:
        import uvicorn

        uvicorn.run(upstream_app(), host="127.0.0.1", port=args.serve_upstream, log_level="warning")
    else:
        print(json.dumps(asyncio.run(main(args)), indent=2))
