"""The rendering mode's pure parts: parsers (each reads what it writes), token-in shapes, and
the gateway command's options."""

from __future__ import annotations

import argparse
import json
from typing import Any

import anyio
import pytest

from agentcore_rl.gateway.backends import backend_named
from agentcore_rl.gateway.render.parsers import (
    REASONING_PARSERS,
    TOOL_PARSERS,
    ToolCall,
    parse_completion,
    reasoning_parser_named,
    tool_parser_named,
)
from agentcore_rl.gateway.upstream import UpstreamPool
from agentcore_rl.local.policy import ScriptedPolicy, Serving, TemplateVoice
from tests.gateway.helpers import chat, served
from tests.gateway.template_rig import RENDER_MISSING, tokenizer_dir

CALL = ToolCall("calculator", {"expression": "1 + 2", "step": 1})


@pytest.mark.parametrize("name", sorted(TOOL_PARSERS))
def test_each_tool_parser_reads_what_it_writes(name: str) -> None:
    parser = tool_parser_named(name)
    assert parser is not None
    content, calls = parser.parse(parser.format([CALL]))
    assert (content, calls) == ("", [CALL])
    assert parser.parse("no calls here") == ("no calls here", [])


@pytest.mark.parametrize("name", sorted(REASONING_PARSERS))
def test_each_reasoning_parser_reads_what_it_writes(name: str) -> None:
    parser = reasoning_parser_named(name)
    assert parser is not None
    reasoning, rest = parser.parse(parser.format("I think.") + "Done.")
    assert reasoning == "I think."
    assert rest.endswith("Done.")


def test_a_malformed_call_stays_content() -> None:
    hermes = tool_parser_named("hermes")
    assert hermes is not None
    text = "<tool_call>\n{not json}\n</tool_call>"
    assert hermes.parse(text) == (text, [])


def test_parse_completion_gives_an_openai_message() -> None:
    message = parse_completion(
        '<think>\nhm\n</think>\n\n<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>',
        reasoning_parser_named("qwen3"),
        tool_parser_named("hermes"),
        "seed",
    )
    assert message["reasoning_content"] == "hm"
    assert message["content"] is None
    (call,) = message["tool_calls"]
    assert call["function"] == {"name": "f", "arguments": json.dumps({"a": 1})}
    mistral = tool_parser_named("mistral")
    assert mistral is not None
    assert len(mistral.call_id("x")) == 9
    assert mistral.call_id("x").isalnum()


def test_unknown_names_are_errors_that_list_the_choices() -> None:
    with pytest.raises(ValueError, match="hermes"):
        tool_parser_named("nope")
    with pytest.raises(ValueError, match="qwen3"):
        reasoning_parser_named("nope")
    with pytest.raises(ValueError, match="sglang"):
        backend_named("nope")


def test_token_in_request_shapes() -> None:
    from agentcore_rl.gateway.render.mode import _check

    body: dict[str, Any] = {"model": "m", "messages": [], "temperature": 0.5, "seed": 3}
    backend, pool = backend_named("vllm"), UpstreamPool("http://vllm:8000/v1")
    _check(backend, body, [9])
    target, generate, rid = backend._request(pool, [1, 2], body, 7)
    assert (str(target.url), rid) == (
        "http://vllm:8000/inference/v1/generate",
        f"generate-tokens-{generate['request_id']}",
    )
    assert generate["token_ids"] == [1, 2]
    sampling = generate["sampling_params"]
    assert (sampling["max_tokens"], sampling["logprobs"], sampling["stop_token_ids"]) == (7, 0, [9])
    backend.sources[pool.base] = "gateway"  # an upstream without the route: completions
    target, vllm, rid = backend._request(pool, [1, 2], body, 7)
    assert (str(target.url), rid) == (
        "http://vllm:8000/v1/completions",
        f"cmpl-{vllm['request_id']}-0",
    )
    assert vllm["prompt"] == [1, 2]
    assert vllm["return_token_ids"] is True
    assert (vllm["max_tokens"], vllm["logprobs"], vllm["stop_token_ids"]) == (7, 0, [9])
    sglang = backend_named("sglang")._request(pool, [1, 2], body, 7)[1]
    assert sglang["input_ids"] == [1, 2]
    assert sglang["return_logprob"] is True
    assert sglang["sampling_params"]["max_new_tokens"] == 7
    served = backend_named("sglang")._read(
        {
            "meta_info": {
                "output_token_logprobs": [[-0.5, 4, None]],
                "finish_reason": {"type": "stop"},
            }
        }
    )
    assert (served.token_ids, served.logprobs, served.finish_reason) == ([4], [-0.5], "stop")


def test_render_options_need_linear_history() -> None:
    from agentcore_rl.cli.commands import _render_mode
    from agentcore_rl.errors import ConfigurationError

    proxy = argparse.Namespace(
        history="proxy", tokenizer="/x", tool_call_parser=None, reasoning_parser=None
    )
    with pytest.raises(ConfigurationError, match="need --history linear"):
        _render_mode(proxy)
    linear = argparse.Namespace(
        history="linear", tokenizer=None, tool_call_parser=None, reasoning_parser=None
    )
    with pytest.raises(ConfigurationError, match="needs --tokenizer"):
        _render_mode(linear)
    linear.tokenizer, linear.backend = "/does/not/exist", "vllm"
    with pytest.raises(ConfigurationError, match="does not exist"):
        _render_mode(linear)


@pytest.mark.skipif(RENDER_MISSING is not None, reason=RENDER_MISSING or "")
async def test_an_upstream_without_the_token_in_route_serves_every_first_call_through_completions(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The stand-in has no /inference/v1/generate: the calls that race to learn it all fall back.
    from agentcore_rl.gateway.render.mode import RenderMode

    directory = str(tokenizer_dir("qwen2.5"))
    policy = ScriptedPolicy(TemplateVoice(directory), serving=Serving(token_ids="requested"))
    async with served(policy, render=RenderMode.load(directory)) as stack:
        llms = [stack.llm(f"s{n}") for n in range(4)]

        async def ask(llm: Any) -> None:
            await chat(llm, [{"role": "user", "content": "Hi"}], stream=False)

        async with anyio.create_task_group() as tg:
            for llm in llms:
                tg.start_soon(ask, llm)
        for llm in llms:
            await llm.close()
        assert stack.gateway.stats["linear_versions"] == {stack.gateway.upstreams[0]: "gateway"}
        traces = [await stack.gateway.finish_session(f"s{n}") for n in range(4)]
    assert all(record.ok for trace in traces for record in trace.records)
    assert sum("--enable-scale-out" in r.message for r in caplog.records) == 1  # said once
