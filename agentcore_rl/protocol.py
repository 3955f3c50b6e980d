"""The wire contract between the agent server, the trainer's client and S3: every header,
route, key layout and envelope field. Pure (no I/O), so anything may import it.

Compatible with the reference toolkit (agentcore-rl-toolkit 0.1.3): a ``_rollout`` block in
the payload, result keys ``{exp_id}/{input_id}/{session_id}.json``, and an envelope with
``status_code``, ``stop_reason``, ``input_id``, ``s3_bucket``, ``result_key`` and
``payload`` beside the handler's own fields.
"""

from __future__ import annotations

import math
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Final, NamedTuple

from agentcore_rl.errors import ConfigurationError, InvalidRolloutConfig

#: Session id header, set by AgentCore Runtime on every call to the container.
SESSION_ID_HEADER: Final = "X-Amzn-Bedrock-AgentCore-Runtime-Session-Id"
REQUEST_ID_HEADER: Final = "X-Amzn-Bedrock-AgentCore-Runtime-Request-Id"

INVOCATIONS_PATH: Final = "/invocations"
PING_PATH: Final = "/ping"
#: Our extension: stop one session's rollout (the HTTP transport's StopRuntimeSession).
STOP_SESSION_PATH: Final = "/sessions/{session_id}/stop"
#: Our extension: ``GET`` answers :func:`session_status`.
SESSION_STATUS_PATH: Final = "/sessions/{session_id}"

DEFAULT_PORT: Final = 8080


class PingStatus(str, Enum):
    """What ``GET /ping`` reports. ``HealthyBusy`` keeps ACR from reclaiming the session.

    Example::

        {"status": PingStatus.HEALTHY_BUSY.value, "time_of_last_update": 1767225600}
    """

    HEALTHY = "Healthy"
    HEALTHY_BUSY = "HealthyBusy"


ROLLOUT_FIELD: Final = "_rollout"

#: Field names inside ``_rollout``.
EXP_ID: Final = "exp_id"
INPUT_ID: Final = "input_id"
S3_BUCKET: Final = "s3_bucket"
BASE_URL: Final = "base_url"
MODEL_ID: Final = "model_id"
#: ``true`` on an invocation sent again: the server first looks for an earlier envelope
#: in S3. Kept in ``RolloutConfig.extra``.
REPEAT: Final = "repeat"

# Key parts become S3 path segments: no "/", "..", URL escaping or listing confusion.
KEY_PART_PATTERN: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._=+@:-]*")
_NOT_IN_KEY_PART: Final = re.compile(r"[^A-Za-z0-9._=+@:-]")
MAX_KEY_PART_LENGTH: Final = 200
# ACR's own rule for session ids: 33-256 characters of letters, digits and single hyphens.
SESSION_ID_PATTERN: Final = re.compile(r"[a-zA-Z0-9](-*[a-zA-Z0-9])*")
ACR_MIN_SESSION_ID_LENGTH: Final = 33
MAX_SESSION_ID_LENGTH: Final = 256
# S3's bucket naming rules (general purpose buckets).
BUCKET_PATTERN: Final = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")


