"""Real chat templates end to end: the stand-in policy serving a real tokenizer and template,
the gateway in proxy or linear mode in front of it (both on uvicorn), a tool-calling agent
on the real OpenAI SDK, and the checks of what was captured. Used by the tests and by
``benchmarks/templates.py``.

The tokenizers are built from llama.cpp's vocab files once into a cache
(``tests/gateway/template_fixtures.py``); without the ``render`` extra the tests skip."""

from __future__ import annotations

import contextlib
import importlib.util
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from openai import AsyncOpenAI

from agentcore_rl.gateway import RolloutGateway
from agentcore_rl.local.background import BackgroundServer
from agentcore_rl.local.policy import ScriptedPolicy, Serving, TemplateVoice
from agentcore_rl.trace import SessionTrace
from agentcore_rl.trajectory import Trajectory, build_trajectory
from tests.gateway.helpers import ADMIN, CALCULATOR

QUESTION = "Add up the numbers step by step with the calculator. What is the total?"

#: Why the template tests cannot run here (None: they can).
RENDER_MISSING: str | None = next(
    (
        f"needs {name} (pip install 'agentcore-rl[render]')"
        for name in ("transformers", "tokenizers", "gguf")
        if importlib.util.find_spec(name) is None
    ),
    None,
)
#: The template tests' marks: skipped without the render extra; the first test builds the
#: tokenizers (downloading llama.cpp's files once per machine).
TEMPLATE_MARKS = [
    pytest.mark.skipif(RENDER_MISSING is not None, reason=RENDER_MISSING or ""),
    pytest.mark.timeout(600),
]


def tokenizer_dir(name: str) -> Path:
    """The fixture's tokenizer directory (built once into the cache)."""
    from tests.gateway.template_fixtures import fixture_dir

    return fixture_dir(name)


@dataclass
class Rig:
    policy: ScriptedPolicy
    gateway: RolloutGateway
    url: str
    render: Any = None  # the gateway's RenderMode in linear history

    def llm(self, sid: str) -> AsyncOpenAI:
        return AsyncOpenAI(
            base_url=RolloutGateway.session_base_url(self.url, sid), api_key="x", max_retries=0
        )


@contextlib.asynccontextmanager
async def template_stack(
    name: str, *, history: str = "linear", backend: str = "vllm", tool_rounds: int = 3
) -> AsyncIterator[Rig]:
    """The stand-in serving fixture ``name`` and a gateway (``history`` proxy or linear)."""
    from agentcore_rl.gateway.render.mode import RenderMode
    from tests.gateway.template_fixtures import FIXTURES

    fixture = FIXTURES[name]
    directory = str(tokenizer_dir(name))
    policy = ScriptedPolicy(
        TemplateVoice(
            directory,
            tool_call_parser=fixture.tool_parser,
            reasoning_parser=fixture.reasoning_parser,
            tool_rounds=tool_rounds,
        ),
        serving=Serving(token_ids="requested", keep_answers=100_000),
    )
    render = None
    if history == "linear":
        render = RenderMode.load(
            directory,
            backend=backend,
            tool_call_parser=fixture.tool_parser,
            reasoning_parser=fixture.reasoning_parser,
        )
    async with BackgroundServer(policy) as upstream:
        base = upstream.url if backend == "sglang" else upstream.url + "/v1"
        gateway = RolloutGateway(base, admin_token=ADMIN, render=render)
        async with BackgroundServer(gateway) as server:
            yield Rig(policy, gateway, server.url, render)


async def chat(
    llm: AsyncOpenAI, messages: list[Any], *, stream: bool
) -> tuple[dict[str, Any], str | None]:
    """One chat call with the calculator -> (assistant message as a dict, finish reason)."""
    if not stream:
        reply = await llm.chat.completions.create(
            model="policy", messages=messages, tools=[CALCULATOR]
        )
        first = reply.choices[0]
        return first.message.model_dump(exclude_none=True), first.finish_reason
    message: dict[str, Any] = {"role": "assistant"}
    calls: dict[int, dict[str, Any]] = {}
    finish: str | None = None
    chunks = await llm.chat.completions.create(
        model="policy", messages=messages, tools=[CALCULATOR], stream=True
    )
    async for chunk in chunks:
        for choice in chunk.choices:
            delta = choice.delta.model_dump(exclude_none=True)
            for key in ("content", "reasoning_content"):
                if delta.get(key):
                    message[key] = message.get(key, "") + delta[key]
            for call in choice.delta.tool_calls or ():
                slot = calls.setdefault(call.index, {"id": call.id, "type": "function"})
                if call.function is not None:
                    slot["function"] = {
                        "name": call.function.name,
                        "arguments": call.function.arguments,
                    }
            finish = choice.finish_reason or finish
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    return message, finish


async def agent(llm: AsyncOpenAI, *, stream: bool, max_turns: int = 12) -> list[dict[str, Any]]:
    """A tool-calling agent as agents are written: it keeps each answer's content and tool
    calls (not its reasoning, which the chat format has no field for) and runs the tool.
    -> the answers it got, in order."""
    messages: list[Any] = [{"role": "user", "content": QUESTION}]
    answers = []
    for _ in range(max_turns):
        message, finish = await chat(llm, messages, stream=stream)
        answers.append({**message, "finish_reason": finish})
        echo = {k: v for k, v in message.items() if k in ("role", "content", "tool_calls")}
        messages.append(echo)
        if finish != "tool_calls":
            return answers
        for call in message["tool_calls"]:
            arguments = json.loads(call["function"]["arguments"])
            a, _, b = arguments["expression"].partition(" + ")
            messages.append(
                {"role": "tool", "tool_call_id": call["id"], "content": str(int(a) + int(b))}
            )
    raise AssertionError(f"the agent did not finish in {max_turns} turns")


def served(policy: ScriptedPolicy) -> dict[tuple[int, ...], tuple[list[int], list[float]]]:
    """What the stand-in was fed -> what it generated (ids, logprobs)."""
    return {tuple(prompt): choices[0] for prompt, choices in policy.answers}


def exactness(trace: SessionTrace, policy: ScriptedPolicy) -> tuple[int, int]:
    """-> (exact calls, calls): a call is exact when its prompt ids are a prompt the server
    was fed and its completion ids and logprobs are what the server generated for it."""
    fed = served(policy)
    calls = [r for r in trace.records if r.ok]
    exact = 0
    for record in calls:
        got = fed.get(tuple(record.prompt_ids))
        completion = record.completions[0]
        if got is not None and got == (completion.token_ids.tolist(), completion.logprobs.tolist()):
            exact += 1
    return exact, len(calls)


def trained_tokens_exact(trajectory: Trajectory, trace: SessionTrace) -> bool:
    """Every mask-1 token of every segment is a served token with its logprob, in order."""
    by_index = {r.index: r for r in trace.records}
    for segment in trajectory.segments:
        ids = [t for t, m in zip(segment.token_ids, segment.loss_mask, strict=True) if m]
        logprobs = [x for x, m in zip(segment.logprobs, segment.loss_mask, strict=True) if m]
        want_ids: list[int] = []
        want_logprobs: list[float] = []
        for index in segment.calls:
            completion = by_index[index].completions[0]
            want_ids += completion.token_ids.tolist()
            want_logprobs += completion.logprobs.tolist()
        if ids != want_ids or logprobs != want_logprobs:
            return False
    return True


def trajectory_of(trace: SessionTrace) -> Trajectory:
    return build_trajectory(trace, reward=1.0)
