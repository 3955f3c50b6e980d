"""The agent server's HTTP side: reading and checking an invocation, and the routes.

Refusals are :class:`~agentcore_rl.errors.InvalidPayloadError` answered as
``{"error": <message>, "field": <field>}``. :class:`RolloutRoutes` is a mixin of
:class:`~agentcore_rl.server.AgentCoreRLApp`.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
import math
from collections.abc import Callable, Mapping
from typing import Any, Final

import anyio
from starlette.background import BackgroundTask
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response

from agentcore_rl import protocol
from agentcore_rl.errors import BucketNotAllowedError, InvalidPayloadError, InvalidRolloutConfig
from agentcore_rl.server.buckets import BucketCheck
from agentcore_rl.server.config import RequestLimits, ShutdownConfig
from agentcore_rl.server.invoke import HandlerSpec, RequestContext, call_handler
from agentcore_rl.server.runner import RolloutRunner

__all__ = ["BodyBudget", "RolloutRoutes"]

logger = logging.getLogger("agentcore_rl.server")

# All of them, or none (run without saving).
_S3_FIELDS: Final = (protocol.EXP_ID, protocol.INPUT_ID, protocol.S3_BUCKET)
_STOP_REASON: Final = "the session was stopped"


class BodyBudget:
    """Request-body bytes held by all invocations being received (one event loop, no lock).

    ``max_body_bytes`` bounds one request, this the sum; a body that does not fit gets 503.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.in_flight = 0

    def reserve(self, size: int) -> None:
        if self.in_flight + size > self.limit:
            raise InvalidPayloadError(
                f"the server holds {self.in_flight} bytes of request bodies and this one does "
                f"not fit its budget of {self.limit} bytes (max_inflight_body_bytes); retry "
                "shortly",
                status_code=503,
            )
        self.in_flight += size

    def release(self, size: int) -> None:
        self.in_flight = max(0, self.in_flight - size)


def _too_large(limit: int, detail: str) -> InvalidPayloadError:
    return InvalidPayloadError(
        f"request body {detail}; the limit is {limit} bytes (max_body_bytes)", status_code=413
    )


async def read_body(request: Request, *, limit: int, budget: BodyBudget) -> bytearray:
    """The body in one buffer; 413 over ``limit``. The caller releases ``len(body)`` from
    ``budget`` once done with it."""
    declared = request.headers.get("content-length")
    reserved = 0
    if declared is not None:
        try:
            reserved = int(declared)
        except ValueError:
            raise InvalidPayloadError(
                f"Content-Length header {declared!r} is not a number", field="content-length"
            ) from None
        if reserved > limit:
            raise _too_large(limit, f"is {reserved} bytes")
        budget.reserve(reserved)
    body = bytearray()
    try:
        async for chunk in request.stream():
            size = len(body) + len(chunk)
            if size > limit:
                raise _too_large(limit, f"exceeds {len(body)} + {len(chunk)} bytes")
            if size > reserved:
                budget.reserve(size - reserved)
                reserved = size
            body += chunk
    except BaseException:
        budget.release(reserved)
        raise
    budget.release(reserved - len(body))  # shorter than declared
    return body


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


class _OutOfRange(ValueError):
    """A JSON number too large for a float: Python would read it as infinity."""


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        # Accepted, it would make the envelope unserialisable long after the caller's 200.
        shown = text if len(text) <= 40 else text[:37] + "..."
        raise _OutOfRange(
            f"number {shown} in the request body is out of range for a 64-bit float "
            "(it would become infinity)"
        )
    return value


