"""The veRL adapter against veRL 0.9.1's own code: its agent-loop worker's postprocessing
(classic trainer), its v1 multi-output GRPO, its advantage estimator and policy loss."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import hydra
import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from verl.experimental.agent_loop.agent_loop import (
    AgentLoopWorker,
    DictConfigWrap,
    ToolListWrap,
    _agent_loop_registry,
)
from verl.protocol import DataProto
from verl.trainer.ppo.core_algos import AdvantageEstimator, get_policy_loss_fn
from verl.trainer.ppo.ray_trainer import compute_advantage
from verl.trainer.ppo.v1.utils import compute_advantage_for_multi_trajectories

from agentcore_rl.integrations._client import close_shared_clients
from agentcore_rl.integrations.settings import AgentCoreSettings
from agentcore_rl.integrations.verl import AGENT_NAME, AgentCoreAgentLoop
from tests.trainers.helpers import Rig, local_rig, offline_tokenizer, project_advantages

pytestmark = pytest.mark.timeout(180)

PROMPT_LENGTH = 64
RESPONSE_LENGTH = 64
# One GRPO step: two prompts of four samples; the first prompt has a sub-agent member
# (two segments) and a member that fails (kept zeroed).
PLANS = [
    [("split", 1.0), ("plain", 0.0), ("fail", 1.0), ("plain", 1.0)],
    [("plain", 0.0), ("plain", 0.5), ("plain", 1.0), ("plain", 0.0)],
]


def trainer_config(**rollout: Any) -> Any:
    values: dict[str, Any] = {
        "temperature": 1.0,
        "top_p": 1.0,
        "top_k": -1,
        "calculate_log_probs": True,
        "prompt_length": PROMPT_LENGTH,
        "response_length": RESPONSE_LENGTH,
        "n": 4,
        "val_kwargs": {"temperature": 0.0, "top_p": 1.0, "top_k": -1, "n": 1},
        "agent": {"default_agent_loop": AGENT_NAME, "agent_loop_config_path": None},
        "trace": {"token2text": False},
    }
    values.update(rollout)
    return OmegaConf.create({"actor_rollout_ref": {"rollout": values}, "data": {}})


def register_from_file(tmp_path: Path, settings: AgentCoreSettings) -> str:
    """Register the loop the way a veRL user does: an agent-loop config file."""
    section = {
        k: (list(v) if isinstance(v, tuple) else v)
        for k, v in settings.__dict__.items()
        if v is not None
    }
    path = tmp_path / "agent_loops.yaml"
    OmegaConf.save(
        OmegaConf.create(
            [
                {
                    "name": "agentcore-test",
                    "_target_": f"{AgentCoreAgentLoop.__module__}."
                    f"{AgentCoreAgentLoop.__qualname__}",
                    "agentcore": section,
                }
            ]
        ),
        path,
    )
    # What AgentLoopWorker.__init__ does with rollout.agent.agent_loop_config_path.
    for entry in OmegaConf.load(path):
        _agent_loop_registry[entry.name] = entry
    return "agentcore-test"


def classic_worker(config: Any) -> Any:
    """veRL's AgentLoopWorker without its Ray actor and LLM servers (the agent has its own
    model path): the attributes its generate_sequences and postprocessing read."""
    worker = object.__new__(AgentLoopWorker)
    worker.config = config
    worker.rollout_config = config.actor_rollout_ref.rollout
    worker.llm_client = None
    worker.tokenizer = offline_tokenizer()
    worker.processor = None
    worker.hf_model_type = None
    worker.dataset_cls = None
    worker.tools = []
    worker.reward_loop_worker_handles = None
    worker.distillation_enabled = False
    worker.mm_processor_kwargs = {}
    return worker


def batch_for(plans: list[list[tuple[str, float]]], agent_name: str) -> DataProto:
    """veRL's batch after its repeat(n, interleave=True): one row per sample, uid per prompt."""
    payloads, uids, names, prompts = [], [], [], []
    for p, group in enumerate(plans):
        for do, reward in group:
            payloads.append({"prompt": f"What is {p} + 2?", "plan": {"do": do, "reward": reward}})
            uids.append(f"uid-{p}")
            names.append(agent_name)
            prompts.append([{"role": "user", "content": f"What is {p} + 2?"}])
    return DataProto.from_dict(
        non_tensors={
            "agentcore_payload": np.array(payloads, dtype=object),
            "uid": np.array(uids, dtype=object),
            "agent_name": np.array(names, dtype=object),
            "raw_prompt": np.array([*prompts, None], dtype=object)[:-1],
            "index": np.array([i // 4 for i in range(len(uids))]),
        }
    )


def first_trained(advantages: torch.Tensor, mask: torch.Tensor) -> list[float | None]:
    out: list[float | None] = []
    for adv, m in zip(advantages, mask, strict=True):
        nz = m.nonzero()
        out.append(float(adv[nz[0, 0]]) if len(nz) else None)
    return out


def policy_loss(data: DataProto) -> torch.Tensor:
    loss_fn = get_policy_loss_fn("vanilla")
    old = data.batch["rollout_log_probs"]
    log_prob = old.clone().requires_grad_(True)
    actor = OmegaConf.create(
        {
            "clip_ratio": 0.2,
            "clip_ratio_low": 0.2,
            "clip_ratio_high": 0.2,
            "clip_ratio_c": 3.0,
            "global_batch_info": {"dp_size": 1},
        }
    )
    loss, _ = loss_fn(
        old, log_prob, data.batch["advantages"], data.batch["response_mask"], "token-mean", actor
    )
    loss.backward()
    assert log_prob.grad is not None
    return loss


async def test_classic_trainer_step(tmp_path: Path) -> None:
    async with local_rig() as rig:
        config = trainer_config()
        name = register_from_file(tmp_path, rig.settings())
        worker = classic_worker(config)
        try:
            data = await worker.generate_sequences(batch_for(PLANS, name))
        finally:
            await close_shared_clients()
    assert len(data) == 8  # one output per sample
    extra = data.non_tensor_batch
    assert extra["dropped_segments"][0] == 1  # the sub-agent's first segment
    assert list(extra["agentcore_reward"]) == [1.0, 0.0, 0.0, 1.0, 0.0, 0.5, 1.0, 0.0]
    assert np.array(extra["min_global_steps"], dtype=int).tolist() == [0] * 8
    # The zeroed member: a placeholder whose mask is 0 and whose reward (0) is in the group.
    assert extra["zeroed"][2]
    assert extra["placeholder"][2]
    assert int(data.batch["response_mask"][2].sum()) == 0
    data.batch["token_level_rewards"] = data.batch["rm_scores"]
    data = compute_advantage(data, AdvantageEstimator.GRPO, norm_adv_by_std_in_grpo=True)
    got = first_trained(data.batch["advantages"], data.batch["response_mask"])
    expected = project_advantages([1.0, 0.0, 0.0, 1.0]) + project_advantages([0.0, 0.5, 1.0, 0.0])
    for i, (g, e) in enumerate(zip(got, expected, strict=True)):
        if i == 2:
            assert g is None  # nothing of the zeroed member trains
        else:
            assert g == pytest.approx(e, abs=1e-5)
    assert torch.isfinite(policy_loss(data))


async def run_loop(rig: Rig, tmp_path: Path, plan: dict[str, Any], **rollout: Any) -> Any:
    config = trainer_config(**rollout)
    name = register_from_file(tmp_path, rig.settings())
    loop = hydra.utils.instantiate(
        _agent_loop_registry[name],
        trainer_config=DictConfigWrap(config=config),
        server_manager=None,
        tokenizer=offline_tokenizer(),
        processor=None,
        hf_model_type=None,
        dataset_cls=None,
        data_config=DictConfigWrap(config.data),
        tools=ToolListWrap([]),
    )
    payload = {"prompt": "What is 3 + 4?", "plan": plan}
    return await loop.run(
        {"temperature": 1.0}, agentcore_payload=payload, uid="u", session_id=0, global_steps=7
    )


async def test_v1_trainer_counts_a_split_member_once(tmp_path: Path) -> None:
    plans = [("split", 1.0), ("plain", 0.0), ("fail", 1.0), ("plain", 1.0)]
    async with local_rig() as rig:
        try:
            per_session = [
                await run_loop(rig, tmp_path, {"do": do, "reward": r}) for do, r in plans
            ]
        finally:
            await close_shared_clients()
    assert [len(outputs) for outputs in per_session] == [2, 1, 1, 1]
    # What veRL's v1 worker stores per output (as_dict) and its GRPO over the sessions.
    keys, fields = [], []
    for session, outputs in enumerate(per_session):
        for i, output in enumerate(outputs):
            keys.append(f"u_{session}_{i}")
            fields.append(output.as_dict())
            tags = output.extra_fields
            assert "reward_extra_info" in tags
            assert isinstance(tags["min_global_steps"], int)
    steps = np.array([f["extra_fields"]["min_global_steps"] for f in fields], dtype=int)
    # The gateway served every call under version 0; the token-less placeholder has no
    # version of its own and takes the trainer's step.
    assert steps.tolist() == [0, 0, 0, 7, 0]

    def pad(name: str, dtype: torch.dtype) -> torch.Tensor:
        return torch.nn.utils.rnn.pad_sequence(
            [f[name].to(dtype) for f in fields], batch_first=True, padding_value=0
        )

    data = DataProto.from_dict(
        tensors={
            "responses": pad("responses", torch.int64),
            "response_mask": pad("response_mask", torch.int64),
            "token_level_rewards": pad("rm_scores", torch.float32),
        },
        non_tensors={"uid": np.array(["u"] * len(keys), dtype=object)},
    )
    data = compute_advantage_for_multi_trajectories(
        data, batch_keys=keys, adv_estimator=AdvantageEstimator.GRPO, norm_adv_by_std_in_grpo=True
    )
    got = first_trained(data.batch["advantages"], data.batch["response_mask"])
    a = project_advantages([1.0, 0.0, 0.0, 1.0])
    assert got[0] == pytest.approx(a[0], abs=1e-5)
    assert got[1] == pytest.approx(a[0], abs=1e-5)  # both segments, one member
    assert got[2] == pytest.approx(a[1], abs=1e-5)
    assert got[3] is None
    assert got[4] == pytest.approx(a[3], abs=1e-5)


async def test_over_length_rows_are_fitted(tmp_path: Path) -> None:
    async with local_rig() as rig:
        try:
            outputs = await run_loop(
                rig, tmp_path, {"do": "plain", "reward": 1.0}, prompt_length=4, response_length=3
            )
        finally:
            await close_shared_clients()
    (output,) = outputs
    assert len(output.prompt_ids) == 4
    assert len(output.response_ids) == 3
    assert output.response_mask == [0, 0, 0]  # its context was cut: nothing trains
    assert output.extra_fields["prompts_masked"] == 1
    assert output.extra_fields["responses_truncated"] == 1


async def test_a_group_of_one_gets_its_reward(tmp_path: Path) -> None:
    async with local_rig() as rig:
        config = trainer_config()
        name = register_from_file(tmp_path, rig.settings())
        worker = classic_worker(config)
        try:
            data = await worker.generate_sequences(batch_for([[("plain", 0.75)]], name))
        finally:
            await close_shared_clients()
    data.batch["token_level_rewards"] = data.batch["rm_scores"]
    data = compute_advantage(data, AdvantageEstimator.GRPO, norm_adv_by_std_in_grpo=True)
    got = first_trained(data.batch["advantages"], data.batch["response_mask"])
    assert got == [pytest.approx(project_advantages([0.75])[0], abs=1e-5)]


async def test_staleness_steps_are_the_gateways_policy_versions(tmp_path: Path) -> None:
    async with local_rig() as rig:
        rig.gateway.set_policy_version(5)  # the weights the rollout servers hold
        try:
            (output,) = await run_loop(rig, tmp_path, {"do": "plain", "reward": 1.0})
        finally:
            await close_shared_clients()
    extra = output.extra_fields
    assert (extra["min_global_steps"], extra["max_global_steps"]) == (5, 5)
    # veRL v1's off-policy metric at trainer step 7: (7 - 1) - max_global_steps.
    assert (7 - 1) - np.array([extra["max_global_steps"]], dtype=int)[0] == 1


@pytest.fixture
def local_ray() -> Iterator[None]:
    import ray

    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()


@pytest.mark.usefixtures("local_ray")
async def test_through_agentcore_runtime_with_limits_shared_on_ray(tmp_path: Path) -> None:
    async with local_rig() as rig:
        settings = rig.settings(
            agent_url=None,
            agent_runtime_arn=rig.stack.agent_runtime_arn,
            endpoint_url=rig.stack.runtime_endpoint_url,
            shared_limits="trainer-test-limits",
            tps=50.0,
            max_concurrent_sessions=8,
        )
        name = register_from_file(tmp_path, settings)
        worker = classic_worker(trainer_config())
        try:
            data = await worker.generate_sequences(batch_for(PLANS[1:], name))
        finally:
            await close_shared_clients()
    assert list(data.non_tensor_batch["agentcore_reward"]) == [0.0, 0.5, 1.0, 0.0]
    data.batch["token_level_rewards"] = data.batch["rm_scores"]
    data = compute_advantage(data, AdvantageEstimator.GRPO, norm_adv_by_std_in_grpo=True)
    got = first_trained(data.batch["advantages"], data.batch["response_mask"])
    assert got == pytest.approx(project_advantages([0.0, 0.5, 1.0, 0.0]), abs=1e-5)
