"""The Strands math agent as it runs in production, BEFORE it was made trainable.

Written for AWS's ``BedrockAgentCoreApp``; to train it, the import changes and then, in
``agent.py``, the decorator::

    # from bedrock_agentcore.runtime import BedrockAgentCoreApp
    # app = BedrockAgentCoreApp()
    from agentcore_rl import AgentCoreRLApp
    app = AgentCoreRLApp()

    @app.entrypoint            # agent.py: @app.rollout_entrypoint, and a reward returned

Example::

    OPENAI_BASE_URL=http://127.0.0.1:8000/v1 OPENAI_MODEL=qwen3-8b \\
        agentcore-rl serve examples.strands_math.production_agent:app --port 8080
    curl -s localhost:8080/invocations -d '{"prompt": "What is 6 * 7?"}'
"""

from __future__ import annotations

import functools
from typing import Any

from agentcore_rl import AgentCoreRLApp
from examples.math_agent.agent import validate_payload
from examples.strands_math.agent import final_text, math_agent

__all__ = ["answer", "app"]

app = AgentCoreRLApp()
app.payload_validator(functools.partial(validate_payload, require_answer=False))


@app.entrypoint  # agent.py: @app.rollout_entrypoint
async def answer(payload: dict[str, Any]) -> dict[str, Any]:
    """Solve one problem and answer the caller directly.

    Example::

        await answer({"prompt": "What is 6 * 7?"})   # {"answer": "The answer is 42."}
    """
    task = validate_payload(payload, require_answer=False)
    async with math_agent(task) as agent:
        result = await agent.invoke_async(task.prompt)
    return {"answer": final_text(result.message)}
