"""The math agent as a Claude-style tool loop on the Anthropic SDK, made trainable.

This is ``production_agent.py`` with the decorator swapped (``@app.entrypoint`` became
``@app.rollout_entrypoint``), a reward added, and the client pointed at the rollout's
session: ``AsyncAnthropic(base_url=context.rollout.session_url, ...)``. Through the rollout
gateway every ``messages.create`` call is recorded with its exact token ids.

Run it::

    agentcore-rl serve examples.claude_math.agent:app --port 8080

A payload is ``{"prompt": ..., "answer": ..., "_rollout": {"exp_id", "input_id",
"s3_bucket", "base_url", "model_id", ...sampling}}``, exactly as for the plain math agent.

Example::

    payload = {"prompt": "Maya has 12 apples. She eats 3. How many are left?",
               "answer": "9",
               "_rollout": {"exp_id": "e1", "input_id": "q-1", "s3_bucket": "rollouts",
                            "base_url": "http://127.0.0.1:9000/sessions/s-1/v1",
                            "model_id": "qwen"}}
"""

from __future__ import annotations

import json
from typing import Any, Final

from anthropic import AsyncAnthropic

from agentcore_rl.server import AgentCoreRLApp, RequestContext
from examples.math_agent.agent import MAX_TURNS, SYSTEM_PROMPT, validate_payload
from examples.math_agent.calculator import CALCULATOR_TOOL, calculate
from examples.math_agent.reward import RewardFunction

__all__ = ["TOOLS", "app", "claude_loop", "solve"]

#: The calculator as an Anthropic tool.
TOOLS: Final[Any] = [
    {
        "name": CALCULATOR_TOOL["function"]["name"],
        "description": CALCULATOR_TOOL["function"]["description"],
        "input_schema": CALCULATOR_TOOL["function"]["parameters"],
    }
]
_SAMPLING: Final = ("temperature", "top_p", "max_tokens")  # what messages.create takes

app = AgentCoreRLApp()
app.payload_validator(validate_payload)
reward_fn = RewardFunction()


async def claude_loop(
    llm: AsyncAnthropic, model: str, prompt: str, **sampling: Any
) -> dict[str, Any]:
    """Claude's tool loop: ask with the calculator, answer each ``tool_use`` with a
    ``tool_result``, until the model ends its turn. -> the final text and the loop's counts.

    Example::

        async with AsyncAnthropic() as llm:
            (await claude_loop(llm, "claude-sonnet-4-5", "What is 6 * 7?"))["answer"]
    """
    messages: list[Any] = [{"role": "user", "content": prompt}]
    sampling.setdefault("max_tokens", 1024)  # the Messages API requires it
    turns = tool_calls = input_tokens = output_tokens = 0
    final = ""
    while turns < MAX_TURNS:
        turns += 1
        reply = await llm.messages.create(
            model=model, system=SYSTEM_PROMPT, messages=messages, tools=TOOLS, **sampling
        )
        input_tokens += reply.usage.input_tokens
        output_tokens += reply.usage.output_tokens
        messages.append({"role": "assistant", "content": reply.content})
        if reply.stop_reason != "tool_use":
            final = "".join(b.text for b in reply.content if b.type == "text")
            break
        results = []
        for block in reply.content:
            if block.type == "tool_use":
                tool_calls += 1
                value = calculate(json.dumps(block.input))
                results.append({"type": "tool_result", "tool_use_id": block.id, "content": value})
        messages.append({"role": "user", "content": results})
    return {
        "answer": final,
        "turns": turns,
        "tool_calls": tool_calls,
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "messages": [{"role": m["role"], "content": _plain(m["content"])} for m in messages],
    }


def _plain(content: Any) -> Any:
    """A turn's content as JSON (the SDK's blocks as dicts)."""
    if isinstance(content, str):
        return content
    return [b if isinstance(b, dict) else b.model_dump(exclude_none=True) for b in content]


@app.rollout_entrypoint
async def solve(payload: dict[str, Any], context: RequestContext) -> dict[str, Any]:
    """One rollout: Claude's tool loop with the calculator, then the reward.

    Example::

        result = await solve(payload, context)
        result["rewards"]   # [1.0] or [0.0]
    """
    task = validate_payload(payload)
    rollout = context.rollout
    assert rollout is not None  # a rollout entrypoint runs rollouts only
    sampling = {k: v for k, v in task.sampling.items() if k in _SAMPLING}
    # The session's root (the gateway's /sessions/{id}); the key is ignored there.
    async with AsyncAnthropic(
        base_url=rollout.session_url, api_key=rollout.api_key or "unused"
    ) as llm:
        out = await claude_loop(llm, task.model_id, task.prompt, **sampling)
    reward = reward_fn(out["answer"], task.answer)
    return {
        "rewards": [reward],
        "answer": out["answer"],
        "turns": out["turns"],
        "metrics": {
            "correct": reward > 0,
            "turns": out["turns"],
            "tool_calls": out["tool_calls"],
            "prompt_tokens": out["input_tokens"],
            "completion_tokens": out["output_tokens"],
            "session_id": context.session_id,
        },
        "messages": out["messages"],
    }
