"""shared_limits: one quota (calls per second, live sessions) shared by many trainer
processes on a Ray cluster (extra ``[ray]``): one named, detached Ray actor
(:class:`LimitsActor`) holds the books. docs/distributed.md has the design.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Any, Final

import anyio
import anyio.abc

from agentcore_rl._extras import require
from agentcore_rl.errors import ConfigurationError, SharedLimitsUnavailableError
from agentcore_rl.keywords import check_numbers
from agentcore_rl.ratelimit import Priority, TokenBucket

__all__ = ["DEFAULT_NAMESPACE", "LimitsActor", "LimitsConfig", "SharedLimits", "shared_limits"]

logger = logging.getLogger(__name__)

#: The Ray namespace the actors live in, so any job on the cluster finds them by name.
DEFAULT_NAMESPACE = "agentcore-rl"
#: A holder not heard from for this long is gone: its slots are free again.
DEFAULT_SLOT_TTL: Final = 30.0


@dataclass(frozen=True, kw_only=True)
class LimitsConfig:
    """One shared quota. ``burst`` defaults to half a second's worth: the runtime's own
    bucket holds a second's worth, the rest absorbs uneven delays."""

    tps: float
    sessions: int
    burst: float | None = None
    slot_ttl: float = DEFAULT_SLOT_TTL

    def __post_init__(self) -> None:
        check_numbers(self, "tps", "slot_ttl", above=0, finite=True)
        check_numbers(self, "sessions", at_least=1, integer=True)
        check_numbers(self, "burst", at_least=1, finite=True, optional=True)


@dataclass
class _Holder:
    count: int  # slots it holds by the actor's books
    grants: int  # slots granted to it so far
    heard: float


