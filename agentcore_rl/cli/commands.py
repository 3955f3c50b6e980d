"""The ``agentcore-rl`` commands: each takes parsed arguments and returns an exit code;
errors are raised and mapped to exit codes by :func:`agentcore_rl.cli.main`."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import fields
from pathlib import Path
from typing import Any

from agentcore_rl import protocol
from agentcore_rl._extras import require
from agentcore_rl.cli.common import (
    EXIT_FAILURES,
    EXIT_OK,
    PROG,
    cwd_importable,
    import_object,
    run_async,
)

# Light modules only at the top: `serve` must run with just the `server` extra.
from agentcore_rl.cli.cost import Prices
from agentcore_rl.cli.eval_config import EvalOptions, load_inputs
from agentcore_rl.cli.journal import EvalJournal
from agentcore_rl.cli.show import load_run, render, write_example
from agentcore_rl.cli.summary import EvalRun
from agentcore_rl.cli.summary import render as render_summary
from agentcore_rl.errors import ConfigurationError, InfraFailureRateError

__all__ = [
    "cmd_demo",
    "cmd_eval",
    "cmd_gateway",
    "cmd_local_runtime",
    "cmd_report",
    "cmd_serve",
    "cmd_show",
    "cmd_up",
    "print_run",
]


_LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def _serve_asgi(
    app: Any, host: str, port: int, log_level: str, banner: str, **uvicorn_options: Any
) -> int:
    # lazy: the server extra
    import uvicorn

    from agentcore_rl.local.background import bound_socket
    from agentcore_rl.server.overload import serve_options

    # A no-op where the program set up logging already.
    logging.basicConfig(level=log_level.upper(), format=_LOG_FORMAT)
    sock = bound_socket(host, port)
    print(banner, file=sys.stderr)
    try:
        # uvicorn owns SIGINT/SIGTERM: the lifespan shutdown gives rollouts their grace.
        options = serve_options({"log_level": log_level, **uvicorn_options})
        server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, **options))
        server.run(sockets=[sock])
    finally:
        sock.close()
    return EXIT_OK


def cmd_serve(args: argparse.Namespace) -> int:
    # lazy: the server extra
    from agentcore_rl.server import AgentCoreRLApp

    app = import_object(args.target, "an ASGI app")
    if isinstance(app, AgentCoreRLApp):
        app.tune_process()  # the app owns this process
    banner = f"{PROG}: serving {args.target} on http://{args.host}:{args.port}"
    return _serve_asgi(app, args.host, args.port, args.log_level, banner)


def cmd_local_runtime(args: argparse.Namespace) -> int:
    # lazy: a command imports only what it runs
    from agentcore_rl.local.runtime import DEFAULT_AGENT_RUNTIME_ARN, LocalAgentCoreRuntime

    arn = args.arn or DEFAULT_AGENT_RUNTIME_ARN
    runtime = LocalAgentCoreRuntime({arn: list(args.agent_url)}, tps=args.tps)
    banner = (
        f"{PROG}: local AgentCore Runtime for {arn}\n"
        f"  agents: {', '.join(args.agent_url)}\n"
        f"  use it: export AWS_ENDPOINT_URL_BEDROCK_AGENTCORE=http://{args.host}:{args.port}"
    )
    return _serve_asgi(runtime, args.host, args.port, args.log_level, banner)


def cmd_gateway(args: argparse.Namespace) -> int:
    # lazy: the gateway extra
    from agentcore_rl.gateway import ADMIN_TOKEN_ENV, DirectorySink, GatewayOptions, RolloutGateway

    render = _render_mode(args)
    try:
        gateway = RolloutGateway(
            args.upstream,
            backend=args.backend,
            model=args.model,
            admin_token=args.admin_token or os.environ.get(ADMIN_TOKEN_ENV) or None,
            sink=DirectorySink(args.sink_dir) if args.sink_dir else None,
            render=render,
            options=GatewayOptions(session_ttl=args.session_ttl, require_open=args.require_open),
        )
    except ValueError as exc:
        raise ConfigurationError(str(exc)) from None
    admin = "on" if gateway.admin_token else "off (no --admin-token)"
    banner = (
        f"{PROG}: rollout gateway on http://{args.host}:{args.port} -> "
        f"{', '.join(gateway.upstreams)} ({gateway.backend.name}, {render or 'proxy mode'}); "
        f"admin routes {admin}\n"
        f"  agents: base_url=http://{args.host}:{args.port}/sessions/<session id>/v1"
    )
    # The hot path (docs/gateway.md): keep-alive longer than an agent's think time.
    return _serve_asgi(
        gateway,
        args.host,
        args.port,
        args.log_level,
        banner,
        loop="auto",
        access_log=False,
        lifespan="on",
        backlog=4096,
        timeout_keep_alive=300,
        limit_concurrency=args.max_connections,
    )


def _render_mode(args: argparse.Namespace) -> Any:
    """``--history linear``'s RenderMode (None in proxy mode)."""
    if args.history == "proxy":
        if args.tokenizer or args.tool_call_parser or args.reasoning_parser:
            raise ConfigurationError(
                "--tokenizer, --tool-call-parser and --reasoning-parser need --history linear"
            )
        return None
    if not args.tokenizer:
        raise ConfigurationError("--history linear needs --tokenizer DIR (the model's tokenizer)")
    # lazy: the render extra
    from agentcore_rl.gateway.render.mode import RenderMode

    try:
        return RenderMode.load(
            args.tokenizer,
            backend=args.backend,
            tool_call_parser=args.tool_call_parser,
            reasoning_parser=args.reasoning_parser,
        )
    except (ValueError, ImportError, OSError) as exc:
        raise ConfigurationError(str(exc)) from None


