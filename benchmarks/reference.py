"""Side by side with the reference toolkit's client (agentcore-rl-toolkit 0.1.3), over ACR.

Both clients run the same rollouts (seeded durations of ``--min``..``--max`` seconds) against
the same agent, the reference toolkit's own ``AgentCoreRLApp`` sleeping for the payload's
``duration``, reached through this project's local AgentCore Runtime stand-in (no TPS quota
of its own: each client paces itself at ``--tps``). Each client gets a fresh stack (embedded
S3, runtime stand-in, agent server) and runs in its own process, so the CPU and RSS measured
are the client's alone. The reference runs from its own venv (its dependencies conflict with
ours), created on first use in ``.bench/ref-venv`` unless ``--ref-python`` names one.

Prints one JSON line per client, then one line of comparisons:

- ``wall_over_ideal``: the time until the last result is in the caller's hands over a
  zero-latency schedule of the same durations under the same rate and concurrency, in
  which every stop call takes a token too, after any invocation that could use it (both
  clients stop each finished session: it holds a microVM). The reference stops a session
  before handing its result over; ours stops in the background, and the stops still queued
  when the last result arrives are sent when the client closes (``close_s``);
- ``s3_reads_per_rollout``: S3 requests the client sent (HEAD, GET, LIST; retries count);
- ``detection_s``: the agent's ``finished_at`` (just before its PUT) to the client handing
  the result over, p50 and p95;
- ``client_cpu_s``: user+system CPU of the client's process (threads included), from
  making the client to closing it, and ``cpu_ours_over_reference``.

Example::

    python benchmarks/reference.py                                  # 1,000 x 5-30 s, 500 live
    python benchmarks/reference.py --n 200 --concurrency 100 --min 2 --max 6
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import resource
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
REF_VENV = REPO / ".bench" / "ref-venv"
REF_PACKAGES = (
    ["--no-deps", "agentcore-rl-toolkit==0.1.3"],
    ["bedrock-agentcore", "boto3", "uvicorn"],
)
ARN = "arn:aws:bedrock-agentcore:us-east-1:123456789012:runtime/bench_agent"
BUCKET = "bench-reference"
# The stack is local: fixed fake credentials keep real ones out of the picture.
LOCAL_AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "bench",
    "AWS_SECRET_ACCESS_KEY": "bench",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}
ROLLOUT_TIMEOUT = 600.0


def durations(args: argparse.Namespace) -> list[float]:
    rng = random.Random(args.seed)
    return [rng.uniform(args.min, args.max) for _ in range(args.n)]


def summary(
    name: str,
    wall: float,
    cpu: float,
    latencies: list[float],
    reads: dict[str, int],
    acr: dict[str, int],
    n: int,
) -> dict[str, Any]:
    """One client's line; percentiles by nearest rank (no project import: the reference's
    venv runs this too)."""
    latencies.sort()

    def rank(p: float) -> float | None:
        if not latencies:
            return None
        return round(latencies[min(len(latencies) - 1, int(p / 100 * len(latencies)))], 3)

    total = sum(reads.values())
    return {
        "client": name,
        "rollouts": n,
        "ok": len(latencies),
        "wall_s": round(wall, 2),
        "client_cpu_s": round(cpu, 2),
        "acr_calls": acr,
        "s3_reads": reads,
        "s3_reads_per_rollout": round(total / max(n, 1), 3),
        "detection_s": {"p50": rank(50), "p95": rank(95), "max": rank(100)},
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


# --- the two clients (each in a process of its own) ----------------------------------------


async def drive_ours(args: argparse.Namespace) -> dict[str, Any]:
    from agentcore_rl import AsyncRolloutClient, Limits

    payloads = [{"duration": d} for d in durations(args)]
    latencies: list[float] = []
    cpu0, t0 = time.process_time(), time.time()
    client = AsyncRolloutClient(
        agent_runtime_arn=ARN,
        s3_bucket=BUCKET,
        exp_id=f"ours-{int(t0)}",
        limits=Limits(max_concurrent_sessions=args.concurrency, tps=args.tps),
    )
    async with client:
        async for item in client.run_batch(payloads, timeout=ROLLOUT_TIMEOUT):
            if item.success and item.result is not None:
                latencies.append(time.time() - float(item.result["finished_at"]))
        wall = time.time() - t0
    cpu = time.process_time() - cpu0
    stats = client.stats
    reads = {op: n for op, n in stats.s3_requests.items() if op != "PutObject"}
    acr = {"InvokeAgentRuntime": stats.invocations, "StopRuntimeSession": stats.stops}
    line = summary("agentcore-rl", wall, cpu, latencies, reads, acr, args.n)
    line["close_s"] = round(time.time() - t0 - wall, 2)  # the stops not yet sent
    return line


def drive_reference(args: argparse.Namespace) -> dict[str, Any]:
    from agentcore_rl_toolkit import RolloutClient

    payloads = [{"duration": d} for d in durations(args)]
    latencies: list[float] = []
    cpu0, t0 = time.process_time(), time.time()
    client = RolloutClient(
        agent_runtime_arn=ARN,
        s3_bucket=BUCKET,
        exp_id=f"ref-{int(t0)}",
        max_pool_connections=args.concurrency,
        tps_limit=int(args.tps),
    )
    reads: dict[str, int] = {}
    acr: dict[str, int] = {}

    def counter(into: dict[str, int]) -> Any:
        def count(event_name: str, **_: Any) -> None:
            op = event_name.rsplit(".", 1)[-1]
            into[op] = into.get(op, 0) + 1

        return count

    client.s3_client.meta.events.register("before-send.s3", counter(reads))
    client.agentcore_client.meta.events.register("before-send.bedrock-agentcore", counter(acr))

    async def run() -> None:
        batch = client.run_batch_async(
            payloads, max_concurrent_sessions=args.concurrency, timeout=ROLLOUT_TIMEOUT
        )
        async for item in batch:
            if item.success:
                latencies.append(time.time() - float(item.result["finished_at"]))

    asyncio.run(run())
    wall, cpu = time.time() - t0, time.process_time() - cpu0
    return summary("reference-0.1.3", wall, cpu, latencies, reads, acr, args.n)


# --- the stack: S3 and the runtime stand-in (ours), the agent (the reference's) ------------


async def serve_stack(agent_url: str) -> None:
    from agentcore_rl.local.background import BackgroundServer
    from agentcore_rl.local.embedded_s3 import EmbeddedS3
    from agentcore_rl.local.runtime import LocalAgentCoreRuntime
    from agentcore_rl.s3 import ResultStore

    with EmbeddedS3() as s3:
        async with ResultStore(endpoint_url=s3.endpoint_url) as store:
            await store.ensure_bucket(BUCKET)
        runtime = LocalAgentCoreRuntime({ARN: [agent_url]}, tps=None, max_connections=1024)
        async with BackgroundServer(runtime, backlog=4096) as server:
            print(json.dumps({"s3": s3.endpoint_url, "runtime": server.url}), flush=True)
            # The parent closes the pipe when done.
            await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
            server.shutdown_timeout = 2.0
        await runtime.aclose()


def serve_agent(port: int) -> None:
    import uvicorn
    from agentcore_rl_toolkit import AgentCoreRLApp

    app = AgentCoreRLApp()

    @app.rollout_entrypoint  # type: ignore[untyped-decorator]
    async def rollout(payload: dict[str, Any]) -> dict[str, Any]:
        await asyncio.sleep(float(payload["duration"]))
        return {"rewards": [1.0], "finished_at": time.time()}

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", backlog=4096)


# --- the parent --------------------------------------------------------------------------------


def ensure_reference_venv() -> Path:
    python = REF_VENV / "bin" / "python"
    if not python.exists():
        print(f"creating {REF_VENV} (once)", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", str(REF_VENV)], check=True)
        for packages in REF_PACKAGES:
            subprocess.run([str(python), "-m", "pip", "install", "-q", *packages], check=True)
    return python


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_for(url: str, proc: subprocess.Popen[Any], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the agent server exited ({proc.returncode}) before answering")
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"{url} did not answer in {timeout} s")


def run_one(which: str, args: argparse.Namespace, ref_python: Path) -> dict[str, Any]:
    """A fresh stack, one client over it, the stack stopped; the client's line."""
    env = {**os.environ, **LOCAL_AWS_ENV}
    me = str(Path(__file__).resolve())
    agent_port = free_port()
    agent_url = f"http://127.0.0.1:{agent_port}"
    quiet = None if args.verbose else subprocess.DEVNULL
    stack = subprocess.Popen(
        [sys.executable, me, "--serve-stack", agent_url],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=quiet,
        env=env,
        text=True,
    )
    agent: subprocess.Popen[Any] | None = None
    try:
        assert stack.stdout is not None
        info = json.loads(stack.stdout.readline())
        env["AWS_ENDPOINT_URL_S3"] = info["s3"]
        env["AWS_ENDPOINT_URL_BEDROCK_AGENTCORE"] = info["runtime"]
        agent = subprocess.Popen(
            [str(ref_python), me, "--serve-agent", str(agent_port)], env=env, stderr=quiet
        )
        wait_for(f"{agent_url}/ping", agent)
        python = str(ref_python) if which == "reference" else sys.executable
        flags = ["--n", str(args.n), "--concurrency", str(args.concurrency)]
        flags += ["--min", str(args.min), "--max", str(args.max), "--tps", str(args.tps)]
        flags += ["--seed", str(args.seed)]
        out = subprocess.run(
            [python, me, "--drive", which, *flags], env=env, capture_output=True, text=True
        )
        if out.returncode != 0:
            raise SystemExit(f"the {which} client failed:\n{out.stderr[-3000:]}")
        line: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
        return line
    finally:
        if agent is not None:
            agent.terminate()
            agent.wait(10)
        if stack.stdin is not None:
            stack.stdin.close()
        stack.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=1000, help="rollouts")
    parser.add_argument("--concurrency", type=int, default=500, help="sessions live at once")
    parser.add_argument("--min", type=float, default=5.0, help="shortest rollout, seconds")
    parser.add_argument("--max", type=float, default=30.0, help="longest rollout, seconds")
    parser.add_argument("--tps", type=float, default=25.0, help="ACR calls per second")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--only", choices=["ours", "reference"], help="run one client only")
    parser.add_argument("--ref-python", type=Path, help="a python with the reference installed")
    parser.add_argument("--verbose", action="store_true", help="show the stack's logs")
    parser.add_argument("--drive", choices=["ours", "reference"], help=argparse.SUPPRESS)
    parser.add_argument("--serve-stack", metavar="AGENT_URL", help=argparse.SUPPRESS)
    parser.add_argument("--serve-agent", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.drive == "ours":
        print(json.dumps(asyncio.run(drive_ours(args))))
        return
    if args.drive == "reference":
        print(json.dumps(drive_reference(args)))
        return
    if args.serve_stack:
        asyncio.run(serve_stack(args.serve_stack))
        return
    if args.serve_agent:
        serve_agent(args.serve_agent)
        return

    sys.path.insert(0, str(REPO))
    from benchmarks.rollouts import ideal_wall

    ref_python = args.ref_python or ensure_reference_venv()
    ideal = ideal_wall(durations(args), args.concurrency, args.tps, args.tps, True)
    lines: dict[str, dict[str, Any]] = {}
    for which in ("reference", "ours"):
        if args.only in (None, which):
            line = run_one(which, args, ref_python)
            line["ideal_wall_s"] = round(ideal, 2)
            line["wall_over_ideal"] = round(line["wall_s"] / ideal, 3)
            lines[which] = line
            print(json.dumps(line), flush=True)
    compared: dict[str, Any] = {
        "setup": {
            "rollouts": args.n,
            "concurrency": args.concurrency,
            "duration_s": [args.min, args.max],
            "tps": args.tps,
            "transport": "acr",
        }
    }
    for which, line in lines.items():
        compared[which] = {
            "wall_over_ideal": line["wall_over_ideal"],
            "s3_reads_per_rollout": line["s3_reads_per_rollout"],
            "detection_p50_s": line["detection_s"]["p50"],
            "detection_p95_s": line["detection_s"]["p95"],
            "client_cpu_s": line["client_cpu_s"],
        }
    if len(lines) == 2 and lines["reference"]["client_cpu_s"]:
        cpu = lines["ours"]["client_cpu_s"] / lines["reference"]["client_cpu_s"]
        compared["cpu_ours_over_reference"] = round(cpu, 3)
    print(json.dumps(compared))


if __name__ == "__main__":
    main()
