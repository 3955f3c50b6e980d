"""The wire contract: key parts, session ids, the _rollout block and envelopes."""

from __future__ import annotations

import json

import pytest

from agentcore_rl.errors import InvalidRolloutConfig
from agentcore_rl.protocol import (
    RolloutConfig,
    is_acr_session_id,
    is_error_envelope,
    new_session_id,
    parse_result_key,
    result_key,
    validate_bucket,
    validate_key_part,
    validate_session_id,
)
from agentcore_rl.server.envelope import cancelled, envelope_bytes, processing

BLOCK = {"exp_id": "exp-1", "input_id": "q-17", "s3_bucket": "rollouts"}


def test_rollout_config_round_trips_with_extras() -> None:
    block = {**BLOCK, "base_url": "http://127.0.0.1:9000/v1", "temperature": 0.7}
    cfg = RolloutConfig.from_dict(block)
    assert cfg.extra == {"temperature": 0.7}
    assert cfg.to_dict() == block
    assert RolloutConfig.from_dict(cfg.to_dict()) == cfg


@pytest.mark.parametrize("missing", ["exp_id", "input_id", "s3_bucket"])
def test_missing_field_is_named(missing: str) -> None:
    block = {k: v for k, v in BLOCK.items() if k != missing}
    with pytest.raises(InvalidRolloutConfig, match=f"_rollout.{missing} is required") as info:
        RolloutConfig.from_dict(block)
    assert info.value.field == f"_rollout.{missing}"
    assert info.value.status_code == 400


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("a/b", "character '/'"),
        ("..", "must start with a letter or digit"),
        ("../x", "character '/'"),
        ("a\nb", r"character '\\n'"),
        ("a b", "character ' '"),
        ("", "must not be empty"),
        ("x" * 201, "limit is 200"),
        (17, "must be a string, got int"),
        ("é", "character 'é'"),
    ],
)
def test_unsafe_key_parts_are_refused(value: object, fragment: str) -> None:
    with pytest.raises(InvalidRolloutConfig, match=fragment):
        validate_key_part("input_id", value)


def test_bad_types_and_buckets() -> None:
    with pytest.raises(InvalidRolloutConfig, match="_rollout must be a JSON object"):
        RolloutConfig.from_dict(["x"])
    with pytest.raises(InvalidRolloutConfig, match="not a valid S3 bucket name"):
        validate_bucket("Bad_Bucket")
    with pytest.raises(InvalidRolloutConfig, match="base_url must be a string"):
        RolloutConfig.from_dict({**BLOCK, "base_url": 3})


def test_session_ids() -> None:
    sid = new_session_id()
    assert is_acr_session_id(sid)
    assert validate_session_id("local-1") == "local-1"
    assert not is_acr_session_id("local-1")
    for bad in ["a/b", "-a", "a-", "", "x" * 257]:
        with pytest.raises(InvalidRolloutConfig):
            validate_session_id(bad)


def test_result_keys() -> None:
    key = result_key("exp", "q-1", "sid")
    assert key == "exp/q-1/sid.json"
    assert parse_result_key(key) == ("exp", "q-1", "sid")
    with pytest.raises(InvalidRolloutConfig):
        parse_result_key("exp/sid.json")


def test_envelopes() -> None:
    cfg = RolloutConfig.from_dict(BLOCK)
    assert processing(None, "s", None) == {"status": "processing"}
    assert processing(cfg, "s", None)["result_key"] == "exp-1/q-17/s.json"
    meta = {"payload": {"p": 1}, "started_at": 1.0}
    body, failure = envelope_bytes(
        cfg, "s", meta, {"rewards": [1.0], "session_id": "spoofed"}, None
    )
    ok = json.loads(body)
    assert failure is None
    assert ok["status_code"] == 200
    assert ok["stop_reason"] == "end_turn"
    assert ok["session_id"] == "s"
    assert not is_error_envelope(ok)
    assert is_error_envelope(
        json.loads(envelope_bytes(cfg, "s", meta, {"status_code": 503}, None)[0])
    )
    body, failure = envelope_bytes(cfg, "s", meta, None, cancelled("shutdown"))
    bad = json.loads(body)
    assert bad["status_code"] == 500
    assert is_error_envelope(bad)
    assert is_error_envelope({"status_code": "200"})
