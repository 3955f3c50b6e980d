"""The agent side: :class:`AgentCoreRLApp`, an ASGI rollout server, and its request context.

Example::

    from agentcore_rl.server import AgentCoreRLApp, RequestContext

    app = AgentCoreRLApp()

    @app.rollout_entrypoint
    async def solve(payload: dict, context: RequestContext) -> dict:
        return {"rewards": [1.0]}
"""

from agentcore_rl.server.app import AgentCoreRLApp
from agentcore_rl.server.context import RequestContext
from agentcore_rl.server.faults import FaultChecks

__all__ = ["AgentCoreRLApp", "FaultChecks", "RequestContext"]
