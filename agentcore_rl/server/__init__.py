"""The agent side: :class:`AgentCoreRLApp`, an ASGI rollout server, its config objects
and its request context (docs/server.md)."""

from agentcore_rl._extras import require

require("server", "agentcore_rl.server", "starlette", "uvicorn")  # first: a missing extra is named

from agentcore_rl.server.app import AgentCoreRLApp  # noqa: E402
from agentcore_rl.server.invoke import RequestContext  # noqa: E402
from agentcore_rl.server.options import (  # noqa: E402
    FaultChecks,
    RequestLimits,
    ShutdownConfig,
    SpoolConfig,
)

__all__ = [
    "AgentCoreRLApp",
    "FaultChecks",
    "RequestContext",
    "RequestLimits",
    "ShutdownConfig",
    "SpoolConfig",
]
