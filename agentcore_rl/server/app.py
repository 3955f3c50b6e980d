"""AgentCoreRLApp: an ASGI server that runs an agent as fire-and-forget rollouts (the
adapter: its construction, its entrypoint and its routes). Its parts and their life are in
:mod:`~agentcore_rl.server.lifecycle`, the ``BedrockAgentCoreApp`` surface it keeps in
:mod:`~agentcore_rl.server.compat`, reading an invocation in :mod:`~agentcore_rl.server.routes`.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable, Sequence
from typing import Any, Final, TypeVar

from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Lifespan

from agentcore_rl import protocol
from agentcore_rl.edge import BodyBudget, Refusal
from agentcore_rl.errors import ConfigurationError, InvalidPayloadError
from agentcore_rl.keywords import check_config_types, checked
from agentcore_rl.s3 import ResultStore
from agentcore_rl.server.compat import BedrockSurface, plain_answer
from agentcore_rl.server.envelope import processing
from agentcore_rl.server.invoke import Handler, HandlerSpec, RequestContext, call_handler
from agentcore_rl.server.lifecycle import Lifecycle
from agentcore_rl.server.options import (
    DEFAULT_FAULT_CHECKS,
    DEFAULT_REQUEST_LIMITS,
    DEFAULT_SHUTDOWN,
    DEFAULT_SPOOL,
    MOVED_KEYWORDS,
    FaultChecks,
    RequestLimits,
    ShutdownConfig,
    SpoolConfig,
    handler_app_name,
)
from agentcore_rl.server.overload import OverloadGuard
from agentcore_rl.server.routes import (
    Invocation,
    error_response,
    path_session_id,
    read_invocation,
    refused,
)

__all__ = ["AgentCoreRLApp"]

logger = logging.getLogger("agentcore_rl.server")

F = TypeVar("F", bound=Handler)
V = TypeVar("V", bound=Callable[[dict[str, Any]], Any])

_STOP_REASON: Final = "the session was stopped"


class AgentCoreRLApp(BedrockSurface, Lifecycle, Starlette):
    """The agent server: ``POST /invocations``, ``GET /ping``, ``POST /sessions/{id}/stop``.

    Register one handler with :meth:`rollout_entrypoint` (fire and forget; the result goes
    to S3) or :meth:`entrypoint` (plain request/response). Handlers may be async or sync
    (sync ones run in worker threads) and take ``(payload)`` or ``(payload, context)``.

    ``store`` is the S3 door (default: a ``ResultStore()``); the rest is grouped by
    concern: ``limits`` (:class:`~agentcore_rl.server.options.RequestLimits`: the body,
    the allowed buckets, the sync workers), ``shutdown``
    (:class:`~agentcore_rl.server.options.ShutdownConfig`), ``spool``
    (:class:`~agentcore_rl.server.options.SpoolConfig`: also the app's name) and ``faults``
    (:class:`~agentcore_rl.server.options.FaultChecks`). ``debug``, ``lifespan`` (run
    inside the app's own) and ``middleware`` are Starlette's, as in AWS's
    ``BedrockAgentCoreApp``, whose public surface it keeps. ``app.clock`` (epoch seconds)
    stamps envelopes and ``/ping``. It is an ordinary Starlette app: add routes, or mount
    it (then enter it from the parent's lifespan). docs/server.md has the defaults, the
    environment variables, repeated invocations and what is left out of AWS's app.

    Example::

        app = AgentCoreRLApp(limits=RequestLimits(allowed_buckets=["rollouts"]))

        @app.rollout_entrypoint
        def solve(payload: dict) -> dict:       # sync works too
            return {"rewards": [float(payload["answer"] == "4")]}
    """

    @checked(moved=MOVED_KEYWORDS)
    def __init__(
        self,
        *,
        store: ResultStore | None = None,
        limits: RequestLimits = DEFAULT_REQUEST_LIMITS,
        shutdown: ShutdownConfig = DEFAULT_SHUTDOWN,
        spool: SpoolConfig = DEFAULT_SPOOL,
        faults: FaultChecks = DEFAULT_FAULT_CHECKS,
        debug: bool = False,
        lifespan: Lifespan[Any] | None = None,
        middleware: Sequence[Middleware] | None = None,
    ) -> None:
        check_config_types(
            ("limits", limits, RequestLimits),
            ("shutdown", shutdown, ShutdownConfig),
            ("spool", spool, SpoolConfig),
            ("faults", faults, FaultChecks),
        )
        BedrockSurface.__init__(self)
        self._build(store, limits=limits, shutdown=shutdown, spool=spool, faults=faults)
        Starlette.__init__(
            self,
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
        self._user_lifespan = lifespan
        self.logger = logger
        self.body_budget = BodyBudget(limits.max_inflight_body_bytes)
        self._spec: HandlerSpec | None = None
        self._rollout_mode = False
        self._validator: Callable[[dict[str, Any]], Any] | None = None

    def __repr__(self) -> str:
        handler = self._spec.name if self._spec is not None else None
        kind = "rollout_entrypoint" if self._rollout_mode else "entrypoint"
        return (
            f"AgentCoreRLApp({kind}={handler!r}, active={self.runner.active}, "
            f"spooled={self.spool.pending}, closing={self._closing})"
        )

    def _busy(self) -> bool:
        return self.runner.active > 0 or self.spool.pending > 0 or super()._busy()

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

        functools.update_wrapper(main, spec.func, updated=())
        del main.__wrapped__  # type: ignore[attr-defined]  # signature: (payload, context)
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
            invocation = await read_invocation(
                request,
                limits=self.limits,
                budget=self.body_budget,
                rollout_mode=self._rollout_mode,
                allowed_buckets=self.allowed_buckets,
                require_bucket=self.bucket_check.require,
                validator=self._validator,
            )
        except (InvalidPayloadError, Refusal) as refusal:
            return refused(refusal)
        except Exception as exc:  # only the user's validator runs code not ours
            logger.exception("the payload validator raised")
            return error_response(f"payload validator failed: {exc}", 500)
        if invocation.status_only:
            return JSONResponse(self.runner.session_state(invocation.session_id))
        context = RequestContext(
            session_id=invocation.session_id,
            request_id=request.headers.get(protocol.REQUEST_ID_HEADER.lower()),
            headers=request.headers,
            rollout=invocation.rollout,
            request=request,
        )
        if self._rollout_mode:
            return self._accept_rollout(spec, invocation, context)
        return await plain_answer(spec, invocation.payload, context, self._get_limiter())

    def _accept_rollout(
        self, spec: HandlerSpec, invocation: Invocation, context: RequestContext
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
            invocation.payload,
            context,
            limiter=self._get_limiter(),
            envelope_payload=invocation.envelope_payload,
            # Only a marked re-send can have an earlier run, so only it costs a HEAD.
            check_existing=config is not None and config.extra.get(protocol.REPEAT) is True,
        )
        # No lifespan task group: run after the answer, in the request's own task.
        background = None if self._tasks is not None else BackgroundTask(self.runner.run, job)
        return JSONResponse(self._processing(config, context.session_id), background=background)

    def _processing(self, config: protocol.RolloutConfig | None, session_id: str) -> dict[str, Any]:
        """The answer to an accepted rollout, naming this process's heartbeat when it beats."""
        beat = self.heartbeat.reference(config) if config and self.heartbeat else None
        return processing(config, session_id, beat)

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
