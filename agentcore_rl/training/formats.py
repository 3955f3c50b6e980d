"""Training rows in the shapes veRL, slime and SkyRL take, as plain dicts (no trainer import).

The shapes follow each project's public source (checked in their main branches, 2026):

- veRL ``verl/experimental/agent_loop/agent_loop.py`` ``AgentLoopOutput`` (pydantic):
  ``prompt_ids``, ``response_ids``, ``response_mask`` (1 = generated), ``response_logprobs``,
  ``reward_score``, ``metrics`` (``AgentLoopMetrics``), ``extra_fields``.
  Build one with ``AgentLoopOutput(**to_verl(row))``; veRL groups by its own ``uid``.
- slime ``slime/utils/types.py`` ``Sample`` (dataclass): ``group_index``, ``index``,
  ``rollout_id`` (shared by the samples of one rollout), ``tokens`` (prompt + response),
  ``response_length``, ``reward``, ``loss_mask`` (response only), ``rollout_log_probs``,
  ``weight_versions`` (strings), ``status``, ``metadata``, ``session_id``, ``remove_sample``.
  Build one with ``Sample(**{**d, "status": Sample.Status(d["status"])})``.
- SkyRL ``skyrl/train/generators/base.py`` ``GeneratorOutput`` (TypedDict, one per batch):
  ``prompt_token_ids``, ``response_ids``, ``rewards``, ``loss_masks``, ``rollout_logprobs``,
  ``trajectory_ids`` (``TrajectoryID(instance_id, repetition_id)``; here as dicts), and
  optional keys set to ``None``; ``is_last_step`` is set when a member has several segments.

Example::

    outputs = [to_verl(row) for row in group_rows(group)]
    samples = to_slime(rows_from_groups(groups))
    batch = to_skyrl(rows_from_groups(groups))
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, TypedDict

from agentcore_rl.training.rows import TrainingRow

__all__ = [
    "SkyRLGeneratorOutput",
    "SlimeSampleFields",
    "VerlAgentLoopOutput",
    "to_skyrl",
    "to_slime",
    "to_verl",
]


def _extra(row: TrainingRow) -> dict[str, Any]:
    """What the trainers have no field for, kept so a sample traces back to its session."""
    return {
        "exp_id": row.exp_id,
        "group_id": row.group_id,
        "session_id": row.session_id,
        "member": row.member,
        "attempt": row.attempt,
        "segment": row.segment,
        "num_segments": row.num_segments,
        "advantage": row.advantage,
        "policy_versions": list(row.policy_versions),
        "zeroed": row.zeroed,
    }


# --- veRL -------------------------------------------------------------------------------------


class VerlAgentLoopOutput(TypedDict):
    """The keyword arguments of veRL's ``AgentLoopOutput`` this library fills."""

    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    response_logprobs: list[float] | None
    reward_score: float
    metrics: dict[str, Any]
    extra_fields: dict[str, Any]


def to_verl(row: TrainingRow) -> VerlAgentLoopOutput:
    """One row as veRL's agent-loop output (``metrics`` empty: veRL's defaults apply).

    Example::

        AgentLoopOutput(**to_verl(row))
    """
    return VerlAgentLoopOutput(
        prompt_ids=list(row.prompt_ids),
        response_ids=list(row.response_ids),
        response_mask=list(row.loss_mask),
        response_logprobs=None if row.logprobs is None else list(row.logprobs),
        reward_score=row.reward,
        metrics={},
        extra_fields=_extra(row),
    )


# --- slime ------------------------------------------------------------------------------------


class SlimeSampleFields(TypedDict):
    """The keyword arguments of slime's ``Sample`` this library fills."""

    group_index: int
    index: int
    rollout_id: int
    tokens: list[int]
    response_length: int
    reward: float
    loss_mask: list[int]
    rollout_log_probs: list[float] | None
    weight_versions: list[str]
    status: str
    metadata: dict[str, Any]
    session_id: str
    remove_sample: bool


