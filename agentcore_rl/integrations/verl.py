"""veRL: an agent loop that runs each sample as a rollout of your agent (extra ``[verl]``).

Each sample goes to the agent through ``AsyncRolloutClient`` and the token gateway and comes
back as veRL's own ``AgentLoopOutput`` (one per segment under veRL's v1 trainer, else the
final one). Configuration and behaviour: docs/trainers.md#verl.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from typing import Any

from agentcore_rl._extras import require
from agentcore_rl.errors import AgentCoreRLError
from agentcore_rl.integrations._client import run_sample, shared_client
from agentcore_rl.integrations.settings import AgentCoreSettings
from agentcore_rl.training.formats import DEFAULT_PAD_TOKEN_ID, to_verl
from agentcore_rl.training.rows import fit_rows, trajectory_rows

require("verl", "agentcore_rl.integrations.verl", "verl", "omegaconf")

from omegaconf import OmegaConf  # noqa: E402
from verl.experimental.agent_loop.agent_loop import (  # noqa: E402
    AgentLoopBase,
    AgentLoopMetrics,
    AgentLoopOutput,
    register,
)

__all__ = ["AGENT_NAME", "AgentCoreAgentLoop", "SampleFailedError"]

#: The name the loop is registered under (``rollout.agent.default_agent_loop``).
AGENT_NAME = "agentcore"
#: Sampling parameters of veRL's that the agent receives in its ``_rollout`` block.
_SAMPLING = ("temperature", "top_p")


class SampleFailedError(AgentCoreRLError, RuntimeError):
    """A sample failed after its retries under ``on_failure="drop_group"``."""


def _plain(value: Any) -> Any:
    if OmegaConf.is_config(value):
        return OmegaConf.to_container(value, resolve=True)
    if hasattr(value, "item") and callable(value.item) and not isinstance(value, Mapping):
        return value.item()  # numpy scalars from veRL's non-tensor batch
    return value


@register(AGENT_NAME)
class AgentCoreAgentLoop(AgentLoopBase):  # type: ignore[misc]
    """One sample, one rollout of the agent; veRL's outputs from its captured tokens.

    Example::

        # agent_loops.yaml, named by rollout.agent.agent_loop_config_path
        - name: agentcore
          _target_: agentcore_rl.integrations.verl.AgentCoreAgentLoop
          agentcore: {agent_url: "http://10.0.0.5:8080", s3_bucket: rollouts,
                      exp_id: grpo-1, gateway_url: "http://10.0.0.6:9000"}
    """

    def __init__(
        self, *args: Any, agentcore: Any = None, name: str | None = None, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        section = agentcore if agentcore is not None else self.config.get("agentcore")
        if section is None:
            raise ValueError(
                "AgentCoreAgentLoop needs its settings: an 'agentcore' mapping in its "
                "agent-loop config entry (or at the top of the trainer config)"
            )
        self.settings = (
            section
            if isinstance(section, AgentCoreSettings)
            else AgentCoreSettings.from_mapping(_plain(section))
        )

    def payload(self, sample: Mapping[str, Any]) -> dict[str, Any]:
        """The agent's payload for one dataset row (override to build your own)."""
        given = _plain(sample.get(self.settings.payload_key))
        if isinstance(given, Mapping):
            return dict(given)
        extra = _plain(sample.get("extra_info"))
        payload = dict(extra) if isinstance(extra, Mapping) else {}
        payload["prompt"] = _plain(sample.get("raw_prompt"))
        return payload

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> Any:
        """Run the sample; one ``AgentLoopOutput``, or a list of them under veRL's v1."""
        started = time.perf_counter()
        client = await shared_client(self.settings)
        step = int(_plain(kwargs.get("global_steps", 0)) or 0)
        uid = _plain(kwargs.get("uid"))
        input_id = str(uid) if uid is not None else uuid.uuid4().hex
        overrides = {k: sampling_params[k] for k in _SAMPLING if k in sampling_params}
        outcome = await run_sample(
            client,
            self.payload(kwargs),
            input_id=input_id,
            retry=self.settings.retry,
            overrides=overrides,
        )
        if outcome.error is not None and self.settings.on_failure == "drop_group":
            raise SampleFailedError(f"session {outcome.session_id}: {outcome.error}")
        rows = trajectory_rows(
            outcome.trajectory,
            exp_id=self.settings.exp_id,
            group_id=input_id,
            session_id=outcome.session_id,
            reward=outcome.reward,
            outcome="failed" if outcome.error else "succeeded",
            zeroed=outcome.error is not None,
        )
        fitted = fit_rows(
            rows,
            max_prompt_length=int(self.rollout_config.prompt_length),
            max_response_length=int(self.rollout_config.response_length),
        )
        pad = getattr(self.tokenizer, "pad_token_id", None)
        pad = DEFAULT_PAD_TOKEN_ID if pad is None else int(pad)
        elapsed = time.perf_counter() - started
        outputs = []
        for row in fitted.rows:
            fields = to_verl(row, pad_token_id=pad, global_steps=step)
            fields["extra_fields"].update(
                responses_truncated=fitted.responses_truncated,
                prompts_masked=fitted.prompts_masked,
                error=outcome.error,
            )
            metrics = AgentLoopMetrics(generate_sequences=elapsed)
            outputs.append(AgentLoopOutput(**{**fields, "metrics": metrics}))
        # veRL's v1 worker passes the repetition as session_id and takes a list.
        if "session_id" in kwargs:
            return outputs
        final = outputs[-1]
        final.extra_fields["dropped_segments"] = len(outputs) - 1
        return final
