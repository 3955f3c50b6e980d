"""Benchmark the agent server: accept latency under load, /ping latency under blocking work.

Runs the agent server under uvicorn in a separate process on 127.0.0.1 (with embedded S3
in this process) and drives it with httpx from here. Prints one JSON document:

- ``accept``: latency of ``POST /invocations`` (time to the ``processing`` answer) while
  ``--rollouts`` rollouts (async handlers holding until released) are in flight, sent
  open-loop at ``--rate`` per second (ACR allows 25-100 invocations/s per endpoint); next
  to it the saturation point: the highest open-loop rate among ``--saturation-rates``
  (``--saturation-seconds`` each) that the server keeps up with (at least 95% of the
  offered rate answered, p99 under a second), and the highest whose p99 stays within
  the 20 ms target; also the throughput and latency of
  filling the server with ``--ramp-concurrency`` clients.
- ``ping``: latency of ``GET /ping`` while ``--blocking`` sync handlers block in
  ``threading.Event.wait`` and ``--burners`` more burn CPU.

Targets on a 2-core machine: accept p99 <= 20 ms, ping p99 <= 100 ms.

Example::

    python benchmarks/server.py                        # full size
    python benchmarks/server.py --rollouts 50 --samples 50 --blocking 4 --pings 50
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import socket
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx

from agentcore_rl import protocol
from agentcore_rl.cli.summary import percentile
from agentcore_rl.local.embedded_s3 import EmbeddedS3
from agentcore_rl.s3 import ResultStore
from agentcore_rl.server.options import (
    DEFAULT_GIL_SWITCH_INTERVAL,
    FaultChecks,
    RequestLimits,
    ShutdownConfig,
)
from agentcore_rl.server.overload import serve_options

BUCKET = "bench-rollouts"
# Embedded S3 accepts any credentials; fixed fake ones keep real ones out of the picture.
LOCAL_AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "bench",
    "AWS_SECRET_ACCESS_KEY": "bench",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}


# --- the agent (runs in the child process) ---------------------------------------------------


def rss_bytes() -> int | None:
    """This process's resident memory now (Linux: /proc/self/statm), else None."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE")


def build_app(handler_kind: str, workers: int, switch_interval: float | None) -> Any:
    """The benchmarked agent: a rollout handler that holds until /bench/release."""
    from starlette.requests import Request
    from starlette.responses import JSONResponse

    from agentcore_rl.server import AgentCoreRLApp

    app = AgentCoreRLApp(
        shutdown=ShutdownConfig(grace=5),
        limits=RequestLimits(max_sync_workers=workers),
        faults=FaultChecks(gil_switch_interval=switch_interval),
    )
    release_sync = threading.Event()
    release_async: list[asyncio.Event] = []
    entered = {"count": 0}
    lock = threading.Lock()

    def mark_entered() -> None:
        with lock:
            entered["count"] += 1

    if handler_kind == "fast":

        @app.rollout_entrypoint
        async def fast(payload: dict[str, Any]) -> dict[str, Any]:
            mark_entered()
            return {"rewards": [1.0]}

    elif handler_kind == "async":

        @app.rollout_entrypoint
        async def hold(payload: dict[str, Any]) -> dict[str, Any]:
            mark_entered()
            if not release_async:
                release_async.append(asyncio.Event())
            await release_async[0].wait()
            return {"rewards": [1.0]}

    else:

        @app.rollout_entrypoint
        def work(payload: dict[str, Any]) -> dict[str, Any]:
            mark_entered()
            deadline = time.monotonic() + float(payload.get("max_seconds", 120))
            if payload.get("mode") == "burn":
                total = 0
                while not release_sync.is_set() and time.monotonic() < deadline:
                    total += sum(i * i for i in range(2000))
                return {"rewards": [float(total % 7)]}
            release_sync.wait(max(0.0, deadline - time.monotonic()))
            return {"rewards": [1.0]}

    async def release(request: Request) -> JSONResponse:
        release_sync.set()
        if release_async:
            release_async[0].set()
        return JSONResponse({"released": True})

    async def stats(request: Request) -> JSONResponse:
        return JSONResponse(
            {"active": app.runner.active, "entered": entered["count"], "rss_bytes": rss_bytes()}
        )

    app.add_route("/bench/release", release, methods=["POST"])
    app.add_route("/bench/stats", stats, methods=["GET"])
    return app


