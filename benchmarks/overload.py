"""Benchmark the agent server under overload: many connections sending invocations at once.

``--invocations`` invocations (default 5,000) are sent to one agent server (a separate
process, rollouts held in flight, embedded S3 in this process) by ``--connections``
workers, each sending back to back over its own keep-alive connection; the run is made
for each value of ``--connections`` (default 200 and 32). A ``503`` is a pause: the
worker waits its ``Retry-After`` and sends the same invocation again. Prints one JSON
document with, per connection count:

- ``resets``: invocations that got no answer (connection reset or closed): lost;
- ``refused_503``: 503 answers (each followed by a resend, as the client does);
- ``accepts_per_s``: accepted invocations per second of the run;
- ``accept``: latency from the first send of an invocation to its acceptance (p50/p99),
  and ``attempt``: latency of single requests, 503s included.

Target: no resets, and accepts/s at 200 connections not below that at 32.

Example::

    python benchmarks/overload.py                     # 5,000 over 200 and over 32
    python benchmarks/overload.py --invocations 500 --connections 64,8
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script: make `benchmarks` importable
    sys.path.insert(0, str(ROOT))

from agentcore_rl import protocol  # noqa: E402
from agentcore_rl.local.embedded_s3 import EmbeddedS3  # noqa: E402
from agentcore_rl.s3 import ResultStore  # noqa: E402
from benchmarks.server import (  # noqa: E402
    BUCKET,
    LOCAL_AWS_ENV,
    agent_process,
    payload,
    summary,
)

#: Seconds a worker waits after a 503 without a usable Retry-After.
DEFAULT_PAUSE = 1.0


async def drive(url: str, invocations: int, connections: int, deadline: float) -> dict[str, Any]:
    """Send ``invocations`` over ``connections`` workers; count what came back.

    aiohttp, not httpx, drives the load: at 200 connections httpx spends twice the CPU of
    the server under test on the same 2 cores, and the run would measure the client."""
    counts = {"accepted": 0, "resets": 0, "refused_503": 0, "other": 0}
    accept_s: list[float] = []
    attempt_s: list[float] = []
    queue = iter(range(invocations))
    target = url + protocol.INVOCATIONS_PATH

    async def worker(http: aiohttp.ClientSession) -> None:
        for i in queue:
            body = json.dumps(payload(i)).encode()
            headers = {
                protocol.SESSION_ID_HEADER: protocol.new_session_id(),
                "Content-Type": "application/json",
            }
            first = time.perf_counter()
            while time.perf_counter() < deadline:
                sent = time.perf_counter()
                try:
                    async with http.post(target, data=body, headers=headers) as response:
                        await response.read()
                        status = response.status
                        retry_after = response.headers.get("Retry-After")
                except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError):
                    counts["resets"] += 1  # no answer: the invocation is lost
                    break
                except asyncio.TimeoutError:
                    counts["other"] += 1
                    break
                attempt_s.append(time.perf_counter() - sent)
                if status == 503:
                    counts["refused_503"] += 1
                    await asyncio.sleep(_retry_after(retry_after))
                    continue
                if status == 200:
                    counts["accepted"] += 1
                    accept_s.append(time.perf_counter() - first)
                else:
                    counts["other"] += 1
                break

    started = time.perf_counter()
    connector = aiohttp.TCPConnector(limit=connections, force_close=False)
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
        await asyncio.gather(*(worker(http) for _ in range(connections)))
    seconds = time.perf_counter() - started
    return {
        "connections": connections,
        "invocations": invocations,
        **counts,
        "seconds": round(seconds, 2),
        "accepts_per_s": round(counts["accepted"] / seconds, 1),
        "accept": summary(accept_s),
        "attempt": summary(attempt_s),
    }


def _cpu(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def _retry_after(value: str | None) -> float:
    try:
        return max(0.0, float(value)) if value is not None else DEFAULT_PAUSE
    except ValueError:
        return DEFAULT_PAUSE


async def run(args: argparse.Namespace) -> dict[str, Any]:
    os.environ.update(LOCAL_AWS_ENV)
    os.environ.pop("AWS_PROFILE", None)
    runs = []
    with EmbeddedS3() as s3, tempfile.TemporaryDirectory() as tmp:
        async with ResultStore(endpoint_url=s3.endpoint_url) as store:
            await store.ensure_bucket(BUCKET)
        for connections in (int(c) for c in args.connections.split(",")):
            # A fresh server per run: each starts empty, holding what it accepts. Its CPU
            # (start and shutdown included) is counted once it has exited.
            server_before = _cpu(resource.RUSAGE_CHILDREN)
            own_before = _cpu(resource.RUSAGE_SELF)
            async with agent_process("async", 64, s3.endpoint_url, Path(tmp), 0.001) as control:
                url = str(control.base_url).rstrip("/")
                deadline = time.perf_counter() + args.timeout
                result = await drive(url, args.invocations, connections, deadline)
            server_cpu = _cpu(resource.RUSAGE_CHILDREN) - server_before
            result["server_cpu_ms_per_accept"] = round(
                1000 * server_cpu / max(result["accepted"], 1), 3
            )
            result["load_generator_cpu_s"] = round(_cpu(resource.RUSAGE_SELF) - own_before, 2)
            runs.append(result)
    by_connections = {r["connections"]: r for r in runs}
    most, fewest = max(by_connections), min(by_connections)
    return {
        "benchmark": "agent_server_overload",
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
        "runs": runs,
        "targets": {"resets": 0, "accepts_per_s_ratio_min": 1.0},
        "accepts_per_s_ratio": round(
            by_connections[most]["accepts_per_s"]
            / max(by_connections[fewest]["accepts_per_s"], 1e-9),
            2,
        ),
        "resets": sum(r["resets"] for r in runs),
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--invocations", type=int, default=5000, help="invocations per run")
    parser.add_argument(
        "--connections", default="200,32", help="concurrent connections per run (comma-separated)"
    )
    parser.add_argument("--timeout", type=float, default=600, help="bound on each run (s)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    result = asyncio.run(run(args))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
