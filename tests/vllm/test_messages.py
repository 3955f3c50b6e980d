"""The Anthropic Messages dialect against a real vLLM, proxy mode and linear history, streamed
and not, with the real ``anthropic`` SDK: the recorded prompt ids are what vLLM renders for
the translated conversation (an earlier tool round sent back as ``tool_use`` and
``tool_result`` blocks included), the completion ids what it served, the SDK's text their
decoding; the same first turn in chat completions feeds vLLM the same prompt ids."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
from anthropic import AsyncAnthropic
from anthropic.types import Message, TextBlock

from agentcore_rl import build_trajectory
from tests.vllm.conftest import MODEL, VLLMServer
from tests.vllm.rig import Rig, assert_logprobs_are_vllms, gateway_on, vllm_prompt_ids

pytestmark = pytest.mark.timeout(300)

SYSTEM = "You are terse."
TOOL: Any = {
    "name": "calculator",
    "description": "Evaluate an arithmetic expression.",
    "input_schema": {"type": "object", "properties": {"expression": {"type": "string"}}},
}
# An earlier tool round, as a Claude agent sends it back.
FIRST: Any = [
    {"role": "user", "content": "What is 2 + 3?"},
    {
        "role": "assistant",
        "content": [
            {"type": "text", "text": "Let me add."},
            {
                "type": "tool_use",
                "id": "call_1",
                "name": "calculator",
                "input": {"expression": "2 + 3"},
            },
        ],
    },
    {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "call_1", "content": "5"},
            {"type": "text", "text": "Go on."},
        ],
    },
]
CHAT_TOOL: Any = {
    "type": "function",
    "function": {
        "name": TOOL["name"],
        "description": TOOL["description"],
        "parameters": TOOL["input_schema"],
    },
}
# The same conversation in chat completions.
CHAT: Any = [
    {"role": "system", "content": SYSTEM},
    {"role": "user", "content": "What is 2 + 3?"},
    {
        "role": "assistant",
        "content": "Let me add.",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {
                    "name": "calculator",
                    "arguments": json.dumps({"expression": "2 + 3"}),
                },
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "5"},
    {"role": "user", "content": "Go on."},
]


def _claude(rig: Rig, sid: str) -> AsyncAnthropic:
    return AsyncAnthropic(base_url=f"{rig.url}/sessions/{sid}", api_key="x", max_retries=0)


async def _ask(llm: AsyncAnthropic, messages: list[Any], *, stream: bool) -> Message:
    options: Any = {"model": MODEL, "max_tokens": 24, "system": SYSTEM, "tools": [TOOL]}
    if not stream:
        reply: Message = await llm.messages.create(messages=messages, **options)
        return reply
    async with llm.messages.stream(messages=messages, **options) as events:
        return await events.get_final_message()


@pytest.mark.parametrize("stream", [False, True], ids=["create", "stream"])
@pytest.mark.parametrize("linear", [False, True], ids=["proxy", "linear"])
async def test_messages_records_what_vllm_was_fed_and_served(
    vllm_server: VLLMServer, stream: bool, linear: bool
) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(vllm_server.model_dir)
    messages: list[Any] = list(FIRST)
    replies = []
    async with gateway_on(vllm_server, linear=linear) as rig:
        rig.gateway.open_session("m", sampling={"seed": 0})  # the SDK has no seed: the session's
        async with _claude(rig, "m") as llm:
            for turn in range(2):
                reply = await _ask(llm, messages, stream=stream)
                replies.append(reply)
                messages += [
                    {"role": "assistant", "content": reply.content},
                    {"role": "user", "content": f"Go on with part {turn + 2}."},
                ]
        trace = await rig.gateway.finish_session("m")
    records = trace.records
    assert all(r.ok and r.endpoint == "messages" for r in records), [r.error for r in records]
    assert records[0].messages == CHAT
    if linear:  # turn 1 rendered as vLLM renders it; turn 2 extends turn 1's served ids
        assert records[0].prompt_ids.tolist() == await vllm_prompt_ids(
            vllm_server, CHAT, records[0].tools
        )
        for before, after in itertools.pairwise(records):
            kept = before.prompt_ids.tolist() + before.completions[0].token_ids.tolist()
            assert after.prompt_ids.tolist()[: len(kept)] == kept
        assert len(build_trajectory(trace).segments) == 1
    else:
        for record in records:
            fed = await vllm_prompt_ids(vllm_server, record.messages, record.tools)
            assert record.prompt_ids.tolist() == fed
    for record, reply in zip(records, replies, strict=True):
        (completion,) = record.completions
        ids = completion.token_ids.tolist()
        assert len(ids) == len(completion.logprobs) > 0
        await assert_logprobs_are_vllms(vllm_server, record)
        assert (reply.usage.input_tokens, reply.usage.output_tokens) == (
            len(record.prompt_ids),
            len(ids),
        )
        if reply.stop_reason == "tool_use":  # the random model wrote a call: parsed, not text
            continue
        text = "".join(b.text for b in reply.content if isinstance(b, TextBlock))
        shown = ids[:-1] if reply.stop_reason == "end_turn" else ids  # without <|im_end|>
        # vLLM's chat endpoint skips special tokens; linear history shows what the model wrote
        assert text == tokenizer.decode(shown, skip_special_tokens=not linear)


@pytest.mark.parametrize("linear", [False, True], ids=["proxy", "linear"])
async def test_the_first_turn_in_chat_and_messages_feeds_vllm_the_same_prompt(
    vllm_server: VLLMServer, linear: bool
) -> None:
    async with gateway_on(vllm_server, linear=linear) as rig:
        async with rig.llm("chat") as llm:
            await llm.chat.completions.create(
                model=MODEL,
                messages=CHAT,
                max_tokens=4,
                tools=[CHAT_TOOL],
            )
        async with _claude(rig, "messages") as claude:
            await _ask(claude, FIRST, stream=False)
        chat = (await rig.gateway.finish_session("chat")).records[0]
        messages = (await rig.gateway.finish_session("messages")).records[0]
    assert messages.prompt_ids.tolist() == chat.prompt_ids.tolist()
    assert messages.prompt_ids.tolist() == await vllm_prompt_ids(vllm_server, CHAT, chat.tools)
