"""slime: a custom rollout function and a group-aware reward hook (extra ``[slime]``).

``generate_rollout`` runs each of the step's prompt groups through
``AsyncRolloutClient.invoke_group`` and fills slime's own ``Sample`` objects;
``reward_post_process`` counts each rollout once in its group (a member with several
segments is several samples). Configuration and behaviour: docs/trainers.md#slime.
"""

from __future__ import annotations

import copy
import json
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any, Final

import anyio

from agentcore_rl._extras import require
from agentcore_rl.groups import advantages
from agentcore_rl.integrations._client import (
    close_shared_clients,
    run_groups,
    set_policy_version,
    shared_client,
)
from agentcore_rl.integrations.settings import AgentCoreSettings
from agentcore_rl.training.formats import DEFAULT_PAD_TOKEN_ID, to_slime
from agentcore_rl.training.rows import TrainingRow

require("slime", "agentcore_rl.integrations.slime", "torch")

try:
    from slime.rollout.base_types import RolloutFnTrainOutput
    from slime.utils.types import Sample
except ModuleNotFoundError as exc:
    if (exc.name or "").split(".")[0] != "slime":
        raise
    # slime is not on PyPI, so no extra can bring it.
    raise ModuleNotFoundError(
        "agentcore_rl.integrations.slime needs slime, which is not on PyPI: install it from "
        "its source (pip install -e path/to/slime), then pip install 'agentcore-rl[slime]'",
        name="slime",
    ) from exc

__all__ = ["SETTINGS_ENV", "generate_rollout", "reward_post_process", "settings_of"]

#: The environment variable naming a JSON file of settings (when ``args`` has none).
SETTINGS_ENV: Final = "AGENTCORE_RL_SETTINGS"
_GRPO_LIKE: Final = ("grpo", "gspo", "cispo", "reinforce_plus_plus_baseline")
_STD_NORMALIZED: Final = ("grpo", "gspo", "cispo")


def settings_of(args: Any) -> AgentCoreSettings:
    """The adapter's settings: ``args.agentcore``, else the JSON file ``$AGENTCORE_RL_SETTINGS``.

    Example::

        settings_of(argparse.Namespace(agentcore={"agent_url": ..., ...}))
    """
    given = getattr(args, "agentcore", None)
    if isinstance(given, AgentCoreSettings):
        return given
    if isinstance(given, Mapping):
        return AgentCoreSettings.from_mapping(given)
    path = os.environ.get(SETTINGS_ENV)
    if not path:
        raise ValueError(
            f"the slime adapter needs its settings: args.agentcore or a JSON file named by "
            f"{SETTINGS_ENV}"
        )
    with open(path, encoding="utf-8") as file:
        return AgentCoreSettings.from_mapping(json.load(file))


def _payload(sample: Any, key: str) -> dict[str, Any]:
    metadata = sample.metadata if isinstance(sample.metadata, Mapping) else {}
    given = metadata.get(key)
    if isinstance(given, Mapping):
        return dict(given)
    return {"prompt": sample.prompt, "label": sample.label}


def _fill(original: Any, rows: list[TrainingRow], pad_token_id: int) -> list[Any]:
    """slime samples for one member's rows: copies of the original, slime's indices kept."""
    out = []
    for fields in to_slime(rows, pad_token_id=pad_token_id):
        sample = copy.copy(original)
        sample.tokens = fields["tokens"]
        sample.response_length = fields["response_length"]
        sample.loss_mask = fields["loss_mask"]
        sample.rollout_log_probs = fields["rollout_log_probs"]
        sample.reward = fields["reward"]
        sample.weight_versions = fields["weight_versions"]
        sample.status = Sample.Status(fields["status"])
        sample.remove_sample = fields["remove_sample"]
        sample.rollout_id = original.index
        sample.session_id = fields["session_id"]
        sample.metadata = {**(original.metadata or {}), "agentcore": fields["metadata"]}
        out.append(sample)
    return out


async def _run_groups(
    args: Any, settings: AgentCoreSettings, groups: Sequence[Sequence[Any]], rollout_id: int
) -> tuple[list[list[Any]], dict[str, Any]]:
    client = await shared_client(settings)
    set_policy_version(client, rollout_id)
    pad = getattr(args, "pad_token_id", None)
    pad = DEFAULT_PAD_TOKEN_ID if pad is None else int(pad)
    try:
        jobs = [
            (_payload(g[0], settings.payload_key), len(g), f"r{rollout_id}-g{g[0].group_index}")
            for g in groups
        ]
        results = await run_groups(client, jobs, settings=settings, overrides={})
    finally:
        # Each step runs on its own event loop (slime calls this function synchronously).
        await close_shared_clients()
    samples = [
        [out for sample, rows in zip(g, members, strict=True) for out in _fill(sample, rows, pad)]
        for g, members in zip(groups, results, strict=True)
        if members is not None  # slime's own rule for a dropped group: it is not trained
    ]
    return samples, {"agentcore/groups_dropped": results.count(None)}


def generate_rollout(args: Any, rollout_id: int, data_source: Any, evaluation: bool = False) -> Any:
    """slime's rollout function: the step's prompt groups, run as groups, as slime samples.

    Example::

        --rollout-function-path agentcore_rl.integrations.slime.generate_rollout
    """
    if evaluation:
        raise NotImplementedError(
            "the slime adapter generates training rollouts; keep slime's own "
            "--eval-function-path (or agentcore-rl eval) for evaluation"
        )
    settings = settings_of(args)
    groups = data_source.get_samples(args.rollout_batch_size)
    samples, metrics = anyio.run(_run_groups, args, settings, groups, rollout_id)
    return RolloutFnTrainOutput(samples=samples, metrics=metrics)


def reward_post_process(args: Any, samples: Sequence[Any]) -> tuple[list[float], list[float]]:
    """slime's reward hook: each rollout counts once in its group (by ``group_index``).

    Returns ``(raw_rewards, rewards)`` in the samples' order, as slime's own normalization
    does; every sample of a rollout (same ``rollout_id``) gets the rollout's value.

    Example::

        --custom-reward-post-process-path agentcore_rl.integrations.slime.reward_post_process
    """
    raw = [float(s.get_reward_value(args)) for s in samples]
    normalize = getattr(args, "advantage_estimator", None) in _GRPO_LIKE and getattr(
        args, "rewards_normalization", False
    )
    if not normalize:
        return raw, list(raw)
    std = getattr(args, "advantage_estimator", None) in _STD_NORMALIZED and getattr(
        args, "grpo_std_normalization", False
    )
    # A rollout is (group, rollout_id), or (group, index) for a sample of its own.
    keys = [(s.group_index, s.index if s.rollout_id is None else s.rollout_id) for s in samples]
    members: dict[Any, dict[tuple[Any, Any], float]] = {}
    for key, reward in zip(keys, raw, strict=True):
        members.setdefault(key[0], {}).setdefault(key, reward)
    values: dict[tuple[Any, Any], float] = {}
    for rewards in members.values():
        scaled = advantages(list(rewards.values()), "mean_std" if std else "mean")
        values.update(zip(rewards, scaled, strict=True))
    return raw, [values[key] if math.isfinite(values[key]) else 0.0 for key in keys]
