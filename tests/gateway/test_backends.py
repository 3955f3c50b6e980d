"""Proxy mode's capture rules on answers shaped like each server's (vLLM, SGLang)."""

from __future__ import annotations

from typing import Any

from agentcore_rl.gateway.backends import backend_named
from agentcore_rl.gateway.dialects.codec import chunks_of
from agentcore_rl.gateway.proxy import Capture, prepare, take
from agentcore_rl.trace import CallRecord


def test_sglang_request_flags_and_answer_capture() -> None:
    backend = backend_named("sglang")
    body, keep = prepare(backend, {"messages": [], "stream": True}, "chat.completions")
    assert (keep, body["return_prompt_token_ids"], body["return_meta_info"]) == (False, True, True)
    assert body["logprobs"] is True
    assert "stream" not in body
    answer: dict[str, Any] = {
        "id": "x",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "hi"},
                "logprobs": {"content": [{"token": "hi", "logprob": -0.5}]},
                "finish_reason": "stop",
                "prompt_token_ids": [1, 2, 3],
                "meta_info": {"output_token_logprobs": [[-0.5, 42, None], [-0.25, 43, None]]},
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2},
    }
    capture = Capture()
    take(backend, answer, capture, keep, "chat.completions")
    assert capture.missing(backend) is None
    record = CallRecord("s", 0, "chat.completions")
    capture.fill(record)
    assert record.prompt_ids.tolist() == [1, 2, 3]
    (completion,) = record.completions
    assert completion.token_ids.tolist() == [42, 43]
    assert completion.logprobs.tolist() == [-0.5, -0.25]
    choice = answer["choices"][0]
    assert "meta_info" not in choice
    assert "prompt_token_ids" not in choice
    assert choice["logprobs"] is None
    chunks = chunks_of(answer)
    assert chunks[0]["choices"][0]["delta"]["content"] == "hi"
    assert chunks[-1]["usage"] == {"prompt_tokens": 3, "completion_tokens": 2}


def test_sglang_without_meta_info_names_what_is_missing() -> None:
    backend = backend_named("sglang")
    capture = Capture()
    answer = {"choices": [{"index": 0, "message": {"content": "hi"}, "finish_reason": "stop"}]}
    take(backend, answer, capture, False, "chat.completions")
    message = capture.missing(backend)
    assert message is not None
    assert "no prompt token ids and no completion token ids" in message
    assert "return_meta_info" in message


def test_vllm_keeps_logprobs_the_agent_asked_for() -> None:
    backend = backend_named("vllm")
    body, keep = prepare(backend, {"prompt": "x", "logprobs": 2}, "completions")
    assert keep
    assert body["logprobs"] == 2
    assert body["return_token_ids"] is True
    body, keep = prepare(backend, {"prompt": "x"}, "completions")
    assert not keep
    assert body["logprobs"] == 0
