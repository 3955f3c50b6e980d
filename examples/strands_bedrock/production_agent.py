"""The Strands math agent as shipped on AgentCore, BEFORE it was made trainable: Strands'
default model provider, ``BedrockModel`` (boto3 ``bedrock-runtime``, Converse streamed).

Written for AWS's ``BedrockAgentCoreApp``; to train it, the import changes and then, in
``agent.py``, the decorator and the one model argument::

    # from bedrock_agentcore.runtime import BedrockAgentCoreApp
    # app = BedrockAgentCoreApp()
    from agentcore_rl import AgentCoreRLApp
    app = AgentCoreRLApp()

    @app.entrypoint            # agent.py: @app.rollout_entrypoint, and a reward returned
    BedrockModel()             # agent.py: BedrockModel(endpoint_url=context.rollout.session_url)

Example::

    agentcore-rl serve examples.strands_bedrock.production_agent:app --port 8080
    curl -s localhost:8080/invocations -d '{"prompt": "What is 6 * 7?"}'
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from strands import Agent
from strands.models.bedrock import BedrockModel

from agentcore_rl import AgentCoreRLApp
from agentcore_rl.errors import InvalidPayloadError
from examples.math_agent.agent import SYSTEM_PROMPT
from examples.strands_math.agent import calculator, final_text

__all__ = ["answer", "app", "bedrock_agent", "prompt_of"]

app = AgentCoreRLApp()


def bedrock_agent(model: BedrockModel) -> Agent:
    """The Strands agent with the calculator on ``model``.

    Example::

        result = await bedrock_agent(BedrockModel()).invoke_async("What is 6 * 7?")
    """
    return Agent(
        model=model,
        tools=[calculator],
        system_prompt=SYSTEM_PROMPT,
        callback_handler=None,  # no printing of every event to stdout
    )


@app.payload_validator
def prompt_of(payload: Mapping[str, Any]) -> str:
    """The payload's problem (a 400 naming ``prompt`` when it is not a non-empty string).

    Example::

        prompt_of({"prompt": "What is 6 * 7?"})   # "What is 6 * 7?"
    """
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
    result = await bedrock_agent(BedrockModel()).invoke_async(prompt_of(payload))
    return {"answer": final_text(result.message)}
