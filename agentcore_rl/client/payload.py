"""Building an invocation body: the payload plus its validated ``_rollout`` block."""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Mapping
from typing import Any

from agentcore_rl import protocol
from agentcore_rl.errors import ConfigurationError, InvalidPayloadError, InvalidRolloutConfig

__all__ = [
    "attached_config",
    "build_invocation",
    "client_defaults",
    "rollout_extras",
]

_NO_EXTRAS: Mapping[str, Any] = {}


def default_input_id(payload: Mapping[str, Any], index: int) -> str:
    """A batch or group item's name when its ``_rollout`` has none: the payload's own
    ``input_id`` or ``id`` when it fits a key (as ``agentcore-rl eval`` names inputs), else
    its index, zero-padded (``"000017"``)."""
    for name in (protocol.INPUT_ID, "id"):
        value = payload.get(name)
        if isinstance(value, str | int) and not isinstance(value, bool):
            text = str(value)
            if len(text) <= protocol.MAX_KEY_PART_LENGTH and protocol.KEY_PART_PATTERN.fullmatch(
                text
            ):
                return text
    return f"{index:06d}"


def rollout_extras(value: object) -> Mapping[str, Any]:
    if value is None:
        return _NO_EXTRAS
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise InvalidRolloutConfig(
            "rollout= takes a mapping of _rollout keys, e.g. rollout={'temperature': 0.7}, "
            f"got {value!r:.80}",
            field="rollout",
        )
    return value


def client_defaults(
    rollout: object, *, exp_id: str, s3_bucket: str, gateway: bool
) -> protocol.RolloutConfig:
    try:
        extra = dict(rollout_extras(rollout))
    except InvalidRolloutConfig as exc:
        raise ConfigurationError(str(exc)) from exc
    for name in (protocol.EXP_ID, protocol.S3_BUCKET, protocol.INPUT_ID):
        if name in extra:
            where = "each call's input_id=" if name == protocol.INPUT_ID else f"{name}="
            raise ConfigurationError(f"rollout= cannot set {name!r}: give it as {where}")
    if gateway and protocol.BASE_URL in extra:
        raise ConfigurationError(
            "give rollout={'base_url': ...} or a gateway, not both: through a gateway each "
            "rollout's base_url is its session's gateway URL (the gateway's --upstream "
            "is the policy)"
        )
    block = {**extra, protocol.EXP_ID: exp_id, protocol.INPUT_ID: "placeholder"}
    try:
        return protocol.RolloutConfig.from_dict({**block, protocol.S3_BUCKET: s3_bucket})
    except InvalidRolloutConfig as exc:
        raise ConfigurationError(str(exc)) from exc


def attached_config(
    defaults: protocol.RolloutConfig,
    session_id: str,
    result_key: object,
    input_id: str | None,
    s3_bucket: object,
) -> protocol.RolloutConfig:
    """``input_id`` defaults to the key's."""
    bucket = protocol.validate_bucket(s3_bucket, name="s3_bucket")
    if not isinstance(result_key, str) or not result_key:
        raise InvalidRolloutConfig(
            f"result_key must be a non-empty string, got {result_key!r}", field="result_key"
        )
    if input_id is None:
        try:
            input_id = protocol.parse_result_key(result_key)[1]
        except InvalidRolloutConfig:
            input_id = session_id  # a key outside the usual layout: the session names it
    return dataclasses.replace(defaults, input_id=input_id, s3_bucket=bucket)


def _check_json(value: Any, where: str, input_id: str) -> None:
    """Refuse what JSON cannot carry (a set, a datetime, NaN or infinity) before sending,
    naming the field and the input."""
    if isinstance(value, Mapping):
        for key, item in value.items():
            _check_json(item, f"{where}.{key}", input_id)
    elif isinstance(value, list | tuple):
        for number, item in enumerate(value):
            _check_json(item, f"{where}[{number}]", input_id)
    elif isinstance(value, float) and not math.isfinite(value):
        raise InvalidPayloadError(
            f"input {input_id!r}: {where} is {value}, which JSON cannot carry", field=where
        )
    elif value is not None and not isinstance(value, str | int | float):
        raise InvalidPayloadError(
            f"input {input_id!r}: {where} is a {type(value).__name__}, which JSON cannot "
            "carry (convert it to a list, string or number)",
            field=where,
        )


def build_invocation(
    defaults: protocol.RolloutConfig,
    payload: Mapping[str, Any],
    *,
    input_id: str | None,
    overrides: Mapping[str, Any],
    default_input_id: str | None = None,
) -> tuple[dict[str, Any], protocol.RolloutConfig]:
    """The body to send and its ``_rollout`` config: ``defaults`` (its ``input_id``
    ignored), then the payload's own ``_rollout`` keys, then ``overrides``, then
    ``input_id``; without any input id, ``default_input_id`` or microseconds since the
    epoch: unique enough (result keys also hold the session id) and time-ordered, so the
    watcher's LIST skips older results."""
    if not isinstance(payload, Mapping):
        raise InvalidPayloadError(
            f"a payload must be a JSON object (a dict), got {type(payload).__name__}"
        )
    own = payload.get(protocol.ROLLOUT_FIELD) or {}
    if not isinstance(own, Mapping):
        raise InvalidRolloutConfig(
            f"payload {protocol.ROLLOUT_FIELD} must be a dict, got {type(own).__name__}",
            field=protocol.ROLLOUT_FIELD,
        )
    block = defaults.to_dict()
    block.pop(protocol.INPUT_ID)
    block.update(own)
    block.update(overrides)
    if input_id is not None:
        block[protocol.INPUT_ID] = input_id
    elif block.get(protocol.INPUT_ID) is None:
        block[protocol.INPUT_ID] = default_input_id or str(time.time_ns() // 1000)
    config = protocol.RolloutConfig.from_dict(block)
    _check_json(payload, "payload", config.input_id)
    body = dict(payload)
    body[protocol.ROLLOUT_FIELD] = config.to_dict()
    return body, config
