"""Reading and checking an invocation: its body within the bytes in flight, its JSON, its
session, its ``_rollout`` block (and its bucket), control requests and the user's validator.
:func:`read_invocation` decides: this request is that :class:`Invocation`, or a refusal
(:class:`~agentcore_rl.errors.InvalidPayloadError`, or the edge's
:class:`~agentcore_rl.edge.Refusal`), answered as ``{"error": <message>, "field": <field>}``.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
import math
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from agentcore_rl import protocol
from agentcore_rl.edge import BodyBudget, Refusal, read_body
from agentcore_rl.errors import BucketNotAllowedError, InvalidPayloadError, InvalidRolloutConfig
from agentcore_rl.server.envelope import payload_digest
from agentcore_rl.server.options import RequestLimits

__all__ = [
    "Invocation",
    "control_op",
    "error_response",
    "parse_payload",
    "parse_rollout",
    "path_session_id",
    "read_invocation",
    "refused",
]

logger = logging.getLogger("agentcore_rl.server")

# All of them, or none (run without saving).
_S3_FIELDS: Final = (protocol.EXP_ID, protocol.INPUT_ID, protocol.S3_BUCKET)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        # Accepted, it would make the envelope unserialisable long after the caller's 200.
        shown = text if len(text) <= 40 else text[:37] + "..."
        raise InvalidPayloadError(
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
    except InvalidPayloadError:
        raise
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


def error_response(message: str, status_code: int, field: str | None = None) -> JSONResponse:
    return JSONResponse({"error": message, "field": field}, status_code=status_code)


def refused(refusal: InvalidPayloadError | Refusal) -> JSONResponse:
    """A refused invocation's answer, logged (a client that left, routinely)."""
    if isinstance(refusal, InvalidPayloadError):
        refusal = Refusal(refusal.status_code, refusal.message, field=refusal.field)
    level = logging.INFO if refusal.kind == "client_disconnected" else logging.WARNING
    logger.log(level, "refused an invocation (%d): %s", refusal.status, refusal.message)
    answer = error_response(refusal.message, refusal.status, refusal.field)
    answer.headers.update(refusal.headers)
    return answer


@dataclass(frozen=True, slots=True)
class Invocation:
    """An accepted invocation: its payload, session, ``_rollout`` block (None: run without
    saving) and, over ``envelope_payload_max_bytes``, the digest its envelope holds instead
    of the payload; ``status_only`` for a status control request."""

    payload: dict[str, Any]
    session_id: str
    rollout: protocol.RolloutConfig | None = None
    envelope_payload: dict[str, Any] | None = None
    status_only: bool = False


async def read_invocation(
    request: Request,
    *,
    limits: RequestLimits,
    budget: BodyBudget,
    rollout_mode: bool,
    allowed_buckets: frozenset[str] | None,
    require_bucket: Callable[[str], Awaitable[None]],
    validator: Callable[[dict[str, Any]], Any] | None,
) -> Invocation:
    """What the request asks, or a refusal (``InvalidPayloadError``, ``Refusal``)."""
    body = await read_body(
        request.receive, request.scope["headers"], limit=limits.max_body_bytes, budget=budget
    )
    try:
        payload = parse_payload(body, max_depth=limits.max_json_depth)
        cap = limits.envelope_payload_max_bytes
        digest = None  # the envelope copies the payload, unless over the cap
        if rollout_mode and cap is not None and len(body) > cap:
            sha256 = hashlib.sha256(body).hexdigest()
            digest = payload_digest(sha256, len(body), payload.get(protocol.ROLLOUT_FIELD))
    finally:
        budget.release(len(body))
        del body
    header = request.headers.get(protocol.SESSION_ID_HEADER.lower())
    session_id = (
        protocol.new_session_id()
        if header is None
        else protocol.validate_session_id(header, name=f"{protocol.SESSION_ID_HEADER} header")
    )
    if control_op(payload) == protocol.CONTROL_OP_STATUS:
        return Invocation(payload, session_id, status_only=True)
    config = parse_rollout(payload, allowed_buckets=allowed_buckets) if rollout_mode else None
    if config is not None:
        await require_bucket(config.s3_bucket)
    if validator is not None:
        checked = validator(payload)
        if inspect.isawaitable(checked):
            await checked
    return Invocation(payload, session_id, config, digest)


def path_session_id(request: Request) -> str | Response:
    session_id: str = request.path_params["session_id"]
    try:
        return protocol.validate_session_id(session_id, name="session id in the path")
    except InvalidPayloadError as exc:
        return error_response(exc.message, 400, exc.field)
