"""Benchmark the rollout client: many long rollouts, paced and bounded, results via S3.

Agents sleep a random ``--min-sleep``..``--max-sleep`` seconds (seeded). The agent
server(s), embedded S3 (moto) and, with ``--transport acr``, the local AgentCore Runtime
run in a CHILD process, so that the CPU time and RSS measured here are the client's alone.
The client drives ``--rollouts`` rollouts through ``run_batch`` with
``--concurrency`` slots and ``--tps`` invocations per second. Prints one JSON document:

- ``wall_s`` and ``ideal_wall_s``: the ideal is a simulation of the same durations under
  the same token bucket (rate ``--tps``, burst = one second's worth) and concurrency, with
  zero latency anywhere. Over HTTP a finished session needs no stop call, so stop calls do
  not count against the tps; over ACR each finished session gets a StopRuntimeSession,
  which takes a token at low priority, in the simulation as in the client.
- ``client_cpu_ms_per_rollout``: user+system CPU of this process during the run.
- ``s3_requests_per_rollout``: every S3 request of the client (LIST, GET, HEAD).
- ``detection_latency_s`` p50/p95: the envelope's ``finished_at`` (stamped by the agent
  server when the handler returned, just before its PUT) to the future's resolution.
- ``peak_rss_mb`` of this process, and ``inflight``: RSS with ``--inflight`` rollouts in
  flight at once (agents that never finish; sent at ``--inflight-tps``).

Targets: S3 requests/rollout <= 1.5; detection p95 <= 1.0 s; wall <= 1.1 x ideal; client
CPU <= 5 ms/rollout; RSS <= 200 MB with 10,000 in flight.

Example::

    python benchmarks/rollouts.py                                   # full size (~2 min)
    python benchmarks/rollouts.py --rollouts 100 --concurrency 50 --max-sleep 6 --inflight 500
    python benchmarks/rollouts.py --transport acr --inflight 0
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from agentcore_rl.cli.summary import percentile
from agentcore_rl.server.options import ShutdownConfig

BUCKET = "bench-rollouts"
# The stack is local: fixed fake credentials keep real ones out of the picture.
LOCAL_AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "bench",
    "AWS_SECRET_ACCESS_KEY": "bench",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}


# --- the stack (child process) -------------------------------------------------------------


async def serve_stack(agents: int, runtime_tps: float | None, with_runtime: bool) -> None:
    """Embedded S3 + ``agents`` agent servers (+ the local runtime); print their URLs,
    then run until stdin closes."""
    from agentcore_rl.local.background import BackgroundServer
    from agentcore_rl.local.embedded_s3 import EmbeddedS3
    from agentcore_rl.local.runtime import DEFAULT_AGENT_RUNTIME_ARN, LocalAgentCoreRuntime
    from agentcore_rl.s3 import ResultStore
    from agentcore_rl.server import AgentCoreRLApp

    s3 = EmbeddedS3().start()
    os.environ["AWS_ENDPOINT_URL_S3"] = s3.endpoint_url
    store = ResultStore(endpoint_url=s3.endpoint_url, max_pool_connections=128)
    await store.ensure_bucket(BUCKET)
    servers = []
    for _ in range(agents):
        app = AgentCoreRLApp(store=store, shutdown=ShutdownConfig(grace=0.0, cancel_timeout=1.0))

        @app.rollout_entrypoint
        async def sleeper(payload: dict[str, Any]) -> dict[str, Any]:
            await asyncio.sleep(float(payload["sleep"]))
            return {"rewards": [1.0], "slept": payload["sleep"]}

        servers.append(await BackgroundServer(app, backlog=4096).start())
    info: dict[str, Any] = {"s3": s3.endpoint_url, "agents": [s.url for s in servers]}
    if with_runtime:
        runtime = LocalAgentCoreRuntime(
            {DEFAULT_AGENT_RUNTIME_ARN: info["agents"]}, tps=runtime_tps, max_connections=1024
        )
        server = await BackgroundServer(runtime, backlog=4096).start()
        servers.append(server)
        info["runtime"] = server.url
        info["arn"] = DEFAULT_AGENT_RUNTIME_ARN
    print(json.dumps(info), flush=True)
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, sys.stdin.read)  # parent closed the pipe: done
    for srv in reversed(servers):
        srv.shutdown_timeout = 2.0
        await srv.aclose()
    await store.aclose()
    s3.stop()


def start_stack(
    agents: int, transport: str, runtime_tps: float | None, verbose: bool
) -> tuple[Any, dict[str, Any]]:
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--serve-stack",
        "--agents",
        str(agents),
        "--transport",
        transport,
    ]
    if runtime_tps is not None:
        cmd += ["--runtime-tps", str(runtime_tps)]
    env = {**os.environ, **LOCAL_AWS_ENV}
    # The stack's own logs (cancelled rollouts at the end...) are not the benchmark's output.
    child = subprocess.Popen(
        cmd,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=None if verbose else subprocess.DEVNULL,
        env=env,
        text=True,
    )
    assert child.stdout is not None
    line = child.stdout.readline()
    if not line:
        child.wait(10)
        raise RuntimeError("the stack process exited before starting")
    return child, json.loads(line)


def stop_stack(child: Any) -> None:
    try:
        child.stdin.close()
        child.wait(30)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait(10)


# --- the ideal schedule -----------------------------------------------------------------------


def ideal_wall(
    durations: list[float], concurrency: int, rate: float, burst: float, stops_count: bool
) -> float:
    """Wall time with zero latency: a rollout starts as soon as a token and a slot are
    free; with ``stops_count`` each finished rollout also needs a token, taken only when
    no invocation could use it (stops have lower priority)."""
    tokens, now = burst, 0.0
    running: list[float] = []  # completion times
    next_i, stops_due, end = 0, 0, 0.0
    n = len(durations)
    while next_i < n or running or (stops_count and stops_due):
        while running and running[0] <= now + 1e-12:
            end = max(end, heapq.heappop(running))
            stops_due += 1
        while tokens >= 1 - 1e-9 and next_i < n and len(running) < concurrency:
            tokens -= 1
            heapq.heappush(running, now + durations[next_i])
            next_i += 1
        can_invoke = next_i < n and len(running) < concurrency
        while stops_count and stops_due and tokens >= 1 - 1e-9 and not can_invoke:
            tokens -= 1
            stops_due -= 1
        if not stops_count:
            stops_due = 0
        wants_token = can_invoke or (stops_count and stops_due > 0)
        candidates = []
        if running:
            candidates.append(running[0])
        if wants_token and tokens < 1:
            candidates.append(now + (1 - tokens) / rate)
        if not candidates:
            break
        later = max(min(candidates), now)
        tokens = min(burst, tokens + (later - now) * rate)
        now = later
    return end


# --- the client (this process) ----------------------------------------------------------------


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def current_rss_mb() -> float:
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def client_options(args: argparse.Namespace, info: dict[str, Any], **extra: Any) -> dict[str, Any]:
    from agentcore_rl.client import AwsConfig, Timeouts

    options: dict[str, Any] = {
        "s3_bucket": BUCKET,
        "exp_id": extra.pop("exp_id"),
        "timeouts": Timeouts(rollout=args.max_sleep * 4 + 60),
    }
    if args.transport == "acr":
        options.update(
            agent_runtime_arn=info["arn"],
            aws=AwsConfig(endpoint_url=info["runtime"], s3_endpoint_url=info["s3"]),
        )
    else:
        options.update(agent_url=info["agents"], aws=AwsConfig(s3_endpoint_url=info["s3"]))
    options.update(extra)
    return options


async def run_rollouts(args: argparse.Namespace, info: dict[str, Any]) -> dict[str, Any]:
    from agentcore_rl.client import AsyncRolloutClient, Limits

    rng = random.Random(args.seed)
    durations = [rng.uniform(args.min_sleep, args.max_sleep) for _ in range(args.rollouts)]
    payloads = [{"sleep": d} for d in durations]
    options = client_options(
        args,
        info,
        exp_id=f"bench-{int(time.time())}",
        limits=Limits(max_concurrent_sessions=args.concurrency, tps=args.tps),
    )
    detection: list[float] = []
    failures: dict[str, int] = {}
    async with AsyncRolloutClient(**options) as client:
        cpu0, t0 = cpu_seconds(), time.time()
        async for item in client.run_batch(payloads):
            if item.success and item.result is not None and item.resolved_at is not None:
                detection.append(item.resolved_at - float(item.result["finished_at"]))
            else:
                name = type(item.error).__name__
                failures[name] = failures.get(name, 0) + 1
        wall = time.time() - t0
        cpu = cpu_seconds() - cpu0
        stats = client.stats
        stops_count = client.stop_finished_sessions
        watcher = client._rollouts.watcher
        watch = {
            "rounds": watcher.rounds,
            "lists": watcher.lists,
            "listed_keys": watcher.listed_keys,
            "probes": watcher.probes,
        }
    ideal = ideal_wall(durations, args.concurrency, args.tps, args.tps, stops_count)
    n = args.rollouts
    return {
        "rollouts": n,
        "ok": len(detection),
        "failures": failures,
        "wall_s": round(wall, 2),
        "ideal_wall_s": round(ideal, 2),
        "wall_over_ideal": round(wall / ideal, 3),
        "stop_calls_count_against_tps": stops_count,
        "client_cpu_s": round(cpu, 3),
        "client_cpu_ms_per_rollout": round(cpu / n * 1000, 3),
        "s3_requests": stats.s3_requests,
        "s3_requests_per_rollout": round(stats.s3_total / n, 3),
        "detection_latency_s": {
            "p50": _rounded(percentile(detection, 50)),
            "p95": _rounded(percentile(detection, 95)),
            "max": round(max(detection, default=float("nan")), 3),
            "mean": round(statistics.fmean(detection), 3) if detection else None,
        },
        "watcher": watch,
        "invocations": stats.invocations,
        "retries": stats.retries,
        "throttles": stats.throttles,
        "stops": stats.stops,
        "peak_rss_mb": round(peak_rss_mb(), 1),
    }


async def run_inflight(args: argparse.Namespace, info: dict[str, Any]) -> dict[str, Any]:
    """RSS with ``--inflight`` rollouts accepted and pending at once."""
    from agentcore_rl.client import AsyncRolloutClient, Limits, Timeouts

    n = args.inflight
    options = client_options(
        args,
        info,
        exp_id=f"inflight-{int(time.time())}",
        limits=Limits(max_concurrent_sessions=n, tps=args.inflight_tps),
        # The stack dies with the benchmark; no need to stop 10k sessions.
        timeouts=Timeouts(rollout=3600, close=1.0),
    )
    rss_before = current_rss_mb()
    async with AsyncRolloutClient(**options) as client:
        t0 = time.time()
        batch = client.run_batch({"sleep": 3600} for _ in range(n))

        async def consume() -> None:
            async for _ in batch:
                pass

        consumer = asyncio.create_task(consume())
        deadline = time.time() + args.inflight / args.inflight_tps * 3 + 60
        while client.in_flight < n and not consumer.done() and time.time() < deadline:
            await asyncio.sleep(0.5)
            if args.verbose:
                print(f"in flight: {client.in_flight}", file=sys.stderr)
        filled = time.time() - t0
        rss = current_rss_mb()
        in_flight = client.in_flight
        s3_per_poll = client.stats.s3_total
        await asyncio.sleep(3)  # a few watcher rounds with everything pending
        s3_per_poll = client.stats.s3_total - s3_per_poll
        consumer.cancel()
        await asyncio.gather(consumer, return_exceptions=True)
        await batch.aclose()
    return {
        "in_flight": in_flight,
        "fill_s": round(filled, 1),
        "rss_mb_before": round(rss_before, 1),
        "rss_mb_in_flight": round(rss, 1),
        "s3_requests_in_3s_with_all_pending": s3_per_poll,
        "peak_rss_mb": round(peak_rss_mb(), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rollouts", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=500)
    parser.add_argument("--tps", type=float, default=25.0)
    parser.add_argument("--min-sleep", type=float, default=5.0)
    parser.add_argument("--max-sleep", type=float, default=30.0)
    parser.add_argument("--agents", type=int, default=1, help="agent server count")
    parser.add_argument("--transport", choices=["http", "acr"], default="http")
    parser.add_argument(
        "--runtime-tps",
        type=float,
        default=None,
        help="the local runtime's own TPS quota (acr; default: none, the client paces)",
    )
    parser.add_argument("--inflight", type=int, default=10_000, help="0 skips this part")
    parser.add_argument("--inflight-tps", type=float, default=1000.0)
    parser.add_argument("--seed", type=int, default=17)
    parser.add_argument("--verbose", action="store_true", help="show the stack's logs")
    parser.add_argument("--serve-stack", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.environ.update(LOCAL_AWS_ENV)
    if args.serve_stack:
        asyncio.run(serve_stack(args.agents, args.runtime_tps, args.transport == "acr"))
        return
    child, info = start_stack(args.agents, args.transport, args.runtime_tps, args.verbose)
    try:
        report: dict[str, Any] = {
            "setup": {
                "transport": args.transport,
                "rollouts": args.rollouts,
                "concurrency": args.concurrency,
                "tps": args.tps,
                "sleep_s": [args.min_sleep, args.max_sleep],
                "agents": args.agents,
                "python": sys.version.split()[0],
                "cpus": os.cpu_count(),
                "note": "agent server(s), moto S3 and the local runtime run in a child "
                "process; CPU and RSS are this (client) process's only",
            }
        }
        if args.rollouts:
            report["rollouts"] = asyncio.run(run_rollouts(args, info))
        if args.inflight:
            report["inflight"] = asyncio.run(run_inflight(args, info))
    finally:
        stop_stack(child)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
