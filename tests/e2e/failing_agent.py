"""The math agent, except that a payload with ``"explode": true`` raises in the handler
(a failure with a traceback in its envelope), for the report's end-to-end test."""

from __future__ import annotations

from typing import Any

from agentcore_rl.server import AgentCoreRLApp, RequestContext
from examples.math_agent.agent import solve as solve_math

app = AgentCoreRLApp()


@app.rollout_entrypoint
async def solve(payload: dict[str, Any], context: RequestContext) -> dict[str, Any]:
    if payload.get("explode"):
        raise ValueError(f"the calculator exploded on {payload['id']}")
    return await solve_math(payload, context)
