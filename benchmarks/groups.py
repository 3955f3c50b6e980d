"""Benchmark GRPO groups: many prompts x n members with failing and hanging members.

Each member attempt's fate is a stable hash of (seed, prompt, member index, attempt): it
runs ``--min-sleep``..``--max-sleep`` seconds, then succeeds (reward 0 or 1), or fails
(``--fail`` of attempts) or hangs until the member timeout (``--hang``). The agent servers
and embedded S3 run in a CHILD process (as in benchmarks/rollouts.py), so the CPU measured
here is the client's alone. The client runs the prompts through ``run_groups`` with the
default rules (retry once, then drop the member, at least 2 kept), once per
``--redundancy`` value. Prints one JSON document per setting:

- ``groups``: complete, dropped by reason, and ``resolved`` (complete + dropped; the
  target is every prompt);
- ``wall_s`` and ``ideal_wall_s``: the ideal is the same plan run by the same
  :class:`~agentcore_rl.group_tracker.GroupTracker` in a zero-latency simulation under the
  same token bucket (rate ``--tps``, burst one second's worth) and concurrency (retries
  queue ahead of members not started yet, as in the client; stop calls are not paced);
- ``first_group_s`` (and its ideal): time to the first complete group;
- ``group_detection_lag_s``: from the last kept member's result being written (the agent's
  ``finished_at``) to the group being yielded;
- ``client_cpu_ms_per_member``: user+system CPU of this process per member attempt started.

Target: every group resolved by its rule; wall <= 1.1 x ideal.

Example::

    python -m benchmarks.groups                                     # 128 x 8, r = 0 and 1
    python -m benchmarks.groups --prompts 16 --max-sleep 3 --member-timeout 5
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import heapq
import json
import os
import subprocess
import sys
import time
from collections import Counter, deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentcore_rl.cli.summary import percentile
from agentcore_rl.server.options import ShutdownConfig
from benchmarks.rollouts import LOCAL_AWS_ENV, cpu_seconds, stop_stack

BUCKET = "bench-groups"
REPO = Path(__file__).resolve().parents[1]


# --- the plan (shared by the agent and the simulation) ---------------------------------------


@dataclass(frozen=True)
class Fate:
    """What one member attempt does."""

    duration: float
    kind: str  # "ok", "fail" or "hang"
    reward: float


def fate(plan: dict[str, Any], prompt: int, index: int, attempt: int) -> Fate:
    """The stable fate of one attempt (see the module docstring)."""
    digest = hashlib.blake2b(
        f"{plan['seed']}:{prompt}:{index}:{attempt}".encode(), digest_size=16
    ).digest()
    u1, u2, u3 = (int.from_bytes(digest[i : i + 4], "big") / 2**32 for i in (0, 4, 8))
    duration = plan["min_sleep"] + u1 * (plan["max_sleep"] - plan["min_sleep"])
    if u2 < plan["fail"]:
        kind = "fail"
    elif u2 < plan["fail"] + plan["hang"]:
        kind = "hang"
    else:
        kind = "ok"
    return Fate(duration, kind, 1.0 if u3 < 0.5 else 0.0)


# --- the stack (child process) -------------------------------------------------------------


async def serve_stack(agents: int) -> None:
    """Embedded S3 + agent servers running members by their fate; print the URLs, then run
    until stdin closes."""
    from agentcore_rl.groups import parse_member_session_id
    from agentcore_rl.local.background import BackgroundServer
    from agentcore_rl.local.embedded_s3 import EmbeddedS3
    from agentcore_rl.s3 import ResultStore
    from agentcore_rl.server import AgentCoreRLApp, RequestContext

    s3 = EmbeddedS3().start()
    os.environ["AWS_ENDPOINT_URL_S3"] = s3.endpoint_url
    store = ResultStore(endpoint_url=s3.endpoint_url, max_pool_connections=128)
    await store.ensure_bucket(BUCKET)
    servers = []
    for _ in range(agents):
        app = AgentCoreRLApp(store=store, shutdown=ShutdownConfig(grace=0.0, cancel_timeout=1.0))

        @app.rollout_entrypoint
        async def member(payload: dict[str, Any], context: RequestContext) -> dict[str, Any]:
            key = parse_member_session_id(context.session_id)
            assert key is not None
            what = fate(payload["plan"], payload["prompt"], key.index, key.attempt)
            if what.kind == "hang":
                await asyncio.Event().wait()
            await asyncio.sleep(what.duration)
            if what.kind == "fail":
                raise RuntimeError("planned failure")
            return {"rewards": [what.reward]}

        servers.append(await BackgroundServer(app, backlog=4096).start())
    print(json.dumps({"s3": s3.endpoint_url, "agents": [s.url for s in servers]}), flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    for srv in reversed(servers):
        srv.shutdown_timeout = 2.0
        await srv.aclose()
    await store.aclose()
    s3.stop()


def start_stack(agents: int, verbose: bool) -> tuple[Any, dict[str, Any]]:
    cmd = [sys.executable, "-m", "benchmarks.groups", "--serve-stack", "--agents", str(agents)]
    child = subprocess.Popen(
        cmd,
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=None if verbose else subprocess.DEVNULL,
        env={**os.environ, **LOCAL_AWS_ENV},
        text=True,
    )
    assert child.stdout is not None
    line = child.stdout.readline()
    if not line:
        child.wait(10)
        raise RuntimeError("the stack process exited before starting")
    return child, json.loads(line)


# --- the ideal schedule ----------------------------------------------------------------------


def ideal(args: argparse.Namespace, plan: dict[str, Any], redundancy: int) -> dict[str, Any]:
    """The plan under the real GroupTracker with zero latency (see the module docstring)."""
    from agentcore_rl.group_tracker import GroupTracker, StartMember, StopMember
    from agentcore_rl.groups import GroupDroppedError, GroupRules, RolloutGroup

    tracker = GroupTracker(exp_id="ideal")
    rules = GroupRules(n=args.n, redundancy=redundancy)
    initial: deque[StartMember] = deque()
    retries: deque[StartMember] = deque()
    prompt_of: dict[str, int] = {}
    for prompt in range(args.prompts):
        input_id = f"{prompt:06d}"
        prompt_of[input_id] = prompt
        initial.extend(a for a in tracker.open(input_id, rules) if isinstance(a, StartMember))
    rate = burst = args.tps
    tokens, now = burst, 0.0
    ends: list[tuple[float, int, str, StartMember]] = []
    running: set[str] = set()
    stopped: set[str] = set()
    seq = 0
    first: float | None = None
    last = 0.0
    ready = 0
    dropped: Counter[str] = Counter()

    def apply(actions: list[Any]) -> None:
        nonlocal first, last, ready
        for action in actions:
            if isinstance(action, StartMember):
                retries.append(action)
            elif isinstance(action, StopMember):
                running.discard(action.session_id)
                stopped.add(action.session_id)
            elif isinstance(action, RolloutGroup):
                ready += 1
                first = now if first is None else first
                last = now
            elif isinstance(action, GroupDroppedError):
                dropped[action.reason.value] += 1
                last = now

    while initial or retries or ends:
        while ends and ends[0][0] <= now + 1e-12:
            _, _, kind, action = heapq.heappop(ends)
            if action.session_id not in running:
                continue
            running.discard(action.session_id)
            what = fate(plan, prompt_of[action.input_id], action.index, action.attempt)
            if kind == "ok":
                apply(tracker.succeeded(action.session_id, what.reward))
            elif kind == "fail":
                apply(tracker.failed(action.session_id, "planned failure"))
            else:
                apply(tracker.timed_out(action.session_id))
        for queue in (retries, initial):
            while queue and queue[0].session_id in stopped:
                queue.popleft()
        while tokens >= 1 - 1e-9 and (retries or initial) and len(running) < args.concurrency:
            action = (retries or initial).popleft()
            if action.session_id in stopped:
                continue
            tokens -= 1
            what = fate(plan, prompt_of[action.input_id], action.index, action.attempt)
            if what.kind == "hang" or what.duration > args.member_timeout:
                end, kind = now + args.member_timeout, "timeout"
            else:
                end, kind = now + what.duration, what.kind
            seq += 1
            heapq.heappush(ends, (end, seq, kind, action))
            running.add(action.session_id)
        candidates = [ends[0][0]] if ends else []
        waiting = (retries or initial) and len(running) < args.concurrency
        if waiting and tokens < 1:
            candidates.append(now + (1 - tokens) / rate)
        if not candidates:
            break
        later = max(min(candidates), now)
        tokens = min(burst, tokens + (later - now) * rate)
        now = later
    return {"wall_s": last, "first_group_s": first, "complete": ready, "dropped": dict(dropped)}


# --- the client (this process) ----------------------------------------------------------------


async def run_groups(
    args: argparse.Namespace, info: dict[str, Any], plan: dict[str, Any], redundancy: int
) -> dict[str, Any]:
    from agentcore_rl.client import AsyncRolloutClient, AwsConfig, Limits, Timeouts
    from agentcore_rl.groups import GroupRules

    payloads = [{"prompt": p, "plan": plan} for p in range(args.prompts)]
    async with AsyncRolloutClient(
        agent_url=info["agents"],
        s3_bucket=BUCKET,
        exp_id=f"bench-groups-{int(time.time())}-r{redundancy}",
        limits=Limits(max_concurrent_sessions=args.concurrency, tps=args.tps),
        timeouts=Timeouts(rollout=args.member_timeout, close=5.0),
        aws=AwsConfig(s3_endpoint_url=info["s3"]),
    ) as client:
        cpu0, t0 = cpu_seconds(), time.time()
        first: float | None = None
        complete = 0
        lags: list[float] = []
        async for group in client.run_groups(
            payloads, rules=GroupRules(n=args.n, redundancy=redundancy)
        ):
            complete += 1
            now = time.time()
            first = now - t0 if first is None else first
            # The last kept member's result written (agent clock) -> the group yielded.
            finished = [float(m.result["finished_at"]) for m in group.members if m.result]
            if finished:
                lags.append(now - max(finished))
        wall = time.time() - t0
        cpu = cpu_seconds() - cpu0
        counters = client.group_stats
        stats = client.stats
    best = ideal(args, plan, redundancy)
    started = counters.members_started
    return {
        "redundancy": redundancy,
        "groups": {
            "prompts": args.prompts,
            "complete": complete,
            "dropped": counters.groups_dropped,
            "resolved": counters.groups_ready + sum(counters.groups_dropped.values()),
            "ideal_complete": best["complete"],
            "ideal_dropped": best["dropped"],
        },
        "members": {
            "started": started,
            "succeeded": counters.members_succeeded,
            "failed": counters.members_failed,
            "timed_out": counters.members_timed_out,
            "retried": counters.members_retried,
            "stopped": counters.members_stopped,
            "dropped": counters.members_dropped,
        },
        "wall_s": round(wall, 2),
        "ideal_wall_s": round(best["wall_s"], 2),
        "wall_over_ideal": round(wall / best["wall_s"], 3) if best["wall_s"] else None,
        "first_group_s": None if first is None else round(first, 2),
        "ideal_first_group_s": best["first_group_s"] and round(best["first_group_s"], 2),
        "group_detection_lag_s": {
            "p50": None if not lags else round(percentile(lags, 50) or 0.0, 3),
            "p95": None if not lags else round(percentile(lags, 95) or 0.0, 3),
        },
        "client_cpu_s": round(cpu, 3),
        "client_cpu_ms_per_member": round(cpu / max(1, started) * 1000, 3),
        "invocations": stats.invocations,
        "stops": stats.stops,
        "s3_requests_per_member": round(stats.s3_total / max(1, started), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=128)
    parser.add_argument("--n", type=int, default=8, help="members per group")
    parser.add_argument("--redundancy", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--min-sleep", type=float, default=1.0)
    parser.add_argument("--max-sleep", type=float, default=10.0)
    parser.add_argument("--fail", type=float, default=0.10, help="share of attempts failing")
    parser.add_argument("--hang", type=float, default=0.05, help="share of attempts hanging")
    parser.add_argument("--member-timeout", type=float, default=20.0)
    parser.add_argument("--concurrency", type=int, default=2048)
    parser.add_argument("--tps", type=float, default=200.0)
    parser.add_argument("--agents", type=int, default=2)
    parser.add_argument("--seed", type=int, default=17)
    parser.add_argument("--verbose", action="store_true", help="show the stack's logs")
    parser.add_argument("--serve-stack", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.environ.update(LOCAL_AWS_ENV)
    if args.serve_stack:
        asyncio.run(serve_stack(args.agents))
        return
    plan = {
        "seed": args.seed,
        "min_sleep": args.min_sleep,
        "max_sleep": args.max_sleep,
        "fail": args.fail,
        "hang": args.hang,
    }
    report: dict[str, Any] = {
        "setup": {
            "prompts": args.prompts,
            "n": args.n,
            "sleep_s": [args.min_sleep, args.max_sleep],
            "fail": args.fail,
            "hang": args.hang,
            "member_timeout_s": args.member_timeout,
            "concurrency": args.concurrency,
            "tps": args.tps,
            "agents": args.agents,
            "python": sys.version.split()[0],
            "cpus": os.cpu_count(),
            "note": "agent servers and moto S3 run in a child process; CPU is the client's",
        },
        "runs": [],
    }
    for redundancy in args.redundancy:
        child, info = start_stack(args.agents, args.verbose)
        try:
            report["runs"].append(asyncio.run(run_groups(args, info, plan, redundancy)))
        finally:
            stop_stack(child)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
