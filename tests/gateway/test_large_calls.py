"""Large valid calls (megabytes of conversation): captured exactly."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from agentcore_rl.gateway import dump_trace, load_trace
from tests.gateway.helpers import chat, served

# About 2 MB of words: ~700,000 prompt ids, an upstream answer of ~5 MB.
TEXT = " ".join(f"w{i % 997}" for i in range(500_000))


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
async def test_a_large_call_round_trips_exactly(stream: bool) -> None:
    async with served() as stack:
        async with stack.llm("big") as llm:
            messages: list[Any] = [{"role": "user", "content": TEXT}]
            reply, _ = await chat(llm, messages, stream=stream)
            messages += [reply, {"role": "user", "content": TEXT[:1000]}]
            await chat(llm, messages, stream=stream)
        trace = await stack.gateway.finish_session("big")

    assert len(trace.records) == len(stack.policy.answers) == 2
    for record, (prompt_ids, choices) in zip(trace.records, stack.policy.answers, strict=True):
        assert record.ok, record.error
        assert record.prompt_ids.tolist() == prompt_ids
        assert [c.token_ids.tolist() for c in record.completions] == [ids for ids, _ in choices]
        assert [c.logprobs.tolist() for c in record.completions] == [lp for _, lp in choices]
    assert trace.records[1].messages == messages
    again = load_trace(dump_trace(trace))
    assert again.to_json() == trace.to_json()
    assert json.loads(again.records[0].request_body) == json.loads(trace.records[0].request_body)


async def test_a_large_completions_call_round_trips_exactly() -> None:
    async with served() as stack, httpx.AsyncClient(base_url=stack.url, timeout=60) as http:
        response = await http.post(
            "/sessions/c/v1/completions", json={"model": "m", "prompt": TEXT, "max_tokens": 8}
        )
        assert response.status_code == 200, response.text
        assert "prompt_token_ids" not in response.text
        trace = await stack.gateway.finish_session("c")
    ((prompt_ids, choices),) = stack.policy.answers
    (record,) = trace.records
    assert record.ok, record.error
    assert record.prompt_ids.tolist() == prompt_ids
    assert [c.token_ids.tolist() for c in record.completions] == [ids for ids, _ in choices]
    assert [c.logprobs.tolist() for c in record.completions] == [lp for _, lp in choices]