def serve(args: argparse.Namespace) -> None:
    import uvicorn

    app = build_app(args.handler, args.workers, args.switch_interval or None)
    # Served as app.run() serves: the GIL switch interval (--switch-interval) and uvicorn
    # options.
    app.tune_process()
    uvicorn.run(app, host="127.0.0.1", port=args.port, **serve_options({"log_level": "warning"}))


# --- the load generator (this process) -------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def summary(samples_s: list[float]) -> dict[str, float]:
    ms = sorted(s * 1000 for s in samples_s)
    if not ms:
        return {}

    def pct(q: float) -> float:
        value = percentile(ms, q)
        assert value is not None  # ms is not empty
        return round(value, 2)

    return {
        "n": len(ms),
        "p50_ms": pct(50),
        "p90_ms": pct(90),
        "p99_ms": pct(99),
        "max_ms": round(ms[-1], 2),
        "mean_ms": round(statistics.fmean(ms), 2),
    }


@contextlib.asynccontextmanager
async def agent_process(
    handler: str,
    workers: int,
    s3_endpoint: str,
    log_dir: Path,
    switch_interval: float,
) -> AsyncIterator[httpx.AsyncClient]:
    port = free_port()
    env = {**os.environ, **LOCAL_AWS_ENV, "AWS_ENDPOINT_URL_S3": s3_endpoint}
    log_path = log_dir / f"agent-{handler}.log"
    with log_path.open("wb") as log:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            __file__,
            "--serve",
            "--handler",
            handler,
            "--workers",
            str(workers),
            "--port",
            str(port),
            "--switch-interval",
            str(switch_interval),
            stdout=log,
            stderr=log,
            env=env,
        )
    limits = httpx.Limits(max_connections=256, max_keepalive_connections=256)
    http = httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", limits=limits, timeout=30)
    try:
        for _ in range(600):  # up to ~30 s for the child to import and bind
            if proc.returncode is not None:
                raise RuntimeError(f"agent exited early:\n{log_path.read_text()[-2000:]}")
            with contextlib.suppress(httpx.TransportError):
                if (await http.get("/ping")).status_code == 200:
                    break
            await asyncio.sleep(0.05)
        else:
            raise RuntimeError("agent did not start within 30 s")
        yield http
    finally:
        with contextlib.suppress(httpx.HTTPError):
            await http.post("/bench/release")
        await http.aclose()
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), 30)
            except asyncio.TimeoutError:
                proc.kill()
                await proc.wait()


def payload(i: int, **extra: Any) -> dict[str, Any]:
    return {
        **extra,
        protocol.ROLLOUT_FIELD: {
            protocol.EXP_ID: "bench",
            protocol.INPUT_ID: f"q-{i}",
            protocol.S3_BUCKET: BUCKET,
        },
    }


async def invoke_timed(http: httpx.AsyncClient, body: dict[str, Any]) -> float:
    start = time.perf_counter()
    response = await http.post(
        protocol.INVOCATIONS_PATH,
        json=body,
        headers={protocol.SESSION_ID_HEADER: protocol.new_session_id()},
    )
    elapsed = time.perf_counter() - start
    response.raise_for_status()
    return elapsed


async def bounded_gather(
    n: int, concurrency: int, make: Callable[[int], Awaitable[float]]
) -> list[float]:
    gate = asyncio.Semaphore(concurrency)

    async def one(i: int) -> float:
        async with gate:
            return await make(i)

    return list(await asyncio.gather(*(one(i) for i in range(n))))