def _deeper_than(value: dict[str, Any] | list[Any], limit: int) -> bool:
    # Iterative, so the check itself cannot exhaust the recursion limit.
    stack: list[tuple[dict[str, Any] | list[Any], int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return True
        for child in node.values() if isinstance(node, dict) else node:
            if isinstance(child, dict | list):
                stack.append((child, depth + 1))
    return False


def _too_deep(limit: int) -> InvalidPayloadError:
    return InvalidPayloadError(
        f"request body nests objects/arrays deeper than {limit} levels (max_json_depth)"
    )


# Built once: json.loads with hooks builds a decoder per request (a measurable cost).
_DECODER: Final = json.JSONDecoder(parse_constant=_reject_constant, parse_float=_finite_float)
_JSON_KINDS: Final = {list: "array", str: "string", bool: "boolean", type(None): "null"}


def parse_payload(body: bytes | bytearray, *, max_depth: int) -> dict[str, Any]:
    """The body as a JSON object, else 400 (also NaN, ``1e400``, nesting over ``max_depth``)."""
    try:
        payload = _DECODER.decode(body.decode(json.detect_encoding(body), "surrogatepass"))
    except _OutOfRange as exc:
        raise InvalidPayloadError(str(exc)) from None
    except RecursionError:
        raise _too_deep(max_depth) from None
    except ValueError as exc:  # UnicodeDecodeError included
        raise InvalidPayloadError(f"request body is not valid JSON: {exc}") from None
    if not isinstance(payload, dict):
        kind = _JSON_KINDS.get(type(payload), "number")
        raise InvalidPayloadError(f"request body must be a JSON object, got a JSON {kind}")
    # Depth <= the count of opening brackets, a cheap C loop: most payloads skip the walk.
    if body.count(b"{") + body.count(b"[") > max_depth and _deeper_than(payload, max_depth):
        raise _too_deep(max_depth)
    return payload


def _not_allowed(bucket: str, allowed: frozenset[str] | None, field: str) -> None:
    if allowed is not None and bucket not in allowed:
        raise BucketNotAllowedError(bucket, allowed, field=field)


def parse_rollout(
    payload: Mapping[str, Any], *, allowed_buckets: frozenset[str] | None
) -> protocol.RolloutConfig | None:
    """The validated ``_rollout`` block (None: run without saving); 400 if bad, 403 if a
    bucket it names is not allowed."""
    if protocol.ROLLOUT_FIELD not in payload:
        return None
    block = payload[protocol.ROLLOUT_FIELD]
    if isinstance(block, Mapping) and all(block.get(name) is None for name in _S3_FIELDS):
        return None  # the reference toolkit's rule
    try:
        config = protocol.RolloutConfig.from_dict(block)
    except InvalidRolloutConfig as exc:
        if exc.field and not exc.field.startswith(protocol.ROLLOUT_FIELD):
            exc.field = f"{protocol.ROLLOUT_FIELD}.{exc.field}"
        raise
    field = f"{protocol.ROLLOUT_FIELD}.{protocol.S3_BUCKET}"
    _not_allowed(config.s3_bucket, allowed_buckets, field)
    if protocol.LEASE in config.extra:
        bucket, _ = protocol.parse_lease_reference(config.extra[protocol.LEASE])
        lease_field = f"{protocol.ROLLOUT_FIELD}.{protocol.LEASE}.{protocol.S3_BUCKET}"
        _not_allowed(bucket, allowed_buckets, lease_field)
    return config


def control_op(payload: Mapping[str, Any]) -> str | None:
    """The operation of a control request (None for an ordinary payload); 400 if bad."""
    if protocol.CONTROL_FIELD not in payload:
        return None
    field = protocol.CONTROL_FIELD
    block = payload[field]
    if len(payload) != 1:
        raise InvalidPayloadError(
            f"a control request holds only {field}; this payload also has other keys",
            field=field,
        )
    if not isinstance(block, dict) or set(block) != {protocol.CONTROL_OP}:
        raise InvalidPayloadError(
            f'{field} must be {{"{protocol.CONTROL_OP}": <operation>}}', field=field
        )
    op = block[protocol.CONTROL_OP]
    if op not in protocol.CONTROL_OPS:
        raise InvalidPayloadError(
            f"unknown control operation {op!r}; known: {sorted(protocol.CONTROL_OPS)}",
            field=f"{field}.{protocol.CONTROL_OP}",
        )
    return str(op)


def _error_response(message: str, status_code: int, field: str | None = None) -> JSONResponse:
    return JSONResponse({"error": message, "field": field}, status_code=status_code)


def _path_session_id(request: Request) -> str | Response:
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
    runner: RolloutRunner
    _spec: HandlerSpec | None
    _rollout_mode: bool
    _closing: bool
    _validator: Callable[[dict[str, Any]], Any] | None

    async def startup(self) -> None:
        raise NotImplementedError

    def _get_limiter(self) -> anyio.CapacityLimiter:
        raise NotImplementedError

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
            refusal = _error_response(exc.message, exc.status_code, exc.field)
            if exc.status_code == 503:
                refusal.headers["Retry-After"] = "1"
            return refusal
        except ClientDisconnect:
            # Routine, so no traceback.
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
            return JSONResponse(protocol.processing_response(config, context.session_id))
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
            logger.warning("entrypoint %s refused its payload: %s", spec.name, exc.message)
            return _error_response(exc.message, exc.status_code, exc.field)
        except Exception as exc:
            logger.exception("entrypoint %s raised in session %s", spec.name, context.session_id)
            # The message alone, as BedrockAgentCoreApp's clients parse it.
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
        return JSONResponse(self.runner.session_state(session_id))

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
