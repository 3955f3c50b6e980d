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

__all__ = [
    "ALLOWED_BUCKETS_ENV",
    "allowed_buckets_from",
    "parse_payload",
    "parse_rollout",
    "read_body",
    "session_id_from",
]

#: Comma-separated bucket names; when set (and no allow-list is passed to the app), a
#: payload naming any other bucket is refused with 403.
ALLOWED_BUCKETS_ENV: Final = "AGENTCORE_RL_ALLOWED_BUCKETS"

# The fields that say where a result is saved: all of them, or none (run without saving).
_S3_FIELDS: Final = (protocol.EXP_ID, protocol.INPUT_ID, protocol.S3_BUCKET)


def _too_large(limit: int, detail: str) -> InvalidPayloadError:
    return InvalidPayloadError(
        f"request body {detail}; the limit is {limit} bytes (max_body_bytes)", status_code=413
    )


async def read_body(request: Request, *, limit: int) -> bytes:
    """The request body, refusing more than ``limit`` bytes with 413.

    A declared ``Content-Length`` over the limit is refused before reading anything; the
    limit is also enforced while the body streams in, since chunked bodies declare none.
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
    chunks: list[bytes] = []
    received = 0
    async for chunk in request.stream():
        received += len(chunk)
        if received > limit:
            raise _too_large(limit, f"exceeds {received - len(chunk)} + {len(chunk)} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def parse_payload(body: bytes) -> dict[str, Any]:
    """Parse the body as a JSON object (NaN and Infinity refused) or raise 400."""
    try:
        payload = json.loads(body, parse_constant=_reject_constant)
    except ValueError as exc:
        # UnicodeDecodeError is a ValueError too.
        raise InvalidPayloadError(f"request body is not valid JSON: {exc}") from None
    if not isinstance(payload, dict):
        raise InvalidPayloadError(
            f"request body must be a JSON object, got a JSON {_json_kind(payload)}"
        )
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
