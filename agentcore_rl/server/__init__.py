"""The agent side: :class:`AgentCoreRLApp`, an ASGI rollout server, its config objects
and its request context.

Example::

    from agentcore_rl.server import AgentCoreRLApp, RequestContext

    app = AgentCoreRLApp()

    @app.rollout_entrypoint
    async def solve(payload: dict, context: RequestContext) -> dict:
        return {"rewards": [1.0]}
"""

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
