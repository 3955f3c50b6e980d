"""Client CPU per AWS call: the generic aiobotocore path against the lean one, per operation.

A CHILD process serves moto S3, a trivial agent and the local AgentCore Runtime in front
of it, so the CPU measured here is the calling side's alone. For each operation
(GetObject hit and miss, a ListObjectsV2 page, InvokeAgentRuntime, StopRuntimeSession)
each path makes ``--calls`` signed requests with ``--concurrency`` in flight; the paths
alternate ``--rounds`` times and the best round counts (the machine may be shared).
Prints one JSON document: CPU microseconds per call for each path and their ratio, and
for two operations the transport floor (one pre-signed request resent through the lean
path's HTTP pool, ``agentcore_rl._http1`` through ``agentcore_rl.aws.wire``): what is left
once signing is free.

Example::

    python benchmarks/aws_calls.py                       # 2,000 calls per operation and path
    python benchmarks/aws_calls.py --calls 200 --rounds 1
    python benchmarks/aws_calls.py --profile lean:GetObject   # cProfile of one cell, to stderr
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import json
import os
import pstats
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from aiobotocore.config import AioConfig
from aiobotocore.session import get_session
from botocore.exceptions import ClientError

BUCKET = "bench-calls"
LISTED = 100  # keys on the listed page
ARN = "arn:aws:bedrock-agentcore:us-west-2:123456789012:runtime/local-agent"
LOCAL_AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "bench",
    "AWS_SECRET_ACCESS_KEY": "bench",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}
# The library's generic clients (ResultStore, AcrTransport): one attempt, no extras.
GENERIC = AioConfig(
    retries={"total_max_attempts": 1},
    parameter_validation=False,
    request_checksum_calculation="when_required",
    response_checksum_validation="when_required",
    max_pool_connections=64,
)


async def serve_stack() -> None:
    """moto + a trivial agent + the local runtime; print their URLs; run until stdin closes."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    from agentcore_rl.local.background import BackgroundServer
    from agentcore_rl.local.embedded_s3 import EmbeddedS3
    from agentcore_rl.local.runtime import LocalAgentCoreRuntime

    async def invoke(request: Request) -> JSONResponse:
        await request.body()
        return JSONResponse({"status": "processing"})

    async def stop(request: Request) -> JSONResponse:
        return JSONResponse({"stopped": True})

    agent_app = Starlette(
        routes=[
            Route("/invocations", invoke, methods=["POST"]),
            Route("/sessions/{sid}/stop", stop, methods=["POST"]),
        ]
    )
    s3 = EmbeddedS3().start()
    async with get_session().create_client("s3", endpoint_url=s3.endpoint_url) as client:
        await client.create_bucket(Bucket=BUCKET)
        for i in range(LISTED):
            await client.put_object(Bucket=BUCKET, Key=f"exp/{i:05d}.json", Body=b'{"r": 1}')
    async with BackgroundServer(agent_app, backlog=1024) as agent:
        runtime = LocalAgentCoreRuntime({ARN: [agent.url]}, tps=None, max_connections=256)
        async with BackgroundServer(runtime, backlog=1024, one_write=True) as server:
            print(json.dumps({"s3": s3.endpoint_url, "runtime": server.url}), flush=True)
            await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    s3.stop()


Call = Callable[[int], Awaitable[Any]]


async def generic_calls(s3: Any, acr: Any) -> dict[str, Call]:
    # Each path invokes, then stops, its own sessions: every stop finds a live session.
    async def read(response: Any, field: str) -> bytes:
        async with response[field] as stream:
            data: bytes = await stream.read()
        return data

    async def get_hit(i: int) -> bytes:
        return await read(
            await s3.get_object(Bucket=BUCKET, Key=f"exp/{i % LISTED:05d}.json"), "Body"
        )

    async def get_miss(i: int) -> None:
        with contextlib.suppress(ClientError):
            await s3.get_object(Bucket=BUCKET, Key=f"exp/missing-{i}.json")

    async def list_page(i: int) -> list[str]:
        page = await s3.list_objects_v2(Bucket=BUCKET, Prefix="exp/")
        return [item["Key"] for item in page.get("Contents", ())]

    async def invoke(i: int) -> bytes:
        response = await acr.invoke_agent_runtime(
            agentRuntimeArn=ARN,
            runtimeSessionId=f"generic-session-{i:030d}",
            payload=b'{"prompt": "hi"}',
            contentType="application/json",
            accept="application/json",
        )
        return await read(response, "response")

    async def stop(i: int) -> None:
        with contextlib.suppress(ClientError):  # a 404 for a stopped session is fine
            await acr.stop_runtime_session(
                agentRuntimeArn=ARN, runtimeSessionId=f"generic-session-{i:030d}"
            )

    return {
        "GetObject": get_hit,
        "GetObject(miss)": get_miss,
        f"ListObjectsV2({LISTED} keys)": list_page,
        "InvokeAgentRuntime": invoke,
        "StopRuntimeSession": stop,
    }


async def lean_calls(s3: Any, acr: Any) -> dict[str, Call]:
    from agentcore_rl.aws import LeanAgentCore, LeanS3

    reader = await LeanS3.create(s3)
    runtime = await LeanAgentCore.create(acr, ARN)

    async def get_miss(i: int) -> None:
        with contextlib.suppress(ClientError):
            await reader.get_object(BUCKET, f"exp/missing-{i}.json")

    async def stop(i: int) -> None:
        with contextlib.suppress(ClientError):
            await runtime.stop(f"lean-session-{i:030d}")

    return {
        "GetObject": lambda i: reader.get_object(BUCKET, f"exp/{i % LISTED:05d}.json"),
        "GetObject(miss)": get_miss,
        f"ListObjectsV2({LISTED} keys)": lambda i: reader.list_objects_v2(BUCKET, "exp/"),
        "InvokeAgentRuntime": lambda i: runtime.invoke(
            f"lean-session-{i:030d}", b'{"prompt": "hi"}'
        ),
        "StopRuntimeSession": stop,
    }


