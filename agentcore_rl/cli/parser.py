"""The ``agentcore-rl`` parser: each command's options, checked as they are parsed."""

from __future__ import annotations

import argparse
import difflib
from collections.abc import Callable, Sequence
from typing import Final, NoReturn, TypeVar

from agentcore_rl import __version__, protocol
from agentcore_rl.cli.common import DEBUG_ENV, EXIT_USAGE, PROG

__all__ = ["COMMANDS", "EXIT_CODES_HELP", "build_parser"]


class _Parser(argparse.ArgumentParser):
    """argparse, but a bad argument is one clear line, a mistyped option with the closest."""

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        parsed, extras = super().parse_known_args(args, namespace)
        if extras:
            guesses = [
                close[0]
                for extra in extras
                if extra.startswith("-")
                and (
                    close := difflib.get_close_matches(
                        extra.split("=")[0], self._option_string_actions, 1
                    )
                )
            ]
            hint = f" (did you mean {', '.join(guesses)}?)" if guesses else ""
            self.error(f"unrecognized arguments: {' '.join(extras)}{hint}")
        return parsed, extras

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


EXIT_CODES_HELP: Final = (
    "exit codes: 0 ok; 1 some rollouts failed or timed out; 2 usage error (a bad argument "
    "or data file, a missing extra); 3 a service is unreachable or refuses us (S3, the "
    "agent, the runtime, the gateway, a port in use); 4 internal error (a bug; "
    f"{DEBUG_ENV}=1 shows the traceback); 130 interrupted (143 on SIGTERM)"
)

_N = TypeVar("_N", int, float)
_LEVELS: Final = ["critical", "error", "warning", "info", "debug"]


def _number(
    convert: Callable[[str], _N], kind: str, accept: Callable[[_N], bool], rule: str
) -> Callable[[str], _N]:
    """An argparse ``type=`` that parses a number and checks its range."""

    def parse(text: str) -> _N:
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {kind}, got {text!r}") from None
        # "not accepted" so that NaN is refused.
        if not accept(value):
            raise argparse.ArgumentTypeError(f"must be {rule}, got {text}")
        return value

    return parse


_positive_int = _number(int, "a whole number", lambda v: v >= 1, ">= 1")
_positive_float = _number(float, "a number", lambda v: v > 0, "> 0")
_fraction = _number(float, "a number", lambda v: 0 <= v <= 1, "between 0 and 1")
_non_negative_float = _number(float, "a number", lambda v: v >= 0, ">= 0")
_non_negative_int = _number(int, "a whole number", lambda v: v >= 0, ">= 0")
_port = _number(int, "a port number", lambda v: 0 <= v <= 65535, "0-65535")


_share = _number(float, "a share or off", lambda v: 0 < v <= 1, "in (0, 1]")


def _share_or_off(text: str) -> float | None:
    return None if text == "off" else _share(text)


def _url(text: str) -> str:
    if not text.startswith(("http://", "https://")) or len(text) < 10:
        raise argparse.ArgumentTypeError(f"expected an http(s):// URL, got {text!r}")
    return text.rstrip("/")


def _tps(text: str) -> float | None:
    """0 means no limit."""
    value = _non_negative_float(text)
    return None if value == 0 else value


def _add_price(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--price",
        metavar="NAME=USD",
        action="append",
        default=[],
        help="a price for the cost estimate: vcpu_hour (default 0.0895), gb_hour (default "
        "0.00945; AgentCore Runtime's rates), input_mtok, output_mtok (per million prompt / "
        "completion tokens; unset: not priced)",
    )


def _add_run(
    parser: argparse.ArgumentParser, tps: float, tps_help: str, base_url: str, out: str
) -> None:
    parser.add_argument(
        "--concurrency", type=_positive_int, default=32, help="rollouts in flight (default 32)"
    )
    parser.add_argument("--tps", type=_tps, default=tps, help=tps_help)
    parser.add_argument("--base-url", type=_url, help=base_url)
    parser.add_argument("--model-id", help="model id put in every _rollout block")
    parser.add_argument("--out", metavar="FILE", help=out)
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    _add_price(parser)


def _add_server(parser: argparse.ArgumentParser, port: int, log_level: str) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="interface (default 127.0.0.1)")
    parser.add_argument("--port", type=_port, default=port, help=f"port (default {port})")
    parser.add_argument(
        "--log-level",
        default=log_level,
        choices=_LEVELS,
        help=f"uvicorn log level (default {log_level})",
    )


