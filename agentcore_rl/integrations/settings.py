"""What every trainer adapter needs to know, from keyword arguments or a trainer's config."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, get_args

from agentcore_rl.errors import ConfigurationError
from agentcore_rl.keywords import check_numbers, checked_init

__all__ = ["AdapterFailure", "AgentCoreSettings"]

#: What a sample that still failed after its retries becomes when the trainer owns the loop.
AdapterFailure = Literal["zero", "drop_group"]


@checked_init
@dataclass(frozen=True, kw_only=True)
class AgentCoreSettings:
    """Where rollouts run and which of the project's group rules apply in a trainer.

    The agent is ``agent_runtime_arn`` (AgentCore Runtime) or ``agent_url`` (agent servers
    over HTTP); results go to ``s3_bucket`` under ``exp_id``; tokens are captured by the
    gateway at ``gateway_url`` (required: training rows are its tokens). ``tps`` and
    ``max_concurrent_sessions`` are the client's limits; with ``shared_limits`` (a name)
    they are shared by every process on the Ray cluster that uses the same name.

    Group rules: ``retry`` re-runs a failed sample in a fresh session; what still failed
    follows ``on_failure`` (``"zero"``: a placeholder with reward 0 and loss mask 0 stays in
    its group; ``"drop_group"``: the error propagates and the trainer drops the prompt).
    ``redundancy`` extra members apply where the adapter runs the group itself (slime,
    SkyRL). ``payload_key`` names the dataset field holding the agent's payload.

    Example::

        AgentCoreSettings.from_mapping({"agent_url": "http://127.0.0.1:8080",
                                        "s3_bucket": "rollouts", "exp_id": "grpo-1",
                                        "gateway_url": "http://127.0.0.1:9000"})
    """

    s3_bucket: str
    exp_id: str
    agent_runtime_arn: str | None = None
    agent_url: str | tuple[str, ...] | None = None
    gateway_url: str | None = None
    gateway_admin_token: str | None = None
    model_id: str | None = None
    s3_endpoint_url: str | None = None
    endpoint_url: str | None = None
    max_concurrent_sessions: int = 100
    tps: float = 25.0
    timeout: float | None = 3600.0
    retry: int = 1
    on_failure: AdapterFailure = "zero"
    redundancy: int = 0
    shared_limits: str | None = None
    payload_key: str = "agentcore_payload"

    def __post_init__(self) -> None:
        if (self.agent_runtime_arn is None) == (self.agent_url is None):
            raise ConfigurationError("give exactly one of agent_runtime_arn and agent_url")
        if self.gateway_url is None:
            raise ConfigurationError(
                "gateway_url is required: a trainer trains on the tokens the gateway captures"
            )
        if self.on_failure not in get_args(AdapterFailure):
            raise ConfigurationError(
                f"on_failure must be one of {', '.join(get_args(AdapterFailure))}, "
                f"got {self.on_failure!r}"
            )
        check_numbers(self, "retry", "redundancy", at_least=0, integer=True)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> AgentCoreSettings:
        """Settings from a mapping (a trainer's config section); unknown keys are errors."""
        values = dict(data)
        url = values.get("agent_url")
        if url is not None and not isinstance(url, str):
            values["agent_url"] = tuple(str(u) for u in url)
        try:
            return cls(**values)
        except TypeError as exc:  # an unknown key (named with the closest known one), a missing one
            raise ConfigurationError(f"agentcore settings: {exc}") from None
