"""The ``agentcore-rl`` exit codes and an event-loop runner that turns Ctrl-C into a clean
shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from typing import Any, Final

from agentcore_rl.errors import ConfigurationError

__all__ = [
    "DEBUG_ENV",
    "EXIT_FAILURES",
    "EXIT_INTERNAL",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_TERMINATED",
    "EXIT_UNAVAILABLE",
    "EXIT_USAGE",
    "PROG",
    "cwd_importable",
    "import_object",
    "run_async",
]

PROG: Final = "agentcore-rl"
#: Set, an internal error shows its traceback.
DEBUG_ENV: Final = "AGENTCORE_RL_DEBUG"

EXIT_OK: Final = 0
EXIT_FAILURES: Final = 1
EXIT_USAGE: Final = 2
EXIT_UNAVAILABLE: Final = 3
EXIT_INTERNAL: Final = 4
EXIT_INTERRUPTED: Final = 130
EXIT_TERMINATED: Final = 143


def run_async(work: Callable[[], Awaitable[int]]) -> int:
    """Run ``work``; Ctrl-C/SIGTERM cancel it so every ``async with`` unwinds (130/143).
    A second Ctrl-C exits at once."""
    received: list[int] = []

    async def supervised() -> int:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None

        def on_signal(signum: int) -> None:
            received.append(signum)
            if len(received) > 1:
                # Nothing is left behind: files are flushed per line, servers are in-process.
                print(f"\n{PROG}: interrupted again; exiting at once", file=sys.stderr)
                sys.stderr.flush()
                os._exit(_exit_code(signum))
            print(
                f"\n{PROG}: interrupted; shutting down cleanly "
                "(press Ctrl-C again to exit at once)...",
                file=sys.stderr,
            )
            task.cancel()

        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(sig, on_signal, sig)
        try:
            return await work()
        except asyncio.CancelledError:
            if not received:
                raise
            return EXIT_INTERRUPTED  # the signal's own code is returned below
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                    loop.remove_signal_handler(sig)

    code = asyncio.run(supervised())
    return _exit_code(received[0]) if received else code


def _exit_code(signum: int) -> int:
    return EXIT_TERMINATED if signum == signal.SIGTERM else EXIT_INTERRUPTED


def cwd_importable() -> None:
    """Like ``python -m`` and uvicorn."""
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)


def import_object(target: str, what: str) -> Any:
    """The callable named by ``"package.module:attribute"`` (``what`` it should be, for the
    errors), the current directory importable; else ConfigurationError."""
    module_name, sep, attribute = target.partition(":")
    if not sep or not module_name or not attribute:
        raise ConfigurationError(f"{target!r} must look like 'package.module:attribute'")
    cwd_importable()
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise ConfigurationError(
            f"cannot import {module_name!r}: {exc} (run from the directory that contains it)"
        ) from None
    except Exception as exc:
        raise ConfigurationError(
            f"importing {module_name!r} failed: {type(exc).__name__}: {exc}"
        ) from exc
    value: Any = module
    for name in attribute.split("."):
        if not hasattr(value, name):
            raise ConfigurationError(f"module {module_name!r} has no attribute {attribute!r}")
        value = getattr(value, name)
    if not callable(value):
        raise ConfigurationError(f"{target} is not {what} (got {type(value).__name__})")
    return value
