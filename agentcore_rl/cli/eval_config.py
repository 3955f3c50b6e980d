"""What ``agentcore-rl eval`` works on: its inputs (a JSONL file), its options and what a
run reports.

Each input line is a JSON object, sent as the payload. Its ``input_id`` (or ``id``) field
names it (the line number otherwise); ids must be unique and usable in an S3 key.

Example::

    inputs = load_inputs(Path("examples/math_agent/data/problems.jsonl"), limit=10)
    options = EvalOptions(data=Path("problems.jsonl"), out=Path("results.jsonl"),
                          s3_bucket="rollouts", exp_id="eval-1",
                          agent_urls=("http://127.0.0.1:8080",))
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentcore_rl import protocol
from agentcore_rl.cli.cost import Prices
from agentcore_rl.cli.summary import RunSummary
from agentcore_rl.errors import ConfigurationError, InvalidRolloutConfig

__all__ = ["EvalInput", "EvalOptions", "EvalRun", "iter_lines", "load_inputs"]


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
    """Everything one eval run needs (the CLI's arguments, checked).

    Exactly one of ``agent_runtime_arn`` and ``agent_urls`` is given. ``s3_endpoint_url``
    and ``runtime_endpoint_url`` default to botocore's own resolution (``AWS_ENDPOINT_URL_S3``,
    ``AWS_ENDPOINT_URL_BEDROCK_AGENTCORE``). With ``gateway_url`` every rollout runs through
    that rollout gateway and its trajectory is written beside ``out``.
    """

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
    #: Run each input as a GRPO group of this many members (``None``: one rollout each).
    group_size: int | None = None
    #: Extra members per group, stopped once ``group_size`` have succeeded.
    redundancy: int = 0
    #: The client's retry budgets (``None``: its defaults): agent losses, other failures.
    retry_lost: int | None = None
    retry_rollouts: int | None = None
    #: Prices of the cost estimate on each results line and in the summary.
    prices: Prices = field(default_factory=Prices)
    #: With ``group_size``: member i's ``_rollout.seed`` is ``group_seed + i`` (``None``: none).
    group_seed: int | None = None

    def __post_init__(self) -> None:
        if (self.agent_runtime_arn is None) == (not self.agent_urls):
            raise ConfigurationError("give either an agent runtime ARN or agent URL(s)")
        protocol.validate_bucket(self.s3_bucket, name="--s3-bucket")
        try:
            protocol.validate_key_part("--exp-id", self.exp_id)
        except InvalidRolloutConfig as exc:
            raise ConfigurationError(str(exc)) from None
        if self.concurrency < 1:
            raise ConfigurationError(f"--concurrency must be >= 1, got {self.concurrency}")
        if self.tps is not None and self.tps <= 0:
            raise ConfigurationError(f"--tps must be > 0, got {self.tps}")
        if self.timeout <= 0:
            raise ConfigurationError(f"--timeout must be > 0 seconds, got {self.timeout}")
        if self.gateway_url is not None and self.base_url is not None:
            raise ConfigurationError(
                "give --gateway-url or --base-url, not both: through the gateway each "
                "rollout's base_url is its session's gateway URL (the gateway's --upstream "
                "is the policy)"
            )
        if self.gateway_admin_token is not None and self.gateway_url is None:
            raise ConfigurationError("--gateway-admin-token needs --gateway-url")
        if self.group_size is not None and self.group_size < 1:
            raise ConfigurationError(f"--group-size must be >= 1, got {self.group_size}")
        if self.redundancy < 0 or (self.redundancy and self.group_size is None):
            raise ConfigurationError("--redundancy must be >= 0 and needs --group-size")


@dataclass
class EvalRun:
    """What a finished (or interrupted) run reports: the summary, S3 request count and
    where the results file is.
    """

    summary: RunSummary
    wall_seconds: float = 0.0
    s3_requests: int = 0
    interrupted: bool = False
    out: Path | None = None
    trajectories: Path | None = None  # the trajectories file, with a gateway


def iter_lines(path: Path) -> Iterator[dict[str, Any]]:
    """The JSON objects of a results file (for scripts and tests)."""
    with path.open(encoding="utf-8") as handle:
        for line in handle:
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                if isinstance(record, dict):
                    yield record
