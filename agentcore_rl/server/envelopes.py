"""Turning a handler's outcome into the JSON bytes of its result envelope.

Every outcome becomes exactly one envelope: the handler's dict on success, or an error
envelope whose ``error_type`` says what went wrong (the handler raised, returned a
non-dict, returned something JSON cannot hold, or was cancelled).

Example::

    body, error_type = outcome_envelope(meta, {"rewards": [1.0]})   # error_type is None
    body = error_envelope_bytes(meta, error_type=ERROR_CANCELLED, reason="stopped by request")
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from agentcore_rl import protocol

__all__ = [
    "describe_exception",
    "dumps_strict",
    "error_envelope_bytes",
    "outcome_envelope",
]


def describe_exception(exc: BaseException) -> str:
    """``"KeyError: 'a'"``: the type always, since some messages mean nothing alone."""
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def dumps_strict(obj: Any) -> bytes:
    """JSON as S3 will hold it: NaN and infinities refused, since readers choke on them."""
    return json.dumps(obj, allow_nan=False).encode()


def error_envelope_bytes(
    metadata: Mapping[str, Any],
    *,
    error_type: str,
    reason: str,
    traceback: str | None = None,
    status_code: int = protocol.ERROR_STATUS_CODE,
) -> bytes:
    """Serialise an error envelope; never fails.

    The payload in the metadata came from JSON, but a handler may have put anything into
    it since, so if it no longer serialises it is replaced by its ``repr``.
    """
    envelope = protocol.error_envelope(
        error_type=error_type,
        stop_reason=reason,
        metadata=metadata,
        traceback=traceback,
        status_code=status_code,
    )
    try:
        return dumps_strict(envelope)
    except (TypeError, ValueError):
        envelope[protocol.PAYLOAD] = {"unserialisable_payload": repr(metadata.get("payload"))}
        return dumps_strict(envelope)


def outcome_envelope(metadata: Mapping[str, Any], result: object) -> tuple[bytes, str | None]:
    """The envelope for a handler that returned ``result``: ``(body, error_type or None)``."""
    if not isinstance(result, Mapping):
        return (
            error_envelope_bytes(
                metadata,
                error_type=protocol.ERROR_NOT_A_DICT,
                reason=f"handler returned {type(result).__name__}, expected a dict",
            ),
            protocol.ERROR_NOT_A_DICT,
        )
    try:
        return dumps_strict(protocol.success_envelope(result, metadata)), None
    except (TypeError, ValueError) as exc:
        return (
            error_envelope_bytes(
                metadata,
                error_type=protocol.ERROR_NOT_JSON,
                reason=f"handler result is not JSON-serialisable: {exc}",
            ),
            protocol.ERROR_NOT_JSON,
        )
