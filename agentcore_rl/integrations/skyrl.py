"""SkyRL: a generator that runs each prompt's samples as one GRPO group (extra ``[skyrl]``).

The repetitions of each ``instance_id`` run as one group through
``AsyncRolloutClient.invoke_group``; the output is SkyRL's ``GeneratorOutput`` in its input
order. Configuration and behaviour: docs/trainers.md#skyrl.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from agentcore_rl._extras import require
from agentcore_rl.integrations._client import run_groups, set_policy_version, shared_client
from agentcore_rl.integrations.settings import AgentCoreSettings
from agentcore_rl.training.formats import DEFAULT_PAD_TOKEN_ID, to_skyrl
from agentcore_rl.training.rows import FitReport, TrainingRow, fit_rows, trajectory_rows

require("skyrl", "agentcore_rl.integrations.skyrl", "skyrl")

from skyrl.train.generators.base import GeneratorInterface, TrajectoryID  # noqa: E402

__all__ = ["AgentCoreGenerator"]

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


class AgentCoreGenerator(GeneratorInterface):  # type: ignore[misc]
    """SkyRL's generator over agents that run as rollout servers.

    Example::

        generator = AgentCoreGenerator(settings, step_wise=True, max_response_length=4096)
    """

    def __init__(
        self,
        settings: AgentCoreSettings,
        *,
        step_wise: bool = False,
        max_prompt_length: int | None = None,
        max_response_length: int | None = None,
        pad_token_id: int = DEFAULT_PAD_TOKEN_ID,
    ) -> None:
        self.settings = settings
        self.step_wise = step_wise
        self.max_prompt_length = max_prompt_length
        self.max_response_length = max_response_length
        self.pad_token_id = pad_token_id

    def payload(self, prompt: Any, env_extras: Mapping[str, Any] | None) -> dict[str, Any]:
        """The agent's payload for one input (override to build your own)."""
        extras = dict(env_extras or {})
        given = extras.get(self.settings.payload_key)
        if isinstance(given, Mapping):
            return dict(given)
        extras["prompt"] = prompt
        return extras

    async def generate(self, input_batch: Mapping[str, Any]) -> dict[str, Any]:
        """The batch's rollouts, as SkyRL's ``GeneratorOutput`` in input order."""
        prompts: Sequence[Any] = input_batch["prompts"]
        extras: Sequence[Mapping[str, Any]] | None = input_batch.get("env_extras")
        ids: Sequence[Any] = input_batch.get("trajectory_ids") or [
            TrajectoryID(instance_id=str(i), repetition_id=0) for i in range(len(prompts))
        ]
        meta = input_batch.get("batch_metadata")
        step = int(getattr(meta, "global_step", 0) or 0)
        phase = str(getattr(meta, "training_phase", "train"))
        instances: dict[str, list[int]] = {}
        for position, tid in enumerate(ids):
            instances.setdefault(str(tid.instance_id), []).append(position)
        client = await shared_client(self.settings)
        set_policy_version(client, step)
        sampling = dict(input_batch.get("sampling_params") or {})
        overrides = {k: sampling[k] for k in ("temperature", "top_p") if k in sampling}

        jobs = []
        for instance, positions in instances.items():
            first = positions[0]
            payload = self.payload(prompts[first], extras[first] if extras else None)
            jobs.append((payload, len(positions), f"{_UNSAFE.sub('-', instance)}@{phase}{step}"))
        results = await run_groups(client, jobs, settings=self.settings, overrides=overrides)
        member_rows: dict[int, list[TrainingRow]] = {}
        for positions, (_, _, input_id), members in zip(
            instances.values(), jobs, results, strict=True
        ):
            if members is None:  # SkyRL's own rule for a failed group: placeholders
                placeholder = trajectory_rows(
                    None,
                    exp_id=self.settings.exp_id,
                    group_id=input_id,
                    session_id="",
                    reward=0.0,
                    outcome="dropped",
                    zeroed=True,
                )
                members = [placeholder] * len(positions)
            member_rows.update(zip(positions, members, strict=True))

        rows: list[TrainingRow] = []
        trajectory_ids: list[Any] = []
        dropped_segments = 0
        for position, tid in enumerate(ids):
            segments = member_rows[position]
            if not self.step_wise:
                dropped_segments += len(segments) - 1
                segments = segments[-1:]
            rows.extend(segments)
            trajectory_ids.extend([tid] * len(segments))
        fitted = FitReport(rows=rows)
        if self.max_prompt_length is not None and self.max_response_length is not None:
            fitted = fit_rows(
                rows,
                max_prompt_length=self.max_prompt_length,
                max_response_length=self.max_response_length,
            )
        rows = fitted.rows
        output: dict[str, Any] = dict(to_skyrl(rows, pad_token_id=self.pad_token_id))
        output["trajectory_ids"] = trajectory_ids
        output["stop_reasons"] = ["stop"] * len(rows)
        output["rollout_metrics"] = {
            "agentcore/dropped_segments": dropped_segments,
            "agentcore/groups_dropped": results.count(None),
            "agentcore/responses_truncated": fitted.responses_truncated,
            "agentcore/prompts_masked": fitted.prompts_masked,
        }
        return output
