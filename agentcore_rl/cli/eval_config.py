"""What an eval run works on: its inputs, its options and what it reports."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentcore_rl import protocol
from agentcore_rl.cli.cost import Prices
from agentcore_rl.errors import ConfigurationError, InvalidRolloutConfig

__all__ = ["EvalInput", "EvalOptions", "load_inputs"]


@dataclass(frozen=True)
class EvalInput:
    """One input: its id and the payload sent to the agent."""

    input_id: str
    payload: dict[str, Any]


def _refuse_constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number; the agent would refuse it")


def load_inputs(path: Path, *, limit: int | None = None) -> list[EvalInput]:
    """Read and check a JSONL file of inputs; raise ConfigurationError naming the line."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigurationError(f"data file not found: {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigurationError(f"cannot read data file {path}: {exc}") from None
    inputs: list[EvalInput] = []
    seen: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if limit is not None and len(inputs) >= limit:
            break
        if not line.strip():
            continue
        try:
            record = json.loads(line, parse_constant=_refuse_constant)
        except ValueError as exc:
            raise ConfigurationError(f"{path}:{number}: not valid JSON ({exc})") from None
        if not isinstance(record, dict):
            raise ConfigurationError(
                f"{path}:{number}: each line must be a JSON object, got {type(record).__name__}"
            )
        raw_id = record.get("input_id", record.get("id", f"line-{number}"))
        try:
            input_id = protocol.validate_key_part("input id", str(raw_id))
        except InvalidRolloutConfig as exc:
            raise ConfigurationError(f"{path}:{number}: {exc}") from None
        if input_id in seen:
            raise ConfigurationError(
                f"{path}:{number}: input id {input_id!r} repeats line {seen[input_id]}; "
                "ids must be unique (they name the results)"
            )
        seen[input_id] = number
        inputs.append(EvalInput(input_id, record))
    if not inputs:
        raise ConfigurationError(f"data file {path} has no inputs")
    return inputs


@dataclass(frozen=True, kw_only=True)
class EvalOptions:
    """The arguments of one eval run (``agentcore-rl eval --help``)."""

    data: Path
    out: Path
    s3_bucket: str
    exp_id: str
    agent_runtime_arn: str | None = None
    agent_urls: Sequence[str] = ()
    concurrency: int = 32
    tps: float | None = protocol.DEFAULT_TPS
    timeout: float = 900.0
    base_url: str | None = None
    model_id: str | None = None
    resume: bool = False
    limit: int | None = None
    s3_endpoint_url: str | None = None
    runtime_endpoint_url: str | None = None
    rollout_extra: dict[str, Any] = field(default_factory=dict)
    gateway_url: str | None = None
    gateway_admin_token: str | None = None
    group_size: int | None = None  # None: one rollout per input, not a group
    redundancy: int = 0
    group_seed: int | None = None
    pass_threshold: float | None = None  # None: a reward above 0 passes
    retry_lost: int | None = None  # None: the client's default
    retry_rollouts: int | None = None
    infra_stop: float | None = 0.2  # the InfraStop share; None: off
    prices: Prices = field(default_factory=Prices)

    def __post_init__(self) -> None:
        # Ranges and the choice of agent are the parser's (and the client's) to check; these
        # values name S3 keys, and the rest span options. (A bad one is a usage error either way.)
        protocol.validate_bucket(self.s3_bucket, name="--s3-bucket")
        protocol.validate_key_part("--exp-id", self.exp_id)
        if self.gateway_url is not None and self.base_url is not None:
            raise ConfigurationError(
                "give --gateway-url or --base-url, not both: through the gateway each "
                "rollout's base_url is its session's gateway URL (the gateway's --upstream "
                "is the policy)"
            )
        if self.gateway_admin_token is not None and self.gateway_url is None:
            raise ConfigurationError("--gateway-admin-token needs --gateway-url")
        if self.pass_threshold is not None and self.group_size is None:
            raise ConfigurationError("--pass-threshold needs --group-size")
        if self.redundancy and self.group_size is None:
            raise ConfigurationError("--redundancy needs --group-size")
