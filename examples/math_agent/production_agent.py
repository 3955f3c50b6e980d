"""The math agent as it runs in production, BEFORE it was made trainable.

A plain request/response agent: ``@app.entrypoint`` answers the caller with the model's
answer. ``agent.py`` is this file after the swap to ``@app.rollout_entrypoint`` (plus a
reward): the server then answers at once, runs the rollout in the background and writes
the result to S3 for the trainer.

Example::

    OPENAI_BASE_URL=http://127.0.0.1:8000/v1 OPENAI_MODEL=qwen3-8b \\
        agentcore-rl serve examples.math_agent.production_agent:app --port 8080
    curl -s localhost:8080/invocations -d '{"prompt": "What is 6 * 7?"}'
"""

from __future__ import annotations

import functools
from typing import Any

from openai import AsyncOpenAI

from agentcore_rl.server import AgentCoreRLApp

from .agent import MAX_TURNS, SYSTEM_PROMPT, http_client, validate_payload
from .calculator import CALCULATOR_TOOL, calculate

__all__ = ["answer", "app"]

app = AgentCoreRLApp()
# In production there is no ground truth: only the prompt is required. Bad payloads get a
# 400 and never reach the model.
app.payload_validator(functools.partial(validate_payload, require_answer=False))


@app.entrypoint  # agent.py: @app.rollout_entrypoint
async def answer(payload: dict[str, Any]) -> dict[str, Any]:
    """Solve one problem and answer the caller directly.

    Example::

        await answer({"prompt": "What is 6 * 7?"})   # {"answer": "The answer is 42."}
    """
    task = validate_payload(payload, require_answer=False)
    messages: list[Any] = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": task.prompt},
    ]
    async with AsyncOpenAI(
        base_url=task.base_url, api_key="EMPTY", http_client=http_client()
    ) as llm:
        for _ in range(MAX_TURNS):
            reply = await llm.chat.completions.create(
                model=task.model_id, messages=messages, tools=[CALCULATOR_TOOL]
            )
            message = reply.choices[0].message
            messages.append(message.model_dump(exclude_none=True))
            if not message.tool_calls:
                return {"answer": message.content or ""}
            for call in message.tool_calls:
                arguments = getattr(getattr(call, "function", None), "arguments", "")
                messages.append(
                    {"role": "tool", "tool_call_id": call.id, "content": calculate(arguments)}
                )
    return {"answer": ""}