def _describe(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def validate_key_part(name: str, value: object, *, max_length: int = MAX_KEY_PART_LENGTH) -> str:
    if not isinstance(value, str):
        raise InvalidRolloutConfig(
            f"{name} must be a string, got {type(value).__name__}", field=name
        )
    if not value:
        raise InvalidRolloutConfig(f"{name} must not be empty", field=name)
    if len(value) > max_length:
        raise InvalidRolloutConfig(
            f"{name} is {len(value)} characters long; the limit is {max_length}", field=name
        )
    if KEY_PART_PATTERN.fullmatch(value) is None:
        bad = _NOT_IN_KEY_PART.search(value)
        reason = f"contains character {bad[0]!r}" if bad else "must start with a letter or digit"
        raise InvalidRolloutConfig(
            f"{name} {_describe(value)} {reason}; use letters, digits and ._=+@:- "
            "(it becomes part of the S3 key)",
            field=name,
        )
    return value


def validate_session_id(value: object, *, name: str = "session id") -> str:
    """ACR's alphabet and upper bound; shorter than ACR's 33 is accepted locally."""
    if not isinstance(value, str) or not value:
        raise InvalidRolloutConfig(f"{name} must be a non-empty string", field="session_id")
    if len(value) > MAX_SESSION_ID_LENGTH:
        raise InvalidRolloutConfig(
            f"{name} is {len(value)} characters long; the limit is {MAX_SESSION_ID_LENGTH}",
            field="session_id",
        )
    if SESSION_ID_PATTERN.fullmatch(value) is None:
        raise InvalidRolloutConfig(
            f"{name} {_describe(value)} must be letters, digits and hyphens, "
            "starting and ending with a letter or digit",
            field="session_id",
        )
    return value


def is_acr_session_id(value: str) -> bool:
    return (
        ACR_MIN_SESSION_ID_LENGTH <= len(value) <= MAX_SESSION_ID_LENGTH
        and SESSION_ID_PATTERN.fullmatch(value) is not None
    )


def new_session_id() -> str:
    return secrets.token_hex(24)


#: ``arn:<partition>:bedrock-agentcore:<region>:<12-digit account>:runtime/<runtime id>``
RUNTIME_ARN_PATTERN: Final = re.compile(
    r"arn:(?P<partition>aws[a-z-]*):bedrock-agentcore:(?P<region>[a-z]{2}(-[a-z0-9]+)+):"
    r"(?P<account>\d{12}):runtime/(?P<runtime_id>[A-Za-z0-9][A-Za-z0-9_-]{0,99})"
)


class RuntimeArn(NamedTuple):
    partition: str
    region: str
    account: str
    runtime_id: str


def parse_runtime_arn(arn: object) -> RuntimeArn:
    match = RUNTIME_ARN_PATTERN.fullmatch(arn) if isinstance(arn, str) else None
    if match is None:
        raise ConfigurationError(
            f"{repr(arn)[:300]} is not an AgentCore Runtime ARN; expected "
            "arn:aws:bedrock-agentcore:<region>:<12-digit account>:runtime/<name>"
        )
    return RuntimeArn(match["partition"], match["region"], match["account"], match["runtime_id"])


def validate_bucket(value: object, *, name: str = S3_BUCKET) -> str:
    if not isinstance(value, str):
        raise InvalidRolloutConfig(
            f"{name} must be a string, got {type(value).__name__}", field=name
        )
    if BUCKET_PATTERN.fullmatch(value) is None or ".." in value:
        raise InvalidRolloutConfig(
            f"{name} {_describe(value)} is not a valid S3 bucket name "
            "(3-63 characters: lowercase letters, digits, dots and hyphens)",
            field=name,
        )
    return value


def result_key(exp_id: str, input_id: str, session_id: str) -> str:
    return f"{exp_id}/{input_id}/{session_id}.json"


def trace_key(result_key: str) -> str:
    return result_key.removesuffix(".json") + ".trace.json.gz"


def parse_result_key(key: str) -> tuple[str, str, str]:
    parts = key.split("/")
    if len(parts) != 3 or not parts[2].endswith(".json"):
        raise InvalidRolloutConfig(f"{key!r} is not a result key", field="result_key")
    return parts[0], parts[1], parts[2][: -len(".json")]


@dataclass(frozen=True, kw_only=True)
class RolloutConfig:
    """The ``_rollout`` block a trainer adds to every payload.

    ``exp_id``, ``input_id`` and ``s3_bucket`` are required; ``base_url`` and ``model_id``
    tell the agent where its policy is served; any other key (sampling parameters, a
    system prompt...) is kept in ``extra`` and passed through untouched.

    Example::

        cfg = RolloutConfig(exp_id="e1", input_id="q-1", s3_bucket="rollouts",
                            extra={"temperature": 0.7})
        payload = {"prompt": "2+2?", "_rollout": cfg.to_dict()}
        RolloutConfig.from_dict(payload["_rollout"]) == cfg   # True
    """

    exp_id: str
    input_id: str
    s3_bucket: str
    base_url: str | None = None
    model_id: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        validate_key_part(EXP_ID, self.exp_id)
        validate_key_part(INPUT_ID, self.input_id)
        validate_bucket(self.s3_bucket)
        for name in (BASE_URL, MODEL_ID):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise InvalidRolloutConfig(
                    f"{name} must be a string when given, got {type(value).__name__}",
                    field=name,
                )

    @classmethod
    def from_dict(cls, block: object) -> RolloutConfig:
        if not isinstance(block, Mapping):
            raise InvalidRolloutConfig(
                f"{ROLLOUT_FIELD} must be a JSON object, got {type(block).__name__}",
                field=ROLLOUT_FIELD,
            )
        for name in (EXP_ID, INPUT_ID, S3_BUCKET):
            if block.get(name) is None:
                raise InvalidRolloutConfig(
                    f"{ROLLOUT_FIELD}.{name} is required: give all of {EXP_ID}, {INPUT_ID}, "
                    f"{S3_BUCKET} to save the result to S3, or none of them to run without saving",
                    field=f"{ROLLOUT_FIELD}.{name}",
                )
        known = {EXP_ID, INPUT_ID, S3_BUCKET, BASE_URL, MODEL_ID}
        return cls(
            exp_id=block[EXP_ID],
            input_id=block[INPUT_ID],
            s3_bucket=block[S3_BUCKET],
            base_url=block.get(BASE_URL),
            model_id=block.get(MODEL_ID),
            extra={k: v for k, v in block.items() if k not in known},
        )

    @property
    def api_key(self) -> str | None:
        """Through a gateway: the session's key."""
        value = self.extra.get("api_key")
        return value if isinstance(value, str) else None

    @property
    def session_url(self) -> str | None:
        """``base_url`` without its ``/v1``: through a gateway, the session's root, which the
        Anthropic SDK takes as its ``base_url`` and ``boto3.client("bedrock-runtime")`` (or
        Strands' ``BedrockModel``) as its ``endpoint_url`` (docs/gateway.md, "Agent dialects").

        Example::

            Anthropic(base_url=context.rollout.session_url, api_key=context.rollout.api_key)
        """
        if self.base_url is None:
            return None
        base = self.base_url.rstrip("/")
        return base[: -len("/v1")] if base.endswith("/v1") else base

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(self.extra)
        out.update({EXP_ID: self.exp_id, INPUT_ID: self.input_id, S3_BUCKET: self.s3_bucket})
        if self.base_url is not None:
            out[BASE_URL] = self.base_url
        if self.model_id is not None:
            out[MODEL_ID] = self.model_id
        return out

    def key_for(self, session_id: str) -> str:
        return result_key(self.exp_id, self.input_id, session_id)


#: Fields of the immediate answer to a rollout invocation.
STATUS: Final = "status"
STATUS_PROCESSING: Final = "processing"
RESULT_KEY: Final = "result_key"

#: Envelope fields the server adds to the handler's result.
STATUS_CODE: Final = "status_code"
STOP_REASON: Final = "stop_reason"
SESSION_ID: Final = "session_id"
PAYLOAD: Final = "payload"
STARTED_AT: Final = "started_at"
FINISHED_AT: Final = "finished_at"
ERROR_TYPE: Final = "error_type"
TRACEBACK: Final = "traceback"

#: What a rollout cost, as the agent server measured it: wall seconds from acceptance to
#: the envelope; the process's CPU seconds over that span (``null`` when other rollouts
#: ran in the process meanwhile); its peak resident memory in bytes (``ru_maxrss``).
RUNTIME_SECONDS: Final = "runtime_seconds"
CPU_SECONDS: Final = "cpu_seconds"
PEAK_MEMORY_BYTES: Final = "peak_memory_bytes"

DEFAULT_STATUS_CODE: Final = 200
DEFAULT_STOP_REASON: Final = "end_turn"
ERROR_STATUS_CODE: Final = 500

#: ``error_type`` values the server writes for its own failure kinds.
ERROR_HANDLER_RAISED: Final = "handler_exception"
ERROR_NOT_A_DICT: Final = "invalid_result"
ERROR_NOT_JSON: Final = "result_not_json_serializable"
ERROR_CANCELLED: Final = "cancelled"
#: The handler refused its payload (raised InvalidPayloadError); ``status_code`` is 4xx.
ERROR_INVALID_PAYLOAD: Final = "invalid_payload"
#: The process running the rollout died (``status_code`` 503, written by an agent or a
#: supervisor; our client's probes detect it otherwise): retryable in a new session.
ERROR_AGENT_LOST: Final = "agent_lost"
#: The handler raised ``InfraError``: a service it depends on failed, not the agent.
ERROR_INFRA: Final = "infra_error"
#: The handler raised ``RewardError``, or its result's reward is not usable.
ERROR_INVALID_REWARD: Final = "invalid_reward"

#: Envelope field: the :class:`FailureKind` of an error envelope.
FAILURE_KIND: Final = "failure_kind"


class FailureKind(str, Enum):
    """What a rollout's failure was, in one word a trainer can act on (docs/failure-model.md).

    ``infra``: the rollout did not get a fair run (never trained on); ``agent``: the agent's
    own run failed; ``reward``: it finished but its reward cannot be used; ``timeout``: it
    passed its deadline; ``stopped``: the trainer stopped it.

    Example::

        if item.kind is FailureKind.INFRA: ...
    """

    INFRA = "infra"
    AGENT = "agent"
    REWARD = "reward"
    TIMEOUT = "timeout"
    STOPPED = "stopped"


def reward_problem(result: Mapping[str, Any], *, required: bool = False) -> str | None:
    """What makes ``result``'s reward unusable, one line naming the field (``rewards[0]``
    is not a number...), or ``None``: ``rewards`` must be a list of finite numbers and
    ``reward`` a finite number; with ``required`` one of them must hold a value."""

    def problem(name: str, value: object) -> str | None:
        if isinstance(value, bool) or not isinstance(value, int | float):
            return f"{name} must be a number, got {type(value).__name__} {_describe(value)}"
        return None if math.isfinite(value) else f"{name} must be finite, got {value!r}"

    rewards = result.get("rewards")
    if rewards is not None:
        if not isinstance(rewards, list):
            return f"rewards must be a list of numbers, got {type(rewards).__name__}"
        for index, value in enumerate(rewards):
            if found := problem(f"rewards[{index}]", value):
                return found
    if result.get("reward") is not None and (found := problem("reward", result["reward"])):
        return found
    if required and not rewards and result.get("reward") is None:
        return "the result has no reward: return rewards: [r, ...] or reward: r"
    return None


#: What an envelope carries instead of a payload over ``envelope_payload_max_bytes``.
PAYLOAD_SHA256: Final = "payload_sha256"
PAYLOAD_BYTES: Final = "payload_bytes"

#: A payload with only this reserved key, ``{"op": <operation>}``, is a control request to
#: the agent server itself (over ACR the only way to reach a session's process); with other
#: keys beside it the payload is refused (400).
CONTROL_FIELD: Final = "_agentcore_rl_control"
CONTROL_OP: Final = "op"
#: The one operation: the answer is :func:`session_status` for the invocation's session.
CONTROL_OP_STATUS: Final = "status"
CONTROL_OPS: Final = frozenset({CONTROL_OP_STATUS})

#: Fields of a session status answer.
SESSION_STATE: Final = "state"
RESULT_KEYS: Final = "result_keys"


class SessionState(str, Enum):
    """What an agent server knows about a session (``unknown`` from the one that should
    hold it: the process restarted or the request reached another; it will not finish).

    Example::

        SessionState(answer["state"]) is SessionState.RUNNING
    """

    RUNNING = "running"
    FINISHED = "finished"
    UNKNOWN = "unknown"


def status_request() -> dict[str, Any]:
    """Sent with the session's id header."""
    return {CONTROL_FIELD: {CONTROL_OP: CONTROL_OP_STATUS}}


def session_status(
    session_id: str, state: SessionState, result_keys: list[str] | None = None
) -> dict[str, Any]:
    return {
        SESSION_ID: session_id,
        SESSION_STATE: state.value,
        RESULT_KEYS: list(result_keys or []),
    }


def is_error_envelope(envelope: Mapping[str, Any]) -> bool:
    """``status_code`` >= 400 or not an int."""
    code = envelope.get(STATUS_CODE, DEFAULT_STATUS_CODE)
    return not isinstance(code, int) or isinstance(code, bool) or code >= 400


# --- Client leases --------------------------------------------------------------------------
# A client keeps one small object alive per experiment and names it in every invocation's
# ``_rollout.lease``; agent servers cancel the rollouts whose lease is no longer renewed.

#: ``_rollout`` field naming the invoking client's lease: ``{"bucket": ..., "key": ...}``.
LEASE: Final = "lease"
#: Folder of the leases under an experiment's prefix (a dot: never an input id).
LEASE_FOLDER: Final = ".leases"
LEASE_ID: Final = "lease_id"
#: The lease reference's field holding the lease object's key.
LEASE_KEY: Final = "key"
#: Incremented by every renewal: agent servers see a renewal as a change of ``seq``.
LEASE_SEQ: Final = "seq"
#: Epoch seconds of the renewal, by the client's clock.
LEASE_RENEWED_AT: Final = "renewed_at"
#: Seconds without a renewal after which the lease has lapsed.
LEASE_TTL: Final = "ttl"
#: Seconds between renewals.
LEASE_RENEW: Final = "renew"
_LEASE_KEY: Final = re.compile(
    rf"{KEY_PART_PATTERN.pattern}/{re.escape(LEASE_FOLDER)}/{KEY_PART_PATTERN.pattern}\.json"
)


def lease_key(exp_id: str, lease_id: str) -> str:
    validate_key_part(EXP_ID, exp_id)
    validate_key_part(LEASE_ID, lease_id)
    return f"{exp_id}/{LEASE_FOLDER}/{lease_id}.json"


def lease_reference(bucket: str, key: str) -> dict[str, str]:
    return {S3_BUCKET: bucket, LEASE_KEY: key}


def parse_lease_reference(value: object) -> tuple[str, str]:
    """``(bucket, key)``, refused unless a lease key: a payload cannot point the server at
    other objects."""
    name = f"{ROLLOUT_FIELD}.{LEASE}"
    if not isinstance(value, Mapping):
        raise InvalidRolloutConfig(f"{name} must be a JSON object", field=name)
    bucket = validate_bucket(value.get(S3_BUCKET), name=f"{name}.{S3_BUCKET}")
    key = value.get(LEASE_KEY)
    if not isinstance(key, str) or _LEASE_KEY.fullmatch(key) is None:
        raise InvalidRolloutConfig(
            f"{name}.key {_describe(key)} is not a lease key "
            f"({{exp_id}}/{LEASE_FOLDER}/{{id}}.json)",
            field=f"{name}.key",
        )
    return bucket, key


def lease_body(
    lease_id: str, *, seq: int, renewed_at: float, ttl: float, renew: float
) -> dict[str, Any]:
    return {
        LEASE_ID: lease_id,
        LEASE_SEQ: seq,
        LEASE_RENEWED_AT: renewed_at,
        LEASE_TTL: ttl,
        LEASE_RENEW: renew,
    }


#: Why a rollout whose client's lease lapsed was cancelled (its envelope's stop_reason).
LEASE_LAPSED_REASON: Final = (
    "cancelled: the client's lease lapsed (not renewed for {ttl:g} s: the client crashed "
    "or lost its connection to S3)"
)

# --- Agent heartbeats -------------------------------------------------------------------------
# An agent process rewrites one small object per experiment it runs rollouts of, every
# ``interval`` seconds, and names it in its answer to each rollout it accepts: a client that
# sees it unchanged for HEARTBEAT_MISSES intervals knows the process is gone.

#: Answer field: ``{"key": ..., "interval": seconds}`` (in the rollout's bucket).
HEARTBEAT: Final = "heartbeat"
#: Folder of the heartbeats under an experiment's prefix (a dot: never an input id).
HEARTBEAT_FOLDER: Final = ".heartbeats"
HEARTBEAT_INTERVAL: Final = "interval"
#: Intervals a heartbeat may stay unchanged before its process counts as gone.
HEARTBEAT_MISSES: Final = 3


def heartbeat_key(exp_id: str, process_id: str) -> str:
    return f"{exp_id}/{HEARTBEAT_FOLDER}/{process_id}.json"


def parse_heartbeat(answer: Mapping[str, Any], exp_id: str) -> tuple[str, float] | None:
    """``(key, interval)`` of an answer's heartbeat; ``None`` without a usable one (a
    server that does not heartbeat, or one naming a key outside the experiment's folder)."""
    value = answer.get(HEARTBEAT)
    key, interval = (value.get(LEASE_KEY), value.get(HEARTBEAT_INTERVAL)) if value else (0, 0)
    if not isinstance(key, str) or not key.startswith(f"{exp_id}/{HEARTBEAT_FOLDER}/"):
        return None
    if isinstance(interval, bool) or not isinstance(interval, int | float) or not interval > 0:
        return None
    return key, float(interval)


#: AgentCore Runtime's published default quota: invoke + stop calls per second per endpoint.
DEFAULT_TPS: Final = 25.0