async def measure(call: Call, calls: int, concurrency: int) -> tuple[float, float]:
    """CPU and wall microseconds per call for ``calls`` calls, ``concurrency`` at a time."""
    limit = asyncio.Semaphore(concurrency)

    async def one(i: int) -> None:
        async with limit:
            await call(i)

    cpu0, t0 = time.process_time(), time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(calls)))
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - t0
    return cpu / calls * 1e6, wall / calls * 1e6


async def transport_floor(s3: Any, acr: Any, args: argparse.Namespace) -> dict[str, float]:
    """CPU per call of resending one already-signed request through the lean HTTP pool:
    what the lean path pays for the connection, the loop and the kernel."""
    from agentcore_rl.aws import LeanAgentCore, LeanS3
    from agentcore_rl.aws.http import LeanHttp, join_url

    floor: dict[str, float] = {}
    runtime = await LeanAgentCore.create(acr, ARN)
    signed = await runtime._signer.sign(
        "POST",
        runtime.invoke_url,
        {"X-Amzn-Bedrock-AgentCore-Runtime-Session-Id": "floor-session-" + "0" * 30},
        b'{"prompt": "hi"}',
    )
    http = LeanHttp.from_client(acr)

    async def invoke(i: int) -> Any:
        return await http.send("POST", runtime.invoke_url, signed, b'{"prompt": "hi"}')

    reader = await LeanS3.create(s3)
    route = await reader._route(BUCKET)
    assert route.signer is not None
    url = join_url(route.base_url, "/exp/00000.json")
    signed_get = await route.signer.sign("GET", url, {}, b"")
    s3_http = LeanHttp.from_client(s3)

    async def get(i: int) -> Any:
        return await s3_http.send("GET", url, signed_get, b"")

    for name, call in (("InvokeAgentRuntime", invoke), ("GetObject", get)):
        await measure(call, args.concurrency, args.concurrency)
        rounds = [
            (await measure(call, args.calls, args.concurrency))[0] for _ in range(args.rounds)
        ]
        floor[name] = round(min(rounds), 1)
    return floor


def _keep_timestamp(value: str) -> str:
    return value


async def run(args: argparse.Namespace, info: dict[str, Any]) -> dict[str, Any]:
    session = get_session()
    # As the library's watcher does (lean_s3_session): listed timestamps stay strings.
    session.get_component("response_parser_factory").set_parser_defaults(
        timestamp_parser=_keep_timestamp
    )
    async with (
        session.create_client("s3", endpoint_url=info["s3"], config=GENERIC) as s3,
        session.create_client(
            "bedrock-agentcore",
            region_name="us-west-2",
            endpoint_url=info["runtime"],
            config=GENERIC,
        ) as acr,
    ):
        paths = {"generic": await generic_calls(s3, acr), "lean": await lean_calls(s3, acr)}
        for calls in paths.values():  # warm-up: connections, endpoint resolution, imports
            for call in calls.values():
                await asyncio.gather(*(call(i) for i in range(args.concurrency)))
        best: dict[str, dict[str, list[float]]] = {p: {} for p in paths}
        for _ in range(args.rounds):
            for op in paths["generic"]:
                for path, calls in paths.items():
                    profile = (
                        cProfile.Profile(time.process_time)
                        if args.profile == f"{path}:{op}"
                        else None
                    )
                    if profile is not None:
                        profile.enable()
                    cpu, wall = await measure(calls[op], args.calls, args.concurrency)
                    if profile is not None:
                        profile.disable()
                        pstats.Stats(profile, stream=sys.stderr).sort_stats("tottime").print_stats(
                            25
                        )
                    previous = best[path].get(op)
                    if previous is None or cpu < previous[0]:
                        best[path][op] = [cpu, wall]
        floor = await transport_floor(s3, acr, args)
    table: dict[str, Any] = {}
    for op in paths["generic"]:
        generic, lean = best["generic"][op], best["lean"][op]
        table[op] = {
            "generic_cpu_us": round(generic[0], 1),
            "lean_cpu_us": round(lean[0], 1),
            "lean_over_generic": round(lean[0] / generic[0], 3),
            "generic_wall_us": round(generic[1], 1),
            "lean_wall_us": round(lean[1], 1),
        }
        if op in floor:
            table[op]["transport_floor_cpu_us"] = floor[op]
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000, help="calls per operation and path")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3, help="alternations; the best counts")
    parser.add_argument("--profile", default=None, help="PATH:OPERATION to profile")
    parser.add_argument("--serve-stack", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.environ.update(LOCAL_AWS_ENV)
    if args.serve_stack:
        asyncio.run(serve_stack())
        return
    child = subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), "--serve-stack"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env={**os.environ, **LOCAL_AWS_ENV},
        text=True,
    )
    assert child.stdin is not None
    assert child.stdout is not None
    try:
        line = child.stdout.readline()
        if not line:
            raise RuntimeError("the stack process exited before starting")
        table = asyncio.run(run(args, json.loads(line)))
    finally:
        child.stdin.close()
        try:
            child.wait(30)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait(10)
    report = {
        "setup": {
            "calls": args.calls,
            "concurrency": args.concurrency,
            "rounds": args.rounds,
            "python": sys.version.split()[0],
            "note": "moto, the agent and the local runtime run in a child process; "
            "CPU is this (calling) process's, best of the rounds",
        },
        "per_call": table,
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
