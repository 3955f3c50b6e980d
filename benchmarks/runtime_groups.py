"""Benchmark GRPO groups through the local AgentCore Runtime against the same groups sent
straight to the agent servers: ``--prompts`` x 4 math problems on the stand-in, one
``LocalStack`` (two agent servers, the runtime), the two paths run in turns ``--pairs``
times. Prints one JSON document: each run's wall time, the runtime / agents ratio, and the
CPU seconds the process spent on each run (every part runs in it: on a shared machine the
CPU is the steadier figure).

Target: runtime <= 1.3 x agents, the TPS limits set high (``--tps``).

Example::

    python -m benchmarks.runtime_groups --pairs 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

from agentcore_rl import AsyncRolloutClient, AwsConfig, GroupRules, Limits
from agentcore_rl.local.policy import ScriptedPolicy
from agentcore_rl.local.stack import LocalStack
from examples.math_agent.dataset import generate


async def _run(
    stack: LocalStack, path: str, prompts: int, tps: float, run: int
) -> tuple[float, float]:
    target: dict[str, object] = (
        {"agent_runtime_arn": stack.agent_runtime_arn}
        if path == "runtime"
        else {"agent_url": stack.agent_urls}
    )
    async with AsyncRolloutClient(
        **target,  # type: ignore[arg-type]
        s3_bucket=stack.bucket,
        exp_id=f"bench-{path}-{run}",
        rollout={"base_url": stack.policy_base_url, "model_id": stack.policy_model},
        limits=Limits(max_concurrent_sessions=prompts * 4, tps=tps),
        aws=AwsConfig(s3_endpoint_url=stack.s3_endpoint_url),
    ) as client:
        started, cpu = time.monotonic(), time.process_time()
        groups = client.run_groups(
            generate(prompts, seed=run), rules=GroupRules(n=4, member_seed=0)
        )
        members = sum([len(g.members) async for g in groups])
        assert members == prompts * 4, members
        return time.monotonic() - started, time.process_time() - cpu


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=30)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--tps", type=float, default=1000.0)
    args = parser.parse_args()
    runs: dict[str, list[float]] = {"agents": [], "runtime": []}
    cpu: dict[str, list[float]] = {"agents": [], "runtime": []}
    async with LocalStack(
        "examples.math_agent.agent:app", agents=2, tps=args.tps, policy=ScriptedPolicy()
    ) as stack:
        for run in range(args.pairs):
            for path in ("agents", "runtime"):
                wall, used = await _run(stack, path, args.prompts, args.tps, run)
                runs[path].append(round(wall, 2))
                cpu[path].append(round(used, 2))
    ratios = [round(r / a, 2) for r, a in zip(runs["runtime"], runs["agents"], strict=True)]
    print(json.dumps({"rollouts": args.prompts * 4, **runs, "ratio": ratios, "cpu": cpu}))


if __name__ == "__main__":
    asyncio.run(main())
