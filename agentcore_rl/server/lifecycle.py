"""The agent server's long-lived parts and their life: built together, started by the
lifespan (or ``async with app``) in one task group, drained and closed together, and the
process settings of an app that owns its process (``app.run()``)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
from collections.abc import AsyncIterator, Callable
from types import TracebackType
from typing import Any, TypeVar

import anyio
import uvicorn
from anyio.abc import TaskGroup
from starlette.types import Lifespan

from agentcore_rl import protocol
from agentcore_rl._unwrap import raise_unwrapped
from agentcore_rl.s3 import ResultStore
from agentcore_rl.server.buckets import BucketCheck
from agentcore_rl.server.lease import Heartbeat, LeaseWatcher
from agentcore_rl.server.options import (
    FaultChecks,
    RequestLimits,
    ShutdownConfig,
    SpoolConfig,
    allowed_buckets_from,
    app_name_from,
    default_host,
    spool_directory,
)
from agentcore_rl.server.overload import LoopLag, serve_options
from agentcore_rl.server.runner import RolloutRunner, ShutdownReport
from agentcore_rl.server.spool import Spool

__all__ = ["Lifecycle"]

logger = logging.getLogger("agentcore_rl.server")

L = TypeVar("L", bound="Lifecycle")


class Lifecycle:
    """The app's parts (S3 door, spool, rollout runner, bucket check, lease watcher,
    heartbeat, loop-lag monitor) and their one owner: a task group entered with the app."""

    clock: Callable[[], float]
    _user_lifespan: Lifespan[Any] | None

    def _build(
        self,
        store: ResultStore | None,
        *,
        limits: RequestLimits,
        shutdown: ShutdownConfig,
        spool: SpoolConfig,
        faults: FaultChecks,
    ) -> None:
        self.limits, self.shutdown, self.spool_config, self.faults = limits, shutdown, spool, faults
        self.allowed_buckets = allowed_buckets_from(limits)
        self.overload = LoopLag(faults.overload_lag)
        self._owns_store = store is None
        self.store = store if store is not None else ResultStore()
        #: The agent's identity (its spool's owner); from the handler if not given.
        self.app_name = app_name_from(spool)
        # Placed once the name is known (now or at registration), for good at startup with
        # the environment as it is then (a local stack gives its agents a private spool).
        self.spool = Spool(
            self.store,
            retry_interval=spool.retry_interval,
            max_retry_interval=spool.max_retry_interval,
        )
        if self.app_name is not None:
            self._place_spool(self.app_name)
        # Through the attribute, so a clock set on the app (tests) stamps envelopes too.
        self.runner = RolloutRunner(
            spool=self.spool, clock=lambda: self.clock(), exists=self.store.head
        )
        self.bucket_check = BucketCheck(self.store, faults)
        self.leases = LeaseWatcher(self.store, self.runner, faults)
        interval = faults.heartbeat_interval
        self.heartbeat = (
            None if interval is None else Heartbeat(self.store, self.runner, self.spool, interval)
        )
        self._limiter: anyio.CapacityLimiter | None = None
        self._started = False
        self._closing = False
        self._close_lock = asyncio.Lock()
        self._tasks: TaskGroup | None = None
        self.last_shutdown: ShutdownReport | None = None

    def _place_spool(self, name: str) -> None:
        self.spool.place(spool_directory(self.spool_config.directory, name), owner=name)

    @property
    def closing(self) -> bool:
        """True once shutdown has begun (new invocations get 503)."""
        return self._closing

    def _get_limiter(self) -> anyio.CapacityLimiter:
        # Lazy: the app can be built before any event loop runs.
        if self._limiter is None:
            self._limiter = anyio.CapacityLimiter(self.limits.max_sync_workers)
        return self._limiter

    async def startup(self) -> None:
        """Adopt envelopes a previous server left in the spool directory and retry them at
        once. Idempotent.

        Called by the lifespan, by ``async with app``, and by the first invocation when
        the app is mounted somewhere that does not run its lifespan.
        """
        if self._started:
            return
        self._started = True
        if self.app_name is None:  # no handler: nothing of its own to spool
            self.app_name = "unnamed-app"
        self._place_spool(self.app_name)
        for _, key in await self.spool.recover():
            self.spool.kick()
            # A predecessor's spooled rollout has finished; a status probe should say so.
            self.runner.remember_finished(protocol.parse_result_key(key)[2], key)

    async def aclose(self) -> ShutdownReport:
        """Shut down gracefully; idempotent (later calls wait for the first and return its
        report).

        Stops taking invocations (503), gives running rollouts ``shutdown.grace`` seconds,
        cancels the rest (writing their "cancelled" envelopes), retries the spool once
        more, and closes the S3 client if the app created it.
        """
        self._closing = True
        async with self._close_lock:
            if self.last_shutdown is not None:
                return self.last_shutdown
            report = await self.runner.shutdown(
                self.shutdown.grace, cancel_timeout=self.shutdown.cancel_timeout
            )
            await self.spool.aclose()
            if self.heartbeat is not None:
                await self.heartbeat.aclose()
            if self._owns_store:
                await self.store.aclose()
            self.last_shutdown = report
            logger.info(
                "agent server shut down: %d rollout(s) finished during the grace period, "
                "%d cancelled, %d envelope(s) left in the spool",
                report.finished,
                report.cancelled,
                self.spool.pending,
            )
            return report

    async def __aenter__(self: L) -> L:
        if self._tasks is not None:
            raise RuntimeError("this AgentCoreRLApp is already entered")
        self._tasks = tasks = anyio.create_task_group()
        await tasks.__aenter__()
        self.runner.attach(tasks)
        self.spool.attach(tasks)
        tasks.start_soon(self.leases.run, name="lease watcher")
        if self.heartbeat is not None:
            tasks.start_soon(self.heartbeat.run, name="heartbeat")
        tasks.start_soon(self.overload.run, name="loop lag")
        try:
            await self.startup()
        except BaseException:
            await self.__aexit__(None, None, None)
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        tasks = self._tasks
        try:
            await self.aclose()
        finally:
            self.runner.attach(None)
            self.spool.attach(None)
            self._tasks = None
            if tasks is not None:
                # What still runs ignored aclose()'s cancel; cancel it for good.
                tasks.cancel_scope.cancel()
                try:
                    await tasks.__aexit__(None, None, None)
                except BaseException as exc:
                    raise_unwrapped(exc)

    @contextlib.asynccontextmanager
    async def _lifespan(self, app: Any) -> AsyncIterator[Any]:
        async with self:
            if self._user_lifespan is None:
                yield None
            else:
                async with self._user_lifespan(app) as state:
                    yield state

    def tune_process(self) -> None:
        """Process-wide settings for an app that owns its process: lower the GIL switch
        interval to ``faults.gil_switch_interval``. :meth:`run` and ``agentcore-rl serve``
        call it; an app mounted in someone else's never does.
        """
        wanted = self.faults.gil_switch_interval
        if wanted is not None and sys.getswitchinterval() > wanted:
            # /ping must get the GIL back quickly while sync handlers compute; only lowered.
            sys.setswitchinterval(wanted)
            logger.info("GIL switch interval set to %.3g s so /ping stays responsive", wanted)

    def run(
        self, port: int = protocol.DEFAULT_PORT, host: str | None = None, **options: Any
    ) -> None:
        """Serve with uvicorn (blocking). SIGTERM or Ctrl-C shuts down gracefully.

        The positional order is ``BedrockAgentCoreApp``'s: ``app.run(8081)`` is a port.
        ``host`` defaults to :func:`default_host`: loopback on a workstation, ``0.0.0.0``
        in a container (AgentCore Runtime must reach port 8080 from outside). Other
        keyword arguments go to ``uvicorn.run`` as they are (``limit_concurrency``,
        ``h11_max_incomplete_event_size``...), with the defaults of
        :func:`~agentcore_rl.server.overload.serve_options` for keep-alive and backlog.
        """
        chosen = host or default_host()
        self.tune_process()
        # A no-op where the program set up logging already.
        logging.basicConfig(
            level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
        )
        logger.info("agent server listening on http://%s:%d", chosen, port)
        uvicorn.run(self, host=chosen, port=port, **serve_options(options))  # type: ignore[arg-type]
