"""Benchmark entering an ``AsyncRolloutClient`` whose runtime or S3 endpoint is wrong: each
case in a fresh process (a user's first entry loads the AWS service models), the bucket on
an embedded S3. Cases: nobody listens (refused), a name that does not resolve, a port that
takes no connection (its accept queue full: a host that drops packets). Prints one JSON
document: seconds from ``async with`` to the one-line error, per case and run.

Target: under 2 s each (``Timeouts.check``, 1 s, bounds connecting).

Example::

    python -m benchmarks.client_checks --runs 3
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import time

from agentcore_rl import AsyncRolloutClient, AwsConfig
from agentcore_rl.local.embedded_s3 import EmbeddedS3
from agentcore_rl.s3 import ResultStore

ARN = "arn:aws:bedrock-agentcore:us-west-2:123456789012:runtime/checks"


async def _enter(s3: str, runtime: str) -> float:
    started = time.monotonic()
    client = AsyncRolloutClient(
        agent_runtime_arn=ARN,
        s3_bucket="checks",
        exp_id="e",
        aws=AwsConfig(s3_endpoint_url=s3, endpoint_url=runtime),
    )
    with contextlib.suppress(Exception):
        async with client:
            raise SystemExit("entered: no endpoint was wrong")
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--enter", nargs=2, help=argparse.SUPPRESS)  # one case, in a child
    args = parser.parse_args()
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):  # no credential lookups
        os.environ.setdefault(name, "local")
    if args.enter:
        print(asyncio.run(_enter(*args.enter)))
        return
    with EmbeddedS3() as s3, socket.socket() as silent:
        asyncio.run(_bucket(s3.endpoint_url))
        silent.bind(("127.0.0.1", 0))
        silent.listen(0)
        fillers = [socket.socket() for _ in range(3)]
        for filler in fillers:
            filler.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                filler.connect(silent.getsockname())
        refused, quiet = "http://127.0.0.1:9", f"http://127.0.0.1:{silent.getsockname()[1]}"
        cases = {
            "runtime refused": (s3.endpoint_url, refused),
            "runtime name unresolved": (s3.endpoint_url, "http://no-such-host.invalid"),
            "runtime silent": (s3.endpoint_url, quiet),
            "s3 refused": (refused, refused),
            "s3 silent": (quiet, refused),
        }
        child = [sys.executable, "-m", "benchmarks.client_checks", "--enter"]
        seconds = {
            name: [
                round(float(subprocess.check_output([*child, *where])), 2) for _ in range(args.runs)
            ]
            for name, where in cases.items()
        }
        for filler in fillers:
            filler.close()
    print(json.dumps(seconds))


async def _bucket(endpoint: str) -> None:
    async with ResultStore(endpoint_url=endpoint, region_name="us-west-2") as store:
        await store.ensure_bucket("checks")


if __name__ == "__main__":
    main()
