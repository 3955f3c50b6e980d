"""The math agent on the OpenAI Agents SDK, made trainable: ``@app.rollout_entrypoint``.

The agent is the SDK's ``Agent`` on its default model class, ``OpenAIResponsesModel``: every
model call is a Responses API call (``client.responses.create``), which the gateway serves at
``{base_url}/responses``. Its production form differs in two lines (README.md): the decorator
(``@app.entrypoint``) and the reward. The task, calculator and reward are
``examples/math_agent``'s.

Run it::

    agentcore-rl serve examples.openai_agents_math.agent:app --port 8080

A payload is ``{"prompt": ..., "answer": ..., "_rollout": {"exp_id", "input_id",
"s3_bucket", "base_url", "model_id", ...sampling}}``, exactly as for the plain math agent.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from agents import Agent, ModelSettings, OpenAIResponsesModel, RunConfig, Runner, function_tool
from openai import AsyncOpenAI

from agentcore_rl.server import AgentCoreRLApp, RequestContext
from examples.math_agent.agent import MAX_TURNS, SYSTEM_PROMPT, Task, http_client, validate_payload
from examples.math_agent.calculator import calculate
from examples.math_agent.reward import RewardFunction

__all__ = ["app", "calculator", "math_agent", "solve"]

app = AgentCoreRLApp()
app.payload_validator(validate_payload)
reward_fn = RewardFunction()
# No traces exported to OpenAI's platform: a rollout's record is the gateway's trace.
RUN_CONFIG = RunConfig(tracing_disabled=True)


@function_tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression with + - * / and parentheses.

    Args:
        expression: for example (12 + 5) * 3
    """
    return calculate(json.dumps({"expression": expression}))


@asynccontextmanager
async def math_agent(task: Task) -> AsyncIterator[Agent[Any]]:
    """An Agents SDK agent with the calculator, on the policy the payload names (one OpenAI
    client per rollout, closed here).

    Example::

        async with math_agent(validate_payload(payload)) as agent:
            result = await Runner.run(agent, payload["prompt"], run_config=RUN_CONFIG)
    """
    sampling = dict(task.sampling)
    seed = sampling.pop("seed", None)
    settings = ModelSettings(**sampling, extra_body=None if seed is None else {"seed": seed})
    async with AsyncOpenAI(
        base_url=task.base_url, api_key="EMPTY", http_client=http_client()
    ) as llm:
        yield Agent(
            name="math",
            instructions=SYSTEM_PROMPT,
            tools=[calculator],
            model=OpenAIResponsesModel(model=task.model_id, openai_client=llm),
            model_settings=settings,
        )


@app.rollout_entrypoint
async def solve(payload: dict[str, Any], context: RequestContext) -> dict[str, Any]:
    """One rollout: the SDK's tool loop with the calculator, then the reward.

    Example::

        result = await solve(payload, context)
        result["rewards"]   # [1.0] or [0.0]
    """
    task = validate_payload(payload)
    async with math_agent(task) as agent:
        result = await Runner.run(agent, task.prompt, max_turns=MAX_TURNS, run_config=RUN_CONFIG)
    final = str(result.final_output)
    reward = reward_fn(final, task.answer)
    usage = result.context_wrapper.usage
    tool_calls = sum(item.type == "tool_call_item" for item in result.new_items)
    return {
        "rewards": [reward],
        "answer": final,
        "metrics": {
            "correct": reward > 0,
            "turns": usage.requests,
            "tool_calls": tool_calls,
            "prompt_tokens": usage.input_tokens,
            "completion_tokens": usage.output_tokens,
            "session_id": context.session_id,
        },
    }
