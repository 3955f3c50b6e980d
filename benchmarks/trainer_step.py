"""Benchmark one trainer-shaped step through the veRL adapter on the local stack.

``--prompts`` x ``--n`` samples (64 x 8 by default), each sleeping ``--min-sleep``..
``--max-sleep`` seconds in the agent (a stable hash of its position) and then calling the
stand-in policy through the token gateway, are run the way veRL's agent-loop worker runs
them: one ``AgentCoreAgentLoop.run`` per sample, all at once on one event loop, each
returning veRL's ``AgentLoopOutput``. Needs the trainers' venv (veRL, torch): run it with
``.venv-trainers/bin/python -m benchmarks.trainer_step``. Prints one JSON document:

- ``wall_s``: from the step's start to the last output ready;
- ``ideal_s``: the longest sample under the same limits: sample i cannot start before
  ``i / tps`` (the client's token bucket; sessions are not the bottleneck here), so the
  ideal is ``max(i / tps + sleep_i)``; ``longest_sample_s`` is the longest sleep alone;
- ``ratio``: ``wall_s / ideal_s`` (1.0 is perfect; the target is <= 1.1);
- ``outputs``, ``segments`` and ``failed``: what came back.

Example::

    .venv-trainers/bin/python -m benchmarks.trainer_step --prompts 8 --n 4 --max-sleep 2
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import hashlib
import json
import time
from typing import Any

import hydra
from omegaconf import OmegaConf
from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap

from agentcore_rl.integrations._client import close_shared_clients
from agentcore_rl.integrations.verl import AgentCoreAgentLoop
from tests.trainers.helpers import local_rig, offline_tokenizer


def sleep_of(seed: int, index: int, low: float, high: float) -> float:
    digest = hashlib.sha256(f"{seed}/{index}".encode()).digest()
    return low + (high - low) * int.from_bytes(digest[:8], "big") / 2**64


async def main(args: argparse.Namespace) -> dict[str, Any]:
    total = args.prompts * args.n
    sleeps = [sleep_of(args.seed, i, args.min_sleep, args.max_sleep) for i in range(total)]
    config = OmegaConf.create(
        {
            "actor_rollout_ref": {
                "rollout": {
                    "prompt_length": 4096,
                    "response_length": 4096,
                    "agent": {"default_agent_loop": "agentcore"},
                }
            },
            "data": {},
        }
    )
    async with local_rig(agents=args.agents) as rig:
        settings = rig.settings(tps=args.tps, max_concurrent_sessions=total, timeout=120.0, retry=1)
        entry = OmegaConf.create(
            {"_target_": f"{AgentCoreAgentLoop.__module__}.AgentCoreAgentLoop"}
        )
        tokenizer = offline_tokenizer()
        # As an agent-loop config file gives it: plain values.
        section = {
            k: list(v) if isinstance(v, tuple) else v
            for k, v in dataclasses.asdict(settings).items()
            if v is not None
        }

        async def sample(i: int) -> Any:
            loop = hydra.utils.instantiate(
                entry,
                trainer_config=DictConfigWrap(config=config),
                server_manager=None,
                tokenizer=tokenizer,
                processor=None,
                hf_model_type=None,
                dataset_cls=None,
                data_config=DictConfigWrap(config.data),
                tools=ToolListWrap([]),
                agentcore=section,
            )
            payload = {
                "prompt": f"What is {i} + 1?",
                "plan": {"do": "plain", "reward": 1.0, "sleep": sleeps[i]},
            }
            return await loop.run(
                {"temperature": 1.0}, agentcore_payload=payload, uid=f"p{i // args.n}"
            )

        try:
            started = time.perf_counter()
            outputs = await asyncio.gather(*(sample(i) for i in range(total)))
            wall = time.perf_counter() - started
        finally:
            await close_shared_clients()
    ideal = max(i / args.tps + s for i, s in enumerate(sleeps))
    return {
        "benchmark": "trainer_step",
        "prompts": args.prompts,
        "n": args.n,
        "tps": args.tps,
        "agents": args.agents,
        "outputs": len(outputs),
        "failed": sum(1 for o in outputs if o.extra_fields.get("error")),
        "wall_s": round(wall, 3),
        "ideal_s": round(ideal, 3),
        "longest_sample_s": round(max(sleeps), 3),
        "ratio": round(wall / ideal, 3),
    }


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--min-sleep", type=float, default=1.0)
    parser.add_argument("--max-sleep", type=float, default=10.0)
    parser.add_argument("--tps", type=float, default=100.0)
    parser.add_argument("--agents", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args()


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(parse())), indent=2))
