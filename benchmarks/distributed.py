"""Benchmark limits shared across processes: Ray workers, one local AgentCore Runtime quota.

``--workers`` Ray worker processes each drive ``--rollouts`` rollouts (agents sleep
``--min-sleep``..``--max-sleep`` s, seeded) through their own ``AsyncRolloutClient``
against ONE local AgentCore Runtime that enforces ``--tps`` (429 beyond it). The stack
(embedded S3, agent servers, the runtime) runs in a child process, as in rollouts.py.
Two modes, one after the other:

- ``per-process``: each client has its own token bucket at ``--tps`` and its own
  ``--sessions`` slots (what one gets without sharing: workers x tps offered).
- ``shared``: every client uses ``shared_limits(tps, sessions)`` (one Ray actor).

Prints one JSON document, per mode: throttles answered by the runtime (as counted by the
clients), wall time against the ideal schedule for the shared quota (every duration,
``--sessions`` slots, ``--tps`` with one second of burst, stop calls at low priority; zero
latency), actor calls per invocation, failures. Targets (shared): 0 throttles, wall <= 1.1
x ideal, <= 0.2 actor calls per invocation.

Example::

    python benchmarks/distributed.py                       # 4 x 250 rollouts, both modes
    python benchmarks/distributed.py --rollouts 60 --modes shared   # a quick look

Fixed costs (workers starting a little apart, the first share's burst, the last
rollouts' tail) weigh more in short runs: the targets are for the full size.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: make `benchmarks` importable
    sys.path.insert(0, str(ROOT))

from benchmarks.rollouts import (  # noqa: E402
    BUCKET,
    LOCAL_AWS_ENV,
    ideal_wall,
    start_stack,
    stop_stack,
)


def durations_of(worker: int, rollouts: int, low: float, high: float, seed: int) -> list[float]:
    rng = random.Random(seed * 1000 + worker)
    return [rng.uniform(low, high) for _ in range(rollouts)]


async def drive(
    info: dict[str, Any], durations: list[float], mode: str, options: dict[str, Any]
) -> dict[str, Any]:
    """One worker: run its rollouts through its own client; count what happened."""
    from agentcore_rl.client import AsyncRolloutClient, AwsConfig, Limits, Timeouts
    from agentcore_rl.distributed import shared_limits

    client_options: dict[str, Any] = {
        "agent_runtime_arn": info["arn"],
        "s3_bucket": BUCKET,
        "exp_id": f"dist-{mode}-{uuid.uuid4().hex[:8]}",
        "timeouts": Timeouts(rollout=max(durations, default=1.0) * 4 + 120),
        "aws": AwsConfig(endpoint_url=info["runtime"], s3_endpoint_url=info["s3"]),
    }
    failures: dict[str, int] = {}

    timings: dict[str, float] = {}

    async def run(client: Any) -> float:
        # CLOCK_MONOTONIC is one clock for every process on this host.
        t0 = timings["batch_start"] = time.monotonic()
        async for item in client.run_batch([{"sleep": d} for d in durations]):
            if not item.success:
                name = type(item.error).__name__
                failures[name] = failures.get(name, 0) + 1
        timings["batch_end"] = time.monotonic()
        return timings["batch_end"] - t0

    if mode == "per-process":
        async with AsyncRolloutClient(
            **client_options,
            limits=Limits(tps=options["tps"], max_concurrent_sessions=options["sessions"]),
        ) as client:
            wall = await run(client)
        stats, actor_calls, rate_stats = client.stats, 0, {}
    else:
        async with shared_limits(
            options["name"], tps=options["tps"], sessions=options["sessions"]
        ) as limits:
            client = AsyncRolloutClient(
                **client_options, rate_limiter=limits.rate, session_limiter=limits.sessions
            )
            async with client:
                wall = await run(client)
            closed = time.monotonic()
            stats = client.stats
            actor_calls = limits.actor_calls
            rate_stats = {
                "rate": dict(limits.rate.stats),
                "sessions": dict(limits.sessions.stats),
            }
        timings["limits_close_s"] = time.monotonic() - closed
    return {
        "wall_s": wall,
        "invocations": stats.invocations,
        "stops": stats.stops,
        "throttles": stats.throttles,
        "retries": stats.retries,
        "failures": failures,
        "actor_calls": actor_calls,
        "timings": timings,
        "limiter": rate_stats,
    }


def run_mode(mode: str, args: argparse.Namespace, info: dict[str, Any]) -> dict[str, Any]:
    import ray

    @ray.remote(num_cpus=0)
    class BenchWorker:
        async def drive(self, durations: list[float], options: dict[str, Any]) -> dict[str, Any]:
            return await drive(info, durations, mode, options)

    options = {
        "tps": args.tps,
        "sessions": args.sessions,
        "workers": args.workers,
        "name": f"bench-{uuid.uuid4().hex[:8]}",
    }
    plans = [
        durations_of(w, args.rollouts, args.min_sleep, args.max_sleep, args.seed)
        for w in range(args.workers)
    ]
    workers = [BenchWorker.remote() for _ in range(args.workers)]  # type: ignore[attr-defined]
    ray.get([w.__ray_ready__.remote() for w in workers])  # process start-up is not the run
    if mode == "shared":  # nor is creating the limits actor (once per cluster)
        from agentcore_rl.distributed import shared_limits

        limits = shared_limits(options["name"], tps=args.tps, sessions=args.sessions)
        asyncio.run(limits.backend.status())
    t0 = time.monotonic()
    results = ray.get([w.drive.remote(p, options) for w, p in zip(workers, plans, strict=True)])
    wall = time.monotonic() - t0
    for worker in workers:
        ray.kill(worker)
    everything = [d for plan in plans for d in plan]
    ideal = ideal_wall(everything, args.sessions, args.tps, args.tps, stops_count=True)
    invocations = sum(r["invocations"] for r in results)
    calls = invocations + sum(r["stops"] for r in results)
    actor_calls = sum(r["actor_calls"] for r in results)
    failures: dict[str, int] = {}
    for r in results:
        for name, n in r["failures"].items():
            failures[name] = failures.get(name, 0) + n
    # From the first batch's start to the last result, as in the ideal schedule (which
    # also leaves out the stop calls after the last result and client start-up/close).
    rollouts_wall = max(r["timings"]["batch_end"] for r in results) - min(
        r["timings"]["batch_start"] for r in results
    )
    return {
        "rollouts": len(everything),
        "wall_s": round(rollouts_wall, 2),
        "ideal_wall_s": round(ideal, 2),
        "wall_over_ideal": round(rollouts_wall / ideal, 3),
        "total_wall_s": round(wall, 2),
        "throttles": sum(r["throttles"] for r in results),
        "retries": sum(r["retries"] for r in results),
        "failures": failures,
        "invocations": invocations,
        "stops": calls - invocations,
        "actor_calls": actor_calls,
        "actor_calls_per_invocation": round(actor_calls / max(1, invocations), 3),
        "actor_calls_per_call": round(actor_calls / max(1, calls), 3),
        "worker_wall_s": [round(r["wall_s"], 2) for r in results],
        "worker_detail": [{"timings": r["timings"], "limiter": r["limiter"]} for r in results],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--rollouts", type=int, default=250, help="per worker")
    parser.add_argument("--tps", type=float, default=25.0)
    parser.add_argument("--sessions", type=int, default=500)
    parser.add_argument("--min-sleep", type=float, default=1.0)
    parser.add_argument("--max-sleep", type=float, default=5.0)
    parser.add_argument("--agents", type=int, default=2, help="agent server count")
    parser.add_argument("--modes", nargs="+", default=["per-process", "shared"])
    parser.add_argument("--seed", type=int, default=17)
    parser.add_argument("--verbose", action="store_true", help="show the stack's logs")
    args = parser.parse_args()
    os.environ.update(LOCAL_AWS_ENV)

    import ray

    child, info = start_stack(args.agents, "acr", args.tps, args.verbose)
    try:
        ray.init(
            num_cpus=2,
            include_dashboard=False,
            log_to_driver=args.verbose,
            runtime_env={
                "env_vars": {
                    **LOCAL_AWS_ENV,
                    "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
                }
            },
        )
        report: dict[str, Any] = {
            "setup": {
                "workers": args.workers,
                "rollouts_per_worker": args.rollouts,
                "tps": args.tps,
                "sessions": args.sessions,
                "sleep_s": [args.min_sleep, args.max_sleep],
                "agents": args.agents,
                "python": sys.version.split()[0],
                "ray": ray.__version__,
                "cpus": os.cpu_count(),
                "runtime_tps": args.tps,
            }
        }
        for mode in args.modes:
            report[mode] = run_mode(mode, args, info)
    finally:
        ray.shutdown()
        stop_stack(child)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
