"""``agentcore-rl``: run the command the parser names, and map its errors to exit codes
(docs/cli.md).

Errors are one line on stderr, never a traceback (unless ``AGENTCORE_RL_DEBUG=1``).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence

from agentcore_rl._extras import install_hint, is_ours
from agentcore_rl.cli.common import (
    DEBUG_ENV,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    PROG,
)
from agentcore_rl.cli.parser import COMMANDS, build_parser
from agentcore_rl.errors import (
    ConfigurationError,
    GatewayError,
    InfraFailureRateError,
    InvalidPayloadError,
    InvocationError,
    StorageError,
)

__all__ = ["main"]


def _fail(message: str, code: int) -> int:
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return code


def _fail_missing(exc: BaseException, command: str | None) -> int:
    module = (getattr(exc, "name", None) or "").split(".")[0]
    extra = (COMMANDS[command][1] if command else "") or getattr(exc, "extra", None) or "cli"
    what = f"'{PROG} {command}'" if command else PROG
    return _fail(
        f"{what} needs the '{extra}' extra (module {module!r} is not installed): "
        f"{install_hint(extra)}",
        EXIT_USAGE,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` (default ``sys.argv[1:]``), run the command, return the exit code.

    Example::

        raise SystemExit(main(["demo", "--n", "20"]))
    """
    try:
        parser = build_parser()
    except ModuleNotFoundError as exc:
        if not is_ours(exc):
            raise
        return _fail_missing(exc, None)
    arguments = sys.argv[1:] if argv is None else list(argv)
    if not arguments:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        args = parser.parse_args(arguments)
    except SystemExit as exc:  # argparse printed it
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    try:
        # lazy: the CLI starts fast and --help works without extras
        from agentcore_rl.cli import commands

        handler: Callable[[argparse.Namespace], int] = getattr(
            commands, "cmd_" + args.command.replace("-", "_")
        )
        return handler(args)
    except KeyboardInterrupt:
        print(f"\n{PROG}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except (ConfigurationError, InvalidPayloadError) as exc:
        return _fail(str(exc), EXIT_USAGE)
    except (StorageError, InvocationError, GatewayError, InfraFailureRateError, OSError) as exc:
        return _fail(str(exc), EXIT_UNAVAILABLE)
    except Exception as exc:  # a bug
        if is_ours(exc):  # a missing extra
            return _fail_missing(exc, args.command)
        if os.environ.get(DEBUG_ENV):
            raise
        return _fail(
            f"unexpected {type(exc).__name__}: {exc} (set {DEBUG_ENV}=1 for the traceback)",
            EXIT_INTERNAL,
        )
