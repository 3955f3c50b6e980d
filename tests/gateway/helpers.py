"""Shared parts of the gateway tests: the stand-in policy and a gateway on real uvicorn,
an agent's chat call through the real OpenAI SDK (streaming or not), bounded waits."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import anyio
from openai import AsyncOpenAI

from agentcore_rl.gateway import RolloutGateway
from agentcore_rl.local.background import BackgroundServer
from agentcore_rl.local.policy import ScriptedPolicy, Serving

ADMIN = "test-admin-token"
CALCULATOR: Any = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    },
}
PROBLEM = "Maya has 12 apples. She buys 5 more apples. She eats 3. How many apples are left?"


@dataclass
class Stack:
    policy: ScriptedPolicy
    gateway: RolloutGateway
    url: str  # the gateway's http://host:port
    upstream_url: str

    def llm(self, sid: str, *, bearer: bool = False) -> AsyncOpenAI:
        """The agent's OpenAI client for session ``sid``."""
        if bearer:
            return AsyncOpenAI(base_url=self.url + "/v1", api_key=sid, max_retries=0)
        return AsyncOpenAI(
            base_url=RolloutGateway.session_base_url(self.url, sid), api_key="x", max_retries=0
        )


@contextlib.asynccontextmanager
async def served(
    policy: ScriptedPolicy | None = None, **gateway_options: Any
) -> AsyncIterator[Stack]:
    """The stand-in policy (vLLM-like: ids only when asked) and a gateway, both on uvicorn."""
    policy = policy or ScriptedPolicy(
        accuracy=1.0, serving=Serving(token_ids="requested", keep_answers=1000)
    )
    gateway_options.setdefault("admin_token", ADMIN)
    async with BackgroundServer(policy) as upstream:
        gateway = RolloutGateway(upstream.url + "/v1", **gateway_options)
        async with BackgroundServer(gateway) as server:
            try:
                yield Stack(policy, gateway, server.url, upstream.url)
            finally:
                # Both shut down together: uvicorn takes ~0.15 s to notice and to stop.
                upstream.request_exit()


async def chat(
    llm: AsyncOpenAI, messages: list[Any], *, stream: bool, **options: Any
) -> tuple[dict[str, Any], str | None]:
    """One chat call as an agent makes it -> (assistant message as a dict, finish reason)."""
    if not stream:
        reply = await llm.chat.completions.create(model="policy", messages=messages, **options)
        choice = reply.choices[0]
        return choice.message.model_dump(exclude_none=True), choice.finish_reason
    content: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    finish = None
    chunks = await llm.chat.completions.create(
        model="policy", messages=messages, stream=True, **options
    )
    async for chunk in chunks:
        for choice in chunk.choices:
            if choice.delta.content:
                content.append(choice.delta.content)
            for call in choice.delta.tool_calls or ():
                slot = calls.setdefault(
                    call.index, {"id": call.id, "type": "function", "function": {}}
                )
                if call.function is not None:
                    slot["function"]["name"] = call.function.name
                    slot["function"]["arguments"] = call.function.arguments
            finish = choice.finish_reason or finish
    message: dict[str, Any] = {"role": "assistant"}
    if content:
        message["content"] = "".join(content)
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    return message, finish


async def tool_rollout(llm: AsyncOpenAI, *, stream: bool) -> list[Any]:
    """The math agent's loop: ask with the calculator, run the tool, ask again."""
    messages: list[Any] = [{"role": "user", "content": PROBLEM}]
    for _ in range(4):  # bounded
        message, finish = await chat(llm, messages, stream=stream, tools=[CALCULATOR])
        messages.append(message)
        if finish != "tool_calls":
            return messages
        for call in message["tool_calls"]:
            expression = json.loads(call["function"]["arguments"])["expression"]
            messages.append(
                {"role": "tool", "tool_call_id": call["id"], "content": str(eval_plain(expression))}
            )
    raise AssertionError("the agent did not finish in 4 turns")


def eval_plain(expression: str) -> int | float:
    from agentcore_rl.local.policy import evaluate_arithmetic

    return evaluate_arithmetic(expression)


async def wait_until(condition: Callable[[], bool], limit: float = 5.0) -> None:
    """Bounded wait for a condition another task (or uvicorn) makes true."""
    with anyio.fail_after(limit):
        while not condition():  # noqa: ASYNC110 - the state lives in parts with no events
            await anyio.sleep(0.005)


class Latch:
    """An injectable ``sleep`` for the stand-in policy: calls wait until released."""

    def __init__(self) -> None:
        self.waiting = 0
        self._open = anyio.Event()

    async def sleep(self, _: float) -> None:
        self.waiting += 1
        await self._open.wait()
        self.waiting -= 1

    def release(self) -> None:
        self._open.set()


Call = Callable[[], Awaitable[Any]]
