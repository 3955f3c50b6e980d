"""The math agent, except that a payload can make it fail in each way there is, for the
end-to-end tests of the report and of failure kinds: ``"explode": true`` raises in the
handler (the agent's failure, with a traceback in its envelope), ``"reward"`` replaces the
result's reward (``"nan"``: NaN; ``"none"``: no reward at all), ``"infra": true`` raises
``InfraError`` (a service the agent needs is down)."""

from __future__ import annotations

from typing import Any

from agentcore_rl import InfraError
from agentcore_rl.server import AgentCoreRLApp, RequestContext
from examples.math_agent.agent import solve as solve_math

app = AgentCoreRLApp()


@app.rollout_entrypoint
async def solve(payload: dict[str, Any], context: RequestContext) -> dict[str, Any]:
    if payload.get("explode"):
        raise ValueError(f"the calculator exploded on {payload['id']}")
    if payload.get("infra"):
        raise InfraError("the calculator service is down")
    result = await solve_math(payload, context)
    if payload.get("reward") == "nan":
        return {**result, "rewards": [float("nan")]}
    if payload.get("reward") == "none":
        return {k: v for k, v in result.items() if k not in ("rewards", "reward")}
    return result