async def wait_stats(http: httpx.AsyncClient, key: str, target: int, within: float) -> int:
    deadline = time.monotonic() + within
    value = 0
    while time.monotonic() < deadline:
        value = int((await http.get("/bench/stats")).json()[key])
        if value >= target:
            return value
        await asyncio.sleep(0.02)
    raise RuntimeError(f"{key} reached only {value} of {target} within {within} s")


async def open_loop(n: int, rate: float, make: Callable[[int], Awaitable[float]]) -> list[float]:
    """Start request i at i / rate seconds, whatever earlier ones are doing (as a paced
    trainer does), so the latency measured includes any queueing in the server."""
    loop = asyncio.get_running_loop()
    t0 = loop.time()

    async def one(i: int) -> float:
        await asyncio.sleep(max(0.0, t0 + i / rate - loop.time()))
        return await make(i)

    return list(await asyncio.gather(*(one(i) for i in range(n))))


ACCEPT_P99_TARGET_MS = 20.0


async def saturation(
    http: httpx.AsyncClient, rates: list[float], seconds: float, first_input: int
) -> dict[str, Any]:
    """Step the open-loop rate up until the server falls behind. Returns the last rate it
    kept up with (>= 95% of the offered rate answered, p99 under a second: no queue
    building up), the last rate whose p99 met the 20 ms target, and every step."""
    steps: list[dict[str, Any]] = []
    kept_up: float | None = None
    within_target: float | None = None
    next_input = first_input
    for rate in rates:
        n = max(1, int(rate * seconds))
        base = next_input
        next_input += n
        started = time.perf_counter()

        def send(i: int, base: int = base) -> Awaitable[float]:
            return invoke_timed(http, payload(base + i))

        samples = await open_loop(n, rate, send)
        achieved = n / (time.perf_counter() - started)
        latency = summary(samples)
        ok = achieved >= 0.95 * rate and latency["p99_ms"] < 1000
        steps.append(
            {"offered_per_s": rate, "achieved_per_s": round(achieved, 1), "ok": ok, **latency}
        )
        if not ok:
            break
        kept_up = rate
        if latency["p99_ms"] <= ACCEPT_P99_TARGET_MS:
            within_target = rate
    return {"saturation_per_s": kept_up, "within_target_per_s": within_target, "steps": steps}


async def bench_accept(args: argparse.Namespace, s3: str, logs: Path) -> dict[str, Any]:
    async with agent_process("async", 64, s3, logs, args.switch_interval) as http:
        started = time.perf_counter()
        ramp = await bounded_gather(
            args.rollouts, args.ramp_concurrency, lambda i: invoke_timed(http, payload(i))
        )
        ramp_seconds = time.perf_counter() - started
        in_flight = await wait_stats(http, "active", args.rollouts, 30)
        measured = await open_loop(
            args.samples, args.rate, lambda i: invoke_timed(http, payload(args.rollouts + i))
        )
        in_flight_after = int((await http.get("/bench/stats")).json()["active"])
        ping = (await http.get(protocol.PING_PATH)).json()["status"]
        rates = [float(r) for r in args.saturation_rates.split(",") if r.strip()]
        saturated = await saturation(
            http, rates, args.saturation_seconds, args.rollouts + args.samples
        )
    return {
        "in_flight_before": in_flight,
        "in_flight_after": in_flight_after,
        "ping_status": ping,
        "rate_per_s": args.rate,
        "latency": summary(measured),
        # Next to the latency: the highest rate the server keeps up with, and the highest
        # at which accept p99 stays within the 20 ms target.
        "saturation_per_s": saturated["saturation_per_s"],
        "within_target_per_s": saturated["within_target_per_s"],
        "saturation_steps": saturated["steps"],
        "ramp": {
            "concurrency": args.ramp_concurrency,
            "throughput_per_s": round(args.rollouts / ramp_seconds, 1),
            "latency": summary(ramp),
        },
    }


