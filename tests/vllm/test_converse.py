"""Bedrock Converse against a real vLLM: the real boto3 ``bedrock-runtime`` client's calls,
whole and streamed (botocore's event-stream parser), in proxy mode and in linear history.
Each recorded prompt is what vLLM renders for the translated conversation, the text boto3
got decodes from the recorded completion ids, and turn 1 feeds vLLM what chat feeds it."""

from __future__ import annotations

import itertools
from typing import Any

import anyio
import httpx
import pytest

from agentcore_rl import build_trajectory
from tests.gateway.converse_agent import bedrock, close_clients, collect
from tests.vllm.conftest import MODEL, VLLMServer
from tests.vllm.rig import ask, assert_logprobs_are_vllms, gateway_on, vllm_prompt_ids

pytestmark = pytest.mark.timeout(300)
SYSTEM = "You are a poet."
QUESTION = "Tell me about the sea."


def _call(client: Any, messages: list[Any], stream: bool) -> tuple[str, str]:
    request: dict[str, Any] = {
        "modelId": MODEL,
        "system": [{"text": SYSTEM}],
        "messages": messages,
        "inferenceConfig": {"maxTokens": 24},
    }
    answer = collect(client.converse_stream(**request)) if stream else client.converse(**request)
    text = "".join(b.get("text", "") for b in answer["output"]["message"]["content"])
    return text, answer["stopReason"]


async def _detokenize(server: VLLMServer, ids: list[int]) -> str:
    async with httpx.AsyncClient(base_url=server.root, timeout=60) as http:
        answer = await http.post("/detokenize", json={"model": MODEL, "tokens": ids})
        answer.raise_for_status()
        return str(answer.json()["prompt"])


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("linear", [False, True], ids=["proxy", "linear"])
async def test_converse_records_what_vllm_was_fed_and_served(
    vllm_server: VLLMServer, linear: bool, stream: bool
) -> None:
    messages: list[Any] = [{"role": "user", "content": [{"text": QUESTION}]}]
    texts = []
    try:
        async with gateway_on(vllm_server, linear=linear) as rig:
            client = bedrock(f"{rig.url}/sessions/conv-1")
            for turn in range(3):
                text, reason = await anyio.to_thread.run_sync(_call, client, messages, stream)
                assert reason in ("end_turn", "max_tokens")
                texts.append(text)
                messages = [
                    *messages,
                    {"role": "assistant", "content": [{"text": text}]},
                    {"role": "user", "content": [{"text": f"Go on with part {turn + 2}."}]},
                ]
            trace = await rig.gateway.finish_session("conv-1")
    finally:
        close_clients()
    records = trace.records
    assert [(r.endpoint, r.stream, r.ok) for r in records] == [("converse", stream, True)] * 3
    for record, text in zip(records, texts, strict=True):
        (completion,) = record.completions
        assert len(completion.token_ids) == len(completion.logprobs) > 0
        await assert_logprobs_are_vllms(vllm_server, record)
        decoded = await _detokenize(vllm_server, completion.token_ids.tolist())
        assert decoded.removesuffix("<|im_end|>") == text
    assert records[0].prompt_ids.tolist() == await vllm_prompt_ids(
        vllm_server, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]
    )
    if linear:
        for before, after in itertools.pairwise(records):
            kept = before.prompt_ids.tolist() + before.completions[0].token_ids.tolist()
            assert after.prompt_ids.tolist()[: len(kept)] == kept
        trajectory = build_trajectory(trace)
        assert (len(trajectory.segments), trajectory.splits) == (1, 0)
    else:
        for record in records:
            assert record.prompt_ids.tolist() == await vllm_prompt_ids(vllm_server, record.messages)


async def test_turn_one_feeds_vllm_what_chat_feeds_it(vllm_server: VLLMServer) -> None:
    try:
        async with gateway_on(vllm_server) as rig:
            client = bedrock(f"{rig.url}/sessions/conv-2")
            question = [{"role": "user", "content": [{"text": QUESTION}]}]
            await anyio.to_thread.run_sync(_call, client, question, False)
            llm = rig.llm("chat-2")
            chat = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]
            await ask(llm, chat, stream=False, max_tokens=24)
            await llm.close()
            by_converse = await rig.gateway.finish_session("conv-2")
            by_chat = await rig.gateway.finish_session("chat-2")
    finally:
        close_clients()
    assert by_converse.records[0].prompt_ids.tolist() == by_chat.records[0].prompt_ids.tolist()
