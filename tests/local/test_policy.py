"""The scripted stand-in policy, driven through the real OpenAI SDK over loopback HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from openai import AsyncOpenAI, BadRequestError

from agentcore_rl.errors import ConfigurationError
from agentcore_rl.local.background import BackgroundServer
from agentcore_rl.local.policy import (
    ScriptedPolicy,
    ScriptVoice,
    Serving,
    evaluate_arithmetic,
    fake_token_ids,
    solve_word_problem,
)
from tests.server.test_sigterm import free_port

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


@contextlib.asynccontextmanager
async def _served(policy: ScriptedPolicy) -> AsyncIterator[tuple[ScriptedPolicy, AsyncOpenAI]]:
    async with BackgroundServer(policy) as server:
        llm = AsyncOpenAI(base_url=server.url + "/v1", api_key="EMPTY", max_retries=0)
        try:
            yield policy, llm
        finally:
            await llm.close()


@pytest.fixture
async def right() -> AsyncIterator[tuple[ScriptedPolicy, AsyncOpenAI]]:
    async with _served(ScriptedPolicy(accuracy=1.0)) as pair:
        yield pair


@pytest.fixture
async def wrong() -> AsyncIterator[tuple[ScriptedPolicy, AsyncOpenAI]]:
    async with _served(ScriptedPolicy(accuracy=0.0)) as pair:
        yield pair


async def test_tool_call_then_final_answer(right: tuple[ScriptedPolicy, AsyncOpenAI]) -> None:
    policy, llm = right
    messages: list[Any] = [{"role": "user", "content": PROBLEM}]
    first = await llm.chat.completions.create(
        model="any-model", messages=messages, tools=[CALCULATOR]
    )
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.tool_calls is not None
    call = choice.message.tool_calls[0]
    assert call.type == "function"
    assert call.function.name == "calculator"
    expression = json.loads(call.function.arguments)["expression"]
    assert evaluate_arithmetic(expression) == 14

    messages.append(choice.message.model_dump(exclude_none=True))
    messages.append({"role": "tool", "tool_call_id": call.id, "content": "14"})
    second = await llm.chat.completions.create(
        model="any-model", messages=messages, tools=[CALCULATOR]
    )
    assert second.choices[0].finish_reason == "stop"
    assert second.choices[0].message.content == "The answer is 14."
    assert policy.requests == 2


async def test_vllm_style_token_ids_and_usage(right: tuple[ScriptedPolicy, AsyncOpenAI]) -> None:
    _, llm = right
    reply = await llm.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "What is 6 * 7?"}]
    )
    extra = reply.model_extra or {}
    prompt_ids = extra["prompt_token_ids"]
    token_ids = (reply.choices[0].model_extra or {})["token_ids"]
    assert reply.choices[0].message.content == "The answer is 42."
    assert token_ids == fake_token_ids("The answer is 42.")
    assert all(isinstance(i, int) and i >= 0 for i in prompt_ids + token_ids)
    assert reply.usage is not None
    assert reply.usage.prompt_tokens == len(prompt_ids)
    assert reply.usage.completion_tokens == len(token_ids)
    assert reply.system_fingerprint == "agentcore-rl-scripted-stand-in"


async def test_wrong_answers_are_reproducible_and_wrong(
    wrong: tuple[ScriptedPolicy, AsyncOpenAI],
) -> None:
    _, llm = wrong
    request = {"model": "m", "messages": [{"role": "user", "content": "What is 6 * 7?"}]}
    first = await llm.chat.completions.create(**request)  # type: ignore[call-overload]
    again = await llm.chat.completions.create(**request)  # type: ignore[call-overload]
    assert first.choices[0].message.content == again.choices[0].message.content
    assert first.choices[0].message.content != "The answer is 42."


def test_accuracy_knob_controls_the_share_of_right_answers() -> None:
    voice = ScriptVoice(accuracy=0.5, seed=3)
    right = 0
    for i in range(200):
        body = {"messages": [{"role": "user", "content": f"What is {i} + 1?"}]}
        text = voice.say(body, [], 0, chat=True).message["content"]
        right += text == f"The answer is {i + 1}."
    assert 60 < right < 140


async def test_models_and_bad_requests(right: tuple[ScriptedPolicy, AsyncOpenAI]) -> None:
    policy, llm = right
    models = await llm.models.list()
    assert [m.id for m in models.data] == [policy.model]
    with pytest.raises(BadRequestError, match="messages must be a non-empty list"):
        await llm.chat.completions.create(model="m", messages=[])
    async with httpx.AsyncClient(base_url=str(llm.base_url)) as http:
        response = await http.post("chat/completions", content=b"{not json")
    assert response.status_code == 400
    assert "not valid JSON" in response.json()["error"]["message"]


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("Maya has 12 apples. She buys 5 more. She eats 3.", 14),
        ("Leo has 4 boxes. The number of boxes triples.", 12),
        ("Ana has 10 pens. She finds 2 more. She shares them equally among 4 friends.", 3),
        ("Sam has 9 cards. He gets 3 times as many cards.", 27),
        ("Kim has 8 stamps. She gives away half of them.", 4),
        ("What is (2 + 3) * 4?", 20),
    ],
)
def test_solver_reads_the_phrase_language(text: str, value: int) -> None:
    expression = solve_word_problem(text)
    assert expression is not None
    assert evaluate_arithmetic(expression) == value


@pytest.mark.parametrize(
    "expression", ["__import__('os')", "2 ** 10", "a + 1", "1 / 0", "True + 1"]
)
def test_evaluator_refuses_anything_but_arithmetic(expression: str) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - the message varies with the input
        evaluate_arithmetic(expression)


async def test_run_as_a_module_it_says_where_it_listens() -> None:
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "agentcore_rl.local.policy",
        "--port",
        str(port),
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONWARNINGS": "error"},
    )
    assert proc.stderr is not None
    try:
        first = (await asyncio.wait_for(proc.stderr.readline(), 30)).decode()
        assert f"on http://127.0.0.1:{port}/v1" in first, first  # no runpy warning first
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
            for _ in range(200):  # bounded: until uvicorn listens
                try:
                    response = await http.get("/v1/models")
                    break
                except httpx.ConnectError:
                    await asyncio.sleep(0.05)
            assert response.status_code == 200
    finally:
        proc.terminate()
        await asyncio.wait_for(proc.wait(), 30)


def test_serving_and_voice_options_are_checked() -> None:
    with pytest.raises(ConfigurationError, match=r"Serving\.token_ids"):
        Serving(token_ids="sometimes")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match=r"Serving\.latency"):
        Serving(latency=-1.0)
    with pytest.raises(ConfigurationError, match="default voice's"):
        ScriptedPolicy(ScriptVoice(), accuracy=0.5)
    with pytest.raises(ConfigurationError, match="serving must be a Serving"):
        ScriptedPolicy(serving={"latency": 1.0})  # type: ignore[arg-type]


async def test_token_in_needs_a_real_tokenizer(right: tuple[ScriptedPolicy, AsyncOpenAI]) -> None:
    _, llm = right
    root = str(llm.base_url).removesuffix("/v1/")
    async with httpx.AsyncClient(base_url=root) as http:
        completion = await http.post("/v1/completions", json={"model": "m", "prompt": [5, 6]})
        generate = await http.post("/generate", json={"input_ids": [5, 6]})
    for answer in (completion, generate):
        assert answer.status_code == 400
        assert "token-in needs a tokenizer" in answer.json()["error"]["message"]
