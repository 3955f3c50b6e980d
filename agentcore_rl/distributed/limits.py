"""shared_limits: a cluster-wide rate limit and session budget, found by name on Ray.

The first process to ask creates a named, detached Ray actor (restarted by Ray if its
process dies); every other process with the same name gets the same actor. Each process
gets its own :class:`SharedLimits`, whose ``rate`` and ``sessions`` satisfy the rollout
client's ``RateLimiter`` and ``SessionLimiter`` protocols. Ray is imported only here.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, fields
from types import TracebackType
from typing import Any

import anyio
import anyio.abc

from agentcore_rl._extras import require
from agentcore_rl.distributed.actor import LimitsActor
from agentcore_rl.distributed.backend import BackendUnavailable, LimitsBackend
from agentcore_rl.distributed.config import LimitsConfig
from agentcore_rl.distributed.ledger import Demand, RateLease
from agentcore_rl.distributed.rate import SharedRateLimiter
from agentcore_rl.distributed.slots import SharedSessionLimiter
from agentcore_rl.errors import ConfigurationError

__all__ = ["DEFAULT_NAMESPACE", "RayBackend", "SharedLimits", "shared_limits"]

#: The Ray namespace the actors live in, so any job on the cluster finds them by name.
DEFAULT_NAMESPACE = "agentcore-rl"
# Bounds the final give-back calls of a closing process.
_CLOSE_TIMEOUT = 5.0


class RayBackend:
    """Calls the named limits actor through Ray; a dead actor is looked up (or created,
    conservatively) again by ``connect``.
    """

    def __init__(self, connect: Callable[[bool], Any]) -> None:
        self._connect = connect
        self._handle = connect(False)

    def __repr__(self) -> str:
        return f"RayBackend({self._handle!r})"

    async def _call(self, method: str, *args: Any) -> Any:
        # lazy: ray is the ray extra, imported only when used
        import ray.exceptions

        # A restarting actor; older Rays raise RayActorError for it.
        unavailable = getattr(ray.exceptions, "ActorUnavailableError", ray.exceptions.RayActorError)

        try:
            return await getattr(self._handle, method).remote(*args)
        except ray.exceptions.ActorDiedError as exc:
            # Out of restarts (or killed for good): someone must create it again.
            try:
                self._handle = self._connect(True)
            except Exception as again:
                raise BackendUnavailable(f"{exc}; recreating failed: {again}") from exc
            raise BackendUnavailable(str(exc)) from exc
        except (ray.exceptions.RayActorError, unavailable) as exc:
            raise BackendUnavailable(str(exc)) from exc

    async def lease_rate(
        self,
        holder: str,
        held: float,
        held_for: float,
        demand: Demand,
        throttles: int = 0,
        max_wait: float = 0.0,
        seq: int = 0,
    ) -> RateLease:
        """Renew (or ask for) a share of the rate."""
        lease: RateLease = await self._call(
            "lease_rate", holder, held, held_for, demand, throttles, max_wait, seq
        )
        return lease

    async def leave_rate(self, holder: str) -> None:
        """A holder makes no more calls."""
        await self._call("leave_rate", holder)

    async def lease_slots(
        self, holder: str, held: int, want: int, max_wait: float
    ) -> tuple[int, int]:
        """Lease session slots."""
        granted, excess = await self._call("lease_slots", holder, held, want, max_wait)
        return int(granted), int(excess)

    async def renew(self, holder: str, held: int) -> int:
        """Renew a holding."""
        return int(await self._call("renew", holder, held))

    async def leave(self, holder: str, held: int) -> None:
        """A holder closes."""
        await self._call("leave", holder, held)

    async def status(self) -> dict[str, Any]:
        """A snapshot of the shared state."""
        status: dict[str, Any] = await self._call("status")
        return status


class SharedLimits:
    """This process's handle on one cluster-wide quota: ``rate`` and ``sessions``.

    An async context manager: entering starts the lease loops (and checks that the actor
    enforces this configuration); leaving stops them and gives back what is unused.

    Example::

        async with SharedLimits(backend, config) as limits:
            await limits.sessions.acquire()
            await limits.rate.acquire()
    """

    def __init__(
        self,
        backend: LimitsBackend,
        config: LimitsConfig,
        *,
        name: str = "",
        unavailable_timeout: float = 60.0,
    ) -> None:
        self.name = name
        self.config = config
        self.backend = backend
        self.rate = SharedRateLimiter(backend, config, unavailable_timeout=unavailable_timeout)
        self.sessions = SharedSessionLimiter(
            backend, config, unavailable_timeout=unavailable_timeout
        )
        self._group: anyio.abc.TaskGroup | None = None

    def __repr__(self) -> str:
        return (
            f"SharedLimits({self.name!r}, tps={self.config.tps:g}, sessions={self.config.sessions})"
        )

    @property
    def actor_calls(self) -> int:
        """Calls this process made to the shared actor so far."""
        return self.rate.actor_calls + self.sessions.actor_calls

    async def __aenter__(self) -> SharedLimits:
        if self._group is not None:
            raise RuntimeError("SharedLimits is already entered")
        await self._check_config()
        group = anyio.create_task_group()
        await group.__aenter__()
        self._group = group
        await group.start(self.rate.run)
        await group.start(self.sessions.run)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        group, self._group = self._group, None
        if group is None:
            return None
        group.cancel_scope.cancel()
        try:
            return await group.__aexit__(exc_type, exc, tb)
        finally:
            with anyio.move_on_after(_CLOSE_TIMEOUT, shield=True):
                await self.rate.aclose()
                await self.sessions.aclose()

    async def _check_config(self) -> None:
        try:
            status = await self.backend.status()
        except BackendUnavailable as exc:
            raise ConfigurationError(
                f"cannot reach the shared limits {self.name!r}: {exc}"
            ) from exc
        theirs, ours = status["config"], asdict(self.config)
        differ = [
            f"{key}={theirs.get(key)!r} (asked {value!r})"
            for key, value in ours.items()
            if not _same(theirs.get(key), value)
        ]
        if differ:
            raise ConfigurationError(
                f"shared limits {self.name!r} already exist with other settings: "
                f"{', '.join(differ)}; use the same settings or another name"
            )


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return a is not None and b is not None and math.isclose(a, b)
    return bool(a == b)


def _connect(name: str, namespace: str, config: LimitsConfig, recreate: bool) -> Any:
    require("ray", "agentcore_rl.distributed.shared_limits", "ray")
    import ray  # lazy: the [ray] extra, checked just above and imported only when used

    if not ray.is_initialized():
        raise ConfigurationError(
            "shared_limits needs Ray: call ray.init() first (inside a Ray task or actor it is)"
        )
    actor_class = ray.remote(LimitsActor)
    # num_cpus=0: a bookkeeping actor must not take a CPU the trainer scheduled for.
    # max_restarts=-1: Ray brings it back; it then starts conservatively (see LimitsActor).
    return actor_class.options(
        name=name,
        namespace=namespace,
        lifetime="detached",
        get_if_exists=True,
        max_restarts=-1,
        num_cpus=0,
        max_concurrency=1000,
    ).remote(config, restarted=True if recreate else None)


def shared_limits(
    name: str,
    *,
    tps: float,
    sessions: int,
    namespace: str = DEFAULT_NAMESPACE,
    unavailable_timeout: float = 60.0,
    **tuning: Any,
) -> SharedLimits:
    """The cluster-wide limits called ``name`` (created on first use): ``tps`` calls per
    second and ``sessions`` live sessions, shared by every process that asks by name.

    ``tuning`` sets the other :class:`LimitsConfig` fields (``burst``, ``lease_period``,
    ``slot_ttl``...); every process must ask with the same settings. Needs Ray
    initialised (``pip install 'agentcore-rl[ray]'``).

    Example::

        async with shared_limits("acr-math", tps=25, sessions=500) as limits:
            await limits.rate.acquire()
    """
    known = {f.name for f in fields(LimitsConfig)} - {"tps", "sessions"}
    unknown = set(tuning) - known
    if unknown:
        raise ConfigurationError(
            f"unknown setting(s) {', '.join(sorted(unknown))}; known: {', '.join(sorted(known))}"
        )
    if not name:
        raise ConfigurationError("shared limits need a non-empty name")
    config = LimitsConfig(tps=tps, sessions=sessions, **tuning)
    backend = RayBackend(lambda recreate: _connect(name, namespace, config, recreate))
    return SharedLimits(backend, config, name=name, unavailable_timeout=unavailable_timeout)
