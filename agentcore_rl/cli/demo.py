"""``agentcore-rl demo``: every part of the toolkit on one machine, in one process
(docs/cli.md). The policy is a scripted stand-in, NOT a language model."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import importlib.util
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Final

from agentcore_rl.cli.common import PROG
from agentcore_rl.cli.cost import Prices
from agentcore_rl.cli.eval import make_client, run_eval
from agentcore_rl.cli.eval_config import EvalOptions, load_inputs
from agentcore_rl.cli.summary import EvalRun, group_figures
from agentcore_rl.errors import ConfigurationError
from agentcore_rl.groups import GroupRules
from agentcore_rl.local.stack import LocalStack, PolicyEndpoint
from agentcore_rl.server.options import state_dir

__all__ = ["DEMO_AGENT", "demo_dir", "demo_package", "run_demo"]

# The math example as the wheel ships it, and in a checkout (examples/math_agent).
_SHIPPED: Final = "agentcore_rl._examples.math_agent"
_CHECKOUT: Final = "examples.math_agent"
DEMO_AGENT: Final = "agent:app"
_AGENT_SERVERS: Final = 2
# Generous: a rollout of the stand-in takes well under a second.
_ROLLOUT_TIMEOUT: Final = 120.0
_GROUPS: Final = 6
_GROUP_SIZE: Final = 4


def demo_package() -> str:
    """The wheel's copy of the math agent, else (a checkout) ``examples.math_agent``."""
    for name in (_SHIPPED, _CHECKOUT):
        try:
            if importlib.util.find_spec(name) is not None:
                return name
        except ImportError:  # its parent package is missing
            continue
    raise ConfigurationError(
        f"the demo agent is missing: neither {_SHIPPED} (shipped in the wheel) nor "
        f"{_CHECKOUT} (a checkout's examples/) can be imported; reinstall agentcore-rl[local]"
    )


def demo_dir(environ: Mapping[str, str] = os.environ) -> Path:
    """Where the demo writes without ``--out``, emptied at each start (only the last run stays)."""
    candidates = [Path(tempfile.gettempdir()) / f"agentcore-rl-demo-{os.getuid()}"]
    with contextlib.suppress(RuntimeError):  # no home directory at all
        candidates.insert(0, state_dir(environ) / "demo")
    for path in candidates:
        try:
            if path.is_dir():
                shutil.rmtree(path)
            path.mkdir(parents=True, mode=0o700)
        except OSError:
            continue
        return path
    raise ConfigurationError(
        f"the demo cannot write its results to {candidates[0]}: use --out FILE"
    )


def _dataset(package: str, n: int, generated: Path) -> Path:
    """The shipped problems when there are enough, else ``n`` generated into ``generated``."""
    dataset = importlib.import_module(f"{package}.dataset")
    shipped: Path = dataset.DEFAULT_DATA_PATH
    with shipped.open(encoding="utf-8") as lines:
        available = sum(1 for line in lines if line.strip())
    if n <= available:
        return shipped
    problems = dataset.generate(n, seed=0)
    generated.write_text("".join(json.dumps(p) + "\n" for p in problems), encoding="utf-8")
    return generated


async def run_demo(options: argparse.Namespace, run: EvalRun) -> None:
    """Start the local stack, run the problems (``agentcore-rl demo``'s parsed ``options``)
    into ``run``, stop everything."""
    # lazy: the local extra
    from agentcore_rl.local.policy import ScriptedPolicy, Serving

    prices = Prices.parse(options.price)
    out = Path(options.out) if options.out else demo_dir() / "results.jsonl"
    package = demo_package()
    data = _dataset(
        package, options.n, out.with_name(out.name.removesuffix(".jsonl") + ".problems.jsonl")
    )
    policy = (
        PolicyEndpoint(options.base_url, model=options.model_id)
        if options.base_url
        else ScriptedPolicy(accuracy=options.accuracy, serving=Serving(latency=options.latency))
    )
    if isinstance(policy, ScriptedPolicy):
        which = f"the scripted stand-in policy (not a language model; accuracy {options.accuracy})"
    else:
        which = f"the policy at {options.base_url}"
    print(
        f"{PROG} demo: starting embedded S3, {which}, {_AGENT_SERVERS} math agent servers "
        "and a local AgentCore Runtime...",
        file=sys.stderr,
    )
    stack = LocalStack(
        f"{package}.{DEMO_AGENT}",
        agents=_AGENT_SERVERS,
        policy=policy,
        tps=options.tps,
        gateway=not options.no_gateway,
    )
    server_log = logging.getLogger("agentcore_rl.server")
    async with contextlib.AsyncExitStack() as scope:
        # The agents log each cancelled or failed rollout; the summary reports them instead.
        scope.callback(server_log.setLevel, server_log.level)
        server_log.setLevel(logging.ERROR)
        await scope.enter_async_context(stack)
        gateway_url, token = stack.gateway_url, stack.gateway_admin_token
        if gateway_url is not None:
            print(f"  rollout gateway {gateway_url} -> {stack.policy_base_url}", file=sys.stderr)
        print(
            f"  S3 {stack.s3_endpoint_url} (bucket {stack.bucket}) | policy "
            f"{stack.policy_base_url} | agents {' '.join(stack.agent_urls)}\n"
            f"  AgentCore Runtime {stack.runtime_endpoint_url} ({stack.agent_runtime_arn})\n"
            f"  running {options.n} problems, {options.concurrency} at a time, over the ACR "
            "transport...",
            file=sys.stderr,
        )
        eval_options = EvalOptions(
            data=data,
            out=out,
            s3_bucket=stack.bucket,
            exp_id=time.strftime("demo-%Y%m%d-%H%M%S"),
            agent_runtime_arn=stack.agent_runtime_arn,
            concurrency=options.concurrency,
            tps=options.tps,
            timeout=_ROLLOUT_TIMEOUT,
            base_url=None if gateway_url else stack.policy_base_url,
            model_id=stack.policy_model,
            gateway_url=gateway_url,
            gateway_admin_token=token,
            limit=options.n,
            s3_endpoint_url=stack.s3_endpoint_url,
            runtime_endpoint_url=stack.runtime_endpoint_url,
            prices=prices,
        )
        inputs = load_inputs(data, limit=options.n)
        await run_eval(eval_options, inputs, run, progress=not options.no_progress)
        await _group_phase(eval_options, run)


async def _group_phase(eval_options: EvalOptions, run: EvalRun) -> None:
    """A few problems again as GRPO groups, for the summary's group statistics."""
    # At most as many problems as the run had (demo --n 4 stays small).
    inputs = load_inputs(eval_options.data, limit=min(_GROUPS, eval_options.limit or _GROUPS))
    options = dataclasses.replace(
        eval_options,
        exp_id=f"{eval_options.exp_id}-groups",
        concurrency=max(eval_options.concurrency, _GROUPS * _GROUP_SIZE),
    )
    # Each member its own seed: the stand-in then answers members of a group apart.
    rules = GroupRules(n=_GROUP_SIZE, member_seed=0)
    async with make_client(options) as client:
        groups = client.run_groups([item.payload for item in inputs], rules=rules)
        lines = [{"outcome": "done", "rewards": group.rewards} async for group in groups]
        for reason, count in client.group_stats.groups_dropped.items():
            lines += [{"reason": reason}] * count
    run.groups = group_figures(_GROUP_SIZE, lines)
