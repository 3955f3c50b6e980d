"""The Strands math agent on Bedrock, made trainable: ``production_agent.py`` with the
decorator swapped, a reward added, and its ``BedrockModel`` pointed at the gateway with one
argument, ``endpoint_url=context.rollout.session_url`` (and closed after the rollout, as a
model made per rollout should be). Nothing else in the agent changes:
the gateway speaks Bedrock Converse (docs/gateway.md, "Agent dialects"), ignores the AWS
signature, and ``--model`` names the policy whatever model id Strands sends.

Run it::

    agentcore-rl serve examples.strands_bedrock.agent:app --port 8080

A payload is ``{"prompt": ..., "answer": ..., "_rollout": {...}}``; the rollout client fills
``_rollout`` (its ``base_url`` is the session's gateway URL).
"""

from __future__ import annotations

from typing import Any

from strands.models.bedrock import BedrockModel

from agentcore_rl.errors import InvalidPayloadError
from agentcore_rl.server import AgentCoreRLApp, RequestContext
from examples.math_agent.reward import RewardFunction
from examples.strands_bedrock.production_agent import bedrock_agent, prompt_of
from examples.strands_math.agent import final_text

__all__ = ["app", "solve"]

app = AgentCoreRLApp()
app.payload_validator(prompt_of)
reward_fn = RewardFunction()


@app.rollout_entrypoint
async def solve(payload: dict[str, Any], context: RequestContext) -> dict[str, Any]:
    """One rollout: Strands' tool loop on Bedrock Converse through the gateway, the reward.

    Example::

        result = await solve(payload, context)
        result["rewards"]   # [1.0] or [0.0]
    """
    if context.rollout is None or context.rollout.session_url is None:
        raise InvalidPayloadError("_rollout.base_url is required", field="_rollout.base_url")
    model = BedrockModel(endpoint_url=context.rollout.session_url)
    try:
        result = await bedrock_agent(model).invoke_async(prompt_of(payload))
    finally:  # one boto3 client per rollout (its session's URL): its connections go with it
        model.client.close()
    final = final_text(result.message)
    reward = reward_fn(final, str(payload.get("answer", "")))
    usage = result.metrics.accumulated_usage
    return {
        "rewards": [reward],
        "answer": final,
        "metrics": {
            "correct": reward > 0,
            "turns": result.metrics.cycle_count,
            "prompt_tokens": usage["inputTokens"],
            "completion_tokens": usage["outputTokens"],
        },
    }
