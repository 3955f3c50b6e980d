"""Bedrock Converse on real chat templates: the real boto3 client's tool loop through the
gateway in linear history and in proxy mode, against the stand-in serving a real tokenizer
and template (tool calls and reasoning parsed by the template's parsers)."""

from __future__ import annotations

from collections.abc import Iterator

import anyio
import pytest
from strands import Agent, tool
from strands.models.bedrock import BedrockModel

from tests.gateway.converse_agent import bedrock, close_clients, converse, keep, tool_loop
from tests.gateway.template_rig import (
    QUESTION,
    TEMPLATE_MARKS,
    chat,
    exactness,
    template_stack,
    trained_tokens_exact,
    trajectory_of,
)

pytestmark = TEMPLATE_MARKS


@pytest.fixture(autouse=True)
def _close_clients() -> Iterator[None]:
    yield
    close_clients()


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("history", ["linear", "proxy"])
@pytest.mark.parametrize("name", ["qwen3", "llama3.1", "gpt-oss"])
async def test_a_converse_tool_loop_is_one_exact_sequence(
    name: str, history: str, stream: bool
) -> None:
    async with template_stack(name, history=history, tool_rounds=3) as rig:
        client = bedrock(f"{rig.url}/sessions/s1")
        _, answers = await anyio.to_thread.run_sync(
            lambda: tool_loop(client, QUESTION, stream=stream)
        )
        trace = await rig.gateway.finish_session("s1")

    assert [a["stopReason"] for a in answers] == ["tool_use"] * 3 + ["end_turn"]
    for step, answer in enumerate(answers[:3], start=1):
        (use,) = [b["toolUse"] for b in answer["output"]["message"]["content"] if "toolUse" in b]
        assert (use["name"], use["input"]) == (
            "calculator",
            {"expression": f"{10 * step} + {step}", "step": step},
        )
    final = answers[-1]["output"]["message"]["content"]
    assert final[-1] == {"text": "The answer is 33."}
    thoughts = [b for b in final if "reasoningContent" in b]
    if name != "llama3.1":
        assert thoughts == [
            {"reasoningContent": {"reasoningText": {"text": "The tool has answered."}}}
        ]

    records = trace.records
    assert [r.endpoint for r in records] == ["converse"] * 4
    assert exactness(trace, rig.policy) == (4, 4)
    for record, answer in zip(records, answers, strict=True):
        assert answer["usage"]["inputTokens"] == len(record.prompt_ids)
        assert answer["usage"]["outputTokens"] == len(record.completions[0].token_ids)
    trajectory = trajectory_of(trace)
    if history == "linear":
        assert len(trajectory.segments) == 1
        assert (trajectory.merges, trajectory.splits) == (3, 0)
        assert rig.render.forks == 0
    assert trained_tokens_exact(trajectory, trace)


@pytest.mark.parametrize("history", ["linear", "proxy"])
async def test_turn_one_is_the_prompt_chat_gives(history: str) -> None:
    async with template_stack("qwen3", history=history) as rig:
        client = bedrock(f"{rig.url}/sessions/conv")
        question = [{"role": "user", "content": [{"text": QUESTION}]}]
        await anyio.to_thread.run_sync(lambda: converse(client, question, stream=False, system=[]))
        async with rig.llm("chat") as llm:
            await chat(llm, [{"role": "user", "content": QUESTION}], stream=False)
        by_converse = await rig.gateway.finish_session("conv")
        by_chat = await rig.gateway.finish_session("chat")
    assert by_converse.records[0].prompt_ids.tolist() == by_chat.records[0].prompt_ids.tolist()


@tool
def calculator(expression: str, step: int = 0) -> str:
    """Evaluate an addition.

    Args:
        expression: for example 10 + 1
        step: which step of the sum this is
    """
    a, _, b = expression.partition(" + ")
    return str(int(a) + int(b))


@pytest.mark.parametrize("streaming", [True, False], ids=["stream", "whole"])
async def test_a_strands_agent_in_linear_history_is_one_exact_sequence(streaming: bool) -> None:
    async with template_stack("qwen3", history="linear", tool_rounds=3) as rig:
        model = BedrockModel(endpoint_url=f"{rig.url}/sessions/s2", streaming=streaming)
        keep(model.client)
        agent = Agent(model=model, tools=[calculator], callback_handler=None)
        result = await agent.invoke_async(QUESTION)
        trace = await rig.gateway.finish_session("s2")
    assert result.message["content"][-1] == {"text": "The answer is 33."}
    assert result.metrics.tool_metrics["calculator"].success_count == 3
    assert exactness(trace, rig.policy) == (4, 4)
    trajectory = trajectory_of(trace)
    assert (len(trajectory.segments), trajectory.merges, trajectory.splits) == (1, 3, 0)
    assert trained_tokens_exact(trajectory, trace)
    assert rig.render.forks == 0
