"""A GSM8K-style math agent with a calculator tool, served for RL rollouts.

This is ``production_agent.py`` with one line changed: ``@app.entrypoint`` became
``@app.rollout_entrypoint``. The server now answers at once with the S3 result key, runs
the rollout in the background and writes its result (rewards included) to S3.

Run it::

    agentcore-rl serve examples.math_agent.agent:app --port 8080

A payload is ``{"prompt": "<problem>", "answer": "<ground truth>", "_rollout": {...}}``
(anything else is refused with a 400 before the rollout starts);
``_rollout.base_url`` and ``_rollout.model_id`` say where the policy is served (any
OpenAI-compatible server: vLLM, SGLang, or the offline stand-in). Sampling parameters in
``_rollout`` (``temperature``, ``top_p``, ``max_tokens``, ``seed``) are passed through.

Example::

    payload = {"prompt": "Maya has 12 apples. She eats 3. How many are left?",
               "answer": "9",
               "_rollout": {"exp_id": "e1", "input_id": "q-1", "s3_bucket": "rollouts",
                            "base_url": "http://127.0.0.1:8000/v1", "model_id": "qwen"}}
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import httpx
from openai import AsyncOpenAI, DefaultAsyncHttpxClient

from agentcore_rl.errors import InvalidPayloadError
from agentcore_rl.protocol import BASE_URL, MODEL_ID, ROLLOUT_FIELD
from agentcore_rl.server import AgentCoreRLApp, RequestContext

from .calculator import CALCULATOR_TOOL, calculate
from .reward import RewardFunction

__all__ = [
    "MAX_TURNS",
    "SYSTEM_PROMPT",
    "Task",
    "app",
    "http_client",
    "solve",
    "validate_payload",
]

SYSTEM_PROMPT: Final = (
    "You solve arithmetic word problems. Use the calculator tool for every computation, "
    "then finish with one sentence of the form 'The answer is N.'"
)
#: Model turns per rollout: one to call the calculator, one to answer, some slack.
MAX_TURNS: Final = 4
_SAMPLING_KEYS: Final = ("temperature", "top_p", "max_tokens", "seed")
_MAX_PROMPT_CHARS: Final = 20_000

app = AgentCoreRLApp()
reward_fn = RewardFunction()

# Building a TLS context reads the CA bundle (about 20 ms of CPU); sharing one keeps the
# per-rollout model client cheap.
_TLS_CONTEXT: Final = httpx.create_ssl_context()


def http_client() -> DefaultAsyncHttpxClient:
    """A fresh HTTP client for one rollout's model client (closed with it), on the shared
    TLS context, with the OpenAI SDK's default timeouts and limits.

    Example::

        AsyncOpenAI(base_url=url, api_key="EMPTY", http_client=http_client())
    """
    return DefaultAsyncHttpxClient(verify=_TLS_CONTEXT)


@dataclass(frozen=True)
class Task:
    """A validated payload: the problem, its ground truth and where the policy is served.

    Example::

        task = validate_payload(payload)
        task.prompt, task.answer
    """

    prompt: str
    answer: str
    base_url: str
    model_id: str
    sampling: Mapping[str, Any]


@app.payload_validator
def validate_payload(payload: Mapping[str, Any], *, require_answer: bool = True) -> Task:
    """Check the payload before anything is sent to the model; raise a clear 400 if bad.

    Registered as the app's payload validator, so a bad payload is refused with a 400
    (naming the field) before the rollout is accepted; the entrypoint calls it again to
    get the typed task.

    ``prompt`` and ``answer`` (unless ``require_answer`` is false, as in production, where
    there is no ground truth) must be non-empty strings; the policy's address comes from
    ``_rollout.base_url`` (or the ``OPENAI_BASE_URL`` environment variable) and the model
    from ``_rollout.model_id`` (or ``OPENAI_MODEL``).

    Example::

        validate_payload({"prompt": 3, "answer": "3"})   # raises InvalidPayloadError
    """
    for name in ("prompt", "answer") if require_answer else ("prompt",):
        value = payload.get(name)
        if not isinstance(value, str):
            got = "nothing" if value is None else type(value).__name__
            raise InvalidPayloadError(f"{name} must be a string, got {got}", field=name)
        if not value.strip():
            raise InvalidPayloadError(f"{name} must not be empty", field=name)
    prompt, answer = payload["prompt"], payload.get("answer", "")
    if len(prompt) > _MAX_PROMPT_CHARS:
        raise InvalidPayloadError(
            f"prompt is {len(prompt)} characters long; the limit is {_MAX_PROMPT_CHARS}",
            field="prompt",
        )
    rollout = payload.get(ROLLOUT_FIELD)
    block: Mapping[str, Any] = rollout if isinstance(rollout, Mapping) else {}
    base_url = block.get(BASE_URL) or os.environ.get("OPENAI_BASE_URL")
    if not isinstance(base_url, str):
        raise InvalidPayloadError(
            f"{ROLLOUT_FIELD}.{BASE_URL} is required: the URL of an OpenAI-compatible "
            "server (e.g. http://127.0.0.1:8000/v1)",
            field=f"{ROLLOUT_FIELD}.{BASE_URL}",
        )
    model_id = block.get(MODEL_ID) or os.environ.get("OPENAI_MODEL") or "default"
    sampling = {key: block[key] for key in _SAMPLING_KEYS if key in block}
    return Task(prompt, answer, base_url, str(model_id), sampling)


@app.rollout_entrypoint
async def solve(payload: dict[str, Any], context: RequestContext) -> dict[str, Any]:
    """One rollout: a tool loop with the calculator, then the reward.

    Example::

        result = await solve(payload, context)
        result["rewards"]   # [1.0] or [0.0]
    """
    task = validate_payload(payload)
    messages: list[Any] = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": task.prompt},
    ]
    turns = tool_calls = prompt_tokens = completion_tokens = 0
    final = ""
    # One client per rollout, closed with it: base_url may differ between rollouts.
    async with AsyncOpenAI(
        base_url=task.base_url, api_key="EMPTY", http_client=http_client()
    ) as llm:
        while turns < MAX_TURNS:
            turns += 1
            reply = await llm.chat.completions.create(
                model=task.model_id,
                messages=messages,
                tools=[CALCULATOR_TOOL],
                **task.sampling,
            )
            if reply.usage is not None:
                prompt_tokens += reply.usage.prompt_tokens
                completion_tokens += reply.usage.completion_tokens
            message = reply.choices[0].message
            messages.append(message.model_dump(exclude_none=True))
            if not message.tool_calls:
                final = message.content or ""
                break
            for call in message.tool_calls:
                tool_calls += 1
                arguments = getattr(getattr(call, "function", None), "arguments", "")
                messages.append(
                    {"role": "tool", "tool_call_id": call.id, "content": calculate(arguments)}
                )
    reward = reward_fn(final, task.answer)
    return {
        "rewards": [reward],
        "answer": final,
        "turns": turns,
        "metrics": {
            "correct": reward > 0,
            "turns": turns,
            "tool_calls": tool_calls,
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "session_id": context.session_id,
        },
        "messages": messages,
    }
