"""AgentCoreRLApp: an ASGI server that runs an agent as fire-and-forget rollouts.

Swap ``BedrockAgentCoreApp`` for :class:`AgentCoreRLApp` and ``@app.entrypoint`` for
``@app.rollout_entrypoint``: each invocation is answered at once with where its result
will appear, the handler runs in an owned background task, and its result (or what went
wrong) is written to S3 as a JSON envelope. The app's lifespan (or ``async with app``)
owns one task group: every rollout and the spool's retry task run in it.

Example::

    from agentcore_rl import AgentCoreRLApp

    app = AgentCoreRLApp()

    @app.rollout_entrypoint
    async def solve(payload: dict, context) -> dict:
        return {"rewards": [1.0]}

    if __name__ == "__main__":
        app.run()        # uvicorn on port 8080
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import inspect
import logging
import os
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Final, TypeVar

import anyio
import uvicorn
from anyio.abc import TaskGroup
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Lifespan

from agentcore_rl import protocol
from agentcore_rl.errors import ConfigurationError, InvalidPayloadError
from agentcore_rl.protocol import PingStatus
from agentcore_rl.s3 import ResultStore
from agentcore_rl.server.buckets import BucketCheck
from agentcore_rl.server.budget import DEFAULT_MAX_INFLIGHT_BODY_BYTES, BodyBudget
from agentcore_rl.server.context import RequestContext
from agentcore_rl.server.envelopes import lost_envelope_bytes
from agentcore_rl.server.faults import DEFAULT_FAULT_CHECKS, FaultChecks
from agentcore_rl.server.finished import (
    DEFAULT_FINISHED_MAX_ENTRIES,
    DEFAULT_FINISHED_TTL,
    FinishedRollouts,
)
from agentcore_rl.server.health import HealthTracker, PingHandler
from agentcore_rl.server.invoke import Handler, HandlerSpec, call_handler
from agentcore_rl.server.lease import LeaseWatcher, check_lease_reference
from agentcore_rl.server.ledger import LedgerEntry, OrphanLedger, RunLedger, ledger_enabled_by_env
from agentcore_rl.server.limits import LoopLag, prepare_process, serve_options
from agentcore_rl.server.parsing import (
    DEFAULT_MAX_JSON_DEPTH,
    allowed_buckets_from,
    control_op,
    parse_payload,
    parse_rollout,
    read_body,
    session_id_from,
)
from agentcore_rl.server.runner import (
    DEFAULT_CANCEL_TIMEOUT,
    RolloutJob,
    RolloutRunner,
    ShutdownReport,
)
from agentcore_rl.server.settings import (
    DEFAULT_GIL_SWITCH_INTERVAL,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_SYNC_WORKERS,
    DEFAULT_SHUTDOWN_GRACE,
    DEFAULT_STOP_WAIT,
    SPOOL_DIR_ENV,
    app_spool_dir,
    default_host,
)
from agentcore_rl.server.spool import (
    DEFAULT_SPOOL_MAX_RETRY_INTERVAL,
    DEFAULT_SPOOL_RETRY_INTERVAL,
    Spool,
)

__all__ = ["AgentCoreRLApp"]

logger = logging.getLogger("agentcore_rl.server")

F = TypeVar("F", bound=Handler)
V = TypeVar("V", bound=Callable[[dict[str, Any]], Any])
P = TypeVar("P", bound=PingHandler)
A = TypeVar("A", bound=Callable[..., Awaitable[Any]])

_STOP_REASON: Final = "cancelled: the session was stopped"
# Lost envelopes a successor writes at once (each a HEAD, then a PUT).
_LOST_WRITERS: Final = 16


def _run_with(
    app: AgentCoreRLApp, port: int = protocol.DEFAULT_PORT, host: str | None = None
) -> None:
    app.run(port, host)


def _error_response(
    message: str, status_code: int, field: str | None = None, retry_after: int | None = None
) -> JSONResponse:
    headers = None if retry_after is None else {"Retry-After": str(retry_after)}
    return JSONResponse(
        {"error": message, "field": field}, status_code=status_code, headers=headers
    )


class AgentCoreRLApp(Starlette):
    """The agent server: ``POST /invocations``, ``GET /ping``, ``POST /sessions/{id}/stop``.

    Register one handler with :meth:`rollout_entrypoint` (fire and forget; the result goes
    to S3) or :meth:`entrypoint` (plain request/response). Handlers may be async or sync
    (sync ones run in up to ``max_sync_workers`` threads) and take ``(payload)`` or
    ``(payload, context)``.

    ``store`` is the S3 door (default: a ``ResultStore()`` that honours
    ``AWS_ENDPOINT_URL_S3``; its client is created on first write). ``allowed_buckets``
    (default: ``$AGENTCORE_RL_ALLOWED_BUCKETS``, comma-separated) limits which buckets a
    payload may name. Bodies over ``max_body_bytes`` get 413, nesting deeper than
    ``max_json_depth`` 400; once the bodies being received hold ``max_inflight_body_bytes``
    together, more get 503 with ``Retry-After``. A body over
    ``envelope_payload_max_bytes`` (default ``None``: never) is stored in its envelope as
    its SHA-256 and size instead of a copy of the payload. At shutdown running
    rollouts get ``shutdown_grace`` seconds, then are cancelled. Envelopes S3 refuses go
    to ``spool_dir`` (default: ``$AGENTCORE_RL_SPOOL_DIR``, else the same per-user
    directory across restarts, see :func:`default_spool_dir`, in a subdirectory named
    ``app_name`` or ``$AGENTCORE_RL_APP_NAME`` if given; drained at startup) and
    are retried every ``spool_retry_interval`` seconds, backing off. When the app owns
    the process (:meth:`run`, ``agentcore-rl serve``) the interpreter's GIL switch
    interval is lowered to ``gil_switch_interval`` (``None``: leave it) so ``/ping`` stays
    fast while sync handlers burn CPU; mounted in another app, it leaves the process
    alone. ``clock`` (epoch seconds) stamps envelopes and ``/ping``.

    A repeated invocation (same session id and result key) never runs the handler twice:
    while it runs, or for ``finished_ttl`` seconds after it finished (at most
    ``finished_max_entries`` remembered), it is answered from memory; later, or in a new
    process, the rollout HEADs its key before the handler starts and an envelope already
    there wins: for invocations marked ``_rollout.repeat: true`` (``check_existing_results``
    ``"repeats"``, the default), for all (``"always"``), or never (``"never"``).

    ``run_ledger`` (default: on, unless ``$AGENTCORE_RL_RUN_LEDGER`` is ``0``) keeps this
    process's running rollouts in a file in the spool directory, locked while it lives
    (:mod:`agentcore_rl.server.ledger`). At startup a server takes over the ledgers of
    dead processes on the same directory and writes an ``agent_lost`` envelope (which
    clients retry in a new session) for each rollout they left unfinished, unless its key
    holds an envelope already: a restarted agent with the same disk reports its
    predecessor's crash within a second instead of waiting for the clients' probes.

    ``faults`` (:class:`~agentcore_rl.server.faults.FaultChecks`): a result bucket that
    does not exist or refuses the server's credentials gets invocations refused (4xx
    naming it) instead of rollouts whose envelopes can never be written; rollouts whose
    client's lease lapsed (the client crashed) are cancelled; while the event loop runs
    over ``overload_lag`` seconds behind, invocations get 503 with ``Retry-After``.

    It is an ordinary Starlette app: add routes or middleware, or mount it in another app
    (then enter it from the parent's lifespan: ``async with agent_app: yield``; mounted
    where no lifespan reaches it, each rollout runs as its invocation's background task
    and the spool is retried only at ``aclose()``).
    ``lifespan`` (run inside the app's own) and ``middleware`` are passed on as with
    AWS's ``BedrockAgentCoreApp``, whose public surface it keeps: ``handlers``,
    ``@app.ping``, ``@app.async_task``, ``add_async_task``/``complete_async_task``,
    ``force_ping_status``/``clear_forced_ping_status``, ``get_current_ping_status`` and
    ``run(port, host)`` (docs/server.md lists what is left out and why).

    Example::

        app = AgentCoreRLApp(allowed_buckets=["rollouts"], shutdown_grace=60)

        @app.rollout_entrypoint
        def solve(payload: dict) -> dict:       # sync works too
            return {"rewards": [float(payload["answer"] == "4")]}
    """

    def __init__(
        self,
        *,
        store: ResultStore | None = None,
        allowed_buckets: Iterable[str] | None = None,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        max_json_depth: int = DEFAULT_MAX_JSON_DEPTH,
        max_inflight_body_bytes: int = DEFAULT_MAX_INFLIGHT_BODY_BYTES,
        envelope_payload_max_bytes: int | None = None,
        shutdown_grace: float = DEFAULT_SHUTDOWN_GRACE,
        spool_dir: Path | str | None = None,
        app_name: str | None = None,
        spool_retry_interval: float = DEFAULT_SPOOL_RETRY_INTERVAL,
        spool_max_retry_interval: float = DEFAULT_SPOOL_MAX_RETRY_INTERVAL,
        max_sync_workers: int = DEFAULT_MAX_SYNC_WORKERS,
        stop_wait: float = DEFAULT_STOP_WAIT,
        cancel_timeout: float = DEFAULT_CANCEL_TIMEOUT,
        gil_switch_interval: float | None = DEFAULT_GIL_SWITCH_INTERVAL,
        finished_ttl: float = DEFAULT_FINISHED_TTL,
        finished_max_entries: int = DEFAULT_FINISHED_MAX_ENTRIES,
        check_existing_results: str = "repeats",
        run_ledger: bool | None = None,
        faults: FaultChecks = DEFAULT_FAULT_CHECKS,
        clock: Callable[[], float] = time.time,
        debug: bool = False,
        lifespan: Lifespan[Any] | None = None,
        middleware: Sequence[Middleware] | None = None,
    ) -> None:
        if max_body_bytes <= 0:
            raise ConfigurationError(f"max_body_bytes must be positive, got {max_body_bytes}")
        if max_json_depth < 1:
            raise ConfigurationError(f"max_json_depth must be >= 1, got {max_json_depth}")
        if max_inflight_body_bytes < max_body_bytes:
            raise ConfigurationError(
                f"max_inflight_body_bytes ({max_inflight_body_bytes}) must be at least "
                f"max_body_bytes ({max_body_bytes}), or the largest body would never fit"
            )
        if envelope_payload_max_bytes is not None and envelope_payload_max_bytes < 0:
            raise ConfigurationError("envelope_payload_max_bytes must be >= 0 or None")
        if shutdown_grace < 0 or stop_wait < 0 or cancel_timeout < 0:
            raise ConfigurationError("shutdown_grace, stop_wait and cancel_timeout must be >= 0")
        if gil_switch_interval is not None and gil_switch_interval <= 0:
            raise ConfigurationError(
                f"gil_switch_interval must be positive or None, got {gil_switch_interval}"
            )
        if max_sync_workers < 1:
            raise ConfigurationError(f"max_sync_workers must be >= 1, got {max_sync_workers}")
        if not 0 < spool_retry_interval <= spool_max_retry_interval:
            raise ConfigurationError(
                "need 0 < spool_retry_interval <= spool_max_retry_interval, got "
                f"{spool_retry_interval} and {spool_max_retry_interval}"
            )
        super().__init__(
            debug=debug,
            routes=[
                Route(protocol.INVOCATIONS_PATH, self._invocations, methods=["POST"]),
                Route(protocol.PING_PATH, self._ping, methods=["GET"]),
                Route(protocol.STOP_SESSION_PATH, self._stop_session, methods=["POST"]),
                Route(protocol.SESSION_STATUS_PATH, self._session_status, methods=["GET"]),
            ],
            lifespan=self._lifespan,
            middleware=middleware,
        )
        self._user_lifespan = lifespan
        #: The registered entrypoint under ``"main"`` as a ``(payload, context)`` coroutine
        #: function named after it (as in ``BedrockAgentCoreApp``); for inspection and for
        #: calling the handler directly, not a way to replace it.
        self.handlers: dict[str, Callable[..., Awaitable[Any]]] = {}
        self.logger = logger
        self.allowed_buckets = allowed_buckets_from(allowed_buckets)
        self.max_body_bytes = max_body_bytes
        self.max_json_depth = max_json_depth
        if check_existing_results not in ("always", "repeats", "never"):
            raise ConfigurationError(
                "check_existing_results must be 'always', 'repeats' or 'never', got "
                f"{check_existing_results!r}"
            )
        self.check_existing_results = check_existing_results
        self.body_budget = BodyBudget(max_inflight_body_bytes)
        self.envelope_payload_max_bytes = envelope_payload_max_bytes
        self.shutdown_grace = shutdown_grace
        self.max_sync_workers = max_sync_workers
        self.stop_wait = stop_wait
        self.cancel_timeout = cancel_timeout
        self.gil_switch_interval = gil_switch_interval
        self._owns_store = store is None
        self.store = store if store is not None else ResultStore()
        if spool_dir is None and os.environ.get(SPOOL_DIR_ENV):
            spool_dir = os.environ[SPOOL_DIR_ENV]
        self.spool = Spool(
            self.store,
            directory=Path(spool_dir) if spool_dir is not None else app_spool_dir(app_name),
            retry_interval=spool_retry_interval,
            max_retry_interval=spool_max_retry_interval,
            on_change=self._refresh_health,
        )
        self.ledger = RunLedger(
            self.spool.directory,
            enabled=ledger_enabled_by_env() if run_ledger is None else run_ledger,
        )
        #: Set once the dead predecessors' ledgers found at startup are reported.
        self.lost_reported = asyncio.Event()
        # Cancelled at shutdown: the store closes, the ledgers not reported stay for later.
        self._reporting: anyio.CancelScope | None = None
        self._clock = clock
        self.health = HealthTracker(clock=clock)
        try:
            self.finished = FinishedRollouts(
                ttl=finished_ttl, max_entries=finished_max_entries, clock=clock
            )
        except ValueError as exc:
            raise ConfigurationError(f"finished_ttl / finished_max_entries: {exc}") from None
        self.runner = RolloutRunner(
            spool=self.spool,
            clock=clock,
            on_change=self._refresh_health,
            on_finished=self._remember_finished,
            exists=self.store.head if check_existing_results != "never" else None,
            ledger=self.ledger,
        )
        # Final S3 faults are refused at once; rollouts of vanished clients are cancelled.
        self.bucket_check = BucketCheck(self.store, faults)
        self.leases = LeaseWatcher(self.store, self.runner, faults)
        self.overload = LoopLag(faults.overload_lag, clock=faults.clock, sleep=faults.sleep)
        self._spec: HandlerSpec | None = None
        self._rollout_mode = False
        self._validator: Callable[[dict[str, Any]], Any] | None = None
        self._limiter: anyio.CapacityLimiter | None = None
        self._started = False
        self._closing = False
        self._close_lock = asyncio.Lock()
        # The task group of `async with app` (the lifespan's), owning every rollout task.
        self._owner: contextlib.AsyncExitStack | None = None
        self._tasks: TaskGroup | None = None
        self.last_shutdown: ShutdownReport | None = None

    def __repr__(self) -> str:
        handler = self._spec.name if self._spec is not None else None
        kind = "rollout_entrypoint" if self._rollout_mode else "entrypoint"
        return (
            f"AgentCoreRLApp({kind}={handler!r}, active={self.runner.active}, "
            f"spooled={self.spool.pending}, closing={self._closing})"
        )

    # --- registration -----------------------------------------------------------------

    def _register(self, func: Handler, *, rollout: bool) -> None:
        if self._spec is not None:
            raise ConfigurationError(
                f"this app already has an entrypoint ({self._spec.name}); an app serves one"
            )
        self._spec = HandlerSpec.inspect(func)
        self._rollout_mode = rollout
        self.handlers["main"] = self._main_handler(self._spec)
        # BedrockAgentCoreApp lets ``@app.entrypoint`` functions start the server themselves.
        with contextlib.suppress(AttributeError, TypeError):
            func.run = functools.partial(_run_with, self)  # type: ignore[attr-defined]

    def _main_handler(self, spec: HandlerSpec) -> Callable[..., Awaitable[Any]]:
        async def main(payload: dict[str, Any], context: Any = None) -> Any:
            if context is None:
                context = RequestContext(session_id=protocol.new_session_id())
            return await call_handler(spec, payload, context, limiter=self._get_limiter())

        # Named after the handler but without __wrapped__, so that inspect.signature
        # reports (payload, context) like the SDK's wrapper does.
        for name in ("__module__", "__name__", "__qualname__", "__doc__"):
            with contextlib.suppress(AttributeError):
                setattr(main, name, getattr(spec.func, name))
        return main

    def entrypoint(self, func: F) -> F:
        """Register a plain request/response handler (as with AWS's ``BedrockAgentCoreApp``).

        Its return value is the response body (JSON; a Starlette ``Response`` is passed
        through). If it raises, the answer is ``500 {"error": "<message>"}``.
        """
        self._register(func, rollout=False)
        return func

    def rollout_entrypoint(self, func: F) -> F:
        """Register a fire-and-forget rollout handler whose result is written to S3.

        The invocation is answered at once with ``{"status": "processing", "s3_bucket",
        "result_key"}``; the handler's dict becomes the envelope at
        ``s3://{s3_bucket}/{exp_id}/{input_id}/{session_id}.json``.

        Example::

            @app.rollout_entrypoint
            async def solve(payload: dict, context: RequestContext) -> dict:
                return {"rewards": [1.0]}
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

        Example::

            @app.payload_validator
            def check(payload: dict) -> None:
                if not isinstance(payload.get("prompt"), str):
                    raise InvalidPayloadError("prompt must be a string", field="prompt")
        """
        if self._validator is not None:
            raise ConfigurationError("this app already has a payload validator")
        if not callable(func):
            raise ConfigurationError(f"a validator must be callable, got {type(func).__name__}")
        self._validator = func
        return func

    # --- BedrockAgentCoreApp's health API -------------------------------------------------

    def ping(self, func: P) -> P:
        """Register a custom ``/ping`` status: a function returning a ``PingStatus`` (ours or
        AWS's) or its string value. It is asked at every ping unless a status is forced;
        if it raises, the automatic status is reported.

        Example::

            @app.ping
            def status() -> PingStatus:
                return PingStatus.HEALTHY_BUSY if indexing else PingStatus.HEALTHY
        """
        if not callable(func):
            raise ConfigurationError(f"a ping handler must be callable, got {type(func).__name__}")
        self.health.ping_handler = func
        return func

    def async_task(self, func: A) -> A:
        """Decorate an async function so that ``/ping`` says ``HealthyBusy`` while it runs.

        Example::

            @app.async_task
            async def reindex() -> None:
                ...
        """
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
        completes. Returns the id for :meth:`complete_async_task`. Thread-safe.

        Example::

            task_id = app.add_async_task("indexing", {"file": "data.csv"})
            ...
            app.complete_async_task(task_id)
        """
        return self.health.add_task(name, metadata)

    def complete_async_task(self, task_id: int) -> bool:
        """Stop tracking a task from :meth:`add_async_task`; False for an unknown id.

        Example::

            app.complete_async_task(task_id)
        """
        return self.health.complete_task(task_id)

    def get_async_task_info(self) -> dict[str, Any]:
        """The tracked tasks: ``{"active_count": n, "running_jobs": [{"name", "duration"}]}``.

        Example::

            app.get_async_task_info()["active_count"]
        """
        return self.health.task_info()

    def force_ping_status(self, status: PingStatus | str) -> None:
        """Report ``status`` on ``/ping`` whatever else holds, until cleared.

        Example::

            app.force_ping_status(PingStatus.HEALTHY_BUSY)
        """
        self.health.force(status)

    def clear_forced_ping_status(self) -> None:
        """Go back to the custom or automatic ``/ping`` status.

        Example::

            app.clear_forced_ping_status()
        """
        self.health.force(None)

    def get_current_ping_status(self) -> PingStatus:
        """What ``/ping`` reports now: forced, else the custom handler's, else automatic.

        Example::

            assert app.get_current_ping_status() is PingStatus.HEALTHY
        """
        return self.health.status

    # --- lifecycle --------------------------------------------------------------------

    @property
    def closing(self) -> bool:
        """True once shutdown has begun (new invocations get 503)."""
        return self._closing

    def _refresh_health(self) -> None:
        self.health.set_busy(self.runner.active > 0 or self.spool.pending > 0)

    def _get_limiter(self) -> anyio.CapacityLimiter:
        # Created on first use so the app can be built before any event loop runs.
        if self._limiter is None:
            self._limiter = anyio.CapacityLimiter(self.max_sync_workers)
        return self._limiter

    async def startup(self) -> None:
        """Adopt envelopes a previous server left in the spool directory, retry them at
        once and remember their rollouts as finished. Idempotent.

        Called by the lifespan, by ``async with app``, and by the first invocation when
        the app is mounted somewhere that does not run its lifespan.
        """
        if self._started:
            return
        self._started = True
        if await self.spool.recover():
            self.spool.kick()  # a predecessor's envelopes go out now, not after a backoff
        for bucket, key in self.spool.pending_keys:
            # A predecessor's spooled rollout is finished: a re-invoke must not rerun it.
            with contextlib.suppress(InvalidPayloadError):
                self.finished.remember(bucket, key, session_id=protocol.parse_result_key(key)[2])
        # After the spool: a rollout whose envelope waits there is finished, not lost.
        self.ledger.open()
        orphans = self.ledger.claim_orphans()
        self._reporting = anyio.CancelScope()
        if not orphans:
            self.lost_reported.set()
        elif self._tasks is not None:
            self._tasks.start_soon(self._report_lost, orphans, name="agentcore-rl lost rollouts")
        else:
            await self._report_lost(orphans)

    def _settled_here(self, bucket: str, key: str) -> bool:
        """Whether this process runs, finished or spooled the rollout writing that key."""
        return (
            self.runner.find(bucket, key) is not None
            or self.finished.contains(bucket, key)
            or self.spool.holds(bucket, key)
        )

    async def _report_lost(self, orphans: list[OrphanLedger]) -> None:
        """Write an ``agent_lost`` envelope for each rollout dead processes left running
        (unless its key holds an envelope already), then delete their ledgers."""
        limiter = anyio.CapacityLimiter(_LOST_WRITERS)
        try:
            assert self._reporting is not None
            with self._reporting:
                await self._report_orphans(orphans, limiter)
        finally:
            for orphan in orphans:
                orphan.abandon()  # not reported (shut down first): a later server will
            self.lost_reported.set()

    async def _report_orphans(
        self, orphans: list[OrphanLedger], limiter: anyio.CapacityLimiter
    ) -> None:
        for orphan in orphans:
            reported: list[bool] = []
            async with anyio.create_task_group() as writers:
                for entry in orphan.entries:
                    writers.start_soon(self._report_in, limiter, entry, orphan.pid, reported)
            orphan.release()
            if orphan.entries:
                logger.warning(
                    "agent process %s died with %d rollout(s) running; wrote %d 'agent "
                    "lost' envelope(s) (the others had an envelope already)",
                    orphan.pid,
                    len(orphan.entries),
                    sum(reported),
                )

    async def _report_in(
        self,
        limiter: anyio.CapacityLimiter,
        entry: LedgerEntry,
        pid: int | None,
        reported: list[bool],
    ) -> None:
        async with limiter:
            reported.append(await self._report_one_lost(entry, pid))

    async def _report_one_lost(self, entry: LedgerEntry, pid: int | None) -> bool:
        bucket, key = entry.bucket, entry.key
        if self.allowed_buckets is not None and bucket not in self.allowed_buckets:
            return False
        if self._settled_here(bucket, key):
            return False
        try:
            found = await self.store.head(bucket, key)
        except Exception as exc:
            # Unknown: write it (spooled if S3 is down). Its writer is dead, so the only
            # envelope that could be there is one it sent just before dying.
            logger.warning("could not check s3://%s/%s for an envelope: %s", bucket, key, exc)
            found = False
        # Checked again after the wait: a repeat invocation may have started it here.
        if found or self._settled_here(bucket, key):
            return False
        body = lost_envelope_bytes(entry, finished_at=self._clock(), pid=pid)
        await self.spool.deliver(bucket, key, body)
        self.finished.remember(bucket, key, session_id=entry.session_id)
        return True

    def tune_process(self) -> None:
        """Process-wide settings for an app that owns its process: lower the GIL switch
        interval to ``gil_switch_interval``. :meth:`run` and ``agentcore-rl serve`` call
        it; an app mounted in someone else's never does.

        Example::

            app.tune_process()
            uvicorn.run(app, port=8080)
        """
        wanted = self.gil_switch_interval
        if wanted is not None and sys.getswitchinterval() > wanted:
            # Process-wide, but so is the GIL: the thread that answers /ping must get it
            # back quickly even while sync handlers compute. Only ever lowered.
            sys.setswitchinterval(wanted)
            logger.info("GIL switch interval set to %.3g s so /ping stays responsive", wanted)

    def _remember_finished(self, job: RolloutJob) -> None:
        key = job.result_key
        config = job.context.rollout
        if key is not None and config is not None:
            self.finished.remember(config.s3_bucket, key, session_id=job.session_id)

    def session_state(self, session_id: str) -> dict[str, Any]:
        """What this server knows of a session: the ``/sessions/{id}`` answer.

        Example::

            app.session_state(sid)["state"]   # "running", "finished" or "unknown"
        """
        running = [job.result_key for job in self.runner.for_session(session_id)]
        if running:
            keys = sorted(key for key in running if key is not None)
            return protocol.session_status(session_id, protocol.SessionState.RUNNING, keys)
        finished = self.finished.keys_of_session(session_id)
        if finished:
            return protocol.session_status(session_id, protocol.SessionState.FINISHED, finished)
        return protocol.session_status(session_id, protocol.SessionState.UNKNOWN)

    async def aclose(self) -> ShutdownReport:
        """Shut down gracefully; idempotent (later calls wait for the first and return its
        report).

        Stops taking invocations (503), gives running rollouts ``shutdown_grace`` seconds,
        cancels the rest (writing their "cancelled" envelopes), retries the spool once
        more, and closes the S3 client if the app created it.

        Example::

            report = await app.aclose()
            print(report.cancelled, "rollouts were cancelled")
        """
        self._closing = True
        async with self._close_lock:
            if self.last_shutdown is not None:
                return self.last_shutdown
            active = self.runner.active
            if active:
                logger.info(
                    "shutting down: waiting up to %.3g s for %d running rollout(s)",
                    self.shutdown_grace,
                    active,
                )
            if self._reporting is not None:
                self._reporting.cancel()
            report = await self.runner.shutdown(
                self.shutdown_grace, cancel_timeout=self.cancel_timeout
            )
            if report.cancelled:
                logger.warning(
                    "cancelled %d rollout(s) still running after the %.3g s grace period; "
                    "their 'cancelled' envelopes were written",
                    report.cancelled,
                    self.shutdown_grace,
                )
            await self.spool.aclose()
            # Every rollout ended, or its envelope is spooled: nothing for a successor.
            self.ledger.close()
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
                # aclose() waited for every rollout and cancelled the late ones once; what
                # still runs (a handler ignoring cancellation) is cancelled for good here.
                tasks.cancel_scope.cancel()
                await owner.aclose()

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
        keyword arguments go to ``uvicorn.run``, plus ``max_connections`` and
        ``first_request_timeout`` (see :func:`~agentcore_rl.server.limits.serve_options`):
        it serves with those limits and raises the process's open-file limit.

        Example::

            app.run(8080, "0.0.0.0")
        """
        chosen = host or default_host()
        self.tune_process()
        if not logging.getLogger().handlers:
            logging.basicConfig(
                level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
            )
        logger.info("agent server listening on http://%s:%d", chosen, port)
        prepare_process()  # this process is ours: more open files, quieter EMFILE
        uvicorn.run(self, host=chosen, port=port, **serve_options(options))

    # --- routes -----------------------------------------------------------------------

    async def _ping(self, request: Request) -> Response:
        return JSONResponse(self.health.snapshot())

    def _shutting_down(self) -> JSONResponse:
        return _error_response(
            "the agent server is shutting down and takes no new invocations; retry on "
            "another instance",
            503,
        )

    async def _invocations(self, request: Request) -> Response:
        if self._closing:
            return self._shutting_down()
        if self.overload.overloaded:  # decided before any work on the request
            self.overload.refused += 1
            return _error_response("the agent server is overloaded; retry later", 503, None, 1)
        spec = self._spec
        if spec is None:
            return _error_response(
                "no entrypoint is registered: decorate a function with @app.rollout_entrypoint "
                "or @app.entrypoint",
                500,
            )
        await self.startup()
        try:
            body = await read_body(request, limit=self.max_body_bytes, budget=self.body_budget)
            try:
                payload = parse_payload(body, max_depth=self.max_json_depth)
                envelope_payload = self._envelope_payload(body, payload)
            finally:
                self.body_budget.release(len(body))
                del body  # the raw bytes are not needed past parsing
            session_id = session_id_from(request.headers)
            if control_op(payload) == protocol.CONTROL_OP_STATUS:
                # Answered at once, handler untouched: the client's liveness probe.
                return JSONResponse(self.session_state(session_id))
            config = (
                parse_rollout(payload, allowed_buckets=self.allowed_buckets)
                if self._rollout_mode
                else None
            )
            if config is not None:
                check_lease_reference(config, self.allowed_buckets)
                await self.bucket_check.require(config.s3_bucket)
            if self._validator is not None:
                checked = self._validator(payload)
                if inspect.isawaitable(checked):
                    await checked
        except InvalidPayloadError as exc:
            logger.warning("refused an invocation (%d): %s", exc.status_code, exc.message)
            refusal = _error_response(exc.message, exc.status_code, exc.field)
            if exc.status_code == 503:
                refusal.headers["Retry-After"] = "1"
            return refusal
        except ClientDisconnect:
            # The caller went away mid-body: nothing was accepted and nobody reads an
            # answer. Routine on a busy network, so no traceback.
            logger.info("a client disconnected before sending the whole invocation body")
            return Response(status_code=400)
        except Exception as exc:
            logger.exception("the payload validator raised")
            return _error_response(f"payload validator failed: {exc}", 500)
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

    def _should_check_existing(self, config: protocol.RolloutConfig | None) -> bool:
        # "repeats": only invocations the client marks as sent again can have an earlier
        # run; a first send has a fresh session id. Saves one HEAD per rollout.
        if self.check_existing_results == "repeats":
            return config is not None and config.extra.get(protocol.REPEAT) is True
        return self.check_existing_results == "always"

    def _envelope_payload(self, body: bytearray, payload: dict[str, Any]) -> dict[str, Any] | None:
        cap = self.envelope_payload_max_bytes
        if cap is None or len(body) <= cap or not self._rollout_mode:
            return None
        return protocol.payload_digest(
            hashlib.sha256(body).hexdigest(), len(body), payload.get(protocol.ROLLOUT_FIELD)
        )

    def _accept_rollout(
        self,
        spec: HandlerSpec,
        payload: dict[str, Any],
        context: RequestContext,
        envelope_payload: dict[str, Any] | None = None,
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
        else:
            key = config.key_for(context.session_id)
            if self.runner.find(config.s3_bucket, key) is not None:
                # A retried invocation (same session, same result key): one rollout only.
                logger.info("rollout for s3://%s/%s is already running", config.s3_bucket, key)
                return JSONResponse(protocol.processing_response(config, context.session_id))
            if self.finished.contains(config.s3_bucket, key) or self.spool.holds(
                config.s3_bucket, key
            ):
                # Its answer was lost, or a resume re-sent it: the envelope is written (or
                # spooled); running it again would rewrite a key the client may have read.
                logger.info("rollout for s3://%s/%s has already finished", config.s3_bucket, key)
                return JSONResponse(protocol.processing_response(config, context.session_id))
        job = self.runner.start(
            spec,
            payload,
            context,
            limiter=self._get_limiter(),
            envelope_payload=envelope_payload,
            check_existing=self._should_check_existing(config),
        )
        # Mounted where no lifespan runs there is no task group: the rollout runs after
        # the answer, in the request's own task, which the ASGI server owns.
        background = None if self.runner.owns_tasks else BackgroundTask(self.runner.run, job)
        return JSONResponse(
            protocol.processing_response(config, context.session_id), background=background
        )

    async def _call_plain(
        self, spec: HandlerSpec, payload: dict[str, Any], context: RequestContext
    ) -> Response:
        try:
            result = await call_handler(spec, payload, context, limiter=self._get_limiter())
        except InvalidPayloadError as exc:
            # The handler refused its input: that is the caller's error, not a crash.
            logger.warning("entrypoint %s refused its payload: %s", spec.name, exc.message)
            return _error_response(exc.message, exc.status_code, exc.field)
        except Exception as exc:
            logger.exception("entrypoint %s raised in session %s", spec.name, context.session_id)
            return _error_response(str(exc) or type(exc).__name__, 500)
        if isinstance(result, Response):
            return result
        try:
            return JSONResponse(result)
        except (TypeError, ValueError) as exc:
            logger.error("entrypoint %s returned a value JSON cannot hold: %s", spec.name, exc)
            return _error_response(f"handler result is not JSON-serialisable: {exc}", 500)

    async def _session_status(self, request: Request) -> Response:
        session_id = request.path_params["session_id"]
        try:
            protocol.validate_session_id(session_id, name="session id in the path")
        except InvalidPayloadError as exc:
            return _error_response(exc.message, 400, exc.field)
        return JSONResponse(self.session_state(session_id))

    async def _stop_session(self, request: Request) -> Response:
        session_id = request.path_params["session_id"]
        try:
            protocol.validate_session_id(session_id, name="session id in the path")
        except InvalidPayloadError as exc:
            return _error_response(exc.message, 400, exc.field)
        stopped = self.runner.stop_session(session_id, _STOP_REASON)
        if stopped:
            logger.info("stopping %d rollout(s) of session %s", len(stopped), session_id)
            if not await self.runner.wait(stopped, within=self.stop_wait):
                logger.warning(
                    "session %s: rollout(s) still finishing %.3g s after the stop request",
                    session_id,
                    self.stop_wait,
                )
        return JSONResponse({"session_id": session_id, "stopped": bool(stopped)})
