"""A scripted OpenAI-compatible chat-completions server: a STAND-IN for vLLM/SGLang.

No language model is available offline, so demos and tests talk to this instead. It speaks
enough of the OpenAI chat-completions API for the OpenAI SDK and for agents written against
vLLM: ``POST /v1/chat/completions`` (tool calls in the OpenAI ``tools``/``tool_calls``
format, ``finish_reason`` ``"tool_calls"``), ``GET /v1/models``, vLLM-style
``prompt_token_ids`` on the response and ``token_ids`` on each choice (fake, deterministic
ids; see :func:`~agentcore_rl.local.policy_solver.fake_token_ids`) and ``usage``.

How it "answers": it reads the first user message with a small pattern-based solver
(:mod:`agentcore_rl.local.policy_solver`). When tools are offered, the first turn calls the
first tool with the arithmetic expression; after the tool message it answers
``"The answer is N."``. Without tools it answers at once. With probability
``1 - accuracy`` it is wrong: it either slips when copying the tool's result or skips the
tool and guesses. The choice is a stable hash of (``seed``, the problem, the request's own
``seed`` if any, the choice index), so a run is reproducible and rewards still vary.

Example::

    from agentcore_rl.local.background import BackgroundServer
    from agentcore_rl.local.policy import ScriptedPolicy
    from openai import AsyncOpenAI

    policy = ScriptedPolicy(accuracy=0.8, seed=0)
    async with BackgroundServer(policy) as server:
        llm = AsyncOpenAI(base_url=server.url + "/v1", api_key="EMPTY")
        reply = await llm.chat.completions.create(
            model=policy.model, messages=[{"role": "user", "content": "What is 2 + 3?"}])
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from agentcore_rl.local.policy_solver import (
    evaluate_arithmetic,
    fake_token_ids,
    format_number,
    solve_word_problem,
)

__all__ = ["DEFAULT_POLICY_MODEL", "ScriptedPolicy"]

#: The model name the stand-in reports (any requested name is accepted and echoed).
DEFAULT_POLICY_MODEL: Final = "scripted-policy"
#: Marks every response, so nobody mistakes the stand-in for a real model.
_FINGERPRINT: Final = "agentcore-rl-scripted-stand-in"
_MAX_CHOICES: Final = 16


class _BadRequest(Exception):
    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param


@dataclass(frozen=True)
class _Draw:
    """The per-(problem, sample) dice: whether to be right, how to be wrong, by how much."""

    correct: bool
    skip_tool: bool
    slip: int

    @classmethod
    def roll(cls, key: str, accuracy: float) -> _Draw:
        digest = hashlib.sha256(key.encode()).digest()
        unit = int.from_bytes(digest[:8], "big") / 2**64
        slip = 1 + digest[9] % 5
        return cls(
            correct=unit < accuracy,
            skip_tool=digest[8] % 2 == 0,
            slip=-slip if digest[10] % 2 else slip,
        )


def _text_of(message: Mapping[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: keep the text ones
        return " ".join(str(part.get("text", "")) for part in content if isinstance(part, Mapping))
    return ""


def _render_prompt(messages: Sequence[Mapping[str, Any]], tools: Sequence[Any]) -> str:
    """A fake chat template, so prompt token ids depend on the whole conversation."""
    parts = [f"<|{m.get('role')}|>{_text_of(m)}" for m in messages]
    for message in messages:
        for call in message.get("tool_calls") or ():
            parts.append(json.dumps(call, sort_keys=True))
    if tools:
        parts.insert(0, "<|tools|>" + json.dumps(list(tools), sort_keys=True))
    return "".join(parts) + "<|assistant|>"


def _tool_argument_name(tool: Mapping[str, Any]) -> str:
    params = tool.get("function", {}).get("parameters") or {}
    required = params.get("required") or []
    if required:
        return str(required[0])
    props = params.get("properties") or {}
    return next(iter(props), "expression")


class ScriptedPolicy:
    """The stand-in policy server as an ASGI app (serve it with uvicorn/BackgroundServer).

    ``accuracy`` (0..1) is how often it answers correctly; ``seed`` makes the run
    reproducible; ``latency`` seconds are waited per request so that a demo looks like real
    work (``sleep`` is injectable). ``requests`` counts the chat-completion requests
    received, bad ones included.

    Example::

        policy = ScriptedPolicy(accuracy=0.7, latency=0.05)
        async with BackgroundServer(policy) as server:
            base_url = server.url + "/v1"      # give this to agents as _rollout.base_url
    """

    def __init__(
        self,
        *,
        accuracy: float = 0.8,
        seed: int = 0,
        latency: float = 0.0,
        model: str = DEFAULT_POLICY_MODEL,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        if not 0.0 <= accuracy <= 1.0:
            raise ValueError(f"accuracy must be between 0 and 1, got {accuracy}")
        if latency < 0:
            raise ValueError(f"latency must be >= 0 seconds, got {latency}")
        self.accuracy = accuracy
        self.seed = seed
        self.latency = latency
        self.model = model
        self.requests = 0
        self._sleep = sleep
        self.app = Starlette(
            routes=[
                Route("/v1/chat/completions", self._chat_completions, methods=["POST"]),
                Route("/v1/models", self._models, methods=["GET"]),
                Route("/health", self._health, methods=["GET"]),
            ]
        )

    def __repr__(self) -> str:
        return (
            f"ScriptedPolicy(accuracy={self.accuracy}, seed={self.seed}, "
            f"latency={self.latency}, model={self.model!r})"
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.app(scope, receive, send)

    async def _health(self, request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok", "stand_in": True})

    async def _models(self, request: Request) -> JSONResponse:
        return JSONResponse(
            {
                "object": "list",
                "data": [
                    {"id": self.model, "object": "model", "created": 0, "owned_by": _FINGERPRINT}
                ],
            }
        )

    async def _chat_completions(self, request: Request) -> JSONResponse:
        self.requests += 1
        try:
            body = await request.json()
        except ValueError:
            return _error(_BadRequest("request body is not valid JSON"))
        try:
            response = self.complete(body)
        except _BadRequest as exc:
            return _error(exc)
        if self.latency:
            await self._sleep(self.latency)
        return JSONResponse(response)

    def complete(self, body: object) -> dict[str, Any]:
        """Answer one chat-completions request body (what the HTTP route serves).

        Example::

            ScriptedPolicy().complete({"model": "m", "messages": [
                {"role": "user", "content": "What is 2 + 2?"}]})["choices"][0]["message"]
        """
        if not isinstance(body, Mapping):
            raise _BadRequest("request body must be a JSON object")
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise _BadRequest("messages must be a non-empty list", "messages")
        if not all(isinstance(m, Mapping) and isinstance(m.get("role"), str) for m in messages):
            raise _BadRequest("every message must be an object with a string role", "messages")
        if body.get("stream"):
            raise _BadRequest("the scripted stand-in policy does not stream", "stream")
        tools = body.get("tools") or []
        if not isinstance(tools, list):
            raise _BadRequest("tools must be a list", "tools")
        n = body.get("n", 1) or 1
        if not isinstance(n, int) or not 1 <= n <= _MAX_CHOICES:
            raise _BadRequest(f"n must be an integer from 1 to {_MAX_CHOICES}", "n")
        model = body.get("model") if isinstance(body.get("model"), str) else self.model

        prompt_ids = fake_token_ids(_render_prompt(messages, tools))
        choices = [self._choice(i, messages, tools, body.get("seed")) for i in range(n)]
        completion_tokens = sum(len(c["token_ids"]) for c in choices)
        digest = hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode())
        return {
            "id": "chatcmpl-" + digest.hexdigest()[:24],
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "system_fingerprint": _FINGERPRINT,
            "choices": choices,
            "usage": {
                "prompt_tokens": len(prompt_ids),
                "completion_tokens": completion_tokens,
                "total_tokens": len(prompt_ids) + completion_tokens,
            },
            "prompt_token_ids": prompt_ids,
        }

    def _choice(
        self, index: int, messages: list[Any], tools: list[Any], request_seed: object
    ) -> dict[str, Any]:
        problem = next((_text_of(m) for m in messages if m.get("role") == "user"), "")
        draw = _Draw.roll(f"{self.seed}\x00{request_seed}\x00{index}\x00{problem}", self.accuracy)
        expression = solve_word_problem(problem)
        last = messages[-1]
        function_tools = [t for t in tools if isinstance(t, Mapping) and "function" in t]

        if last.get("role") == "tool":
            # The tool answered: report its (last) number, or slip when copying it.
            value = _last_number(_text_of(last))
            if value is None:
                return _say(index, "I could not read the tool's result.")
            return _say(index, self._answer_text(value, draw))
        if expression is None:
            return _say(index, "I am not sure how to solve this problem.")
        value = evaluate_arithmetic(expression)
        if function_tools and (draw.correct or not draw.skip_tool):
            tool = function_tools[0]
            name = str(tool["function"].get("name", "calculator"))
            arguments = json.dumps({_tool_argument_name(tool): expression})
            call_id = "call_" + hashlib.sha256(f"{index}{problem}".encode()).hexdigest()[:16]
            message = {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": name, "arguments": arguments},
                    }
                ],
            }
            return _choice(index, message, "tool_calls", name + arguments)
        return _say(index, self._answer_text(value, draw))

    @staticmethod
    def _answer_text(value: int | float, draw: _Draw) -> str:
        if not draw.correct:
            value = value + draw.slip
        return f"The answer is {format_number(value)}."


def _last_number(text: str) -> int | float | None:
    found = re.findall(r"-?\d+(?:\.\d+)?", text)
    if not found:
        return None
    number = float(found[-1])
    return int(number) if number.is_integer() else number


def _choice(index: int, message: dict[str, Any], finish: str, text: str) -> dict[str, Any]:
    return {
        "index": index,
        "message": message,
        "finish_reason": finish,
        "logprobs": None,
        "token_ids": fake_token_ids(text),
    }


def _say(index: int, text: str) -> dict[str, Any]:
    return _choice(index, {"role": "assistant", "content": text}, "stop", text)


def _error(exc: _BadRequest) -> JSONResponse:
    return JSONResponse(
        {
            "error": {
                "message": exc.message,
                "type": "invalid_request_error",
                "param": exc.param,
                "code": None,
            }
        },
        status_code=400,
    )