def _parse_params(pairs: list[str]) -> dict[str, Any]:
    # These have options of their own (--exp-id, --base-url...).
    reserved = {protocol.EXP_ID, protocol.INPUT_ID, protocol.S3_BUCKET}
    reserved |= {protocol.BASE_URL, protocol.MODEL_ID}
    params: dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        key = key.strip()
        if not sep or not key.isidentifier():
            raise ConfigurationError(f"--param {pair!r} must look like KEY=VALUE")
        if key in reserved:
            raise ConfigurationError(
                f"--param {key}=... is not a free _rollout field; use the command's own "
                "option for it (see --help)"
            )
        try:
            params[key] = json.loads(text)
        except ValueError:
            params[key] = text
    return params


def print_run(run: EvalRun, *, title: str) -> dict[str, Any]:
    """Print the summary of the whole results file (after ``--resume`` too); return its figures."""
    out = run.out
    assert out is not None
    data = load_run(out, partial=True)
    figures = data.summary()
    print(f"\n{title}")
    print(render_summary(figures, run))
    print(f"results: {out.resolve()}")
    if run.trajectories is not None:
        print(f"trajectories: {run.trajectories.resolve()}")
    example = write_example(data)
    if example is not None:
        print(f"one rollout to look at: {example.resolve()} (any other: {PROG} show)")
    return figures


async def _run_and_report(
    execute: Callable[[EvalRun], Awaitable[object]], *, title: str, on_interrupt: str = ""
) -> int:
    """Run ``execute``, print its summary (also when interrupted), return the exit code."""
    run = EvalRun()
    try:
        await execute(run)
    except asyncio.CancelledError:
        if run.out is not None:
            print_run(run, title=f"{title} (interrupted)")
        if on_interrupt:
            print(f"{PROG}: {on_interrupt}", file=sys.stderr)
        raise
    except InfraFailureRateError:
        if run.out is not None:
            print_run(run, title=f"{title} (stopped: its infrastructure is failing)")
        raise
    figures = print_run(run, title=title)
    return EXIT_FAILURES if figures["failed"] or figures["timeout"] else EXIT_OK


