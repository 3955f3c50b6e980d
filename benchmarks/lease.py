"""Benchmark the client lease: a trainer SIGKILLed with rollouts in flight leaves nothing running.

Three processes on 127.0.0.1: this one (embedded S3, the measurement), an agent server
(handlers that hold until cancelled; lease checks every ``--interval`` seconds) and a
trainer (an ``AsyncRolloutClient`` with a ``--ttl`` lease renewed every ``--renew``
seconds) that starts ``--rollouts`` rollouts and is then killed with SIGKILL. Prints one
JSON document:

- ``running_after_lease_plus_interval``: handlers still running ``ttl + interval``
  seconds after the kill (target 0; each handler's end is stamped by the agent);
- ``seconds_to_first_cancelled`` / ``seconds_to_all_cancelled`` /
  ``seconds_to_all_written``: from the kill until the first and the last handler was
  cancelled, and until the last ``cancelled`` envelope was written;
- ``lease_reads``: lease GETs the agent made (one per lease per interval).

Example::

    python benchmarks/lease.py                              # 2,000 rollouts, lease 10 s
    python benchmarks/lease.py --rollouts 200 --ttl 4 --interval 1
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script: make `benchmarks` importable
    sys.path.insert(0, str(ROOT))

from agentcore_rl.local.embedded_s3 import EmbeddedS3  # noqa: E402
from agentcore_rl.s3 import ResultStore  # noqa: E402
from benchmarks.server import BUCKET, LOCAL_AWS_ENV, free_port  # noqa: E402

# --- the agent (a child process) ---------------------------------------------------------


def serve(args: argparse.Namespace) -> None:
    import uvicorn
    from starlette.requests import Request
    from starlette.responses import JSONResponse

    from agentcore_rl.server import AgentCoreRLApp, FaultChecks, ShutdownConfig
    from agentcore_rl.server.overload import serve_options

    app = AgentCoreRLApp(
        shutdown=ShutdownConfig(grace=0),
        faults=FaultChecks(lease_interval=args.interval),
    )
    running = {"handlers": 0}
    exits: list[float] = []  # epoch seconds each handler ended (this machine's clock)

    @app.rollout_entrypoint
    async def hold(payload: dict[str, Any]) -> dict[str, Any]:
        running["handlers"] += 1
        try:
            await asyncio.Event().wait()
        finally:
            running["handlers"] -= 1
            exits.append(time.time())
        return {"rewards": [1.0]}

    async def stats(request: Request) -> JSONResponse:
        return JSONResponse(
            {
                "handlers": running["handlers"],
                "active": app.runner.active,
                "lease_reads": app.leases.reads,
                "lease_cancelled": app.leases.cancelled,
                "exits": exits if request.query_params.get("exits") else [],
            }
        )

    app.add_route("/bench/stats", stats, methods=["GET"])
    uvicorn.run(app, host="127.0.0.1", port=args.port, **serve_options({"log_level": "warning"}))


# --- the trainer (a child process, killed) -------------------------------------------------


async def train(args: argparse.Namespace) -> None:
    from agentcore_rl.client import AsyncRolloutClient, AwsConfig, Limits, LivenessConfig

    client = AsyncRolloutClient(
        agent_url=args.agent_url,
        s3_bucket=BUCKET,
        exp_id="lease-bench",
        aws=AwsConfig(s3_endpoint_url=os.environ["AWS_ENDPOINT_URL_S3"]),
        limits=Limits(max_concurrent_sessions=args.rollouts, tps=10_000.0),
        liveness=LivenessConfig(lease=args.ttl, lease_renew=args.renew),
    )
    async with client:
        futures = await asyncio.gather(*(client.invoke({"n": n}) for n in range(args.rollouts)))
        print("accepted", len(futures), flush=True)
        await asyncio.Event().wait()  # killed here, mid-batch


# --- the measurement (this process) --------------------------------------------------------


async def child(*argv: str, env: dict[str, str], log: Path) -> asyncio.subprocess.Process:
    with log.open("wb") as out:
        return await asyncio.create_subprocess_exec(
            sys.executable, __file__, *argv, stdout=asyncio.subprocess.PIPE, stderr=out, env=env
        )


async def stats(http: httpx.AsyncClient, *, exits: bool = False) -> dict[str, Any]:
    answer: dict[str, Any] = (
        await http.get("/bench/stats", params={"exits": "1"} if exits else None)
    ).json()
    return answer


async def run(args: argparse.Namespace) -> dict[str, Any]:
    os.environ.update(LOCAL_AWS_ENV)
    os.environ.pop("AWS_PROFILE", None)
    logs = Path(args.log_dir)
    with EmbeddedS3() as s3:
        async with ResultStore(endpoint_url=s3.endpoint_url) as store:
            await store.ensure_bucket(BUCKET)
            env = {**os.environ, "AWS_ENDPOINT_URL_S3": s3.endpoint_url}
            port = free_port()
            common = ["--ttl", str(args.ttl), "--renew", str(args.renew)]
            agent = await child(
                "--serve", "--port", str(port), "--interval", str(args.interval),
                env=env, log=logs / "lease-agent.log",
            )  # fmt: skip
            url = f"http://127.0.0.1:{port}"
            trainer: asyncio.subprocess.Process | None = None
            try:
                async with httpx.AsyncClient(base_url=url, timeout=30) as http:
                    for _ in range(600):
                        with contextlib.suppress(httpx.TransportError):
                            if (await http.get("/ping")).status_code == 200:
                                break
                        await asyncio.sleep(0.05)
                    trainer = await child(
                        "--train", "--agent-url", url, "--rollouts", str(args.rollouts), *common,
                        env=env, log=logs / "lease-trainer.log",
                    )  # fmt: skip
                    assert trainer.stdout is not None
                    line = await asyncio.wait_for(trainer.stdout.readline(), args.timeout)
                    if not line.startswith(b"accepted"):
                        raise RuntimeError(f"trainer failed: see {logs / 'lease-trainer.log'}")
                    # Another process's state: polled, there is nothing to wait on here.
                    while (await stats(http))["handlers"] < args.rollouts:  # noqa: ASYNC110
                        await asyncio.sleep(0.05)
                    # Epoch seconds: the agent stamps its handlers' ends with the same clock.
                    killed = time.time()
                    trainer.send_signal(signal.SIGKILL)
                    await trainer.wait()
                    written_at = None
                    while time.time() < killed + args.ttl + 10 * args.interval:
                        if (await stats(http))["active"] == 0:
                            written_at = time.time() - killed
                            break
                        await asyncio.sleep(0.05)
                    final = await stats(http, exits=True)
            finally:
                for proc in (trainer, agent):
                    if proc is not None and proc.returncode is None:
                        proc.send_signal(signal.SIGKILL if proc is trainer else signal.SIGTERM)
                        await proc.wait()
            keys = await store.list_keys(BUCKET, "lease-bench/")
            envelopes = sum(1 for key in keys if "/.leases/" not in key)
    deadline = killed + args.ttl + args.interval
    exits = final["exits"]
    late = sum(1 for t in exits if t > deadline) + final["handlers"]
    return {
        "benchmark": "client_lease",
        "cpus": os.cpu_count(),
        "rollouts": args.rollouts,
        "lease_ttl_s": args.ttl,
        "lease_renew_s": args.renew,
        "check_interval_s": args.interval,
        "running_after_lease_plus_interval": late,
        "seconds_to_first_cancelled": round(min(exits) - killed, 2) if exits else None,
        "seconds_to_all_cancelled": (
            round(max(exits) - killed, 2) if exits and not final["handlers"] else None
        ),
        "seconds_to_all_written": None if written_at is None else round(written_at, 2),
        "cancelled_by_lease": final["lease_cancelled"],
        "lease_reads": final["lease_reads"],
        "envelopes_in_s3": envelopes,
        "target": {"running_after_lease_plus_interval": 0},
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rollouts", type=int, default=2000, help="rollouts in flight")
    parser.add_argument("--ttl", type=float, default=10.0, help="the client's lease (s)")
    parser.add_argument("--renew", type=float, default=1.0, help="lease renewal period (s)")
    parser.add_argument("--interval", type=float, default=2.0, help="agent's lease checks (s)")
    parser.add_argument("--timeout", type=float, default=300, help="bound on starting rollouts")
    parser.add_argument("--log-dir", default="/tmp/agentcore-rl-bench", help="child logs")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--train", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--agent-url", default="", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.serve:
        serve(args)
    elif args.train:
        asyncio.run(train(args))
    else:
        Path(args.log_dir).mkdir(parents=True, exist_ok=True)
        print(json.dumps(asyncio.run(run(args)), indent=2))


if __name__ == "__main__":
    main()
