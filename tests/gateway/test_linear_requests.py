"""Linear history on requests as agent frameworks send them: an answer cut off by
``max_tokens`` or ended by a stop string is closed as the template closes a turn and the next
turn extends it; the agent's text ends before the stop string; every sampling field is
forwarded or refused by name; logprobs go back to an agent that asks. The stand-in serves
token-in as vLLM does (the same cases run against a real vLLM in tests/vllm/)."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from tests.gateway.template_rig import (
    QUESTION,
    TEMPLATE_MARKS,
    exactness,
    template_stack,
    trained_tokens_exact,
    trajectory_of,
)

pytestmark = TEMPLATE_MARKS

END_OF_TURN = {"qwen3": "<|im_end|>", "llama3.1": "<|eot_id|>"}


async def _ask(llm: openai.AsyncOpenAI, messages: list[Any], **options: Any) -> dict[str, Any]:
    """One chat call, streamed or not -> the choice as a dict (message, finish, logprobs)."""
    stream = options.pop("stream", False)
    if not stream:
        reply = await llm.chat.completions.create(model="p", messages=messages, **options)
        first: dict[str, Any] = reply.choices[0].model_dump(exclude_none=True)
        return first
    content: list[str] = []
    logprobs: list[Any] = []
    finish = None
    chunks = await llm.chat.completions.create(model="p", messages=messages, stream=True, **options)
    async for chunk in chunks:
        for choice in chunk.choices:
            content.append(choice.delta.content or "")
            if choice.logprobs is not None:
                logprobs += choice.logprobs.model_dump()["content"] or []
            finish = choice.finish_reason or finish
    message = {"role": "assistant", "content": "".join(content)}
    return {"message": message, "finish_reason": finish, "logprobs": {"content": logprobs}}


def _one_sequence(trace: Any, end_of_turn: int) -> None:
    """Turn 2's prompt is turn 1's prompt + completion + the end-of-turn token; one segment."""
    first, second = trace.records
    served = first.prompt_ids.tolist() + first.completions[0].token_ids.tolist()
    assert second.prompt_ids.tolist()[: len(served) + 1] == [*served, end_of_turn]
    trajectory = trajectory_of(trace)
    assert (len(trajectory.segments), trajectory.splits) == (1, 0)
    assert trained_tokens_exact(trajectory, trace)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("name", ["qwen3", "llama3.1"])
async def test_linear_a_length_cut_off_turn_is_closed_and_extended(name: str, stream: bool) -> None:
    async with template_stack(name, history="linear") as rig, rig.llm("m1") as llm:
        messages: list[Any] = [{"role": "user", "content": QUESTION}]
        first = await _ask(llm, messages, max_tokens=5, stream=stream)
        assert first["finish_reason"] == "length"
        echo = {"role": "assistant", "content": first["message"].get("content") or ""}
        await _ask(llm, [*messages, echo, {"role": "user", "content": "Go on."}], stream=stream)
        trace = await rig.gateway.finish_session("m1")
    assert len(trace.records[0].completions[0].token_ids) == 5
    _one_sequence(trace, rig.render.template.tokenizer.convert_tokens_to_ids(END_OF_TURN[name]))
    assert rig.render.forks == 0
    assert exactness(trace, rig.policy) == (2, 2)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
async def test_linear_a_stop_string_ends_the_text_before_it(stream: bool) -> None:
    async with template_stack("llama3.1", history="linear", tool_rounds=0) as rig:
        async with rig.llm("m2") as llm:
            messages: list[Any] = [{"role": "user", "content": QUESTION}]
            first = await _ask(llm, messages, stop=["answer"], stream=stream)
            # as vLLM's and OpenAI's chat: the text ends before the stop string
            assert first["message"]["content"] == "The "
            assert first["finish_reason"] == "stop"
            echo = {"role": "assistant", "content": first["message"]["content"]}
            again = [*messages, echo, {"role": "user", "content": "Go on."}]
            await _ask(llm, again, stream=stream)
        trace = await rig.gateway.finish_session("m2")
    completion = trace.records[0].completions[0]
    # the last served token holds "answer": the ids decode past the agent's text, marked
    assert rig.render.template.decode(completion.token_ids.tolist()) == "The answer"
    assert completion.stop_string == "answer"
    assert trace.records[1].completions[0].stop_string is None
    _one_sequence(trace, rig.render.template.tokenizer.convert_tokens_to_ids("<|eot_id|>"))


async def test_proxy_marks_ids_that_decode_past_the_agents_text() -> None:
    async with template_stack("llama3.1", history="proxy", tool_rounds=0) as rig:
        async with rig.llm("m3") as llm:
            first = await _ask(llm, [{"role": "user", "content": QUESTION}], stop=["answer"])
        trace = await rig.gateway.finish_session("m3")
    assert first["message"]["content"] == "The "
    (record,) = trace.records
    assert record.completions[0].stop_string == "answer"
    assert exactness(trace, rig.policy) == (1, 1)


async def test_linear_sampling_fields_are_forwarded_or_refused_by_name() -> None:
    async with template_stack("qwen3", history="linear", tool_rounds=0) as rig:
        end = rig.render.template.tokenizer.convert_tokens_to_ids("<|im_end|>")
        async with rig.llm("m4") as llm:
            messages: list[Any] = [{"role": "user", "content": QUESTION}]
            first = await _ask(
                llm,
                messages,
                max_tokens=40,
                logit_bias={str(end): -100},
                extra_body={"min_tokens": 2, "repetition_penalty": 1.1},
                seed=7,
            )
            forwarded = rig.policy.last_request
            for field, value in [("response_format", {"type": "json_object"}), ("foo", 1)]:
                with pytest.raises(openai.BadRequestError, match=repr(field)):
                    await _ask(llm, messages, extra_body={field: value})
        trace = await rig.gateway.finish_session("m4")
    assert forwarded["logit_bias"] == {str(end): -100}
    assert (forwarded["min_tokens"], forwarded["repetition_penalty"]) == (2, 1.1)
    assert forwarded["seed"] == 7
    # the bias took: the stand-in never chose its end-of-turn token
    assert first["finish_reason"] == "length"
    assert end not in trace.records[0].completions[0].token_ids
    assert [r.status for r in trace.records] == [200, 400, 400]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
async def test_linear_logprobs_go_back_to_an_agent_that_asks(stream: bool) -> None:
    async with template_stack("qwen2.5", history="linear", tool_rounds=0) as rig:
        async with rig.llm("m5") as llm:
            messages: list[Any] = [{"role": "user", "content": QUESTION}]
            asked = await _ask(llm, messages, logprobs=True, top_logprobs=2, stream=stream)
            plain = await _ask(llm, messages, stream=stream)
        trace = await rig.gateway.finish_session("m5")
    completion = trace.records[0].completions[0]
    entries = asked["logprobs"]["content"]
    # one entry per token of the text (the end-of-turn token is not text), as served
    assert [e["logprob"] for e in entries] == completion.logprobs.tolist()[:-1]
    assert "".join(e["token"] for e in entries)
    assert all(len(e["top_logprobs"]) == 2 for e in entries)
    assert all(e["top_logprobs"][0]["logprob"] >= e["top_logprobs"][1]["logprob"] for e in entries)
    assert not (plain.get("logprobs") or {}).get("content")


@pytest.mark.parametrize(("least", "cut"), [(8, False), (1, True)], ids=["none", "later"])
async def test_linear_no_stop_string_within_min_tokens(least: int, cut: bool) -> None:
    """The server looks for stop strings ending past the first ``min_tokens`` tokens only; the
    agent's text in linear mode is the server's own (proxy mode's): not cut at an "e" inside
    them, cut at a later one."""
    texts = {}
    for history in ("proxy", "linear"):
        async with template_stack("llama3.1", history=history, tool_rounds=0) as rig:
            async with rig.llm("m6") as llm:
                messages: list[Any] = [{"role": "user", "content": QUESTION}]
                first = await _ask(llm, messages, stop=["e"], extra_body={"min_tokens": least})
            trace = await rig.gateway.finish_session("m6")
        texts[history] = first["message"]["content"]
        completion = trace.records[0].completions[0]
        assert (completion.finish_reason, completion.stop_string) == (
            ("stop", "e") if cut else ("stop", None)
        )
    assert texts["linear"] == texts["proxy"]
    if cut:
        assert texts["linear"] == "The answ"
    else:  # the answer, repeated up to eight tokens: with every "e" in it
        assert texts["linear"].startswith("The answer is ")
        assert texts["linear"].endswith(".The")