def cmd_eval(args: argparse.Namespace) -> int:
    level = args.log_level or ("info" if args.verbose else "warning")
    logging.basicConfig(level=level.upper(), format=_LOG_FORMAT)
    # lazy: the client extra
    from agentcore_rl.cli.eval import run_eval
    from agentcore_rl.client.config import GATEWAY_TOKEN_ENV

    if args.resume and not args.exp_id:
        raise ConfigurationError("--resume needs --exp-id: the one of the run to continue")
    if args.agent_runtime_arn is None and not args.agent_url:
        _target_up(args)
    elif args.s3_bucket is None:
        raise ConfigurationError("--s3-bucket is needed: the bucket your agent writes results to")
    token = args.gateway_admin_token
    if args.gateway_url is not None and not token:
        token = os.environ.get(GATEWAY_TOKEN_ENV) or None
    exp_id = args.exp_id or time.strftime("eval-%Y%m%d-%H%M%S")
    # The options the parser names as EvalOptions does, then those it names or holds otherwise.
    same = {f.name: getattr(args, f.name) for f in fields(EvalOptions) if hasattr(args, f.name)}
    options = EvalOptions(
        **{
            **same,
            "exp_id": exp_id,
            "data": Path(args.data),
            "out": Path(args.out or f"results-{exp_id}.jsonl"),
            "agent_urls": tuple(args.agent_url or ()),
            "runtime_endpoint_url": args.endpoint_url,
            "rollout_extra": _parse_params(args.param),
            "gateway_admin_token": token,
            "prices": Prices.parse(args.price),
        }
    )
    if options.gateway_url is not None and token is None:
        raise ConfigurationError(
            "--gateway-url needs the gateway's admin token: --gateway-admin-token T "
            f"(or env {GATEWAY_TOKEN_ENV})"
        )
    if options.agent_runtime_arn is not None:
        protocol.parse_runtime_arn(options.agent_runtime_arn)
    # Usage errors before touching the network.
    inputs = load_inputs(options.data, limit=options.limit)
    EvalJournal.check(options.out, resume=options.resume)

    async def work() -> int:
        return await _run_and_report(
            lambda run: run_eval(options, inputs, run, progress=not args.no_progress),
            title=f"eval {options.exp_id}",
            on_interrupt="stopped; continue with the same command and --resume",
        )

    return run_async(work)


def _target_up(args: argparse.Namespace) -> None:
    """Aim ``args`` at the stack ``agentcore-rl up`` runs (its options fill what is unset)."""
    # lazy: the local extra
    from agentcore_rl.local.stack import running_stack

    stack = running_stack()
    args.agent_runtime_arn = stack["agent_runtime_arn"]
    args.s3_bucket = args.s3_bucket or stack["s3_bucket"]
    args.endpoint_url = args.endpoint_url or stack["aws"].endpoint_url
    args.s3_endpoint_url = args.s3_endpoint_url or stack["aws"].s3_endpoint_url
    args.model_id = args.model_id or stack["rollout"].get("model_id")
    if "gateway" in stack and args.base_url is None and args.gateway_url is None:
        args.gateway_url = stack["gateway"].url
        args.gateway_admin_token = stack["gateway"].admin_token
    elif args.gateway_url is None:
        args.base_url = args.base_url or stack["rollout"].get("base_url")


def cmd_demo(args: argparse.Namespace) -> int:
    # Checked before anything prints or starts.
    require("local", f"{PROG} demo", "moto", "a2wsgi", "openai", "orjson", "httpx", "tqdm")
    from agentcore_rl.cli.demo import run_demo

    cwd_importable()
    if args.out:
        EvalJournal.check(Path(args.out), resume=False)
    return run_async(lambda: _run_and_report(lambda run: run_demo(args, run), title="demo summary"))


def cmd_up(args: argparse.Namespace) -> int:
    require("local", f"{PROG} up", "moto", "a2wsgi", "httpx", "aiohttp")
    from agentcore_rl.cli.up import run_up

    cwd_importable()
    return run_async(lambda: run_up(args))


def _prices(args: argparse.Namespace) -> Prices | None:
    return Prices.parse(args.price) if args.price else None  # else as the run had it


def cmd_show(args: argparse.Namespace) -> int:
    rollout = load_run(Path(args.results), _prices(args)).find(args.input_id)
    color = sys.stdout.isatty() and not os.environ.get("NO_COLOR")
    try:
        print(render(rollout, color=color))
    except BrokenPipeError:  # `show ... | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return EXIT_OK


def cmd_report(args: argparse.Namespace) -> int:
    require("report", f"{PROG} report", "jinja2", "matplotlib")
    # lazy: the report extra
    from agentcore_rl.cli.report import build_report

    results = Path(args.results)
    out = Path(args.out) if args.out else results.with_name(results.stem + ".report.html")
    if not out.parent.is_dir():
        raise ConfigurationError(f"cannot write {out}: {out.parent} is not a directory")
    if args.tokenizer:
        if not Path(args.tokenizer).is_dir():
            raise ConfigurationError(f"--tokenizer: {args.tokenizer} is not a directory")
        require("render", f"{PROG} report --tokenizer", "transformers")
    compare = Path(args.compare) if args.compare else None
    html = build_report(results, compare=compare, prices=_prices(args), tokenizer=args.tokenizer)
    out.write_text(html, "utf-8")
    print(f"report: {out.resolve()}")
    return EXIT_OK
