"""``agentcore-rl up MODULE:APP``: the whole local stack around your agent, in the foreground
until Ctrl-C; ``agentcore-rl eval`` without a target finds it (docs/cli.md)."""

from __future__ import annotations

import argparse
import asyncio
import sys

from agentcore_rl.cli.common import PROG, import_object
from agentcore_rl.local.policy import PlayVoice, ScriptedPolicy
from agentcore_rl.local.stack import LocalStack, PolicyEndpoint, StackS3

__all__ = ["run_up"]


async def run_up(options: argparse.Namespace) -> int:
    """Start the stack ``options`` describe, say what runs where, wait for a cancellation."""
    if options.upstream is not None:
        policy: ScriptedPolicy | PolicyEndpoint = PolicyEndpoint(
            options.upstream, model=options.model
        )
    else:
        play = import_object(options.policy, "a policy function") if options.policy else None
        policy = ScriptedPolicy(PlayVoice(play) if play else None)
    stack = LocalStack(
        options.app,
        agents=options.agents,
        s3=StackS3(bucket=options.bucket),
        policy=policy,
        tps=options.tps,
        gateway=True,
    )
    async with stack:
        state = stack.save_state()
        which = (
            f"the stand-in playing {options.policy}"
            if options.policy
            else "the stand-in (math voice; --policy MODULE:FUNC plays your task)"
            if options.upstream is None
            else options.upstream
        )
        print(
            f"{PROG} up: {options.app} on {options.agents} agent server(s), ready\n"
            f"  agents   {' '.join(stack.agent_urls)}\n"
            f"  runtime  {stack.runtime_endpoint_url} ({stack.agent_runtime_arn})\n"
            f"  S3       {stack.s3_endpoint_url} (bucket {stack.bucket})\n"
            f"  policy   {stack.policy_base_url}: {which}\n"
            f"  gateway  {stack.gateway_url} (records every model call's tokens)\n"
            f"  state    {state}\n"
            f"run: {PROG} eval DATA.jsonl [--group-size 4]; in Python: "
            "AsyncRolloutClient(exp_id=..., **agentcore_rl.local.running_stack()); "
            "Ctrl-C stops everything",
            file=sys.stderr,
            flush=True,
        )
        await asyncio.Event().wait()
    raise AssertionError("unreachable")  # pragma: no cover
