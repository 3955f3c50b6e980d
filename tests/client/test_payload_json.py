"""A payload JSON cannot carry is refused before anything is sent, naming the field and the
input; ``context.rollout.api_key`` is the key the trainer set."""

from __future__ import annotations

import datetime
import math
from pathlib import Path

import pytest

from agentcore_rl.cli.eval_config import load_inputs
from agentcore_rl.client.payload import build_invocation
from agentcore_rl.errors import ConfigurationError, InvalidPayloadError
from agentcore_rl.protocol import RolloutConfig

DEFAULTS = RolloutConfig(exp_id="e", input_id="default", s3_bucket="bucket")


@pytest.mark.parametrize(
    ("payload", "field", "what"),
    [
        ({"tags": {"a", "b"}}, "payload.tags", "is a set"),
        ({"meta": {"when": datetime.date(2024, 1, 1)}}, "payload.meta.when", "is a date"),
        ({"xs": [1.0, math.nan]}, "payload.xs[1]", "is nan"),
        ({"t": math.inf}, "payload.t", "is inf"),
    ],
)
def test_a_value_json_cannot_carry_is_refused_naming_field_and_input(
    payload: dict[str, object], field: str, what: str
) -> None:
    with pytest.raises(InvalidPayloadError) as caught:
        build_invocation(DEFAULTS, payload, input_id="q-7", overrides={})
    assert caught.value.field == field
    assert str(caught.value).startswith(f"input 'q-7': {field} {what}")


def test_a_nan_in_eval_data_is_a_usage_error(tmp_path: Path) -> None:
    data = tmp_path / "in.jsonl"
    data.write_text('{"id": "a", "x": NaN}\n')
    with pytest.raises(ConfigurationError, match=r"in.jsonl:1: .*NaN is not a JSON number"):
        load_inputs(data)


def test_rollout_api_key_is_an_attribute() -> None:
    block = {"exp_id": "e", "input_id": "i", "s3_bucket": "bucket", "api_key": "sess-1"}
    assert RolloutConfig.from_dict(block).api_key == "sess-1"
    assert RolloutConfig.from_dict({**block, "api_key": None}).api_key is None
