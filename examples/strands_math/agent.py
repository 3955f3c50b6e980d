"""The math agent on Strands Agents, made trainable: ``@app.rollout_entrypoint``.

This is ``production_agent.py`` with the decorator swapped (``@app.entrypoint`` became
``@app.rollout_entrypoint``) and a reward added: the same task, calculator and reward as
``examples/math_agent``, but the tool loop is Strands' ``Agent`` talking to the policy
through Strands' OpenAI-compatible model provider (``strands-agents[openai]``).

Run it::

    agentcore-rl serve examples.strands_math.agent:app --port 8080

A payload is ``{"prompt": ..., "answer": ..., "_rollout": {"exp_id", "input_id",
"s3_bucket", "base_url", "model_id", ...sampling}}``, exactly as for the plain math agent.

Example::

    payload = {"prompt": "Maya has 12 apples. She eats 3. How many are left?",
               "answer": "9",
               "_rollout": {"exp_id": "e1", "input_id": "q-1", "s3_bucket": "rollouts",
                            "base_url": "http://127.0.0.1:8000/v1", "model_id": "qwen"}}
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from openai import AsyncOpenAI
from strands import Agent, tool
from strands.models.openai import OpenAIModel

from agentcore_rl.server import AgentCoreRLApp, RequestContext
from examples.math_agent.agent import SYSTEM_PROMPT, Task, http_client, validate_payload
from examples.math_agent.calculator import calculate
from examples.math_agent.reward import RewardFunction

__all__ = ["app", "calculator", "math_agent", "solve"]

app = AgentCoreRLApp()
app.payload_validator(validate_payload)
reward_fn = RewardFunction()


@tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression with + - * / and parentheses.

    Args:
        expression: for example (12 + 5) * 3
    """
    return calculate(json.dumps({"expression": expression}))


@asynccontextmanager
async def math_agent(task: Task) -> AsyncIterator[Agent]:
    """A Strands agent with the calculator, on the policy the payload names.

    One OpenAI client per rollout, handed to Strands (which then leaves it open) and closed
    here; ``stream=False`` because a rollout needs the whole answer, not tokens as they come.

    Example::

        async with math_agent(validate_payload(payload)) as agent:
            result = await agent.invoke_async(payload["prompt"])
    """
    async with AsyncOpenAI(
        base_url=task.base_url, api_key="EMPTY", http_client=http_client()
    ) as llm:
        model = OpenAIModel(
            client=llm, model_id=task.model_id, params=dict(task.sampling), stream=False
        )
        yield Agent(
            model=model,
            tools=[calculator],
            system_prompt=SYSTEM_PROMPT,
            callback_handler=None,  # no printing of every event to stdout
        )


def final_text(message: Any) -> str:
    """The text blocks of a Strands message, joined.

    Example::

        final_text(result.message)   # "The answer is 14."
    """
    return "".join(block.get("text", "") for block in message.get("content", []))


@app.rollout_entrypoint
async def solve(payload: dict[str, Any], context: RequestContext) -> dict[str, Any]:
    """One rollout: Strands' tool loop with the calculator, then the reward.

    Example::

        result = await solve(payload, context)
        result["rewards"]   # [1.0] or [0.0]
    """
    task = validate_payload(payload)
    async with math_agent(task) as agent:
        result = await agent.invoke_async(task.prompt)
        messages = list(agent.messages)
    final = final_text(result.message)
    reward = reward_fn(final, task.answer)
    metrics = result.metrics
    usage = metrics.accumulated_usage
    tool_calls = sum(m.call_count for m in metrics.tool_metrics.values())
    return {
        "rewards": [reward],
        "answer": final,
        "turns": metrics.cycle_count,
        "metrics": {
            "correct": reward > 0,
            "turns": metrics.cycle_count,
            "tool_calls": tool_calls,
            "prompt_tokens": usage["inputTokens"],
            "completion_tokens": usage["outputTokens"],
            "session_id": context.session_id,
        },
        "messages": messages,
    }
