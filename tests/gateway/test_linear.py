"""Linear history on real chat templates: the gateway renders, splices the served ids and calls
the stand-in token-in; the agent is the real OpenAI SDK (streaming or not), all on uvicorn."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest

from tests.gateway.template_rig import (
    QUESTION,
    TEMPLATE_MARKS,
    agent,
    chat,
    exactness,
    template_stack,
    trained_tokens_exact,
    trajectory_of,
)

pytestmark = TEMPLATE_MARKS

TEMPLATES = ["qwen3", "qwen2.5", "llama3.1", "deepseek-r1-distill", "gpt-oss", "mistral-small-3.2"]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("name", TEMPLATES)
async def test_linear_history_is_one_exact_sequence(name: str, stream: bool) -> None:
    from tests.gateway.template_fixtures import FIXTURES

    fixture = FIXTURES[name]
    async with template_stack(name, history="linear", tool_rounds=3) as rig:
        async with rig.llm("s1") as llm:
            answers = await agent(llm, stream=stream)
        trace = await rig.gateway.finish_session("s1")

    # tool calls and reasoning come back parsed, arguments as a JSON string
    assert [a["finish_reason"] for a in answers] == ["tool_calls"] * 3 + ["stop"]
    for step, answer in enumerate(answers[:3], start=1):
        (call,) = answer["tool_calls"]
        assert call["function"]["name"] == "calculator"
        arguments = json.loads(call["function"]["arguments"])
        assert arguments == {"expression": f"{10 * step} + {step}", "step": step}
        assert not answer.get("content")
    assert answers[-1]["content"] == "The answer is 33."
    if fixture.reasoning_parser:
        assert answers[0]["reasoning_content"] == "Step 1: I ask the calculator."
        assert answers[-1]["reasoning_content"] == "The tool has answered."
    else:
        assert all("reasoning_content" not in a for a in answers)

    # turn k+1's prompt is turn k's prompt + completion, exactly
    records = trace.records
    assert len(records) == 4
    for before, after in itertools.pairwise(records):
        served = before.prompt_ids.tolist() + before.completions[0].token_ids.tolist()
        assert after.prompt_ids.tolist()[: len(served)] == served
    # every prompt is what the server was fed, every completion what it generated
    assert exactness(trace, rig.policy) == (4, 4)
    trajectory = trajectory_of(trace)
    assert len(trajectory.segments) == 1
    assert (trajectory.merges, trajectory.splits) == (3, 0)
    assert trained_tokens_exact(trajectory, trace)
    assert rig.render.forks == 0


@pytest.mark.parametrize("name", ["qwen3", "llama3.1"])
async def test_a_truncated_history_forks(name: str) -> None:
    async with template_stack(name, history="linear", tool_rounds=3) as rig, rig.llm("s2") as llm:
        messages: list[Any] = [{"role": "user", "content": QUESTION}]
        first, _ = await chat(llm, messages, stream=False)
        echo = {k: v for k, v in first.items() if k in ("role", "content", "tool_calls")}
        (call,) = first["tool_calls"]
        messages += [echo, {"role": "tool", "tool_call_id": call["id"], "content": "11"}]
        second, _ = await chat(llm, messages, stream=False)  # extends
        # a sub-agent with a fresh context
        await chat(llm, [{"role": "user", "content": "Start over: " + QUESTION}], stream=False)
        # the parent goes on: it still extends its own served ids
        echo = {k: v for k, v in second.items() if k in ("role", "content", "tool_calls")}
        (call,) = second["tool_calls"]
        await chat(
            llm,
            [*messages, echo, {"role": "tool", "tool_call_id": call["id"], "content": "33"}],
            stream=False,
        )
        # an edited answer is no extension
        edited = {**messages[1], "content": "I changed my mind."}
        await chat(llm, [messages[0], edited, messages[2]], stream=False)
        trace = await rig.gateway.finish_session("s2")
    assert rig.render.forks == 2
    assert rig.gateway.stats["linear_forks"] == 2
    records = trace.records
    for before, after in [(records[0], records[1]), (records[1], records[3])]:
        served = before.prompt_ids.tolist() + before.completions[0].token_ids.tolist()
        assert after.prompt_ids.tolist()[: len(served)] == served
    assert exactness(trace, rig.policy) == (5, 5)
    trajectory = trajectory_of(trace)
    # the trajectory builder follows one history: the interleaved sub-agent splits it
    assert [s.calls for s in trajectory.segments] == [[0, 1], [2], [3], [4]]
    assert trained_tokens_exact(trajectory, trace)


async def test_a_retried_request_is_sent_the_same_prompt() -> None:
    async with template_stack("qwen2.5", history="linear") as rig, rig.llm("s3") as llm:
        messages: list[Any] = [{"role": "user", "content": QUESTION}]
        await chat(llm, messages, stream=False)
        await chat(llm, messages, stream=False)
        trace = await rig.gateway.finish_session("s3")
    first, second = trace.records
    assert first.prompt_ids == second.prompt_ids
    trajectory = trajectory_of(trace)
    assert (len(trajectory.segments), trajectory.duplicates) == (1, 1)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
async def test_sglang_generate_token_in(stream: bool) -> None:
    async with template_stack("qwen3", history="linear", backend="sglang", tool_rounds=2) as rig:
        async with rig.llm("s4") as llm:
            answers = await agent(llm, stream=stream)
        trace = await rig.gateway.finish_session("s4")
    assert [a["finish_reason"] for a in answers] == ["tool_calls", "tool_calls", "stop"]
    assert exactness(trace, rig.policy) == (3, 3)
    assert len(trajectory_of(trace).segments) == 1


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
async def test_proxy_mode_on_a_thinking_template_splits(stream: bool) -> None:
    """Proxy mode is unchanged: exact per call, but Qwen3's template drops the reasoning the
    agent did not send back, so every turn is its own sequence."""
    async with template_stack("qwen3", history="proxy", tool_rounds=3) as rig:
        async with rig.llm("s5") as llm:
            answers = await agent(llm, stream=stream)
        trace = await rig.gateway.finish_session("s5")
    assert [a["finish_reason"] for a in answers] == ["tool_calls"] * 3 + ["stop"]
    assert answers[0]["reasoning_content"] == "Step 1: I ask the calculator."
    assert exactness(trace, rig.policy) == (4, 4)
    trajectory = trajectory_of(trace)
    assert (len(trajectory.segments), trajectory.splits) == (4, 3)
    assert trained_tokens_exact(trajectory, trace)


async def test_bad_requests_in_linear_mode_are_400s() -> None:
    import openai

    async with template_stack("qwen2.5", history="linear") as rig, rig.llm("s6") as llm:
        with pytest.raises(openai.BadRequestError, match="n must be 1"):
            await llm.chat.completions.create(
                model="p", messages=[{"role": "user", "content": "hi"}], n=2
            )
        with pytest.raises(openai.BadRequestError, match="role"):
            await llm.chat.completions.create(model="p", messages=[{"content": "hi"}])  # type: ignore[list-item]
        trace = await rig.gateway.finish_session("s6")
    assert [r.status for r in trace.records] == [400, 400]
