"""``python -m agentcore_rl.gateway --upstream URL [--upstream URL ...] --port 9000``.

A stand-alone gateway process until the ``agentcore-rl gateway`` CLI command lands (the CLI
is being reorganised; it will call :func:`serve` with the same options).

Example::

    python -m agentcore_rl.gateway --upstream http://127.0.0.1:8000/v1 --port 9000 \\
        --admin-token s3cret --sink-dir /var/lib/gateway/expired
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import uvicorn

from agentcore_rl.gateway.app import ADMIN_TOKEN_ENV, DEFAULT_SESSION_TTL, RolloutGateway
from agentcore_rl.gateway.sessions import DirectorySink


def parser() -> argparse.ArgumentParser:
    """The command line of the stand-alone gateway."""
    p = argparse.ArgumentParser(prog="python -m agentcore_rl.gateway", description=__doc__)
    p.add_argument("--upstream", action="append", required=True, help="OpenAI base URL (repeat)")
    p.add_argument("--backend", choices=["vllm", "sglang"], default="vllm")
    p.add_argument("--model", default=None, help="pin this model name on every call")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=9000)
    p.add_argument("--admin-token", default=None, help=f"or env {ADMIN_TOKEN_ENV}")
    p.add_argument("--session-ttl", type=float, default=DEFAULT_SESSION_TTL, help="seconds")
    p.add_argument("--sink-dir", default=None, help="persist expired sessions here")
    p.add_argument("--require-open", action="store_true", help="refuse sessions not opened")
    p.add_argument("--log-level", default="warning")
    return p


def serve(argv: Sequence[str] | None = None) -> None:
    """Parse ``argv`` and serve the gateway with uvicorn until interrupted."""
    args = parser().parse_args(argv)
    gateway = RolloutGateway(
        args.upstream,
        backend=args.backend,
        model=args.model,
        admin_token=args.admin_token,
        session_ttl=args.session_ttl,
        sink=DirectorySink(args.sink_dir) if args.sink_dir else None,
        require_open=args.require_open,
    )
    uvicorn.run(
        gateway,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        access_log=False,
        lifespan="on",
        backlog=4096,
        timeout_keep_alive=300,
    )


if __name__ == "__main__":
    serve(sys.argv[1:])
