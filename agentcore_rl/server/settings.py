"""The agent server's environment: variables, listening host, app name, spool directory."""

from __future__ import annotations

import hashlib
import os
import re
import sys
import tempfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Final

from agentcore_rl import protocol
from agentcore_rl.errors import ConfigurationError, InvalidPayloadError

__all__ = [
    "ALLOWED_BUCKETS_ENV",
    "APP_NAME_ENV",
    "DEFAULT_GIL_SWITCH_INTERVAL",
    "HOST_ENV",
    "SPOOL_DIR_ENV",
    "allowed_buckets_from",
    "app_name_from_env",
    "check_app_name",
    "default_host",
    "default_spool_dir",
    "handler_app_name",
    "spool_directory",
]

#: GIL hand-off interval set at startup: at Python's 5 ms, CPU-bound handler threads push
#: /ping past 100 ms; 1 ms keeps it near 10 ms (benchmarks/server.py).
DEFAULT_GIL_SWITCH_INTERVAL: Final = 0.001

_NAME: Final = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,63}")

#: Comma-separated bucket allow-list, used when the app is given none.
ALLOWED_BUCKETS_ENV: Final = "AGENTCORE_RL_ALLOWED_BUCKETS"
SPOOL_DIR_ENV: Final = "AGENTCORE_RL_SPOOL_DIR"
APP_NAME_ENV: Final = "AGENTCORE_RL_APP_NAME"
HOST_ENV: Final = "AGENTCORE_RL_HOST"


def default_host() -> str:
    """``$AGENTCORE_RL_HOST``, else ``0.0.0.0`` inside a container, else ``127.0.0.1``
    (so a laptop does not expose the agent)."""
    host = os.environ.get(HOST_ENV, "").strip()
    if host:
        return host
    in_container = bool(os.environ.get("DOCKER_CONTAINER")) or any(
        Path(p).exists() for p in ("/.dockerenv", "/run/.containerenv")
    )
    return "0.0.0.0" if in_container else "127.0.0.1"


def check_app_name(name: str) -> str:
    """``name`` if it can name an app (and a directory), else ConfigurationError."""
    if not _NAME.fullmatch(name):
        raise ConfigurationError(
            f"app name {name!r}: use 1-64 letters, digits, '.', '_' or '-' (it names a directory)"
        )
    return name


def app_name_from_env() -> str | None:
    name = os.environ.get(APP_NAME_ENV, "").strip()
    return check_app_name(name) if name else None


def handler_app_name(func: Callable[..., Any]) -> str:
    """``module.qualname`` of the handler: restarts of one agent share a spool, two agents
    never do."""
    module = getattr(func, "__module__", None) or "app"
    if module == "__main__":
        main_file = getattr(sys.modules.get("__main__"), "__file__", None)
        module = Path(main_file).stem if main_file else "main"
    qualname = getattr(func, "__qualname__", None) or type(func).__qualname__
    name = re.sub(r"[^A-Za-z0-9._-]", "_", f"{module}.{qualname}").lstrip(".")
    if len(name) > 64:
        digest = hashlib.sha256(name.encode()).hexdigest()[:12]
        name = f"{name[-51:].lstrip('.')}-{digest}"
    return check_app_name(name or "app")


def _usable(directory: Path) -> bool:
    # Without creating it. Another user's directory (a shared /tmp) must not get our envelopes.
    try:
        if directory.exists():
            return directory.stat().st_uid == os.getuid() and os.access(directory, os.W_OK)
        parent = next(p for p in directory.parents if p.exists())
        return parent.is_dir() and os.access(parent, os.W_OK | os.X_OK)
    except (OSError, StopIteration):
        return False


def default_spool_dir(environ: Mapping[str, str] = os.environ) -> Path:
    """``$XDG_STATE_HOME/agentcore-rl/spool`` (XDG state survives restarts), else
    ``<tempdir>/agentcore-rl-spool-<uid>`` when the home directory is not writable."""
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
    # Neither writable: the spool reports it (and logs the envelope) on use.
    return preferred


def spool_directory(configured: Path | str | None, name: str) -> Path:
    """``configured``, else ``$AGENTCORE_RL_SPOOL_DIR``, else ``name`` under the default."""
    chosen = configured or os.environ.get(SPOOL_DIR_ENV) or None
    return Path(chosen) if chosen is not None else default_spool_dir() / check_app_name(name)


def allowed_buckets_from(allowed: Iterable[str] | None) -> frozenset[str] | None:
    """The argument, else ``$AGENTCORE_RL_ALLOWED_BUCKETS``, else None; checked."""
    source = "allowed_buckets"
    if allowed is None:
        raw = os.environ.get(ALLOWED_BUCKETS_ENV, "")
        names = [part.strip() for part in raw.split(",") if part.strip()]
        if not names:
            return None
        allowed, source = names, ALLOWED_BUCKETS_ENV
    elif isinstance(allowed, str):
        # A lone string would otherwise be taken as a set of one-letter buckets.
        allowed = [allowed]
    try:
        return frozenset(protocol.validate_bucket(b, name="allowed bucket") for b in allowed)
    except InvalidPayloadError as exc:
        raise ConfigurationError(f"{source}: {exc.message}") from None
