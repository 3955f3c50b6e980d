"""Benchmark limits shared across processes: Ray workers, one local AgentCore Runtime quota.

``--workers`` Ray worker processes each drive ``--rollouts`` rollouts (agents sleep
``--min-sleep``..``--max-sleep`` s, seeded) through their own ``AsyncRolloutClient``
against ONE local AgentCore Runtime that enforces ``--tps`` (429 beyond it). The stack
(embedded S3, agent servers, the runtime) runs in a child process, as in rollouts.py.
Three stages, one after the other:

- ``per-process``: each client has its own token bucket at ``--tps`` and its own
  ``--sessions`` slots (the baseline: what one gets without sharing, workers x tps offered).
- ``shared``: every client uses ``shared_limits(tps, sessions)`` (one Ray actor).
- ``kill``: one worker fills a small budget (``--kill-sessions`` slots, ``--slot-ttl``)
  with long rollouts and is SIGKILLed; the time until the actor counts its slots free
  again, then another worker runs rollouts on the freed budget.

Prints one JSON document. Per mode: throttles answered by the runtime (as counted by the
clients), wall time against the ideal schedule for the shared quota (every duration,
``--sessions`` slots, ``--tps`` with one second of burst, stop calls at low priority; zero
latency), client process CPU per rollout (Ray's threads included) and actor calls per
invocation; ``shared`` also as ratios to ``per-process``. Targets: ``shared`` 0 throttles,
wall <= 1.1 x ideal; ``kill`` slots back within ``--slot-ttl`` plus a report interval.

Example::

    python benchmarks/distributed.py                       # 4 x 250 rollouts, all stages
    python benchmarks/distributed.py --rollouts 60 --modes shared kill   # a quick look
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
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

NAMESPACE = "agentcore-rl"


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

    async def run(client: Any) -> None:
        # CLOCK_MONOTONIC is one clock for every process on this host.
        timings["batch_start"] = time.monotonic()
        async for item in client.run_batch([{"sleep": d} for d in durations]):
            if not item.success:
                name = type(item.error).__name__
                failures[name] = failures.get(name, 0) + 1
        timings["batch_end"] = time.monotonic()

    cpu0 = time.process_time()
    if mode == "per-process":
        limits_ = Limits(tps=options["tps"], max_concurrent_sessions=options["sessions"])
        async with AsyncRolloutClient(**client_options, limits=limits_) as client:
            await run(client)
        actor_calls = 0
    else:
        settings = {k: options[k] for k in ("tps", "sessions", "slot_ttl")}
        async with shared_limits(options["name"], **settings) as limits:
            client = AsyncRolloutClient(
                **client_options, rate_limiter=limits.rate, session_limiter=limits.sessions
            )
            async with client:
                await run(client)
        actor_calls = limits.actor_calls
    return {
        "invocations": client.stats.invocations,
        "stops": client.stats.stops,
        "throttles": client.stats.throttles,
        "failures": failures,
        "actor_calls": actor_calls,
        "cpu_s": time.process_time() - cpu0,
        "timings": timings,
    }


def make_worker(info: dict[str, Any]) -> Any:
    import ray

    @ray.remote(num_cpus=0)
    class BenchWorker:
        def pid(self) -> int:
            return os.getpid()

        async def drive(
            self, durations: list[float], mode: str, options: dict[str, Any]
        ) -> dict[str, Any]:
            return await drive(info, durations, mode, options)

    return BenchWorker


def status(name: str) -> dict[str, Any]:
    import ray

    result: dict[str, Any] = ray.get(ray.get_actor(name, namespace=NAMESPACE).status.remote())
    return result


def create_limits(name: str, options: dict[str, Any]) -> None:
    """Create the actor before the clock starts (once per cluster, not the run's cost)."""
    from agentcore_rl.distributed import shared_limits

    settings = {k: options[k] for k in ("tps", "sessions", "slot_ttl")}

    async def enter() -> None:
        async with shared_limits(name, **settings):
            pass

    asyncio.run(enter())


def run_mode(mode: str, args: argparse.Namespace, info: dict[str, Any]) -> dict[str, Any]:
    import ray

    options = {
        "tps": args.tps,
        "sessions": args.sessions,
        "slot_ttl": args.slot_ttl,
        "name": f"bench-{uuid.uuid4().hex[:8]}",
    }
    plans = [
        durations_of(w, args.rollouts, args.min_sleep, args.max_sleep, args.seed)
        for w in range(args.workers)
    ]
    workers = [make_worker(info).remote() for _ in range(args.workers)]
    ray.get([w.pid.remote() for w in workers])  # process start-up is not the run
    if mode == "shared":
        create_limits(options["name"], options)
    results = ray.get(
        [w.drive.remote(p, mode, options) for w, p in zip(workers, plans, strict=True)]
    )
    for worker in workers:
        ray.kill(worker)
    everything = [d for plan in plans for d in plan]
    ideal = ideal_wall(everything, args.sessions, args.tps, args.tps, stops_count=True)
    invocations = sum(r["invocations"] for r in results)
    failures: dict[str, int] = {}
    for r in results:
        for name, n in r["failures"].items():
            failures[name] = failures.get(name, 0) + n
    # From the first batch's start to the last result, as in the ideal schedule.
    wall = max(r["timings"]["batch_end"] for r in results) - min(
        r["timings"]["batch_start"] for r in results
    )
    actor_calls = sum(r["actor_calls"] for r in results)
    return {
        "rollouts": len(everything),
        "wall_s": round(wall, 2),
        "ideal_wall_s": round(ideal, 2),
        "wall_over_ideal": round(wall / ideal, 3),
        "throttles": sum(r["throttles"] for r in results),
        "failures": failures,
        "invocations": invocations,
        "stops": sum(r["stops"] for r in results),
        "client_cpu_ms_per_rollout": round(
            1000 * sum(r["cpu_s"] for r in results) / max(1, invocations), 2
        ),
        "actor_calls": actor_calls,
        "actor_calls_per_invocation": round(actor_calls / max(1, invocations), 3),
    }


def run_kill(args: argparse.Namespace, info: dict[str, Any]) -> dict[str, Any]:
    """A worker holding the whole budget is SIGKILLed: when are its slots free again?"""
    import ray

    name = f"bench-kill-{uuid.uuid4().hex[:8]}"
    options = {"tps": args.tps, "sessions": args.kill_sessions, "slot_ttl": args.slot_ttl}
    options["name"] = name
    create_limits(name, options)
    doomed, survivor = make_worker(info).remote(), make_worker(info).remote()
    pid = ray.get(doomed.pid.remote())
    ray.get(survivor.pid.remote())
    doomed.drive.remote([600.0] * (2 * args.kill_sessions), "shared", options)
    deadline = time.monotonic() + 120
    while status(name)["slots_held"] < args.kill_sessions:
        if time.monotonic() > deadline:
            raise RuntimeError("the doomed worker never filled the budget")
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    while (held := status(name))["slots_held"] > 0:
        time.sleep(0.05)
    back = time.monotonic() - killed
    durations = durations_of(0, args.kill_sessions * 2, 0.2, 0.6, args.seed)
    after = ray.get(survivor.drive.remote(durations, "shared", options))
    ray.kill(survivor)
    return {
        "sessions": args.kill_sessions,
        "slot_ttl_s": args.slot_ttl,
        "slots_back_s": round(back, 2),
        "expired_holders": held["expired_holders"],
        "survivor_rollouts_ok": len(durations) - sum(after["failures"].values()),
        "survivor_throttles": after["throttles"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--rollouts", type=int, default=250, help="per worker")
    parser.add_argument("--tps", type=float, default=25.0)
    parser.add_argument("--sessions", type=int, default=500)
    parser.add_argument("--slot-ttl", type=float, default=10.0)
    parser.add_argument("--kill-sessions", type=int, default=16)
    parser.add_argument("--min-sleep", type=float, default=1.0)
    parser.add_argument("--max-sleep", type=float, default=5.0)
    parser.add_argument("--agents", type=int, default=2, help="agent server count")
    parser.add_argument("--modes", nargs="+", default=["per-process", "shared", "kill"])
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
            }
        }
        for mode in args.modes:
            report[mode] = run_kill(args, info) if mode == "kill" else run_mode(mode, args, info)
        if "per-process" in report and "shared" in report:
            base, shared = report["per-process"], report["shared"]
            report["shared_over_per_process"] = {
                key: round(shared[key] / base[key], 3) if base[key] else None
                for key in ("wall_s", "client_cpu_ms_per_rollout", "throttles")
            }
    finally:
        ray.shutdown()
        stop_stack(child)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
