"""Training rows in the shapes veRL, slime and SkyRL take, as plain dicts (no trainer import).

The fields follow each project's source (main branches, 2026): veRL's ``AgentLoopOutput``
(``verl/experimental/agent_loop/agent_loop.py``), slime's ``Sample``
(``slime/utils/types.py``) and SkyRL's ``GeneratorOutput``
(``skyrl/train/generators/base.py``, one per batch; ``trajectory_ids`` as dicts).

Every trainer takes every row: a row without response tokens becomes a placeholder of one
``pad_token_id`` with loss mask 0, logprob 0.0 and the member's reward (veRL and SkyRL put
the reward on the last response token); an empty prompt gets one ``pad_token_id`` too;
logprobs are never ``None`` (0.0 per token when not captured).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from dataclasses import fields
from typing import Any, Final, NamedTuple, TypedDict

from agentcore_rl.training.rows import TrainingRow

__all__ = [
    "DEFAULT_PAD_TOKEN_ID",
    "SkyRLGeneratorOutput",
    "SlimeSampleFields",
    "VerlAgentLoopOutput",
    "to_skyrl",
    "to_slime",
    "to_verl",
]


#: The token a placeholder row carries unless told otherwise (masked out, never trained).
DEFAULT_PAD_TOKEN_ID: Final = 0


class _Tokens(NamedTuple):
    prompt: list[int]
    response: list[int]
    mask: list[int]
    logprobs: list[float]
    placeholder: bool


def _tokens(row: TrainingRow, pad_token_id: int) -> _Tokens:
    """The row's arrays as every trainer takes them: no empty response, no missing logprobs."""
    prompt = list(row.prompt_ids) or [pad_token_id]
    if not row.response_ids:
        return _Tokens(prompt, [pad_token_id], [0], [0.0], True)
    logprobs = list(row.logprobs) if row.logprobs else [0.0] * len(row.response_ids)
    return _Tokens(prompt, list(row.response_ids), list(row.loss_mask), logprobs, False)


# The token arrays and what every trainer has a field for; the rest goes in _extra.
_HAS_FIELD: Final = frozenset(
    {"prompt_ids", "response_ids", "loss_mask", "logprobs", "reward", "outcome"}
)


def _extra(row: TrainingRow) -> dict[str, Any]:
    """What the trainers have no field for, kept so a sample traces back to its session."""
    return {
        f.name: copy.copy(getattr(row, f.name)) for f in fields(row) if f.name not in _HAS_FIELD
    }


# --- veRL -------------------------------------------------------------------------------------


class VerlAgentLoopOutput(TypedDict):
    """The keyword arguments of veRL's ``AgentLoopOutput`` this library fills."""

    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    response_logprobs: list[float]
    reward_score: float
    metrics: dict[str, Any]
    extra_fields: dict[str, Any]


def to_verl(
    row: TrainingRow, *, pad_token_id: int = DEFAULT_PAD_TOKEN_ID, global_steps: int = 0
) -> VerlAgentLoopOutput:
    """One row as veRL's agent-loop output (``metrics`` empty: veRL's defaults apply).

    ``extra_fields`` carries ``reward_extra_info`` (``{"agentcore_reward": r}``, the same
    keys on every row, as veRL's batch concatenation needs) and ``min_global_steps`` /
    ``max_global_steps``: the oldest and newest policy version that served the row, or
    ``global_steps`` when the row has none.

    Example::

        AgentLoopOutput(**to_verl(row, global_steps=12))
    """
    tokens = _tokens(row, pad_token_id)
    versions = row.policy_versions or [global_steps]
    extra = _extra(row)
    extra.update(
        reward_extra_info={"agentcore_reward": row.reward},
        min_global_steps=min(versions),
        max_global_steps=max(versions),
        placeholder=tokens.placeholder,
    )
    return VerlAgentLoopOutput(
        prompt_ids=tokens.prompt,
        response_ids=tokens.response,
        response_mask=tokens.mask,
        response_logprobs=tokens.logprobs,
        reward_score=row.reward,
        metrics={},
        extra_fields=extra,
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
    rollout_log_probs: list[float]
    weight_versions: list[str]
    status: str
    metadata: dict[str, Any]
    session_id: str
    remove_sample: bool


def to_slime(
    rows: Iterable[TrainingRow], *, pad_token_id: int = DEFAULT_PAD_TOKEN_ID
) -> list[SlimeSampleFields]:
    """Rows as slime samples: ``group_index`` per group, ``rollout_id`` per member.

    Indices count from 0 in the order rows come. A zeroed member's sample has status
    ``"failed"`` (mask 0, reward 0, as the reference toolkit's slime backend makes it); one
    with no tokens at all is the placeholder (one pad token) and is marked
    ``remove_sample``. slime's default reward normalization is positional (it reshapes the
    rewards to ``n_samples_per_prompt`` columns), so rows of members with several segments
    need the group-aware hook ``agentcore_rl.integrations.slime.reward_post_process``.

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
        tokens = _tokens(row, pad_token_id)
        out.append(
            SlimeSampleFields(
                group_index=group_index,
                index=index,
                rollout_id=rollout_id,
                tokens=[*tokens.prompt, *tokens.response],
                response_length=len(tokens.response),
                reward=row.reward,
                loss_mask=tokens.mask,
                rollout_log_probs=tokens.logprobs,
                weight_versions=[str(v) for v in row.policy_versions],
                status="failed" if row.zeroed else "completed",
                metadata={**_extra(row), "placeholder": tokens.placeholder},
                session_id=row.session_id,
                remove_sample=tokens.placeholder,
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
    rollout_logprobs: list[list[float]]
    trajectory_ids: list[dict[str, Any]]
    trajectory_generation_times: list[float] | None
    trajectory_time_splits: dict[str, list[float]] | None
    rollout_expert_indices: list[Any] | None
    rollout_sample_support: list[Any] | None
    is_last_step: list[bool]
    env_metrics: list[dict[str, Any]] | None
    pixel_values: list[Any] | None
    image_grid_thw: list[Any] | None


def to_skyrl(
    rows: Iterable[TrainingRow], *, pad_token_id: int = DEFAULT_PAD_TOKEN_ID
) -> SkyRLGeneratorOutput:
    """Rows as one SkyRL generator output (one entry per row, in order).

    ``is_last_step`` marks each member's last segment (every row of a member with one
    segment), so the output passes SkyRL's step-wise validation with or without splits;
    step-wise training (``generator.step_wise_trajectories``) then takes each member's
    reward once, from its last step. ``rollout_logprobs`` is always a list.

    Example::

        out = to_skyrl(rows)
        out["trajectory_ids"] = [TrajectoryID(**t) for t in out["trajectory_ids"]]
    """
    batch = list(rows)
    tokens = [_tokens(row, pad_token_id) for row in batch]
    return SkyRLGeneratorOutput(
        prompt_token_ids=[t.prompt for t in tokens],
        response_ids=[t.response for t in tokens],
        rewards=[row.reward for row in batch],
        loss_masks=[t.mask for t in tokens],
        stop_reasons=None,
        rollout_metrics=None,
        rollout_logprobs=[t.logprobs for t in tokens],
        trajectory_ids=[
            {"instance_id": row.group_id, "repetition_id": row.member} for row in batch
        ],
        trajectory_generation_times=None,
        trajectory_time_splits=None,
        rollout_expert_indices=None,
        rollout_sample_support=None,
        is_last_step=[row.segment == row.num_segments - 1 for row in batch],
        env_metrics=None,
        pixel_values=None,
        image_grid_thw=None,
    )
