"""AgentCoreRLApp: an ASGI server that runs an agent as fire-and-forget rollouts.

The app's lifespan (or ``async with app``) owns one task group for every task it starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from types import TracebackType
from typing import Any, TypeVar

import anyio
import uvicorn
from anyio.abc import TaskGroup
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.routing import Route
from starlette.types import Lifespan

from agentcore_rl import protocol
from agentcore_rl._unwrap import raise_unwrapped
from agentcore_rl.errors import ConfigurationError
from agentcore_rl.keywords import check_config_types, checked
from agentcore_rl.s3 import ResultStore
from agentcore_rl.server.buckets import BucketCheck
from agentcore_rl.server.compat import BedrockCompat
from agentcore_rl.server.config import (
    APP_NAME_ENV,
    DEFAULT_FAULT_CHECKS,
    DEFAULT_REQUEST_LIMITS,
    DEFAULT_SHUTDOWN,
    DEFAULT_SPOOL,
    DEFAULT_WORKERS,
    MOVED_KEYWORDS,
    FaultChecks,
    RequestLimits,
    ShutdownConfig,
    SpoolConfig,
    WorkerConfig,
    allowed_buckets_from,
    check_app_name,
    default_host,
    handler_app_name,
    spool_directory,
)
from agentcore_rl.server.invoke import Handler, HandlerSpec
from agentcore_rl.server.lease import LeaseWatcher
from agentcore_rl.server.overload import LoopLag, OverloadGuard, serve_options
from agentcore_rl.server.routes import BodyBudget, RolloutRoutes
from agentcore_rl.server.runner import RolloutRunner, ShutdownReport
from agentcore_rl.server.spool import Spool

__all__ = ["AgentCoreRLApp"]

logger = logging.getLogger("agentcore_rl.server")

F = TypeVar("F", bound=Handler)
V = TypeVar("V", bound=Callable[[dict[str, Any]], Any])


class AgentCoreRLApp(RolloutRoutes, BedrockCompat, Starlette):
    """The agent server: ``POST /invocations``, ``GET /ping``, ``POST /sessions/{id}/stop``.

    Register one handler with :meth:`rollout_entrypoint` (fire and forget; the result goes
    to S3) or :meth:`entrypoint` (plain request/response). Handlers may be async or sync
    (sync ones run in worker threads) and take ``(payload)`` or ``(payload, context)``.

    ``store`` is the S3 door (default: a ``ResultStore()``), ``allowed_buckets`` the
    buckets a payload may name, ``app_name`` the agent's identity (its spool's directory
    and owner); the rest is grouped by concern: ``limits``
    (:class:`~agentcore_rl.server.config.RequestLimits`), ``shutdown``
    (:class:`~agentcore_rl.server.config.ShutdownConfig`), ``spool``
    (:class:`~agentcore_rl.server.config.SpoolConfig`), ``workers``
    (:class:`~agentcore_rl.server.config.WorkerConfig`) and ``faults``
    (:class:`~agentcore_rl.server.config.FaultChecks`). ``clock`` (epoch seconds) stamps
    envelopes and ``/ping``; ``debug``, ``lifespan`` (run inside the app's own) and
    ``middleware`` are Starlette's, as in AWS's ``BedrockAgentCoreApp``, whose public
    surface it keeps. It is an ordinary Starlette app: add routes, or mount it (then enter
    it from the parent's lifespan). docs/server.md has the defaults, the environment
    variables, repeated invocations and what is left out of AWS's app.

    Example::

        app = AgentCoreRLApp(allowed_buckets=["rollouts"], shutdown=ShutdownConfig(grace=60))

        @app.rollout_entrypoint
        def solve(payload: dict) -> dict:       # sync works too
            return {"rewards": [float(payload["answer"] == "4")]}
    """

    @checked(moved=MOVED_KEYWORDS)
    def __init__(
        self,
        *,
        store: ResultStore | None = None,
        allowed_buckets: Iterable[str] | None = None,
        app_name: str | None = None,
        limits: RequestLimits = DEFAULT_REQUEST_LIMITS,
        shutdown: ShutdownConfig = DEFAULT_SHUTDOWN,
        spool: SpoolConfig = DEFAULT_SPOOL,
        workers: WorkerConfig = DEFAULT_WORKERS,
        faults: FaultChecks = DEFAULT_FAULT_CHECKS,
        clock: Callable[[], float] = time.time,
        debug: bool = False,
        lifespan: Lifespan[Any] | None = None,
        middleware: Sequence[Middleware] | None = None,
    ) -> None:
        check_config_types(
            ("limits", limits, RequestLimits),
            ("shutdown", shutdown, ShutdownConfig),
            ("spool", spool, SpoolConfig),
            ("workers", workers, WorkerConfig),
            ("faults", faults, FaultChecks),
        )
        self.overload = LoopLag(faults.overload_lag)
        super().__init__(
            debug=debug,
            routes=[
                Route(protocol.INVOCATIONS_PATH, self._invocations, methods=["POST"]),
                Route(protocol.PING_PATH, self._ping, methods=["GET"]),
                Route(protocol.STOP_SESSION_PATH, self._stop_session, methods=["POST"]),
                Route(protocol.SESSION_STATUS_PATH, self._session_status, methods=["GET"]),
            ],
            lifespan=self._lifespan,
            # First: overload is answered ahead of everything else.
            middleware=[Middleware(OverloadGuard, lag=lambda: self.overload), *(middleware or ())],
        )
        self._init_compat(clock)
        self._user_lifespan = lifespan
        self.logger = logger
        self.allowed_buckets = allowed_buckets_from(allowed_buckets)
        self.limits = limits
        self.shutdown = shutdown
        self.spool_config = spool
        self.workers = workers
        self.body_budget = BodyBudget(limits.max_inflight_body_bytes)
        self._owns_store = store is None
        self.store = store if store is not None else ResultStore()
        #: The agent's identity (its spool's owner); from the handler if not given.
        name = app_name if app_name is not None else os.environ.get(APP_NAME_ENV, "").strip()
        self.app_name = check_app_name(name) if name or app_name is not None else None
        # Placed once the name is known (now or at registration), for good at startup with
        # the environment as it is then (a local stack gives its agents a private spool).
        self.spool = Spool(
            self.store,
            retry_interval=spool.retry_interval,
            max_retry_interval=spool.max_retry_interval,
        )
        if self.app_name is not None:
            self._place_spool(self.app_name)
        self.runner = RolloutRunner(spool=self.spool, clock=clock, exists=self.store.head)
        self.bucket_check = BucketCheck(self.store, faults)
        self.leases = LeaseWatcher(self.store, self.runner, faults)
        self._spec: HandlerSpec | None = None
        self._rollout_mode = False
        self._validator: Callable[[dict[str, Any]], Any] | None = None
        self._limiter: anyio.CapacityLimiter | None = None
        self._started = False
        self._closing = False
        self._close_lock = asyncio.Lock()
        self._owner: contextlib.AsyncExitStack | None = None
        self._tasks: TaskGroup | None = None
        self.last_shutdown: ShutdownReport | None = None

    def _place_spool(self, name: str) -> None:
        self.spool.place(spool_directory(self.spool_config.directory, name), owner=name)

    def __repr__(self) -> str:
        handler = self._spec.name if self._spec is not None else None
        kind = "rollout_entrypoint" if self._rollout_mode else "entrypoint"
        return (
            f"AgentCoreRLApp({kind}={handler!r}, active={self.runner.active}, "
            f"spooled={self.spool.pending}, closing={self._closing})"
        )

    def _register(self, func: Handler, *, rollout: bool) -> None:
        if self._spec is not None:
            raise ConfigurationError(
                f"this app already has an entrypoint ({self._spec.name}); an app serves one"
            )
        self._spec = HandlerSpec.inspect(func)
        self._rollout_mode = rollout
        if self.app_name is None:
            self.app_name = handler_app_name(func)
            self._place_spool(self.app_name)
        self._registered(func, self._spec)

    def rollout_entrypoint(self, func: F) -> F:
        """Register a fire-and-forget rollout handler whose result is written to S3.

        The invocation is answered at once with ``{"status": "processing", "s3_bucket",
        "result_key"}``; the handler's dict becomes the envelope at
        ``s3://{s3_bucket}/{exp_id}/{input_id}/{session_id}.json``.
        """
        self._register(func, rollout=True)
        return func

    def payload_validator(self, func: V) -> V:
        """Register a check that runs on every invocation before it is accepted.

        It gets the parsed payload (``_rollout`` already validated) and raises
        :class:`~agentcore_rl.errors.InvalidPayloadError` to refuse it: the caller gets
        that error's status (400 by default) and field at once, instead of a rollout
        that fails later in the background. It runs on the event loop, so it must be
        quick (no I/O); it may be ``async``. Any other exception answers 500.
        """
        if self._validator is not None:
            raise ConfigurationError("this app already has a payload validator")
        if not callable(func):
            raise ConfigurationError(f"a validator must be callable, got {type(func).__name__}")
        self._validator = func
        return func

    @property
    def closing(self) -> bool:
        """True once shutdown has begun (new invocations get 503)."""
        return self._closing

    def _owes_results(self) -> bool:
        return self.runner.active > 0 or self.spool.pending > 0

    def _get_limiter(self) -> anyio.CapacityLimiter:
        # Lazy: the app can be built before any event loop runs.
        if self._limiter is None:
            self._limiter = anyio.CapacityLimiter(self.workers.max_sync_workers)
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
        if await self.spool.recover():
            self.spool.kick()
        for _, key in self.spool.pending_keys:
            # A predecessor's spooled rollout has finished; a status probe should say so.
            self.runner.remember_finished(protocol.parse_result_key(key)[2], key)

    def tune_process(self) -> None:
        """Process-wide settings for an app that owns its process: lower the GIL switch
        interval to ``gil_switch_interval``. :meth:`run` and ``agentcore-rl serve`` call
        it; an app mounted in someone else's never does.
        """
        wanted = self.workers.gil_switch_interval
        if wanted is not None and sys.getswitchinterval() > wanted:
            # /ping must get the GIL back quickly while sync handlers compute; only lowered.
            sys.setswitchinterval(wanted)
            logger.info("GIL switch interval set to %.3g s so /ping stays responsive", wanted)

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

    async def __aenter__(self) -> AgentCoreRLApp:
        if self._owner is not None:
            raise RuntimeError("this AgentCoreRLApp is already entered")
        owner = contextlib.AsyncExitStack()
        self._tasks = await owner.enter_async_context(anyio.create_task_group())
        self._owner = owner
        self.runner.attach(self._tasks)
        self.spool.attach(self._tasks)
        self._tasks.start_soon(self.leases.run, name="lease watcher")
        self._tasks.start_soon(self.overload.run, name="loop lag")
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
        owner, tasks = self._owner, self._tasks
        try:
            await self.aclose()
        finally:
            self.runner.attach(None)
            self.spool.attach(None)
            self._owner = self._tasks = None
            if owner is not None and tasks is not None:
                # What still runs ignored aclose()'s cancel; cancel it for good.
                tasks.cancel_scope.cancel()
                try:
                    await owner.aclose()
                except BaseException as exc:
                    raise_unwrapped(exc)

    @contextlib.asynccontextmanager
    async def _lifespan(self, app: Starlette) -> AsyncIterator[Any]:
        async with self:
            if self._user_lifespan is None:
                yield None
            else:
                async with self._user_lifespan(app) as state:
                    yield state

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
        if not logging.getLogger().handlers:
            logging.basicConfig(
                level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
            )
        logger.info("agent server listening on http://%s:%d", chosen, port)
        uvicorn.run(self, host=chosen, port=port, **serve_options(options))
