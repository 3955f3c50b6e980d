"""The Responses API through the gateway against a real vLLM: the real OpenAI SDK's
``responses.create`` (streamed and not), proxy and linear mode. What is recorded is what vLLM
was fed (its own chat template of the translated conversation) and what it served; the text
the SDK returned decodes from the recorded ids; turn 1 feeds vLLM what chat completions feed."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from openai import AsyncOpenAI
from transformers import AutoTokenizer

from agentcore_rl import build_trajectory
from tests.vllm.conftest import MODEL, VLLMServer
from tests.vllm.rig import gateway_on, vllm_prompt_ids

pytestmark = pytest.mark.timeout(300)

TOOL: Any = {
    "type": "function",
    "name": "calculator",
    "description": "Evaluate an arithmetic expression.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
}


async def respond(llm: AsyncOpenAI, items: list[Any], *, stream: bool, **options: Any) -> Any:
    """One call -> the SDK's ``Response`` (through its stream accumulator when streaming)."""
    options.update(model=MODEL, input=items, instructions="Be brief.", tools=[TOOL])
    if not stream:
        return await llm.responses.create(**options)
    async with llm.responses.stream(**options) as events:
        async for _ in events:
            pass
        return await events.get_final_response()


def _logprobs(response: Any) -> list[float]:
    return [
        entry.logprob
        for item in response.output
        if item.type == "message"
        for part in item.content
        for entry in part.logprobs or ()
    ]


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("linear", [False, True], ids=["proxy", "linear"])
async def test_a_responses_conversation_records_what_vllm_was_fed_and_served(
    vllm_server: VLLMServer, stream: bool, linear: bool
) -> None:
    tokenizer = AutoTokenizer.from_pretrained(vllm_server.model_dir)
    items: list[Any] = [{"role": "user", "content": "Tell me about the sea."}]
    responses = []
    async with gateway_on(vllm_server, linear=linear) as rig:
        llm = rig.llm(f"responses-{linear}-{stream}")
        for turn in range(3):
            response = await respond(
                llm,
                items,
                stream=stream,
                max_output_tokens=24 if not linear else 400,
                include=["message.output_text.logprobs"],
                extra_body={"seed": turn},
            )
            responses.append(response)
            items += [item.model_dump(exclude_none=True) for item in response.output]
            items.append({"role": "user", "content": f"Go on with part {turn + 2}."})
        await llm.close()
        trace = await rig.gateway.finish_session(f"responses-{linear}-{stream}")
    records = trace.records
    assert all(r.ok and r.endpoint == "responses" for r in records), [r.error for r in records]
    first = await vllm_prompt_ids(vllm_server, records[0].messages, records[0].tools)
    assert records[0].prompt_ids.tolist() == first  # vLLM's template of the translation
    for record, response in zip(records, responses, strict=True):
        if not linear:  # proxy: every prompt is vLLM's own rendering
            assert record.prompt_ids.tolist() == await vllm_prompt_ids(
                vllm_server, record.messages, record.tools
            )
        (completion,) = record.completions
        ids = completion.token_ids.tolist()
        assert tokenizer.decode(ids, skip_special_tokens=True) == response.output_text
        assert completion.logprobs.tolist()[: len(_logprobs(response))] == _logprobs(response)
        assert response.usage.output_tokens == len(ids)
        assert response.usage.input_tokens == len(record.prompt_ids)
    if linear:
        for before, after in itertools.pairwise(records):
            kept = before.prompt_ids.tolist() + before.completions[0].token_ids.tolist()
            assert after.prompt_ids.tolist()[: len(kept)] == kept
        assert len(build_trajectory(trace).segments) == 1
        assert rig.gateway.stats["linear_forks"] == 0


async def test_turn_one_feeds_vllm_what_chat_completions_feed(vllm_server: VLLMServer) -> None:
    chat_tool: Any = {
        "type": "function",
        "function": {k: v for k, v in TOOL.items() if k != "type"},
    }
    async with gateway_on(vllm_server) as rig:
        llm = rig.llm("chat-1")
        await llm.chat.completions.create(
            model=MODEL,
            messages=[
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Tell me about the sea."},
            ],
            tools=[chat_tool],
            max_tokens=4,
        )
        llm = rig.llm("responses-1")
        sea = [{"role": "user", "content": "Tell me about the sea."}]
        await respond(llm, sea, stream=False, max_output_tokens=4)
        await llm.close()
        chat = await rig.gateway.finish_session("chat-1")
        responses = await rig.gateway.finish_session("responses-1")
    assert chat.records[0].prompt_ids == responses.records[0].prompt_ids
