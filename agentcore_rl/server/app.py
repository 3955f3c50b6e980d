"""AgentCoreRLApp: an ASGI server that runs an agent as fire-and-forget rollouts, with the
part of AWS's ``BedrockAgentCoreApp`` surface it keeps (docs/server.md lists what is left out).

The app's lifespan (or ``async with app``) owns one task group for every task it starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import inspect
import itertools
import logging
import os
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any, Final, TypeVar

import anyio
import uvicorn
from anyio.abc import TaskGroup
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Lifespan

from agentcore_rl import protocol
from agentcore_rl._unwrap import raise_unwrapped
from agentcore_rl.edge import BodyBudget, Refusal, read_body
from agentcore_rl.errors import ConfigurationError, InvalidPayloadError
from agentcore_rl.keywords import check_config_types, checked
from agentcore_rl.protocol import PingStatus
from agentcore_rl.s3 import ResultStore
from agentcore_rl.server.buckets import BucketCheck
from agentcore_rl.server.invoke import Handler, HandlerSpec, RequestContext, call_handler
from agentcore_rl.server.lease import Heartbeat, LeaseWatcher
from agentcore_rl.server.options import (
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
from agentcore_rl.server.overload import LoopLag, OverloadGuard, serve_options
from agentcore_rl.server.routes import (
    control_op,
    error_response,
    parse_payload,
    parse_rollout,
    path_session_id,
)
from agentcore_rl.server.runner import RolloutRunner, ShutdownReport
from agentcore_rl.server.spool import Spool

__all__ = ["AgentCoreRLApp"]

logger = logging.getLogger("agentcore_rl.server")

#: A custom ping handler: returns a :class:`PingStatus` (ours or AWS's) or its value.
PingHandler = Callable[[], Any]

F = TypeVar("F", bound=Handler)
V = TypeVar("V", bound=Callable[[dict[str, Any]], Any])
P = TypeVar("P", bound=PingHandler)
A = TypeVar("A", bound=Callable[..., Awaitable[Any]])

_STOP_REASON: Final = "the session was stopped"


def _status(value: Any) -> PingStatus:
    # An enum of AWS's SDK or a plain string: both carry the wire value.
    return PingStatus(getattr(value, "value", value))


class AgentCoreRLApp(Starlette):
    """The agent server: ``POST /invocations``, ``GET /ping``, ``POST /sessions/{id}/stop``.

    Register one handler with :meth:`rollout_entrypoint` (fire and forget; the result goes
    to S3) or :meth:`entrypoint` (plain request/response). Handlers may be async or sync
    (sync ones run in worker threads) and take ``(payload)`` or ``(payload, context)``.

    ``store`` is the S3 door (default: a ``ResultStore()``), ``allowed_buckets`` the
    buckets a payload may name, ``app_name`` the agent's identity (its spool's directory
    and owner); the rest is grouped by concern: ``limits``
    (:class:`~agentcore_rl.server.options.RequestLimits`), ``shutdown``
    (:class:`~agentcore_rl.server.options.ShutdownConfig`), ``spool``
    (:class:`~agentcore_rl.server.options.SpoolConfig`), ``workers``
    (:class:`~agentcore_rl.server.options.WorkerConfig`) and ``faults``
    (:class:`~agentcore_rl.server.options.FaultChecks`). ``clock`` (epoch seconds) stamps
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
        #: The registered entrypoint under ``"main"`` as a ``(payload, context)`` coroutine
        #: function named after it (as in ``BedrockAgentCoreApp``); for inspection and for
        #: calling the handler directly, not a way to replace it.
        self.handlers: dict[str, Callable[..., Awaitable[Any]]] = {}
        self._clock = clock
        self._forced: PingStatus | None = None
        self._ping_handler: PingHandler | None = None
        self._status = PingStatus.HEALTHY
        self._last_update = int(clock())
        # add/complete_async_task may be called from sync handlers' threads.
        self._tasks_lock = threading.Lock()
        self._async_tasks: dict[int, tuple[str, float]] = {}
        self._task_ids = itertools.count(1)
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
        interval = faults.heartbeat_interval
        self.heartbeat = (
            None if interval is None else Heartbeat(self.store, self.runner, self.spool, interval)
        )
        self._spec: HandlerSpec | None = None
        self._rollout_mode = False
        self._validator: Callable[[dict[str, Any]], Any] | None = None
        self._limiter: anyio.CapacityLimiter | None = None
        self._started = False
        self._closing = False
        self._close_lock = asyncio.Lock()
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
        self._spec = spec = HandlerSpec.inspect(func)
        self._rollout_mode = rollout
        if self.app_name is None:
            self.app_name = handler_app_name(func)
            self._place_spool(self.app_name)

        async def main(payload: dict[str, Any], context: Any = None) -> Any:
            if context is None:
                context = RequestContext(session_id=protocol.new_session_id())
            return await call_handler(spec, payload, context, limiter=self._get_limiter())

        # No __wrapped__: inspect.signature reports (payload, context) like the SDK's.
        for name in ("__module__", "__name__", "__qualname__", "__doc__"):
            with contextlib.suppress(AttributeError):
                setattr(main, name, getattr(spec.func, name))
        self.handlers["main"] = main
        with contextlib.suppress(AttributeError, TypeError):
            func.run = self.run  # type: ignore[attr-defined]

    def rollout_entrypoint(self, func: F) -> F:
        """Register a fire-and-forget rollout handler whose result is written to S3.

        The invocation is answered at once with ``{"status": "processing", "s3_bucket",
        "result_key"}``; the handler's dict becomes the envelope at
        ``s3://{s3_bucket}/{exp_id}/{input_id}/{session_id}.json``.
        """
        self._register(func, rollout=True)
        return func

    def entrypoint(self, func: F) -> F:
        """Register a plain request/response handler (as with AWS's ``BedrockAgentCoreApp``).

        Its return value is the response body (JSON; a Starlette ``Response`` is passed
        through). If it raises, the answer is ``500 {"error": "<message>"}``.
        """
        self._register(func, rollout=False)
        return func

    def ping(self, func: P) -> P:
        """Register a custom ``/ping`` status: a function returning a ``PingStatus`` (ours or
        AWS's) or its string value. It is asked at every ping unless a status is forced;
        if it raises, the automatic status is reported.
        """
        if not callable(func):
            raise ConfigurationError(f"a ping handler must be callable, got {type(func).__name__}")
        self._ping_handler = func
        return func

    def async_task(self, func: A) -> A:
        """Decorate an async function so that ``/ping`` says ``HealthyBusy`` while it runs."""
        if not inspect.iscoroutinefunction(func):
            raise ConfigurationError("@app.async_task can only decorate async functions")

        @functools.wraps(func)
        async def tracked(*args: Any, **kwargs: Any) -> Any:
            task_id = self.add_async_task(func.__name__)
            try:
                return await func(*args, **kwargs)
            finally:
                self.complete_async_task(task_id)

        return tracked  # type: ignore[return-value]

    def add_async_task(self, name: str, metadata: Mapping[str, Any] | None = None) -> int:
        """Track background work the app does not run itself; ``HealthyBusy`` until it
        completes. Returns the id for :meth:`complete_async_task`. Thread-safe."""
        with self._tasks_lock:
            task_id = next(self._task_ids)
            self._async_tasks[task_id] = (name, self._clock())
        logger.info("async task started: %s (id %d)", name, task_id)
        return task_id

    def complete_async_task(self, task_id: int) -> bool:
        """Stop tracking a task from :meth:`add_async_task`; False for an unknown id."""
        with self._tasks_lock:
            task = self._async_tasks.pop(task_id, None)
        if task is None:
            logger.warning("complete_async_task: unknown task id %r", task_id)
            return False
        name, started = task
        duration = self._clock() - started
        logger.info("async task completed: %s (id %d, %.2f s)", name, task_id, duration)
        return True

    def get_async_task_info(self) -> dict[str, Any]:
        """The tracked tasks: ``{"active_count": n, "running_jobs": [{"name", "duration"}]}``."""
        now = self._clock()
        with self._tasks_lock:
            tasks = list(self._async_tasks.values())
        return {
            "active_count": len(tasks),
            "running_jobs": [{"name": name, "duration": now - began} for name, began in tasks],
        }

    def force_ping_status(self, status: PingStatus | str) -> None:
        """Report ``status`` on ``/ping`` whatever else holds, until cleared."""
        self._forced = _status(status)
        self._refresh_ping()

    def clear_forced_ping_status(self) -> None:
        """Go back to the custom or automatic ``/ping`` status."""
        self._forced = None
        self._refresh_ping()

    def get_current_ping_status(self) -> PingStatus:
        """What ``/ping`` reports now: forced, else the custom handler's, else automatic."""
        return self._refresh_ping()

    def _refresh_ping(self) -> PingStatus:
        status = self._forced
        if status is None and self._ping_handler is not None:
            try:
                status = _status(self._ping_handler())
            except Exception as exc:
                logger.warning(
                    "the custom ping handler failed (%s: %s); reporting the automatic status",
                    type(exc).__name__,
                    exc,
                )
        if status is None:
            busy = self.runner.active > 0 or self.spool.pending > 0 or bool(self._async_tasks)
            status = PingStatus.HEALTHY_BUSY if busy else PingStatus.HEALTHY
        # Changed with the status only: ACR reclaims a session that says Healthy for too long.
        if status is not self._status:
            self._status = status
            self._last_update = int(self._clock())
        return status

    async def _ping(self, request: Request) -> Response:
        status = self._refresh_ping()
        return JSONResponse({"status": status.value, "time_of_last_update": self._last_update})

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
        for _, key in await self.spool.recover():
            self.spool.kick()
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

    async def __aenter__(self) -> AgentCoreRLApp:
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

    def _shutting_down(self) -> JSONResponse:
        return error_response(
            "the agent server is shutting down and takes no new invocations; retry on "
            "another instance",
            503,
        )

    async def _invocations(self, request: Request) -> Response:
        if self._closing:
            return self._shutting_down()
        spec = self._spec
        if spec is None:
            return error_response(
                "no entrypoint is registered: decorate a function with @app.rollout_entrypoint "
                "or @app.entrypoint",
                500,
            )
        await self.startup()
        try:
            body = await read_body(
                request.receive,
                request.scope["headers"],
                limit=self.limits.max_body_bytes,
                budget=self.body_budget,
            )
            try:
                payload = parse_payload(body, max_depth=self.limits.max_json_depth)
                cap = self.limits.envelope_payload_max_bytes
                envelope_payload = None  # a copy of the payload, unless over the cap
                if self._rollout_mode and cap is not None and len(body) > cap:
                    digest = hashlib.sha256(body).hexdigest()
                    rollout = payload.get(protocol.ROLLOUT_FIELD)
                    envelope_payload = protocol.payload_digest(digest, len(body), rollout)
            finally:
                self.body_budget.release(len(body))
                del body
            header = request.headers.get(protocol.SESSION_ID_HEADER.lower())
            session_id = (
                protocol.new_session_id()
                if header is None
                else protocol.validate_session_id(
                    header, name=f"{protocol.SESSION_ID_HEADER} header"
                )
            )
            if control_op(payload) == protocol.CONTROL_OP_STATUS:
                return JSONResponse(self.runner.session_state(session_id))
            config = (
                parse_rollout(payload, allowed_buckets=self.allowed_buckets)
                if self._rollout_mode
                else None
            )
            if config is not None:
                await self.bucket_check.require(config.s3_bucket)
            if self._validator is not None:
                checked = self._validator(payload)
                if inspect.isawaitable(checked):
                    await checked
        except InvalidPayloadError as exc:
            logger.warning("refused an invocation (%d): %s", exc.status_code, exc.message)
            return error_response(exc.message, exc.status_code, exc.field)
        except Refusal as refusal:  # the body (the edge); a client that left is routine
            level = logging.INFO if refusal.kind == "client_disconnected" else logging.WARNING
            logger.log(level, "refused an invocation (%d): %s", refusal.status, refusal.message)
            answer = error_response(refusal.message, refusal.status, refusal.field)
            answer.headers.update(refusal.headers)
            return answer
        except Exception as exc:
            logger.exception("the payload validator raised")
            return error_response(f"payload validator failed: {exc}", 500)
        context = RequestContext(
            session_id=session_id,
            request_id=request.headers.get(protocol.REQUEST_ID_HEADER.lower()),
            headers=request.headers,
            rollout=config,
            request=request,
        )
        if self._rollout_mode:
            return self._accept_rollout(spec, payload, context, envelope_payload)
        return await self._call_plain(spec, payload, context)

    def _accept_rollout(
        self,
        spec: HandlerSpec,
        payload: dict[str, Any],
        context: RequestContext,
        envelope_payload: dict[str, Any] | None,
    ) -> Response:
        # No await between this check and runner.start: shutdown cannot slip in between.
        if self._closing:
            return self._shutting_down()
        config = context.rollout
        if config is None:
            logger.warning(
                "rollout invocation in session %s names no S3 location (%s.exp_id, input_id, "
                "s3_bucket): the handler runs without saving its result, which is only logged",
                context.session_id,
                protocol.ROLLOUT_FIELD,
            )
        elif self.runner.find(config.s3_bucket, key := config.key_for(context.session_id)):
            logger.info("rollout for s3://%s/%s is already running", config.s3_bucket, key)
            return JSONResponse(self._processing(config, context.session_id))
        job = self.runner.start(
            spec,
            payload,
            context,
            limiter=self._get_limiter(),
            envelope_payload=envelope_payload,
            # Only a marked re-send can have an earlier run, so only it costs a HEAD.
            check_existing=config is not None and config.extra.get(protocol.REPEAT) is True,
        )
        # No lifespan task group: run after the answer, in the request's own task.
        background = None if self._tasks is not None else BackgroundTask(self.runner.run, job)
        return JSONResponse(self._processing(config, context.session_id), background=background)

    def _processing(self, config: protocol.RolloutConfig | None, session_id: str) -> dict[str, Any]:
        """The answer to an accepted rollout, naming this process's heartbeat when it beats."""
        beat = None
        if config is not None and self.heartbeat is not None:
            beat = self.heartbeat.reference(config)
        return protocol.processing_response(config, session_id, beat)

    async def _call_plain(
        self, spec: HandlerSpec, payload: dict[str, Any], context: RequestContext
    ) -> Response:
        try:
            result = await call_handler(spec, payload, context, limiter=self._get_limiter())
        except InvalidPayloadError as exc:
            logger.warning("entrypoint %s refused its payload: %s", spec.name, exc.message)
            return error_response(exc.message, exc.status_code, exc.field)
        except Exception as exc:
            logger.exception("entrypoint %s raised in session %s", spec.name, context.session_id)
            # The message alone, as BedrockAgentCoreApp's clients parse it.
            return error_response(str(exc) or type(exc).__name__, 500)
        if isinstance(result, Response):
            return result
        try:
            return JSONResponse(result)
        except (TypeError, ValueError) as exc:
            logger.error("entrypoint %s returned a value JSON cannot hold: %s", spec.name, exc)
            return error_response(f"handler result is not JSON-serialisable: {exc}", 500)

    async def _session_status(self, request: Request) -> Response:
        session_id = path_session_id(request)
        if isinstance(session_id, Response):
            return session_id
        return JSONResponse(self.runner.session_state(session_id))

    async def _stop_session(self, request: Request) -> Response:
        session_id = path_session_id(request)
        if isinstance(session_id, Response):
            return session_id
        ending = self.runner.session_jobs(session_id)  # a finished one may still be writing
        stopped = self.runner.stop_session(session_id, _STOP_REASON)
        if stopped:
            logger.info("stopping %d rollout(s) of session %s", len(stopped), session_id)
        # Answered once their envelopes are written, so the caller may read them next.
        if ending and not await self.runner.wait(ending, within=self.shutdown.stop_wait):
            logger.warning(
                "session %s: rollout(s) still finishing %.3g s after the stop request",
                session_id,
                self.shutdown.stop_wait,
            )
        return JSONResponse({"session_id": session_id, "stopped": bool(stopped)})