def _eval(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("data", metavar="DATA.jsonl", help="inputs, one JSON object per line")
    target = parser.add_mutually_exclusive_group()
    target.add_argument(
        "--agent-runtime-arn",
        metavar="ARN",
        help=f"AgentCore runtime ARN (without it or --agent-url: the stack {PROG} up runs)",
    )
    target.add_argument(
        "--agent-url",
        metavar="URL",
        action="append",
        type=_url,
        help="agent server URL (HTTP transport); repeat to spread sessions over several",
    )
    parser.add_argument(
        "--s3-bucket", help="bucket the agent writes results to (needed with a target option)"
    )
    parser.add_argument(
        "--exp-id",
        help="experiment id, the S3 key prefix (default eval-YYYYMMDD-HHMMSS; --resume needs it)",
    )
    _add_run(
        parser,
        protocol.DEFAULT_TPS,
        f"invoke+stop calls per second (default {protocol.DEFAULT_TPS:g}, ACR's quota; "
        "0 = no limit)",
        "policy URL put in every _rollout block",
        "results file NAME.jsonl (default results-<exp-id>.jsonl); its journal "
        "is NAME.jsonl.journal, its trajectories NAME.trajectories.jsonl",
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue the run that wrote --out: skip finished inputs, resume in-flight "
        "rollouts by session id (see above)",
    )
    parser.add_argument(
        "--timeout",
        type=_positive_float,
        default=900.0,
        help="seconds one rollout may take (default 900)",
    )
    parser.add_argument(
        "--param",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        help="extra _rollout field (VALUE parsed as JSON if it can be), e.g. temperature=0.7",
    )
    parser.add_argument("--limit", type=_positive_int, help="only the first N inputs")
    parser.add_argument(
        "--retry-lost",
        type=_non_negative_int,
        metavar="N",
        help="run an input again in a new session when its agent crashed or restarted, "
        "up to N times (default: the client's, 5; 0: record the loss)",
    )
    parser.add_argument(
        "--retry-rollouts",
        type=_non_negative_int,
        metavar="N",
        help="run an input again in a new session when the agent could not be reached or "
        "kept refusing, up to N times (default: the client's, 2)",
    )
    parser.add_argument(
        "--infra-stop",
        type=_share_or_off,
        default=0.2,
        metavar="SHARE",
        help="stop the run once infrastructure failures (agent lost, invocations failing, "
        "results unwritten...) pass SHARE of the last 100 rollouts (default 0.2; off: never)",
    )
    parser.add_argument(
        "--gateway-url",
        type=_url,
        help="run every rollout through this rollout gateway (agentcore-rl gateway) and write "
        "the trajectories beside --out (FILE.trajectories.jsonl); replaces --base-url",
    )
    parser.add_argument(
        "--gateway-admin-token",
        metavar="T",
        help="the gateway's admin token (default: env AGENTCORE_RL_GATEWAY_ADMIN_TOKEN)",
    )
    parser.add_argument(
        "--group-size",
        type=_positive_int,
        help="run each input as a GRPO group of N rollouts; the summary shows pass@1 / "
        "pass@N and group statistics, and NAME.groups.jsonl beside --out NAME.jsonl gets "
        "the training rows",
    )
    parser.add_argument(
        "--redundancy",
        type=_non_negative_int,
        default=0,
        help="with --group-size: start N+R members, keep the first N (default 0)",
    )
    parser.add_argument(
        "--pass-threshold",
        type=float,
        metavar="R",
        help="with --group-size: a member passes (pass@k) when its reward is at least R "
        "(default: above 0)",
    )
    parser.add_argument(
        "--group-seed",
        type=int,
        metavar="S",
        help="with --group-size: give member i the _rollout.seed S+i, so that an agent "
        "passing it to its model samples each member differently (default: no seed)",
    )
    parser.add_argument("--log-level", choices=_LEVELS, help="log level (default warning)")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at info level")
    parser.add_argument(
        "--s3-endpoint-url", type=_url, help="S3-compatible endpoint (default: AWS_ENDPOINT_URL_S3)"
    )
    parser.add_argument(
        "--endpoint-url",
        type=_url,
        help="AgentCore endpoint (default: AWS_ENDPOINT_URL_BEDROCK_AGENTCORE or AWS's own)",
    )


def _demo(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--n", type=_positive_int, default=200, help="problems to run (default 200)"
    )
    _add_run(
        parser,
        100.0,
        "local runtime's invoke+stop quota per second (default 100; 0 = no limit)",
        "use this OpenAI-compatible server (e.g. vLLM at http://host:8000/v1) instead of the "
        "stand-in policy",
        "results file (default ~/.local/state/agentcore-rl/demo/results.jsonl, emptied at "
        "each start; a temp dir without a home)",
    )
    parser.add_argument(
        "--accuracy",
        type=_fraction,
        default=0.8,
        help="how often the stand-in policy answers right (0-1, default 0.8)",
    )
    parser.add_argument(
        "--latency",
        type=_non_negative_float,
        default=0.05,
        help="seconds the stand-in policy takes per request (default 0.05)",
    )
    parser.add_argument(
        "--no-gateway",
        action="store_true",
        help="let the agents call the policy directly instead of through the rollout gateway "
        "(which captures every call's tokens and writes the trajectories)",
    )


def _up(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "app", metavar="MODULE:APP", help="your agent app, importable from this directory"
    )
    parser.add_argument(
        "--agents", type=_positive_int, default=2, help="agent servers to run (default 2)"
    )
    policy = parser.add_mutually_exclusive_group()
    policy.add_argument(
        "--policy",
        metavar="MODULE:FUNC",
        help="the stand-in policy says what FUNC(messages, tools, seed=, temperature=) "
        "returns (a str, a list of tool calls or an assistant message; docs/local.md) "
        "instead of its math answers",
    )
    policy.add_argument(
        "--upstream",
        type=_url,
        metavar="URL",
        help="a real OpenAI-compatible server (e.g. vLLM at http://gpu1:8000/v1) instead of "
        "the stand-in",
    )
    parser.add_argument("--model", help="with --upstream: the model id given to the agents")
    parser.add_argument(
        "--bucket", help="the embedded S3's bucket for results (default agentcore-rl-local)"
    )
    parser.add_argument(
        "--tps",
        type=_tps,
        default=100.0,
        help="local runtime's invoke+stop quota per second (default 100; 0 = no limit)",
    )


def _serve(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", metavar="module:app", help="where the app object lives")
    _add_server(parser, 8080, "info")


def _local_runtime(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--agent-url",
        metavar="URL",
        action="append",
        type=_url,
        required=True,
        help="agent server URL; repeat for several",
    )
    _add_server(parser, 8081, "info")
    parser.add_argument(
        "--tps",
        type=_tps,
        default=protocol.DEFAULT_TPS,
        help=f"invoke+stop quota per second (default {protocol.DEFAULT_TPS:g})",
    )
    parser.add_argument("--arn", help="the runtime ARN it answers to (default: a local one)")


def _gateway(parser: argparse.ArgumentParser) -> None:
    # lazy: only the gateway's parser reads these names
    from agentcore_rl.gateway.render.parsers import REASONING_PARSERS, TOOL_PARSERS

    parser.add_argument(
        "--upstream",
        metavar="URL",
        action="append",
        type=_url,
        required=True,
        help="OpenAI base URL of the inference server (e.g. http://gpu1:8000/v1); repeat for "
        "replicas (a session sticks to one)",
    )
    parser.add_argument(
        "--backend",
        choices=["vllm", "sglang"],
        default="vllm",
        help="the inference server's kind: how token ids and logprobs are asked for and "
        "read (default vllm)",
    )
    parser.add_argument("--model", help="pin this model name on every call")
    parser.add_argument(
        "--history",
        choices=["proxy", "linear"],
        default="proxy",
        help="proxy: the server renders the chat template and the gateway records what it fed "
        "the model (default); linear: the gateway renders with --tokenizer, keeps each "
        "session's earlier turns as the ids served and calls the server token-in (vLLM "
        "/completions under --upstream; SGLang /generate under --upstream, its root URL)",
    )
    parser.add_argument(
        "--tokenizer",
        metavar="DIR",
        help="the model's Hugging Face tokenizer directory (tokenizer.json, tokenizer_config.json "
        "with its chat template); needed by --history linear",
    )
    parser.add_argument(
        "--tool-call-parser",
        choices=sorted(TOOL_PARSERS),
        help="linear history: how tool calls are read from completions (vLLM's names)",
    )
    parser.add_argument(
        "--reasoning-parser",
        choices=sorted(REASONING_PARSERS),
        help="linear history: how reasoning is split from content (vLLM's names)",
    )
    _add_server(parser, 9000, "warning")
    parser.add_argument(
        "--admin-token",
        help="token of the admin routes (default: env AGENTCORE_RL_GATEWAY_ADMIN_TOKEN; "
        "without one they answer 403)",
    )
    parser.add_argument(
        "--session-ttl",
        type=_positive_float,
        default=8 * 3600.0,
        help="seconds after which an idle session expires (default 28800)",
    )
    parser.add_argument("--sink-dir", metavar="DIR", help="persist expired sessions here")
    parser.add_argument(
        "--require-open", action="store_true", help="refuse sessions the client did not open"
    )
    parser.add_argument(
        "--max-connections",
        type=_positive_int,
        metavar="N",
        help="connections and requests served at once (uvicorn's limit_concurrency): past "
        "it requests are answered 503 (default: no limit)",
    )


def _show(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("results", metavar="RESULTS.jsonl", help="an eval or demo results file")
    parser.add_argument("input_id", metavar="INPUT_ID", help="input id, ID#member or session id")
    _add_price(parser)


def _report(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("results", metavar="RESULTS.jsonl", help="an eval or demo results file")
    parser.add_argument("--compare", metavar="OTHER.jsonl", help="a second run, side by side")
    parser.add_argument(
        "-o", "--out", metavar="FILE", help="where to write it (default: RESULTS.report.html)"
    )
    parser.add_argument(
        "--tokenizer",
        metavar="DIR",
        help="the model's Hugging Face tokenizer directory (the 'render' extra): tokens shown "
        "as text where the trajectories carry none (default: as ids)",
    )
    _add_price(parser)


#: Each command: its options, its extra ("": the missing part's), help and description.
COMMANDS: Final[dict[str, tuple[Callable[[argparse.ArgumentParser], None], str, str, str]]] = {
    "demo": (
        _demo,
        "local",
        "run the whole stack on this machine: 200 math problems through the ACR path",
        "Start embedded S3, a scripted stand-in policy (not a language model), the math "
        "example agent on two servers, a local AgentCore Runtime and the rollout gateway in "
        "this process, run the problems over the ACR transport and print a summary; "
        "everything stops on exit or Ctrl-C.",
    ),
    "eval": (
        _eval,
        "cli",
        "evaluate a JSONL dataset against an agent (AgentCore Runtime or HTTP)",
        "Run every input of DATA (one JSON object per line, sent as the payload; its "
        "'input_id' or 'id' field names it) through the agent and write one line per outcome "
        "to --out. --resume continues an interrupted run: finished inputs are skipped, "
        "rollouts in flight resumed by session id, stopped or lost ones run again.",
    ),
    "up": (
        _up,
        "local",
        "run the whole local stack around your agent until Ctrl-C",
        "Start embedded S3 with its bucket, the stand-in policy (or --upstream), the rollout "
        "gateway, your agent (MODULE:APP) on --agents servers and a local AgentCore Runtime "
        "in this process, say what runs where and stay in the foreground until Ctrl-C. "
        f"'{PROG} eval DATA.jsonl' without a target option runs against it.",
    ),
    "serve": (
        _serve,
        "server",
        "serve an agent app (module:app) with uvicorn",
        "Serve an ASGI app, typically an AgentCoreRLApp, e.g. "
        "'agentcore-rl serve examples.math_agent.agent:app'. The current directory is "
        "importable. The default host is 127.0.0.1 (this machine only); in a container "
        "use --host 0.0.0.0 so that AgentCore Runtime can reach port 8080.",
    ),
    "local-runtime": (
        _local_runtime,
        "cli",
        "serve a local AgentCore Runtime stand-in in front of agent servers",
        "Answer the AgentCore data plane (InvokeAgentRuntime, StopRuntimeSession) for one "
        "runtime ARN and forward each session to one of the agent servers. Point clients "
        "at it with AWS_ENDPOINT_URL_BEDROCK_AGENTCORE=http://HOST:PORT.",
    ),
    "gateway": (
        _gateway,
        "gateway",
        "serve the token-capturing rollout gateway in front of vLLM/SGLang",
        "An OpenAI-compatible proxy that files every model call (prompt and completion "
        "token ids, logprobs) under its rollout's session; agents call "
        "http://HOST:PORT/sessions/<session id>/v1. See docs/gateway.md.",
    ),
    "show": (
        _show,
        "",
        "one rollout of a results file in the terminal: transcript, tokens, envelope",
        "Print one rollout of an eval or demo run (see docs/cli.md).",
    ),
    "report": (
        _report,
        "report",
        "a run report: one self-contained HTML file (opens offline)",
        "Write the run's summary, charts, inputs and rollouts as one HTML file that opens "
        "offline (see docs/cli.md). Needs the 'report' extra.",
    ),
}


def build_parser() -> argparse.ArgumentParser:
    """The ``agentcore-rl`` argument parser.

    Example::

        args = build_parser().parse_args(["serve", "examples.math_agent.agent:app"])
    """
    parser = _Parser(
        prog=PROG,
        description="Train and evaluate LLM agents with RL while they run as HTTP services.",
        epilog=EXIT_CODES_HELP,
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    commands.required = True
    for name, (add_options, _, summary, description) in COMMANDS.items():
        command = commands.add_parser(
            name, help=summary, description=description, epilog=EXIT_CODES_HELP
        )
        add_options(command)
    return parser
