"""The slime adapter against slime's own code (its public source; slime is not on PyPI):
its sample type and rollout-output contract, its train-data conversion (with the adapter's
reward hook, and without it), its tensorization, its GRPO returns and policy loss.

The source is found through ``SLIME_SOURCE`` (a directory holding ``slime/``), else a
fetched mirror of the repository; without either these tests skip, saying so. slime's
code is never part of this repository.
"""

from __future__ import annotations

import argparse
import ast
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.trainers.helpers import local_rig, project_advantages

pytestmark = pytest.mark.timeout(180)

MIRROR = Path("/work/.mirror/THUDM+slime/repo")
PLANS = [
    [("split", 1.0), ("plain", 0.0), ("fail", 1.0), ("plain", 1.0)],
    [("plain", 0.0), ("plain", 0.5), ("plain", 1.0), ("plain", 0.0)],
]


@pytest.fixture(scope="module")
def slime_source(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    given = os.environ.get("SLIME_SOURCE")
    if given:
        root = Path(given)
    elif (MIRROR / "HEAD").exists():
        root = tmp_path_factory.mktemp("slime")
        archive = subprocess.run(
            ["git", "--git-dir", str(MIRROR), "archive", "HEAD", "slime"],
            check=True,
            capture_output=True,
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(root)], input=archive, check=True)
    else:
        pytest.skip("slime's source is not here: set SLIME_SOURCE to a checkout of slime")
    if not (root / "slime" / "utils" / "types.py").exists():
        pytest.skip(f"no slime package under {root}")
    sys.path.insert(0, str(root))
    try:
        yield root
    finally:
        sys.path.remove(str(root))


def manager_methods(root: Path, names: tuple[str, ...]) -> dict[str, Any]:
    """slime's RolloutManager methods, compiled from its source: the module imports SGLang
    at the top, which a CPU machine does not have, and these methods do not use it."""
    import torch
    from slime.observability.rollout_data_utils import validate_rollout_routed_experts_for_replay
    from slime.utils.types import Sample

    tree = ast.parse((root / "slime/ray/rollout.py").read_text())
    manager = next(
        n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "RolloutManager"
    )
    funcs: list[ast.stmt] = [
        n for n in manager.body if isinstance(n, ast.FunctionDef) and n.name in names
    ]
    module = ast.Module(body=funcs, type_ignores=[])
    namespace: dict[str, Any] = {
        "torch": torch,
        "Sample": Sample,
        "get_source": lambda sample: "agentcore",
        "validate_rollout_routed_experts_for_replay": validate_rollout_routed_experts_for_replay,
    }
    exec(compile(module, str(root / "slime/ray/rollout.py"), "exec"), namespace)
    return {name: namespace[name] for name in names}


class DataSource:
    """slime's data source contract: prompt groups of n samples, indices set."""

    def __init__(self, plans: list[list[tuple[str, float]]]) -> None:
        from slime.utils.types import Sample

        self.groups = []
        index = 0
        for g, group in enumerate(plans):
            payload = {
                "prompt": f"Solve {g}",
                "plans": [{"do": do, "reward": reward} for do, reward in group],
            }
            samples = []
            for _ in group:
                samples.append(
                    Sample(
                        group_index=g,
                        index=index,
                        prompt=f"Solve {g}",
                        metadata={"agentcore_payload": payload},
                    )
                )
                index += 1
            self.groups.append(samples)

    def get_samples(self, n: int) -> list[list[Any]]:
        return self.groups[:n]


def slime_args(settings: Any, groups: int, n: int) -> argparse.Namespace:
    return argparse.Namespace(
        agentcore=settings,
        rollout_batch_size=groups,
        n_samples_per_prompt=n,
        advantage_estimator="grpo",
        rewards_normalization=True,
        grpo_std_normalization=True,
        reward_key=None,
        rollout_top_p=1.0,
    )


async def rollout(plans: list[list[tuple[str, float]]]) -> tuple[Any, argparse.Namespace]:
    from agentcore_rl.integrations.slime import generate_rollout

    async with local_rig() as rig:
        args = slime_args(rig.settings(), len(plans), len(plans[0]))
        # slime calls the rollout function synchronously, from a thread with no event loop.
        output = await anyio.to_thread.run_sync(generate_rollout, args, 0, DataSource(plans))
    return output, args


def train_data(root: Path, args: argparse.Namespace, samples: list[Any], hook: bool) -> Any:
    from agentcore_rl.integrations.slime import reward_post_process

    methods = manager_methods(root, ("_post_process_rewards", "_convert_samples_to_train_data"))
    manager = argparse.Namespace(
        args=args,
        custom_convert_samples_to_train_data_func=None,
        custom_reward_post_process_func=reward_post_process if hook else None,
    )
    manager._post_process_rewards = lambda s: methods["_post_process_rewards"](manager, s)
    return methods["_convert_samples_to_train_data"](manager, samples)


async def test_one_grpo_step(slime_source: Path) -> None:
    import torch
    from slime.observability.rollout_data_utils import (
        tensorize_rollout_data_for_training,
        validate_rollout_id_annotated,
    )
    from slime.utils.ppo_utils import compute_policy_loss, get_grpo_returns
    from slime.utils.types import Sample

    output, args = await rollout(PLANS)
    groups = output.samples
    validate_rollout_id_annotated(groups)  # slime's contract for split rollouts
    assert [len(g) for g in groups] == [5, 4]  # the sub-agent member: two samples
    first = groups[0]
    assert [s.group_index for s in first] == [0] * 5
    assert [s.index for s in first] == [0, 0, 1, 2, 3]
    assert [s.rollout_id for s in first] == [0, 0, 1, 2, 3]
    zeroed = first[3]
    assert zeroed.status is Sample.Status.FAILED
    assert (zeroed.response_length, zeroed.loss_mask, zeroed.remove_sample) == (1, [0], True)
    assert first[0].weight_versions == ["0"]

    samples = [s for g in groups for s in g]
    data = train_data(slime_source, args, samples, hook=True)
    tensorize_rollout_data_for_training(data)
    a = project_advantages([1.0, 0.0, 0.0, 1.0])
    b = project_advantages([0.0, 0.5, 1.0, 0.0])
    assert data["rewards"] == pytest.approx([a[0], a[0], a[1], a[2], a[3], *b], abs=1e-5)
    # The rollout's loss denominator spans both of the split member's samples.
    assert data["rollout_mask_sums"][0] == data["rollout_mask_sums"][1]

    kl = [torch.zeros(len(m)) for m in data["loss_masks"]]
    returns = get_grpo_returns(torch.tensor(data["rewards"]), kl)
    advantages = torch.cat(returns).requires_grad_(True)
    losses, _ = compute_policy_loss(torch.zeros_like(advantages), advantages, 0.2, 0.28)
    mask = torch.cat([torch.as_tensor(m, dtype=torch.float32) for m in data["loss_masks"]])
    loss = (losses * mask).sum() / mask.sum()
    loss.backward()
    assert torch.isfinite(loss)

    # Without the hook, slime's positional normalization gets the split group wrong.
    plain = train_data(slime_source, args, samples, hook=False)
    assert plain["rewards"][:5] != pytest.approx(data["rewards"][:5], abs=1e-5)


async def test_a_group_of_one_gets_its_reward(slime_source: Path) -> None:
    output, args = await rollout([[("plain", 0.75)]])
    samples = [s for g in output.samples for s in g]
    data = train_data(slime_source, args, samples, hook=True)
    assert data["rewards"] == [pytest.approx(0.75)]