class LimitsActor:
    """The books of one shared quota, as an async Ray actor.

    The bucket starts empty, so a restarted actor adds no burst to calls just made. When
    the books were lost (``restarted``: Ray restarted the actor, or an unknown holder had
    grants) no slot is granted for half a ``slot_ttl``, by when every live process has
    reported.
    """

    def __init__(
        self,
        config: LimitsConfig,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.config = config
        self.restarted = False
        self._clock = clock
        burst = max(1.0, config.tps / 2) if config.burst is None else config.burst
        self.bucket = TokenBucket(config.tps, burst, tokens=0.0, clock=clock, sleep=sleep)
        self._holders: dict[str, _Holder] = {}
        self._hold_until = 0.0
        self._changed = asyncio.Event()
        self.expired_holders = 0
        # Ray's word is needed too: the first holder to call may never have had a grant.
        if _reconstructed():
            self._lost_books()

    def _lost_books(self) -> None:
        self.restarted, self._hold_until = True, self._clock() + self.config.slot_ttl / 2

    def _notify(self) -> None:
        # Waiters hold the event they saw; a fresh one is for the next change.
        self._changed.set()
        self._changed = asyncio.Event()

    def _held(self) -> int:
        now = self._clock()
        for name, holder in list(self._holders.items()):
            if now - holder.heard > self.config.slot_ttl:
                del self._holders[name]
                if holder.count > 0:
                    self.expired_holders += 1
                    self._notify()
        return sum(h.count for h in self._holders.values())

    def _sync(self, holder: str, in_use: int, seen: int) -> _Holder:
        known, now = self._holders.get(holder), self._clock()
        if known is None:  # new, lapsed, or from before a restart: take its word
            known = self._holders[holder] = _Holder(count=0, grants=seen, heard=now)
            if seen and not self.restarted:
                self._lost_books()
        before, known.count = known.count, max(0, in_use + known.grants - seen)
        known.heard = now
        if known.count < before:
            self._notify()
        return known

    async def acquire_token(self, priority: int) -> None:
        await self.bucket.acquire(priority)

    async def throttled(self) -> None:
        self.bucket.on_throttle()

    async def sync(self, holder: str, in_use: int, seen: int) -> None:
        """``holder`` uses ``in_use`` slots and has received ``seen`` grants (a grant on
        its way still counts as held)."""
        self._sync(holder, in_use, seen)

    async def acquire_slot(self, holder: str, in_use: int, seen: int) -> bool:
        """Wait for a free slot and grant it to ``holder``; False if the holder lapsed
        meanwhile (it stopped calling: nobody is left to receive the slot)."""
        mine = self._sync(holder, in_use, seen)
        while self._held() >= self.config.sessions or self._clock() < self._hold_until:
            changed = self._changed
            # Room also comes without a call: a holder lapsing, the restart hold ending.
            with anyio.move_on_after(self.config.slot_ttl / 4):
                await changed.wait()
            if self._holders.get(holder) is not mine:
                return False
        mine.count += 1
        mine.grants += 1
        return True

    async def status(self) -> dict[str, Any]:
        return {
            "config": asdict(self.config),
            "restarted": self.restarted,
            "rate": self.bucket.rate,
            "slots_held": self._held(),
            "expired_holders": self.expired_holders,
            "throttles": self.bucket.throttles,
        }


def _reconstructed() -> bool:
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized() or ray.get_runtime_context().get_actor_id() is None:
        return False
    return bool(ray.get_runtime_context().was_current_actor_reconstructed)


class _Rate:
    """The shared token bucket (the client's ``RateLimiter``)."""

    def __init__(self, actor: SharedLimits) -> None:
        self._actor = actor

    async def acquire(self, priority: int = Priority.INVOKE) -> None:
        await self._actor.call("acquire_token", int(priority))

    def on_throttle(self) -> None:
        self._actor.send("throttled")

    def on_success(self) -> None:
        """The shared rate recovers with time."""


class _Sessions:
    """This process's slots of the shared budget (the client's ``SessionLimiter``).

    Every call tells the actor what this process holds (slots in use, grants received);
    ``report`` does so every ``slot_ttl / 3`` so that slots stay held while rollouts run.
    """

    def __init__(self, actor: SharedLimits) -> None:
        self._actor = actor
        self.holder = uuid.uuid4().hex
        self.in_use = 0
        self._seen = 0
        self._group: anyio.abc.TaskGroup | None = None

    def _view(self) -> tuple[str, int, int]:
        return self.holder, self.in_use, self._seen

    async def acquire(self) -> None:
        while not await self._actor.call("acquire_slot", view=self._view, abandoned=self._lost):
            pass  # this holder had lapsed at the actor (a long outage): ask again
        self._seen += 1
        self.in_use += 1

    def _lost(self, ref: Any) -> None:
        if self._group is not None:
            self._group.start_soon(self._collect, ref)

    async def _collect(self, ref: Any) -> None:
        # The abandoned wait was cancelled at the actor, or it had granted the slot:
        # then the actor counts it held until told it was received (and is not in use).
        with contextlib.suppress(Exception):
            if await ref:
                self._seen += 1
                self._actor.send("sync", *self._view())

    def release(self) -> None:
        if self.in_use <= 0:
            raise RuntimeError("release() without a matching acquire()")
        self.in_use -= 1
        self._actor.send("sync", *self._view())

    async def report(self, group: anyio.abc.TaskGroup) -> None:
        self._group = group
        while True:
            await anyio.sleep(self._actor.config.slot_ttl / 3)
            await self._actor.call("sync", view=self._view)

    async def aclose(self) -> None:
        self._group = None
        with anyio.move_on_after(5.0, shield=True):
            await self._actor.call("sync", view=self._view)


class SharedLimits:
    """This process's handle on one cluster-wide quota (what ``shared_limits`` yields); its
    calls to the actor are retried with back-off while Ray restarts it.

    Example::

        AsyncRolloutClient(..., rate_limiter=limits.rate, session_limiter=limits.sessions)
    """

    def __init__(self, handle: Any, config: LimitsConfig, *, name: str, timeout: float) -> None:
        self.name = name
        self.config = config
        self._handle = handle
        self._timeout = timeout
        self.actor_calls = 0
        self.rate = _Rate(self)
        self.sessions = _Sessions(self)

    def __repr__(self) -> str:
        return f"SharedLimits({self.name!r}, {self.config!r})"

    async def call(
        self,
        method: str,
        *args: Any,
        view: Callable[[], tuple[Any, ...]] | None = None,
        abandoned: Callable[[Any], None] | None = None,
    ) -> Any:
        """``method(*args, *view())`` at the actor. A wait given up is cancelled there too
        and its reference handed to ``abandoned``: its answer may be on its way already.

        ``view`` is read for every try: a restarted actor takes a holder's first view as
        its baseline, and one older than grants received since would undercount it. Tries
        are at most ``slot_ttl / 6`` apart, so every live process reaches a restarted
        actor well within the half ``slot_ttl`` it grants nothing."""
        import ray  # lazy: the ray extra, present once connected

        since, delay = None, 0.05
        longest = min(2.0, self.config.slot_ttl / 6)
        while True:
            self.actor_calls += 1
            ref = getattr(self._handle, method).remote(*args, *(view() if view else ()))
            try:
                return await ref
            except BaseException as exc:
                if not isinstance(exc, ray.exceptions.RayActorError):
                    with contextlib.suppress(Exception):
                        ray.cancel(ref)
                    if abandoned is not None:
                        abandoned(ref)
                    raise
                now = time.monotonic()
                if since is None:
                    since = now
                    logger.warning("shared limits unreachable, retrying: %s", exc)
                elif now - since > self._timeout:
                    raise SharedLimitsUnavailableError(
                        f"the shared limits' actor stayed unreachable for {now - since:.0f} s: "
                        f"{exc}"
                    ) from exc
            await anyio.sleep(delay)
            delay = min(longest, delay * 2)

    def send(self, method: str, *args: Any) -> None:
        """A call whose answer nobody waits for (the next report corrects a lost one)."""
        self.actor_calls += 1
        try:
            getattr(self._handle, method).remote(*args)
        except Exception as exc:
            logger.warning("shared limits: %s not sent: %s", method, exc)


@contextlib.asynccontextmanager
async def _opened(limits: SharedLimits) -> AsyncIterator[SharedLimits]:
    theirs, ours = (await limits.call("status"))["config"], asdict(limits.config)
    if theirs != ours:
        raise ConfigurationError(
            f"shared limits {limits.name!r} already exist with other settings: {theirs} "
            f"(asked {ours}); use the same settings or another name"
        )
    try:
        async with anyio.create_task_group() as group:
            group.start_soon(limits.sessions.report, group)
            yield limits
            group.cancel_scope.cancel()
    finally:
        await limits.sessions.aclose()


def _connect(name: str, namespace: str, config: LimitsConfig) -> Any:
    import ray  # lazy: the [ray] extra, checked by shared_limits

    if not ray.is_initialized():
        raise ConfigurationError(
            "shared_limits needs Ray: call ray.init() first (inside a Ray task or actor it is)"
        )
    # num_cpus=0: a bookkeeping actor must not take a CPU the trainer scheduled for.
    # max_restarts=-1: Ray brings it back (see LimitsActor for what it then holds back).
    options = {"lifetime": "detached", "get_if_exists": True, "max_restarts": -1}
    return (
        ray.remote(LimitsActor)
        .options(name=name, namespace=namespace, num_cpus=0, max_concurrency=10_000, **options)
        .remote(config)
    )


def shared_limits(
    name: str,
    *,
    tps: float,
    sessions: int,
    burst: float | None = None,
    slot_ttl: float = DEFAULT_SLOT_TTL,
    namespace: str = DEFAULT_NAMESPACE,
    unavailable_timeout: float = 60.0,
) -> contextlib.AbstractAsyncContextManager[SharedLimits]:
    """The cluster-wide limits called ``name`` (created on first use), shared by every
    process that asks by name with the same settings. Callers fail with
    ``SharedLimitsUnavailableError`` once the actor stayed unreachable for
    ``unavailable_timeout`` seconds. Needs Ray initialised.

    Example::

        async with shared_limits("acr-math", tps=25, sessions=500) as limits:
            await limits.rate.acquire()
    """
    require("ray", "agentcore_rl.distributed.shared_limits", "ray")
    if not name:
        raise ConfigurationError("shared limits need a non-empty name")
    config = LimitsConfig(tps=tps, sessions=sessions, burst=burst, slot_ttl=slot_ttl)
    handle = _connect(name, namespace, config)
    return _opened(SharedLimits(handle, config, name=name, timeout=unavailable_timeout))
