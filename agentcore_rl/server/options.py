"""The agent server's configuration: frozen keyword-only objects, one per concern of
:class:`~agentcore_rl.server.AgentCoreRLApp`, the ``DEFAULT_*`` the app uses, and what the
environment decides (variables, listening host, app name, spool directory)."""

from __future__ import annotations

import hashlib
import os
import re
import sys
import tempfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Final

from agentcore_rl import protocol
from agentcore_rl.errors import ConfigurationError, InvalidPayloadError
from agentcore_rl.keywords import check_numbers, checked_init

__all__ = [
    "DEFAULT_FAULT_CHECKS",
    "DEFAULT_REQUEST_LIMITS",
    "DEFAULT_SHUTDOWN",
    "DEFAULT_SPOOL",
    "FaultChecks",
    "RequestLimits",
    "ShutdownConfig",
    "SpoolConfig",
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


def state_dir(environ: Mapping[str, str] = os.environ) -> Path:
    """Where agentcore-rl keeps its state: ``$XDG_STATE_HOME/agentcore-rl`` (default
    ``~/.local/state/agentcore-rl``)."""
    state = environ.get("XDG_STATE_HOME", "").strip()
    base = Path(state) if state and Path(state).is_absolute() else Path.home() / ".local/state"
    return base / "agentcore-rl"


def default_spool_dir(environ: Mapping[str, str] = os.environ) -> Path:
    """``spool`` in :func:`state_dir` (state survives restarts), else
    ``<tempdir>/agentcore-rl-spool-<uid>`` when the home directory is not writable."""
    fallback = Path(tempfile.gettempdir()) / f"agentcore-rl-spool-{os.getuid()}"
    try:
        preferred = state_dir(environ) / "spool"
    except RuntimeError:  # no home directory at all
        return fallback
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


def _bucket_set(allowed: Iterable[str], source: str) -> frozenset[str]:
    # A lone string would otherwise be taken as a set of one-letter buckets.
    names = [allowed] if isinstance(allowed, str) else allowed
    try:
        return frozenset(protocol.validate_bucket(b, name="allowed bucket") for b in names)
    except InvalidPayloadError as exc:
        raise ConfigurationError(f"{source}: {exc.message}") from None


def allowed_buckets_from(limits: RequestLimits) -> frozenset[str] | None:
    """``limits.allowed_buckets``, else ``$AGENTCORE_RL_ALLOWED_BUCKETS``, else None."""
    if limits.allowed_buckets is not None:
        return frozenset(limits.allowed_buckets)
    names = [part.strip() for part in os.environ.get(ALLOWED_BUCKETS_ENV, "").split(",")]
    return _bucket_set([n for n in names if n], ALLOWED_BUCKETS_ENV) if any(names) else None


def app_name_from(spool: SpoolConfig) -> str | None:
    """``spool.app_name``, else ``$AGENTCORE_RL_APP_NAME``, else None (the handler's)."""
    name = spool.app_name or os.environ.get(APP_NAME_ENV, "").strip()
    return check_app_name(name) if name else None


@checked_init
@dataclass(frozen=True, kw_only=True)
class RequestLimits:
    """What an invocation may be, and how many sync handlers run at once.

    A body over ``max_body_bytes`` (default: ACR's 100 MB) gets 413, nesting deeper than
    ``max_json_depth`` 400; once the bodies being received hold
    ``max_inflight_body_bytes`` together, more get 503 with ``Retry-After``. A body over
    ``envelope_payload_max_bytes`` (``None``: never) is stored in its envelope as its
    SHA-256 and size instead of a copy of the payload. A payload naming a bucket outside
    ``allowed_buckets`` (default: ``$AGENTCORE_RL_ALLOWED_BUCKETS``, else any) gets 403.
    Sync handlers run in up to ``max_sync_workers`` threads (more than anyio's default of
    40: rollout handlers mostly wait on a model server).

    Example::

        RequestLimits(allowed_buckets=["rollouts"], max_body_bytes=10 * 1024 * 1024)
    """

    max_body_bytes: int = 100 * 1024 * 1024
    # Far deeper payloads only exhaust the recursion of whatever walks them later.
    max_json_depth: int = 100
    # Room for two bodies of ACR's 100 MB maximum, plus change.
    max_inflight_body_bytes: int = 256 * 1024 * 1024
    envelope_payload_max_bytes: int | None = None
    allowed_buckets: Iterable[str] | None = None
    max_sync_workers: int = 64

    def __post_init__(self) -> None:
        if self.allowed_buckets is not None:
            allowed = _bucket_set(self.allowed_buckets, "allowed_buckets")
            object.__setattr__(self, "allowed_buckets", allowed)
        check_numbers(self, "max_sync_workers", at_least=1, integer=True)
        check_numbers(self, "max_body_bytes", "max_inflight_body_bytes", above=0)
        check_numbers(self, "max_json_depth", at_least=1, integer=True)
        check_numbers(self, "envelope_payload_max_bytes", at_least=0, optional=True)
        if self.max_inflight_body_bytes < self.max_body_bytes:
            raise ConfigurationError(
                f"max_inflight_body_bytes ({self.max_inflight_body_bytes}) must be at least "
                f"max_body_bytes ({self.max_body_bytes}), or the largest body would never fit"
            )


@checked_init
@dataclass(frozen=True, kw_only=True)
class ShutdownConfig:
    """Seconds things get to end.

    At shutdown running rollouts get ``grace`` seconds, then are cancelled; a cancelled
    one that has not ended ``cancel_timeout`` seconds later gets its "cancelled" envelope
    written for it. A stop request (``POST /sessions/{id}/stop``) waits up to ``stop_wait``
    seconds for the stopped rollouts' envelopes.

    Example::

        ShutdownConfig(grace=60.0, stop_wait=2.0)
    """

    grace: float = 20.0
    stop_wait: float = 5.0
    cancel_timeout: float = 5.0

    def __post_init__(self) -> None:
        check_numbers(self, "grace", "stop_wait", "cancel_timeout", at_least=0)


@checked_init
@dataclass(frozen=True, kw_only=True)
class SpoolConfig:
    """Where envelopes S3 refused wait, whose they are, and how often they are retried.

    ``app_name`` is the agent's identity (default: ``$AGENTCORE_RL_APP_NAME``, else the
    handler's module and name): it marks what the app spools and names its directory.
    ``directory`` (default: ``$AGENTCORE_RL_SPOOL_DIR``, else ``app_name`` under
    :func:`default_spool_dir`) is drained at startup; share one between apps only on
    purpose. Spooled envelopes are retried every ``retry_interval`` seconds, doubling up
    to ``max_retry_interval``.

    Example::

        SpoolConfig(app_name="math", directory="/var/spool/math-agent", retry_interval=1.0)
    """

    app_name: str | None = None
    directory: Path | str | None = None
    retry_interval: float = 5.0
    max_retry_interval: float = 300.0

    def __post_init__(self) -> None:
        if self.app_name is not None:
            check_app_name(self.app_name)
        if not 0 < self.retry_interval <= self.max_retry_interval:
            raise ConfigurationError(
                "need 0 < retry_interval <= max_retry_interval, got "
                f"{self.retry_interval} and {self.max_retry_interval}"
            )


@checked_init
@dataclass(frozen=True, kw_only=True)
class FaultChecks:
    """How the agent server tells final faults from passing ones (docs/failure-model.md).

    **Result bucket.** A rollout's bucket is checked once (HeadBucket) and the answer kept
    ``bucket_ttl`` seconds (``bucket_miss_ttl`` when unusable): a bucket that does not exist
    or refuses the server's credentials gets the invocation refused with a 4xx; an S3 that
    gives no verdict within ``bucket_wait`` seconds accepts it (the spool covers it).
    **Leases.** Every ``lease_interval`` seconds the leases of running rollouts are read; a
    client's lease unrenewed for its ``ttl`` cancels its rollouts (an unreadable or missing
    lease counts as renewed). **Overload.** While the event loop runs more than
    ``overload_lag`` seconds behind, new invocations get 503 with ``Retry-After: 1`` before
    their body is read (``None``: never). ``check_buckets`` / ``check_leases`` False: no check.
    **Heartbeat.** While the process runs rollouts of an experiment it rewrites one small
    object under that experiment's prefix every ``heartbeat_interval`` seconds (and names it
    in its answers), so clients see a crash within a few intervals without asking; ``None``:
    no heartbeat (clients then probe its sessions). **GIL.** When the app owns the process
    (``app.run()``, ``agentcore-rl serve``) the GIL switch interval is lowered to
    ``gil_switch_interval`` (``None``: leave it), so ``/ping`` answers fast beside sync
    handlers that burn CPU, and the agent is not taken for a dead one.

    Example::

        FaultChecks(lease_interval=2.0)
    """

    check_buckets: bool = True
    bucket_ttl: float = 300.0
    bucket_miss_ttl: float = 10.0
    bucket_wait: float = 2.0
    check_leases: bool = True
    lease_interval: float = 10.0
    overload_lag: float | None = 1.0
    heartbeat_interval: float | None = 5.0
    gil_switch_interval: float | None = DEFAULT_GIL_SWITCH_INTERVAL

    def __post_init__(self) -> None:
        waits = ("bucket_ttl", "bucket_miss_ttl", "bucket_wait", "lease_interval")
        check_numbers(self, *waits, above=0)
        optional = ("overload_lag", "heartbeat_interval", "gil_switch_interval")
        check_numbers(self, *optional, above=0, optional=True)


DEFAULT_REQUEST_LIMITS: Final = RequestLimits()
DEFAULT_SHUTDOWN: Final = ShutdownConfig()
DEFAULT_SPOOL: Final = SpoolConfig()
DEFAULT_FAULT_CHECKS: Final = FaultChecks()

#: A config field given to the app itself (``grace=``) gets a TypeError naming its home.
_CONFIGS: Final[dict[str, type[object]]] = {
    "limits": RequestLimits,
    "shutdown": ShutdownConfig,
    "spool": SpoolConfig,
    "faults": FaultChecks,
}
MOVED_KEYWORDS: Final = {
    name: f"{param}={cls.__name__}({field}=...)"
    for param, cls in _CONFIGS.items()
    for field in (f.name for f in fields(cls))  # type: ignore[arg-type]
    for name in (field, f"{param}_{field}")
} | {
    "workers": "limits=RequestLimits(max_sync_workers=...), "
    "faults=FaultChecks(gil_switch_interval=...)",
    "clock": "app.clock = ... (an attribute)",
}
