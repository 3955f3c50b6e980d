"""The agent server's routes: ``/invocations``, ``/ping``, ``/sessions/{id}`` and its stop.

A mixin of :class:`~agentcore_rl.server.AgentCoreRLApp`: reading and checking an
invocation, accepting a rollout (once: a repeat of a running one is recognised, a
marked re-send checks S3 first), calling a plain entrypoint, and the session routes. The
app provides the state they use (declared below).
"""

from __future__ import annotations

import hashlib
import inspect
import logging
from collections.abc import Callable
from typing import Any, Final

import anyio
from starlette.background import BackgroundTask
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response

from agentcore_rl import protocol
from agentcore_rl.errors import InvalidPayloadError
from agentcore_rl.server.buckets import BucketCheck
from agentcore_rl.server.budget import BodyBudget
from agentcore_rl.server.config import RequestLimits, ShutdownConfig
from agentcore_rl.server.context import RequestContext
from agentcore_rl.server.health import HealthTracker
from agentcore_rl.server.invoke import HandlerSpec, call_handler
from agentcore_rl.server.lease import check_lease_reference
from agentcore_rl.server.parsing import (
    control_op,
    parse_payload,
    parse_rollout,
    read_body,
    session_id_from,
)
from agentcore_rl.server.runner import RolloutRunner

__all__ = ["RolloutRoutes"]

logger = logging.getLogger("agentcore_rl.server")

_STOP_REASON: Final = "the session was stopped"


def _error_response(message: str, status_code: int, field: str | None = None) -> JSONResponse:
    return JSONResponse({"error": message, "field": field}, status_code=status_code)


def _path_session_id(request: Request) -> str | Response:
    """The session id in the path, or the 400 answer when it is unusable."""
    session_id: str = request.path_params["session_id"]
    try:
        return protocol.validate_session_id(session_id, name="session id in the path")
    except InvalidPayloadError as exc:
        return _error_response(exc.message, 400, exc.field)


class RolloutRoutes:
    """The route handlers of the agent server, over the app's state."""

    allowed_buckets: frozenset[str] | None
    limits: RequestLimits
    shutdown: ShutdownConfig
    body_budget: BodyBudget
    bucket_check: BucketCheck
    health: HealthTracker
    runner: RolloutRunner
    _spec: HandlerSpec | None
    _rollout_mode: bool
    _closing: bool
    _validator: Callable[[dict[str, Any]], Any] | None

    async def startup(self) -> None:
        raise NotImplementedError

    def _get_limiter(self) -> anyio.CapacityLimiter:
        raise NotImplementedError

    def session_state(self, session_id: str) -> dict[str, Any]:
        raise NotImplementedError

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
        spec = self._spec
        if spec is None:
            return _error_response(
                "no entrypoint is registered: decorate a function with @app.rollout_entrypoint "
                "or @app.entrypoint",
                500,
            )
        await self.startup()
        try:
            body = await read_body(
                request, limit=self.limits.max_body_bytes, budget=self.body_budget
            )
            try:
                payload = parse_payload(body, max_depth=self.limits.max_json_depth)
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

    def _envelope_payload(self, body: bytearray, payload: dict[str, Any]) -> dict[str, Any] | None:
        cap = self.limits.envelope_payload_max_bytes
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
        job = self.runner.start(
            spec,
            payload,
            context,
            limiter=self._get_limiter(),
            envelope_payload=envelope_payload,
            # Only a re-send the client marked can have an earlier run (a first send has a
            # fresh session id): one HEAD for those, none for the rest.
            check_existing=config is not None and config.extra.get(protocol.REPEAT) is True,
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
            # BedrockAgentCoreApp's answer: the message alone (its clients parse it so).
            return _error_response(str(exc) or type(exc).__name__, 500)
        if isinstance(result, Response):
            return result
        try:
            return JSONResponse(result)
        except (TypeError, ValueError) as exc:
            logger.error("entrypoint %s returned a value JSON cannot hold: %s", spec.name, exc)
            return _error_response(f"handler result is not JSON-serialisable: {exc}", 500)

    async def _session_status(self, request: Request) -> Response:
        session_id = _path_session_id(request)
        if isinstance(session_id, Response):
            return session_id
        return JSONResponse(self.session_state(session_id))

    async def _stop_session(self, request: Request) -> Response:
        session_id = _path_session_id(request)
        if isinstance(session_id, Response):
            return session_id
        stopped = self.runner.stop_session(session_id, _STOP_REASON)
        if stopped:
            logger.info("stopping %d rollout(s) of session %s", len(stopped), session_id)
            if not await self.runner.wait(stopped, within=self.shutdown.stop_wait):
                logger.warning(
                    "session %s: rollout(s) still finishing %.3g s after the stop request",
                    session_id,
                    self.shutdown.stop_wait,
                )
        return JSONResponse({"session_id": session_id, "stopped": bool(stopped)})
