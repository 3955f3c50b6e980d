"""agentcore-rl: train and evaluate LLM agents with RL while they run as HTTP services.

Agent side: :class:`AgentCoreRLApp` turns an agent into a fire-and-forget rollout server
that writes each result to S3. Trainer side: :class:`AsyncRolloutClient` drives thousands
of rollouts and returns asyncio futures; :class:`RolloutClient` is its synchronous facade.
Training data: :class:`RolloutGateway` captures every model call's tokens per rollout
(:class:`SessionTrace`), and :func:`build_trajectory` turns them into loss-masked
:class:`Trajectory` segments.

Example::

    from agentcore_rl import AgentCoreRLApp, AsyncRolloutClient, Limits

    app = AgentCoreRLApp()                      # in the agent's container

    @app.rollout_entrypoint
    async def solve(payload: dict) -> dict:
        return {"rewards": [1.0]}

    async with AsyncRolloutClient(agent_url="http://127.0.0.1:8080",   # in the trainer
                                  s3_bucket="rollouts", exp_id="e1",
                                  limits=Limits(max_concurrent_sessions=64)) as client:
        result = await client.rollout({"prompt": "2+2?"})
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__version__ = "0.1.0"

# What type checkers see (`X as X` exports X; I001 would split these into one import per
# name); at run time, __getattr__ below.
if TYPE_CHECKING:
    from agentcore_rl.client import (  # noqa: I001
        AsyncRolloutClient as AsyncRolloutClient,
        AwsConfig as AwsConfig,
        BatchItem as BatchItem,
        GatewayConfig as GatewayConfig,
        Limits as Limits,
        LivenessConfig as LivenessConfig,
        Retries as Retries,
        RolloutClient as RolloutClient,
        RolloutFuture as RolloutFuture,
        Timeouts as Timeouts,
    )
    from agentcore_rl.errors import (
        AgentLostError as AgentLostError,
        AgentUnreachableError as AgentUnreachableError,
        ClientClosedError as ClientClosedError,
        ConfigurationError as ConfigurationError,
        InfraError as InfraError,
        InvalidPayloadError as InvalidPayloadError,
        InvocationError as InvocationError,
        RewardError as RewardError,
        RolloutError as RolloutError,
        RolloutTimeoutError as RolloutTimeoutError,
        StorageError as StorageError,
        TraceLostError as TraceLostError,
    )
    from agentcore_rl.gateway import RolloutGateway as RolloutGateway
    from agentcore_rl.groups import (
        GroupDroppedError as GroupDroppedError,
        GroupRules as GroupRules,
        RolloutGroup as RolloutGroup,
        StaleGroupError as StaleGroupError,
    )
    from agentcore_rl.retry import RetryPolicy as RetryPolicy
    from agentcore_rl.s3 import ResultStore as ResultStore
    from agentcore_rl.server import (
        AgentCoreRLApp as AgentCoreRLApp,
        RequestContext as RequestContext,
    )
    from agentcore_rl.trajectory import build_trajectory as build_trajectory

# Public name -> the module that defines it. Imported on first use (PEP 562), so that the
# agent container (the `server` extra) never imports the client's dependencies, nor the
# trainer (the `client` extra) the server's.
_LAZY: dict[str, str] = {
    "AgentCoreRLApp": "agentcore_rl.server",
    "AgentLostError": "agentcore_rl.errors",
    "AgentUnreachableError": "agentcore_rl.errors",
    "AsyncRolloutClient": "agentcore_rl.client",
    "AwsConfig": "agentcore_rl.client",
    "BatchItem": "agentcore_rl.client",
    "ClientClosedError": "agentcore_rl.errors",
    "ConfigurationError": "agentcore_rl.errors",
    "GatewayConfig": "agentcore_rl.client",
    "GroupDroppedError": "agentcore_rl.groups",
    "GroupRules": "agentcore_rl.groups",
    "InfraError": "agentcore_rl.errors",
    "InvalidPayloadError": "agentcore_rl.errors",
    "InvocationError": "agentcore_rl.errors",
    "Limits": "agentcore_rl.client",
    "LivenessConfig": "agentcore_rl.client",
    "RequestContext": "agentcore_rl.server",
    "ResultStore": "agentcore_rl.s3",
    "Retries": "agentcore_rl.client",
    "RewardError": "agentcore_rl.errors",
    "RetryPolicy": "agentcore_rl.retry",
    "RolloutClient": "agentcore_rl.client",
    "RolloutError": "agentcore_rl.errors",
    "RolloutFuture": "agentcore_rl.client",
    "RolloutGateway": "agentcore_rl.gateway",
    "RolloutGroup": "agentcore_rl.groups",
    "RolloutTimeoutError": "agentcore_rl.errors",
    "StaleGroupError": "agentcore_rl.groups",
    "StorageError": "agentcore_rl.errors",
    "Timeouts": "agentcore_rl.client",
    "TraceLostError": "agentcore_rl.errors",
    "build_trajectory": "agentcore_rl.trajectory",
}


__all__ = sorted(_LAZY)


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'agentcore_rl' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
