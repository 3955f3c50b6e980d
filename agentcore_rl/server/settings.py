"""The agent server's defaults, environment variable names and listening-host rule.

Example::

    from agentcore_rl.server.settings import DEFAULT_SHUTDOWN_GRACE, default_host

    app = AgentCoreRLApp(shutdown=ShutdownConfig(grace=2 * DEFAULT_SHUTDOWN_GRACE))
    app.run(host=default_host())
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final

from agentcore_rl.errors import ConfigurationError
from agentcore_rl.server.parsing import ALLOWED_BUCKETS_ENV

__all__ = [
    "ALLOWED_BUCKETS_ENV",
    "APP_NAME_ENV",
    "DEFAULT_GIL_SWITCH_INTERVAL",
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_MAX_SYNC_WORKERS",
    "DEFAULT_SHUTDOWN_GRACE",
    "DEFAULT_STOP_WAIT",
    "HOST_ENV",
    "SPOOL_DIR_ENV",
    "app_name_from_env",
    "app_spool_dir",
    "check_app_name",
    "default_host",
    "default_spool_dir",
    "handler_app_name",
]

#: ACR accepts payloads up to 100 MB; so does the server unless told otherwise.
DEFAULT_MAX_BODY_BYTES: Final = 100 * 1024 * 1024
#: Seconds running rollouts get to finish at shutdown before they are cancelled.
DEFAULT_SHUTDOWN_GRACE: Final = 20.0
#: Worker threads for sync handlers (more than anyio's default of 40, since rollout
#: handlers mostly wait on a model server).
DEFAULT_MAX_SYNC_WORKERS: Final = 64
#: Seconds a stop request waits for the stopped rollouts' envelopes to be written.
DEFAULT_STOP_WAIT: Final = 5.0

#: Seconds between GIL hand-offs set at startup. Python's default (5 ms) lets two threads
#: that burn CPU hold the event loop off the GIL long enough that /ping answers take
#: 100+ ms; 1 ms keeps them near 10 ms (see benchmarks/server.py).
DEFAULT_GIL_SWITCH_INTERVAL: Final = 0.001

_NAME: Final = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,63}")

#: Directory for envelopes S3 refused (default: :func:`default_spool_dir`).
SPOOL_DIR_ENV: Final = "AGENTCORE_RL_SPOOL_DIR"
#: A name for the agent: its default spool directory is a subdirectory of that name.
APP_NAME_ENV: Final = "AGENTCORE_RL_APP_NAME"
#: Interface :meth:`AgentCoreRLApp.run` listens on when no host is passed.
HOST_ENV: Final = "AGENTCORE_RL_HOST"


def default_host() -> str:
    """``$AGENTCORE_RL_HOST``, else ``0.0.0.0`` inside a container, else ``127.0.0.1``.

    A container is recognised by ``DOCKER_CONTAINER`` in the environment (AWS's AgentCore
    starter Dockerfiles set it), ``/.dockerenv`` or ``/run/.containerenv``. Outside one,
    the server only listens on loopback so a laptop does not expose the agent.
    """
    host = os.environ.get(HOST_ENV, "").strip()
    if host:
        return host
    in_container = bool(os.environ.get("DOCKER_CONTAINER")) or any(
        Path(p).exists() for p in ("/.dockerenv", "/run/.containerenv")
    )
    return "0.0.0.0" if in_container else "127.0.0.1"


def check_app_name(name: str) -> str:
    """``name`` if it can name an app (and its spool directory), else ConfigurationError."""
    if not _NAME.fullmatch(name):
        raise ConfigurationError(
            f"app name {name!r}: use 1-64 letters, digits, '.', '_' or '-' (it names a directory)"
        )
    return name


def app_name_from_env(environ: Mapping[str, str] = os.environ) -> str | None:
    """``$AGENTCORE_RL_APP_NAME`` (checked), or ``None`` when unset."""
    name = environ.get(APP_NAME_ENV, "").strip()
    return check_app_name(name) if name else None


def handler_app_name(func: Callable[..., Any]) -> str:
    """The app name derived from its handler: ``module.qualname`` (a script's file name
    for ``__main__``), so every restart of one agent finds the same spool and two
    different agents never share one.
    """
    module = getattr(func, "__module__", None) or "app"
    if module == "__main__":
        main_file = getattr(sys.modules.get("__main__"), "__file__", None)
        module = Path(main_file).stem if main_file else "main"
    qualname = getattr(func, "__qualname__", None) or type(func).__qualname__
    name = re.sub(r"[^A-Za-z0-9._-]", "_", f"{module}.{qualname}").lstrip(".")
    if len(name) > 64:
        # Still one name per handler: the tail says which, the digest keeps them apart.
        digest = hashlib.sha256(name.encode()).hexdigest()[:12]
        name = f"{name[-51:].lstrip('.')}-{digest}"
    return check_app_name(name or "app")


def app_spool_dir(name: str, environ: Mapping[str, str] = os.environ) -> Path:
    """The default spool directory of the agent called ``name``: ``default_spool_dir() /
    name``, so two different agents on one host keep their spools apart
    while restarts of one agent find each other's.
    """
    return default_spool_dir(environ) / check_app_name(name)


def _usable(directory: Path) -> bool:
    """Whether this user can keep a spool in ``directory``, without creating it (the spool
    creates it when it first writes): an existing directory must be ours and writable,
    else the nearest existing parent writable."""
    try:
        if directory.exists():
            # Another user's directory (a shared /tmp) must not receive our envelopes.
            return directory.stat().st_uid == os.getuid() and os.access(directory, os.W_OK)
        parent = next(p for p in directory.parents if p.exists())
        return parent.is_dir() and os.access(parent, os.W_OK | os.X_OK)
    except (OSError, StopIteration):
        return False


def default_spool_dir(environ: Mapping[str, str] = os.environ) -> Path:
    """The spool directory used when none is configured: the same one across restarts.

    ``$XDG_STATE_HOME/agentcore-rl/spool`` (``~/.local/state/agentcore-rl/spool`` by the
    XDG rule: state that should survive a restart but is not worth backing up), else, when
    the home directory cannot be written (containers running as a user without one),
    ``<tempdir>/agentcore-rl-spool-<uid>``. Created (mode 0700) by the spool's first write.
    """
    fallback = Path(tempfile.gettempdir()) / f"agentcore-rl-spool-{os.getuid()}"
    state = environ.get("XDG_STATE_HOME", "").strip()
    try:
        base = Path(state) if state and Path(state).is_absolute() else Path.home() / ".local/state"
    except RuntimeError:  # no home directory at all
        return fallback
    preferred = base / "agentcore-rl" / "spool"
    if _usable(preferred):
        return preferred
    if _usable(fallback):
        return fallback
    # Neither is writable: the spool reports the failure (and logs the envelope) on use.
    return preferred
