"""Benchmark the agent server's memory over many rollouts: flat after warm-up?

Drives ``--rollouts`` (default 100,000) fast rollouts (the handler returns at once)
through one agent server under real uvicorn in a separate process, writing their envelopes
with its real aiobotocore client to an S3 in this process: ``--s3 sink`` (the default)
answers every request 200 and keeps nothing, so the machine's CPU goes to the agent;
``--s3 embedded`` is moto (slower; it keeps every envelope). Invocations go out
``--concurrency`` at a time with fresh session ids; after every ``--batch`` the driver
waits until the agent has fewer than ``--max-active`` rollouts running, so what is
measured is what stays behind, not a backlog. The agent's resident memory
(``/proc/self/statm``) is sampled every ``--sample-every`` rollouts. Prints one JSON
document: the samples, RSS at the end of warm-up (the first ``--warmup`` rollouts) and at
the end, the growth after warm-up in MB and per 10,000 rollouts, and the rate. Target:
growth after warm-up under 5 MB.

Example::

    python benchmarks/server_memory.py                       # 100,000 rollouts
    python benchmarks/server_memory.py --rollouts 5000 --warmup 1000 --sample-every 1000
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script: make `benchmarks` importable
    sys.path.insert(0, str(ROOT))

from agentcore_rl import protocol  # noqa: E402
from agentcore_rl.local.background import BackgroundServer  # noqa: E402
from agentcore_rl.local.embedded_s3 import EmbeddedS3  # noqa: E402
from agentcore_rl.s3 import ResultStore  # noqa: E402
from benchmarks.server import BUCKET, LOCAL_AWS_ENV, agent_process, payload  # noqa: E402

GROWTH_TARGET_MB = 5.0


async def sink_s3(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """An S3 endpoint that answers every request 200 with an ETag and keeps nothing."""
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    while (await receive()).get("more_body"):
        pass
    headers = [(b"etag", b'"0"'), (b"content-length", b"0")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": b""})


@contextlib.asynccontextmanager
async def s3_endpoint(kind: str) -> AsyncIterator[str]:
    if kind == "sink":
        async with BackgroundServer(sink_s3, log_level="warning") as server:
            yield server.url
        return
    with EmbeddedS3() as s3:
        async with ResultStore(endpoint_url=s3.endpoint_url) as store:
            await store.ensure_bucket(BUCKET)
        yield s3.endpoint_url


async def stats(http: httpx.AsyncClient) -> dict[str, Any]:
    answer: dict[str, Any] = (await http.get("/bench/stats")).json()
    return answer


async def send(
    http: httpx.AsyncClient, numbers: range, concurrency: int, refused: list[int]
) -> None:
    queue = iter(numbers)

    async def worker() -> None:
        for i in queue:
            headers = {protocol.SESSION_ID_HEADER: protocol.new_session_id()}
            while True:  # a 503 (overload) is a pause, then the same invocation again
                try:
                    response = await http.post(
                        protocol.INVOCATIONS_PATH, json=payload(i), headers=headers
                    )
                except (httpx.ReadError, httpx.RemoteProtocolError):
                    continue  # a kept-alive connection the server closed as it was reused
                if response.status_code != 503:
                    break
                refused[0] += 1
                await asyncio.sleep(float(response.headers.get("retry-after", "1")))
            response.raise_for_status()

    await asyncio.gather(*(worker() for _ in range(concurrency)))


async def drain(http: httpx.AsyncClient, below: int) -> dict[str, Any]:
    while True:  # bounded by the run's --timeout
        now = await stats(http)
        if now["active"] < below:
            return now
        await asyncio.sleep(0.02)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    os.environ.update(LOCAL_AWS_ENV)
    os.environ.pop("AWS_PROFILE", None)
    samples: list[dict[str, Any]] = []
    refused = [0]  # 503 answers (each followed by a resend)
    with tempfile.TemporaryDirectory() as tmp:
        async with (
            s3_endpoint(args.s3) as s3_url,
            agent_process("fast", 8, s3_url, Path(tmp), 0.001) as http,
        ):
            first = await stats(http)
            samples.append({"rollouts": 0, "rss_mb": round(first["rss_bytes"] / 2**20, 1)})
            started = time.perf_counter()
            done = 0
            while done < args.rollouts:
                batch = min(args.batch, args.rollouts - done)
                await send(http, range(done, done + batch), args.concurrency, refused)
                done += batch
                now = await drain(http, args.max_active)
                if done % args.sample_every == 0 or done == args.rollouts:
                    rss = round(now["rss_bytes"] / 2**20, 1)
                    samples.append({"rollouts": done, "rss_mb": rss, "active": now["active"]})
            now = await drain(http, 1)
            seconds = time.perf_counter() - started
            final = round(now["rss_bytes"] / 2**20, 1)
    warm = next(s for s in samples if s["rollouts"] >= min(args.warmup, args.rollouts))
    growth = round(final - warm["rss_mb"], 1)
    after = max(1, args.rollouts - warm["rollouts"])
    return {
        "benchmark": "agent_server_memory",
        "rollouts": args.rollouts,
        "s3": args.s3,
        "seconds": round(seconds, 1),
        "rollouts_per_s": round(args.rollouts / seconds, 1),
        "refused_503": refused[0],
        "rss_start_mb": samples[0]["rss_mb"],
        "rss_after_warmup_mb": warm["rss_mb"],
        "warmup_rollouts": warm["rollouts"],
        "rss_final_mb": final,
        "rss_max_mb": max(s["rss_mb"] for s in samples),
        "growth_after_warmup_mb": growth,
        "growth_per_10k_rollouts_mb": round(growth * 10_000 / after, 2),
        "target": {"growth_after_warmup_mb_max": GROWTH_TARGET_MB},
        "flat": growth <= GROWTH_TARGET_MB,
        "samples": samples,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rollouts", type=int, default=100_000)
    parser.add_argument("--warmup", type=int, default=20_000, help="rollouts before the baseline")
    parser.add_argument("--concurrency", type=int, default=32, help="invocations sent at once")
    parser.add_argument("--batch", type=int, default=1000, help="invocations between drains")
    parser.add_argument("--max-active", type=int, default=100, help="running rollouts let pass")
    parser.add_argument("--sample-every", type=int, default=5000, help="rollouts per RSS sample")
    parser.add_argument("--s3", choices=["sink", "embedded"], default="sink")
    parser.add_argument("--timeout", type=float, default=3600, help="bound on the whole run")
    args = parser.parse_args(argv)
    result = asyncio.run(asyncio.wait_for(run(args), args.timeout))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
