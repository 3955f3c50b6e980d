"""The agent side: :class:`AgentCoreRLApp`, an ASGI rollout server, its config objects
and its request context (docs/server.md)."""

from agentcore_rl.server import _extra  # noqa: F401  (first: a missing extra is named)
from agentcore_rl.server.app import AgentCoreRLApp
from agentcore_rl.server.config import (
    FaultChecks,
    RequestLimits,
    ShutdownConfig,
    SpoolConfig,
    WorkerConfig,
)
from agentcore_rl.server.invoke import RequestContext

__all__ = [
    "AgentCoreRLApp",
    "FaultChecks",
    "RequestContext",
    "RequestLimits",
    "ShutdownConfig",
    "SpoolConfig",
    "WorkerConfig",
]
