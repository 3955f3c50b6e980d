"""What the agent server writes: the answer to an accepted rollout, and the one envelope each
rollout ends in (the handler's result, or its failure), with the metadata and costs every
envelope carries. The field names are the contract's (:mod:`agentcore_rl.protocol`)."""

from __future__ import annotations

import json
import sys
import traceback
from collections.abc import Mapping
from typing import Any, Final, NamedTuple

from agentcore_rl import protocol
from agentcore_rl.errors import InfraError, InvalidPayloadError, RewardError
from agentcore_rl.protocol import FailureKind

__all__ = ["Failure", "cancelled", "envelope_bytes", "judge", "payload_digest", "processing"]

# Reasons of "cancelled" envelopes: the error type already says "cancelled".
SHUTDOWN_REASON: Final = "the agent server is shutting down"

#: Handler exceptions that are not the agent's failure: their error type and kind.
_RAISED: Final = {
    InfraError: (protocol.ERROR_INFRA, FailureKind.INFRA),
    RewardError: (protocol.ERROR_INVALID_REWARD, FailureKind.REWARD),
}


class Failure(NamedTuple):
    """What an error envelope reports."""

    error_type: str
    reason: str
    traceback: str | None = None
    status_code: int = protocol.ERROR_STATUS_CODE
    kind: FailureKind = FailureKind.AGENT


def cancelled(reason: str) -> Failure:
    """A cancel's failure: a stop's is ``stopped``; the server going away is ``infra``."""
    ours = reason == SHUTDOWN_REASON or "lease lapsed" in reason
    return Failure(
        protocol.ERROR_CANCELLED, reason, kind=FailureKind.INFRA if ours else FailureKind.STOPPED
    )


def raised(exc: Exception) -> Failure:
    """The failure of a handler that raised ``exc`` (being handled)."""
    if isinstance(exc, InvalidPayloadError):
        return Failure(protocol.ERROR_INVALID_PAYLOAD, exc.message, status_code=exc.status_code)
    # The type always ("KeyError: 'a'"): some messages mean nothing alone.
    reason = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    error_type, kind = next(
        (v for t, v in _RAISED.items() if isinstance(exc, t)),
        (protocol.ERROR_HANDLER_RAISED, FailureKind.AGENT),
    )
    return Failure(error_type, reason, traceback.format_exc(), kind=kind)


def judge(result: object) -> Failure | None:
    """The failure a handler's return value is (not a dict, an unusable reward), if any."""
    if not isinstance(result, Mapping):
        return Failure(
            protocol.ERROR_NOT_A_DICT, f"handler returned {type(result).__name__}, expected a dict"
        )
    problem = protocol.reward_problem(result)
    return (
        None
        if problem is None
        else Failure(protocol.ERROR_INVALID_REWARD, problem, kind=FailureKind.REWARD)
    )


def peak_memory_bytes() -> int | None:
    """The process's peak resident memory so far (``ru_maxrss``), or None without it."""
    try:
        import resource
    except ImportError:  # pragma: no cover - Windows
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)  # macOS counts bytes


def _dumps(obj: Any) -> bytes:
    # NaN and infinities refused: readers of the envelope choke on them.
    return json.dumps(obj, allow_nan=False).encode()


def envelope_bytes(
    config: protocol.RolloutConfig,
    session_id: str,
    metadata: Mapping[str, Any],
    result: Any,
    failure: Failure | None,
) -> tuple[bytes, Failure | None]:
    """The envelope (``metadata``: payload, times, costs) and the failure it reports: on
    success the handler's dict plus defaults, where the metadata wins over its keys."""
    meta = {
        protocol.EXP_ID: config.exp_id,
        protocol.INPUT_ID: config.input_id,
        protocol.S3_BUCKET: config.s3_bucket,
        protocol.RESULT_KEY: config.key_for(session_id),
        protocol.SESSION_ID: session_id,
        protocol.PEAK_MEMORY_BYTES: peak_memory_bytes(),
        **metadata,
    }
    if failure is None:
        defaults = {
            protocol.STATUS_CODE: protocol.DEFAULT_STATUS_CODE,
            protocol.STOP_REASON: protocol.DEFAULT_STOP_REASON,
        }
        try:
            return _dumps({**defaults, **result, **meta}), None
        except (TypeError, ValueError) as exc:
            failure = Failure(
                protocol.ERROR_NOT_JSON, f"handler result is not JSON-serialisable: {exc}"
            )
    envelope = {
        protocol.STATUS_CODE: failure.status_code,
        protocol.STOP_REASON: failure.reason,
        protocol.ERROR_TYPE: failure.error_type,
        protocol.FAILURE_KIND: failure.kind.value,
        protocol.TRACEBACK: failure.traceback,
        **meta,
    }
    try:
        return _dumps(envelope), failure
    except (TypeError, ValueError):
        # The payload came from JSON, but a handler may have put anything into it since.
        envelope[protocol.PAYLOAD] = {"unserialisable_payload": repr(meta[protocol.PAYLOAD])}
        return _dumps(envelope), failure


def processing(
    config: protocol.RolloutConfig | None, session_id: str, heartbeat: Mapping[str, Any] | None
) -> dict[str, Any]:
    """The immediate answer of a rollout entrypoint (``heartbeat``: the accepting process's,
    ``{"key", "interval"}``, when it keeps one)."""
    if config is None:
        return {protocol.STATUS: protocol.STATUS_PROCESSING}
    return {
        protocol.STATUS: protocol.STATUS_PROCESSING,
        protocol.S3_BUCKET: config.s3_bucket,
        protocol.RESULT_KEY: config.key_for(session_id),
        **({} if heartbeat is None else {protocol.HEARTBEAT: dict(heartbeat)}),
    }


def payload_digest(sha256_hex: str, size: int, rollout: object = None) -> dict[str, Any]:
    """An envelope's ``payload`` when it was too large to copy (its ``_rollout`` kept)."""
    digest: dict[str, Any] = {protocol.PAYLOAD_SHA256: sha256_hex, protocol.PAYLOAD_BYTES: size}
    if rollout is not None:
        digest[protocol.ROLLOUT_FIELD] = rollout
    return digest
