"""The Claude math agent as it runs in production, BEFORE it was made trainable.

Written for AWS's ``BedrockAgentCoreApp`` and the Anthropic API (the SDK reads
``ANTHROPIC_API_KEY`` and ``ANTHROPIC_BASE_URL``); to train it, the import changes and
then, in ``agent.py``, the decorator and the client's ``base_url``::

    # from bedrock_agentcore.runtime import BedrockAgentCoreApp
    # app = BedrockAgentCoreApp()
    from agentcore_rl import AgentCoreRLApp
    app = AgentCoreRLApp()

    @app.entrypoint            # agent.py: @app.rollout_entrypoint, and a reward returned

Example::

    ANTHROPIC_API_KEY=... agentcore-rl serve examples.claude_math.production_agent:app
    curl -s localhost:8080/invocations -d '{"prompt": "What is 6 * 7?"}'
"""

from __future__ import annotations

import os
from typing import Any

from anthropic import AsyncAnthropic

from agentcore_rl import AgentCoreRLApp
from agentcore_rl.errors import InvalidPayloadError
from examples.claude_math.agent import claude_loop

__all__ = ["answer", "app"]

app = AgentCoreRLApp()


@app.payload_validator
def validate(payload: dict[str, Any]) -> str:
    """The prompt: a non-empty string (else a 400 naming it, before the model is called)."""
    prompt = payload.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise InvalidPayloadError("prompt must be a non-empty string", field="prompt")
    return prompt


@app.entrypoint  # agent.py: @app.rollout_entrypoint
async def answer(payload: dict[str, Any]) -> dict[str, Any]:
    """Solve one problem and answer the caller directly.

    Example::

        await answer({"prompt": "What is 6 * 7?"})   # {"answer": "The answer is 42."}
    """
    async with AsyncAnthropic() as llm:  # agent.py: base_url=context.rollout.session_url
        model = os.environ.get("ANTHROPIC_MODEL", "claude-sonnet-4-5")
        out = await claude_loop(llm, model, validate(payload))
    return {"answer": out["answer"]}
