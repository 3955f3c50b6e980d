"""The SkyRL adapter against SkyRL 0.4.0's own code: its generator-output validation, its
trainer's postprocessing, batch conversion and (step-wise) GRPO, and its policy loss."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from skyrl.backends.skyrl_train.utils.ppo_utils import ppo_policy_loss
from skyrl.train.config.config import SkyRLTrainConfig
from skyrl.train.generators.base import BatchMetadata, TrajectoryID
from skyrl.train.trainer import RayPPOTrainer
from skyrl.train.utils.trainer_utils import validate_generator_output

from agentcore_rl.integrations._client import close_shared_clients
from agentcore_rl.integrations.skyrl import AgentCoreGenerator
from tests.trainers.helpers import local_rig, offline_tokenizer, project_advantages

pytestmark = pytest.mark.timeout(180)

# Two prompts of four samples, SkyRL's order (repetitions of an instance together); the
# first has a sub-agent member (two segments) and a member that fails (kept zeroed).
PLANS = {
    "q-a": [("split", 1.0), ("plain", 0.0), ("fail", 1.0), ("plain", 1.0)],
    "q-b": [("plain", 0.0), ("plain", 0.5), ("plain", 1.0), ("plain", 0.0)],
}


def input_batch(plans: dict[str, list[tuple[str, float]]]) -> dict[str, Any]:
    prompts, extras, ids = [], [], []
    for instance, group in plans.items():
        payload = {
            "prompt": f"Solve {instance}",
            "plans": [{"do": do, "reward": reward} for do, reward in group],
        }
        for repetition in range(len(group)):
            prompts.append([{"role": "user", "content": f"Solve {instance}"}])
            extras.append({"agentcore_payload": payload})
            ids.append(TrajectoryID(instance_id=instance, repetition_id=repetition))
    return {
        "prompts": prompts,
        "env_classes": ["agentcore"] * len(prompts),
        "env_extras": extras,
        "sampling_params": {"temperature": 1.0},
        "trajectory_ids": ids,
        "batch_metadata": BatchMetadata(global_step=3, training_phase="train"),
    }


class Trainer:
    """What RayPPOTrainer's postprocessing, conversion and advantage methods read."""

    postprocess_generator_output = RayPPOTrainer.postprocess_generator_output
    convert_to_training_input = RayPPOTrainer.convert_to_training_input
    compute_advantages_and_returns = RayPPOTrainer.compute_advantages_and_returns

    def __init__(self, step_wise: bool, n: int, prompts: int = 2) -> None:
        cfg = SkyRLTrainConfig()
        cfg.generator.step_wise_trajectories = step_wise
        cfg.generator.n_samples_per_prompt = n
        cfg.trainer.algorithm.advantage_estimator = "grpo"
        cfg.trainer.train_batch_size = prompts
        cfg.trainer.policy_mini_batch_size = prompts
        self.cfg = cfg
        self.tokenizer = offline_tokenizer()
        self.all_metrics: dict[str, Any] = {}
        self.dispatch = OneRank()


class OneRank:
    """One data-parallel rank (the trainer's dispatch pads the batch to a multiple of it)."""

    def get_lcm_dp_size(self) -> int:
        return 1


async def generate(step_wise: bool, plans: dict[str, list[tuple[str, float]]], **kw: Any) -> Any:
    async with local_rig() as rig:
        generator = AgentCoreGenerator(rig.settings(), step_wise=step_wise, **kw)
        try:
            return await generator.generate(input_batch(plans))
        finally:
            await close_shared_clients()


def train_step(output: dict[str, Any], step_wise: bool, n: int) -> Any:
    prompts = len({tid.instance_id for tid in output["trajectory_ids"]})
    trainer = Trainer(step_wise, n, prompts)
    num_prompts = prompts * n
    validate_generator_output(num_prompts, output, step_wise=step_wise)
    uids = [tid.instance_id for tid in output["trajectory_ids"]]
    output, uids = trainer.postprocess_generator_output(output, uids)
    data = trainer.convert_to_training_input(output, uids)
    data["values"] = None
    return trainer.compute_advantages_and_returns(data)


def first_trained(data: Any) -> list[float | None]:
    out: list[float | None] = []
    for adv, mask in zip(data["advantages"], data["loss_mask"], strict=True):
        nz = mask.nonzero()
        out.append(float(adv[nz[0, 0]]) if len(nz) else None)
    return out


def expected(step_wise: bool) -> list[float | None]:
    a = project_advantages([1.0, 0.0, 0.0, 1.0])
    b = project_advantages([0.0, 0.5, 1.0, 0.0])
    first = [a[0], a[0]] if step_wise else [a[0]]
    return [*first, a[1], None, a[3], *b]


@pytest.mark.parametrize("step_wise", [True, False])
async def test_one_grpo_step(step_wise: bool) -> None:
    output = await generate(step_wise, PLANS)
    # SkyRL's order, whatever order the groups finished in.
    assert [t.instance_id for t in output["trajectory_ids"]][-4:] == ["q-b"] * 4
    rows = 9 if step_wise else 8
    assert len(output["response_ids"]) == rows
    assert all(isinstance(lp, list) for lp in output["rollout_logprobs"])
    assert output["rollout_metrics"]["agentcore/dropped_segments"] == (0 if step_wise else 1)
    data = train_step(output, step_wise, n=4)
    got = first_trained(data)
    for g, e in zip(got, expected(step_wise), strict=True):
        if e is None:
            assert g is None  # the zeroed member trains nothing
        else:
            assert g == pytest.approx(e, abs=1e-5)
    log_probs = data["rollout_logprobs"].clone().requires_grad_(True)
    loss, _ = ppo_policy_loss(
        log_probs,
        data["rollout_logprobs"],
        data["advantages"],
        Trainer(step_wise, 4).cfg.trainer.algorithm,
        loss_mask=data["loss_mask"],
    )
    loss.backward()
    assert torch.isfinite(loss)


async def test_a_step_wise_batch_without_splits_validates() -> None:
    plans = {"q-b": PLANS["q-b"]}
    output = await generate(True, plans)
    assert output["is_last_step"] == [True] * 4
    validate_generator_output(4, output, step_wise=True)


async def test_a_group_of_one_gets_its_reward() -> None:
    output = await generate(False, {"q-1": [("plain", 0.75)]})
    trainer_input = train_step(output, step_wise=False, n=1)
    assert first_trained(trainer_input) == [pytest.approx(0.75, abs=1e-5)]


async def test_over_length_rows_are_fitted() -> None:
    output = await generate(
        False, {"q-1": [("plain", 1.0)]}, max_prompt_length=4, max_response_length=3
    )
    assert len(output["response_ids"][0]) == 3
    assert output["loss_masks"][0] == [0, 0, 0]
    assert output["rollout_metrics"]["agentcore/prompts_masked"] == 1