async def bench_ping(args: argparse.Namespace, s3: str, logs: Path) -> dict[str, Any]:
    workers = args.blocking + args.burners + 8
    async with agent_process("sync", workers, s3, logs, args.switch_interval) as http:
        total = args.blocking + args.burners
        await bounded_gather(
            total,
            32,
            lambda i: invoke_timed(
                http,
                payload(
                    i,
                    mode="burn" if i < args.burners else "block",
                    max_seconds=args.max_seconds,
                ),
            ),
        )
        await wait_stats(http, "entered", total, 30)
        samples: list[float] = []
        for _ in range(args.pings):
            start = time.perf_counter()
            response = await http.get(protocol.PING_PATH)
            samples.append(time.perf_counter() - start)
            assert response.json()["status"] == "HealthyBusy"
            await asyncio.sleep(args.ping_interval)
    return {
        "gil_switch_interval_s": args.switch_interval or sys.getswitchinterval(),
        "blocking_handlers": args.blocking,
        "cpu_burning_handlers": args.burners,
        "latency": summary(samples),
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    os.environ.update(LOCAL_AWS_ENV)
    os.environ.pop("AWS_PROFILE", None)
    with EmbeddedS3() as s3, tempfile.TemporaryDirectory() as tmp:
        async with ResultStore(endpoint_url=s3.endpoint_url) as store:
            await store.ensure_bucket(BUCKET)
            started = time.perf_counter()
            accept = await bench_accept(args, s3.endpoint_url, Path(tmp))
            ping = await bench_ping(args, s3.endpoint_url, Path(tmp))
            written = len(await store.list_keys(BUCKET, "bench/"))
        return {
            "benchmark": "agent_server",
            "cpus": os.cpu_count(),
            "python": sys.version.split()[0],
            "accept": accept,
            "ping": ping,
            "targets": {"accept_p99_ms": 20, "ping_p99_ms": 100},
            "meets_targets": {
                "accept": accept["latency"].get("p99_ms", 1e9) <= 20,
                "ping": ping["latency"].get("p99_ms", 1e9) <= 100,
            },
            "envelopes_written": written,
            "seconds": round(time.perf_counter() - started, 1),
        }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rollouts", type=int, default=500, help="rollouts held in flight")
    parser.add_argument("--samples", type=int, default=500, help="invocations measured")
    parser.add_argument(
        "--rate", type=float, default=100.0, help="invocations/s while measuring (ACR: 25-100)"
    )
    parser.add_argument(
        "--ramp-concurrency", type=int, default=64, help="client concurrency filling the server"
    )
    parser.add_argument(
        "--saturation-rates",
        default="50,100,150,200,300,400,600",
        help="open-loop rates (comma-separated, ascending) stepped through to find saturation",
    )
    parser.add_argument(
        "--saturation-seconds", type=float, default=3.0, help="seconds per saturation step"
    )
    parser.add_argument("--blocking", type=int, default=32, help="sync handlers that block")
    parser.add_argument("--burners", type=int, default=2, help="sync handlers that burn CPU")
    parser.add_argument("--pings", type=int, default=300, help="pings measured")
    parser.add_argument("--ping-interval", type=float, default=0.01)
    parser.add_argument("--max-seconds", type=float, default=120, help="handler safety limit")
    parser.add_argument("--timeout", type=float, default=300, help="bound on the whole run")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--handler", default="async", help=argparse.SUPPRESS)
    parser.add_argument("--workers", type=int, default=64, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument(
        "--switch-interval",
        type=float,
        default=DEFAULT_GIL_SWITCH_INTERVAL,
        help="the app's gil_switch_interval (0: leave Python's 5 ms default)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.serve:
        serve(args)
        return
    result = asyncio.run(asyncio.wait_for(run(args), args.timeout))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
