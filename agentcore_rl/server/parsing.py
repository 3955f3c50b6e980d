"""Reading and checking an invocation: body size, JSON, session id, ``_rollout``, bucket.

Every refusal is an :class:`~agentcore_rl.errors.InvalidPayloadError` carrying the HTTP
status (400, 403 or 413) and, where there is one, the offending field; the server turns
it into ``{"error": <message>, "field": <field>}``.

Example::

    body = await read_body(request, limit=1 << 20)
    payload = parse_payload(body)
    config = parse_rollout(payload, allowed_buckets=frozenset({"rollouts"}))
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Mapping
from typing import Any, Final

from starlette.requests import Request

from agentcore_rl import protocol
from agentcore_rl.errors import (
    BucketNotAllowedError,
    ConfigurationError,
    InvalidPayloadError,
    InvalidRolloutConfig,
)
from agentcore_rl.server.budget import BodyBudget

__all__ = [
    "ALLOWED_BUCKETS_ENV",
    "DEFAULT_MAX_JSON_DEPTH",
    "allowed_buckets_from",
    "control_op",
    "parse_payload",
    "parse_rollout",
    "read_body",
    "session_id_from",
]

#: Comma-separated bucket names; when set (and no allow-list is passed to the app), a
#: payload naming any other bucket is refused with 403.
ALLOWED_BUCKETS_ENV: Final = "AGENTCORE_RL_ALLOWED_BUCKETS"

#: Deepest nesting of objects and arrays a payload may have. Real payloads nest a few
#: levels; far deeper ones only exhaust the recursion of whatever walks them later
#: (json.dumps of the envelope, the handler's own code).
DEFAULT_MAX_JSON_DEPTH: Final = 100

# The fields that say where a result is saved: all of them, or none (run without saving).
_S3_FIELDS: Final = (protocol.EXP_ID, protocol.INPUT_ID, protocol.S3_BUCKET)


def _too_large(limit: int, detail: str) -> InvalidPayloadError:
    return InvalidPayloadError(
        f"request body {detail}; the limit is {limit} bytes (max_body_bytes)", status_code=413
    )


def _over_budget(budget: BodyBudget) -> InvalidPayloadError:
    return InvalidPayloadError(
        f"the server holds {budget.in_flight} bytes of request bodies and this one does not "
        f"fit its budget of {budget.limit} bytes (max_inflight_body_bytes); retry shortly",
        status_code=503,
    )


async def read_body(request: Request, *, limit: int, budget: BodyBudget | None = None) -> bytearray:
    """The request body, refusing more than ``limit`` bytes with 413.

    A declared ``Content-Length`` over the limit is refused before reading anything; the
    limit is also enforced while the body streams in, since chunked bodies declare none.
    With a ``budget``, the body's bytes are reserved from it (the declared length up
    front, else chunk by chunk) and a body that does not fit gets 503; the caller
    releases ``len(body)`` once done with it. The chunks are appended to one buffer, so
    the body is not held twice (chunk list plus joined copy).
    """
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            size = int(declared)
        except ValueError:
            raise InvalidPayloadError(
                f"Content-Length header {declared!r} is not a number", field="content-length"
            ) from None
        if size > limit:
            raise _too_large(limit, f"is {size} bytes")
    else:
        size = None
    reserved = 0
    if budget is not None and size is not None:
        if not budget.try_reserve(size):
            raise _over_budget(budget)
        reserved = size
    body = bytearray()
    try:
        async for chunk in request.stream():
            if len(body) + len(chunk) > limit:
                raise _too_large(limit, f"exceeds {len(body)} + {len(chunk)} bytes")
            if budget is not None and len(body) + len(chunk) > reserved:
                extra = len(body) + len(chunk) - reserved
                if not budget.try_reserve(extra):
                    raise _over_budget(budget)
                reserved += extra
            body += chunk
    except BaseException:
        if budget is not None:
            budget.release(reserved)
        raise
    if budget is not None and reserved > len(body):
        budget.release(reserved - len(body))  # shorter than declared
    return body


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


class _OutOfRange(ValueError):
    """A JSON number too large for a float: Python would read it as infinity."""


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        # Accepted, it would turn the handler's good result into an envelope JSON cannot
        # hold (result_not_json_serializable) long after the caller got its 200.
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
        children = node.values() if isinstance(node, dict) else node
        for child in children:
            if isinstance(child, dict | list):
                stack.append((child, depth + 1))
    return False


def _too_deep(limit: int) -> InvalidPayloadError:
    return InvalidPayloadError(
        f"request body nests objects/arrays deeper than {limit} levels (max_json_depth)"
    )


# Built once: json.loads with custom hooks would build a new decoder per request (a
# measurable share of an accept). Decoding bytes as json.loads does (UTF-8/16/32).
_DECODER: Final = json.JSONDecoder(parse_constant=_reject_constant, parse_float=_finite_float)


def parse_payload(
    body: bytes | bytearray, *, max_depth: int = DEFAULT_MAX_JSON_DEPTH
) -> dict[str, Any]:
    """Parse the body as a JSON object or raise 400.

    Refused: NaN and Infinity, numbers out of a float's range (``1e400``), and nesting
    deeper than ``max_depth`` objects/arrays.
    """
    try:
        payload = _DECODER.decode(body.decode(json.detect_encoding(body), "surrogatepass"))
    except _OutOfRange as exc:
        raise InvalidPayloadError(str(exc)) from None
    except RecursionError:
        raise _too_deep(max_depth) from None
    except ValueError as exc:
        # UnicodeDecodeError is a ValueError too.
        raise InvalidPayloadError(f"request body is not valid JSON: {exc}") from None
    if not isinstance(payload, dict):
        raise InvalidPayloadError(
            f"request body must be a JSON object, got a JSON {_json_kind(payload)}"
        )
    # Depth cannot exceed the number of opening brackets; counting them is a C loop over
    # the bytes, so ordinary payloads skip the walk.
    if body.count(b"{") + body.count(b"[") > max_depth and _deeper_than(payload, max_depth):
        raise _too_deep(max_depth)
    return payload


def _json_kind(value: object) -> str:
    if isinstance(value, list):
        return "array"
    if isinstance(value, str):
        return "string"
    if isinstance(value, bool):
        return "boolean"
    if value is None:
        return "null"
    return "number"


def session_id_from(headers: Mapping[str, str]) -> str:
    """The session id from the ACR header, or a fresh one; raise 400 if it is unusable."""
    value = headers.get(protocol.SESSION_ID_HEADER.lower())
    if value is None:
        return protocol.new_session_id()
    return protocol.validate_session_id(value, name=f"{protocol.SESSION_ID_HEADER} header")


def allowed_buckets_from(
    allowed: Iterable[str] | None, environ: Mapping[str, str] = os.environ
) -> frozenset[str] | None:
    """The bucket allow-list: the argument, else the environment variable, else ``None``.

    A name that is not a valid bucket raises :class:`ConfigurationError`.
    """
    source = "allowed_buckets"
    if allowed is None:
        raw = environ.get(ALLOWED_BUCKETS_ENV, "")
        names = [part.strip() for part in raw.split(",") if part.strip()]
        if not names:
            return None
        allowed, source = names, ALLOWED_BUCKETS_ENV
    elif isinstance(allowed, str):
        # A lone string would otherwise be taken as a set of one-letter buckets.
        allowed = [allowed]
    try:
        return frozenset(protocol.validate_bucket(b, name="allowed bucket") for b in allowed)
    except InvalidPayloadError as exc:
        raise ConfigurationError(f"{source}: {exc.message}") from None


def parse_rollout(
    payload: Mapping[str, Any], *, allowed_buckets: frozenset[str] | None
) -> protocol.RolloutConfig | None:
    """The validated ``_rollout`` block; 400 if bad, 403 if the bucket is not allowed.

    ``None`` when there is no block or it names none of ``exp_id``, ``input_id`` and
    ``s3_bucket`` (the rollout then runs without saving); naming only some is a 400.
    """
    if protocol.ROLLOUT_FIELD not in payload:
        return None
    block = payload[protocol.ROLLOUT_FIELD]
    if isinstance(block, Mapping):
        given = [name for name in _S3_FIELDS if block.get(name) is not None]
        if not given:
            # The reference toolkit's rule: without any S3 field the rollout runs but its
            # result is not saved (e.g. only base_url/model_id while trying an agent).
            return None
        if len(given) < len(_S3_FIELDS):
            missing = next(name for name in _S3_FIELDS if name not in given)
            raise InvalidRolloutConfig(
                f"{protocol.ROLLOUT_FIELD}.{missing} is required: give all of "
                f"{', '.join(_S3_FIELDS)} to save the result to S3, or none of them to run "
                "without saving",
                field=f"{protocol.ROLLOUT_FIELD}.{missing}",
            )
    try:
        config = protocol.RolloutConfig.from_dict(block)
    except InvalidRolloutConfig as exc:
        # Name the field by its full path in the payload, whichever check caught it.
        if exc.field and not exc.field.startswith(protocol.ROLLOUT_FIELD):
            exc.field = f"{protocol.ROLLOUT_FIELD}.{exc.field}"
        raise
    if allowed_buckets is not None and config.s3_bucket not in allowed_buckets:
        refusal = BucketNotAllowedError(config.s3_bucket, allowed_buckets)
        refusal.field = f"{protocol.ROLLOUT_FIELD}.{protocol.S3_BUCKET}"
        raise refusal
    return config


def control_op(payload: Mapping[str, Any]) -> str | None:
    """The operation of a control request (``None`` for an ordinary payload); 400 if bad."""
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