def to_slime(rows: Iterable[TrainingRow]) -> list[SlimeSampleFields]:
    """Rows as slime samples: ``group_index`` per group, ``rollout_id`` per member.

    Indices count from 0 in the order rows come. A zeroed member's sample has status
    ``"failed"`` (mask 0, reward 0, as the reference toolkit's slime backend makes it); one
    with no tokens at all is also marked ``remove_sample``.

    Example::

        samples = [Sample(**{**d, "status": Sample.Status(d["status"])})
                   for d in to_slime(rows)]
    """
    groups: dict[tuple[str, str], int] = {}
    rollouts: dict[tuple[str, str, str], int] = {}
    out: list[SlimeSampleFields] = []
    for index, row in enumerate(rows):
        group_index = groups.setdefault((row.exp_id, row.group_id), len(groups))
        rollout_id = rollouts.setdefault((row.exp_id, row.group_id, row.session_id), len(rollouts))
        out.append(
            SlimeSampleFields(
                group_index=group_index,
                index=index,
                rollout_id=rollout_id,
                tokens=[*row.prompt_ids, *row.response_ids],
                response_length=len(row.response_ids),
                reward=row.reward,
                loss_mask=list(row.loss_mask),
                rollout_log_probs=None if row.logprobs is None else list(row.logprobs),
                weight_versions=[str(v) for v in row.policy_versions],
                status="failed" if row.zeroed else "completed",
                metadata=_extra(row),
                session_id=row.session_id,
                remove_sample=not row.response_ids,
            )
        )
    return out


# --- SkyRL ------------------------------------------------------------------------------------


class SkyRLGeneratorOutput(TypedDict):
    """SkyRL's ``GeneratorOutput`` for a batch; ``trajectory_ids`` as plain dicts."""

    prompt_token_ids: list[list[int]]
    response_ids: list[list[int]]
    rewards: list[float]
    loss_masks: list[list[int]]
    stop_reasons: list[str] | None
    rollout_metrics: dict[str, Any] | None
    rollout_logprobs: list[list[float]] | None
    trajectory_ids: list[dict[str, Any]]
    trajectory_generation_times: list[float] | None
    trajectory_time_splits: dict[str, list[float]] | None
    rollout_expert_indices: list[Any] | None
    is_last_step: list[bool] | None
    env_metrics: list[dict[str, Any]] | None
    pixel_values: list[Any] | None
    image_grid_thw: list[Any] | None


def to_skyrl(rows: Iterable[TrainingRow]) -> SkyRLGeneratorOutput:
    """Rows as one SkyRL generator output (one entry per row, in order).

    ``rollout_logprobs`` is ``None`` unless every row has logprobs; ``is_last_step`` is
    ``None`` unless some member has several segments (SkyRL's step-wise training).

    Example::

        out = to_skyrl(rows)
        out["trajectory_ids"] = [TrajectoryID(**t) for t in out["trajectory_ids"]]
    """
    batch = list(rows)
    logprobs = [row.logprobs for row in batch]
    multi = any(row.num_segments > 1 for row in batch)
    return SkyRLGeneratorOutput(
        prompt_token_ids=[list(row.prompt_ids) for row in batch],
        response_ids=[list(row.response_ids) for row in batch],
        rewards=[row.reward for row in batch],
        loss_masks=[list(row.loss_mask) for row in batch],
        stop_reasons=None,
        rollout_metrics=None,
        rollout_logprobs=(
            [list(lp) for lp in logprobs if lp is not None]
            if batch and all(lp is not None for lp in logprobs)
            else None
        ),
        trajectory_ids=[
            {"instance_id": row.group_id, "repetition_id": row.member} for row in batch
        ],
        trajectory_generation_times=None,
        trajectory_time_splits=None,
        rollout_expert_indices=None,
        is_last_step=[row.segment == row.num_segments - 1 for row in batch] if multi else None,
        env_metrics=None,
        pixel_values=None,
        image_grid_thw=None,
    )
