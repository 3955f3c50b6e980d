"""The Anthropic Messages dialect through the gateway, driven by the real ``anthropic`` SDK
(``messages.create`` and ``messages.stream``) in a Claude-style tool loop: proxy mode on the
stand-in policy, linear history on real chat templates, errors as the SDK's typed errors."""

from __future__ import annotations

import itertools
import json
from typing import Any

import anthropic
import anyio
import httpx
import pytest
from anthropic import AsyncAnthropic
from anthropic.types import Message, TextBlock, ThinkingBlock, ToolUseBlock

from agentcore_rl.gateway import GatewayOptions, RolloutGateway
from agentcore_rl.local.background import BackgroundServer
from agentcore_rl.trajectory import build_trajectory
from tests.gateway.helpers import ADMIN, CALCULATOR, PROBLEM, eval_plain, served
from tests.gateway.template_rig import (
    QUESTION,
    TEMPLATE_MARKS,
    exactness,
    template_stack,
    trained_tokens_exact,
    trajectory_of,
)
from tests.gateway.test_bad_input import _broken_upstream

TOOL: Any = {
    "name": "calculator",
    "description": CALCULATOR["function"]["description"],
    "input_schema": CALCULATOR["function"]["parameters"],
}


def claude(url: str, sid: str | None = None) -> AsyncAnthropic:
    """The agent's client: the session's root as ``base_url``, or the bearer form (the session
    id as the API key)."""
    if sid is None:
        return AsyncAnthropic(base_url=url, api_key="unused", max_retries=0)
    return AsyncAnthropic(base_url=url, api_key=sid, max_retries=0)


async def ask(llm: AsyncAnthropic, messages: list[Any], *, stream: bool, **options: Any) -> Message:
    """One model call as a Claude agent makes it: ``create``, or ``stream`` to its end."""
    options = {"model": "policy", "max_tokens": 512, "messages": messages, **options}
    if not stream:
        reply: Message = await llm.messages.create(**options)
        return reply
    async with llm.messages.stream(**options) as events:
        async for _ in events:
            pass
        return await events.get_final_message()


async def tool_loop(
    llm: AsyncAnthropic, question: str, *, stream: bool, **options: Any
) -> list[Message]:
    """The ordinary Claude tool loop: the whole answer (thinking too) goes back as the
    assistant turn, each ``tool_use`` is answered with a ``tool_result``. -> the answers."""
    messages: list[Any] = [{"role": "user", "content": question}]
    answers = []
    for _ in range(6):  # bounded
        reply = await ask(llm, messages, stream=stream, tools=[TOOL], **options)
        answers.append(reply)
        messages.append({"role": "assistant", "content": reply.content})
        if reply.stop_reason != "tool_use":
            return answers
        results = []
        for block in reply.content:
            if isinstance(block, ToolUseBlock):
                value = eval_plain(str(block.input["expression"]))
                results.append(
                    {"type": "tool_result", "tool_use_id": block.id, "content": str(value)}
                )
        messages.append({"role": "user", "content": results})
    raise AssertionError("the agent did not finish in 6 turns")


@pytest.mark.parametrize("stream", [False, True], ids=["create", "stream"])
@pytest.mark.parametrize("bearer", [False, True], ids=["path", "bearer"])
async def test_a_claude_tool_loop_in_proxy_mode_is_exact_and_one_segment(
    stream: bool, bearer: bool
) -> None:
    async with served() as stack:
        stack.gateway.open_session("m1", exp_id="e1", input_id="q1")
        url = stack.url if bearer else f"{stack.url}/sessions/m1"
        async with claude(url, "m1" if bearer else None) as llm:
            answers = await tool_loop(llm, PROBLEM, stream=stream, system="Use the calculator.")
        trace = await stack.gateway.finish_session("m1")

    first, last = answers
    assert first.stop_reason == "tool_use"
    (call,) = first.content
    assert isinstance(call, ToolUseBlock)
    assert (call.name, call.input) == ("calculator", {"expression": "12 + 5 - 3"})
    assert last.stop_reason == "end_turn"
    assert [(b.type, getattr(b, "text", None)) for b in last.content] == [
        ("text", "The answer is 14.")
    ]

    records = trace.records
    assert [(r.endpoint, r.stream, r.status) for r in records] == [("messages", stream, 200)] * 2
    for record, answer, (prompt_ids, ((ids, logprobs),)) in zip(
        records, answers, stack.policy.answers, strict=True
    ):
        assert record.prompt_ids.tolist() == prompt_ids
        assert record.completions[0].token_ids.tolist() == ids
        assert record.completions[0].logprobs.tolist() == logprobs
        assert (answer.usage.input_tokens, answer.usage.output_tokens) == (
            len(prompt_ids),
            len(ids),
        )
    # the translated conversation: system first, the tool result as a chat tool message
    assert records[1].messages == [
        {"role": "system", "content": "Use the calculator."},
        {"role": "user", "content": PROBLEM},
        {"role": "assistant", "tool_calls": [_chat_call(call)]},
        {"role": "tool", "tool_call_id": call.id, "content": "14"},
    ]
    assert records[1].tools == [CALCULATOR]
    assert records[0].request["max_tokens"] == 512
    trajectory = build_trajectory(trace, reward=1.0)
    assert (len(trajectory.segments), trajectory.merges, trajectory.splits) == (1, 1, 0)


def _chat_call(block: ToolUseBlock) -> dict[str, Any]:
    arguments = '{"expression": "12 + 5 - 3"}'
    return {
        "id": block.id,
        "type": "function",
        "function": {"name": block.name, "arguments": arguments},
    }


@pytest.mark.parametrize("stream", [False, True], ids=["create", "stream"])
@pytest.mark.parametrize("name", ["qwen3", "llama3.1"])
@TEMPLATE_MARKS[0]
@TEMPLATE_MARKS[1]
async def test_linear_history_serves_the_claude_loop_as_one_exact_sequence(
    name: str, stream: bool
) -> None:
    async with template_stack(name, history="linear", tool_rounds=3) as rig:
        async with claude(f"{rig.url}/sessions/l1") as llm:
            answers = await tool_loop(llm, QUESTION, stream=stream)
        trace = await rig.gateway.finish_session("l1")

    assert [a.stop_reason for a in answers] == ["tool_use"] * 3 + ["end_turn"]
    for step, answer in enumerate(answers[:3], start=1):
        calls = [b for b in answer.content if isinstance(b, ToolUseBlock)]
        assert [(c.name, c.input) for c in calls] == [
            ("calculator", {"expression": f"{10 * step} + {step}", "step": step})
        ]
    assert isinstance(answers[-1].content[-1], TextBlock)
    assert answers[-1].content[-1].text == "The answer is 33."
    thoughts = [b.thinking for a in answers for b in a.content if isinstance(b, ThinkingBlock)]
    if name == "qwen3":  # reasoning parsed into thinking blocks, sent back by the agent
        assert thoughts[0] == "Step 1: I ask the calculator."
        assert thoughts[-1] == "The tool has answered."
    else:
        assert thoughts == []

    records = trace.records
    assert all(r.endpoint == "messages" and r.stream == stream for r in records)
    for before, after in itertools.pairwise(records):
        served_ids = before.prompt_ids.tolist() + before.completions[0].token_ids.tolist()
        assert after.prompt_ids.tolist()[: len(served_ids)] == served_ids
    for record, answer in zip(records, answers, strict=True):
        usage = (len(record.prompt_ids), len(record.completions[0].token_ids))
        assert (answer.usage.input_tokens, answer.usage.output_tokens) == usage
    assert exactness(trace, rig.policy) == (4, 4)
    trajectory = trajectory_of(trace)
    assert (len(trajectory.segments), trajectory.merges, trajectory.splits) == (1, 3, 0)
    assert trained_tokens_exact(trajectory, trace)
    assert rig.render.forks == 0


@pytest.mark.parametrize("history", ["proxy", "linear"])
@TEMPLATE_MARKS[0]
@TEMPLATE_MARKS[1]
async def test_the_same_first_turn_in_chat_and_messages_feeds_the_same_prompt(
    history: str,
) -> None:
    system, question = "Use the calculator.", QUESTION
    async with template_stack("qwen3", history=history) as rig:
        async with rig.llm("c1") as llm:
            await llm.chat.completions.create(
                model="policy",
                max_tokens=512,
                messages=[
                    {"role": "system", "content": system},
                    {"role": "user", "content": question},
                ],
                tools=[CALCULATOR],
            )
        async with claude(f"{rig.url}/sessions/a1") as llm2:
            messages: list[Any] = [
                {"role": "user", "content": [{"type": "text", "text": question}]}
            ]
            await ask(
                llm2,
                messages,
                stream=False,
                system=[{"type": "text", "text": system}],
                tools=[TOOL],
            )
        chat_trace = await rig.gateway.finish_session("c1")
        messages_trace = await rig.gateway.finish_session("a1")
    (chat_record,) = chat_trace.records
    (messages_record,) = messages_trace.records
    assert messages_record.prompt_ids.tolist() == chat_record.prompt_ids.tolist()
    assert (
        messages_record.completions[0].token_ids.tolist()
        == chat_record.completions[0].token_ids.tolist()
    )


def _text(answer: Message) -> str:
    return "".join(b.text for b in answer.content if isinstance(b, TextBlock))


@pytest.mark.parametrize("stream", [False, True], ids=["create", "stream"])
@pytest.mark.parametrize("history", ["proxy", "linear"])
@TEMPLATE_MARKS[0]
@TEMPLATE_MARKS[1]
async def test_stop_sequences_and_max_tokens_are_anthropic_stop_reasons(
    history: str, stream: bool
) -> None:
    question: Any = [{"role": "user", "content": "What is 6 * 7?"}]
    async with template_stack("llama3.1", history=history, tool_rounds=0) as rig:
        async with claude(f"{rig.url}/sessions/s1") as llm:
            whole = await ask(llm, question, stream=stream)
            cut = await ask(llm, question, stream=stream, stop_sequences=["zzz", "answer"])
            short = await ask(llm, question, stream=stream, max_tokens=2)
        trace = await rig.gateway.finish_session("s1")
    assert (whole.stop_reason, whole.stop_sequence) == ("end_turn", None)
    assert "answer" in _text(whole)
    assert (cut.stop_reason, cut.stop_sequence) == ("stop_sequence", "answer")
    assert "answer" not in _text(cut)
    assert (short.stop_reason, short.usage.output_tokens) == ("max_tokens", 2)
    assert trace.records[1].request["stop"] == ["zzz", "answer"]
    assert [r.completions[0].finish_reason for r in trace.records] == ["stop", "stop", "length"]


async def test_bad_requests_are_anthropic_errors_naming_the_field() -> None:
    async with served(options=GatewayOptions(require_open=True)) as stack:
        stack.gateway.open_session("e1")
        async with claude(f"{stack.url}/sessions/e1") as llm:
            image = {
                "type": "image",
                "source": {"type": "base64", "media_type": "image/png", "data": "iVBO"},
            }
            turns: Any = [
                {"role": "user", "content": [{"type": "text", "text": "What is it?"}, image]}
            ]
            with pytest.raises(
                anthropic.BadRequestError, match=r"messages\.0\.content\.1\.type: 'image'"
            ):
                await ask(llm, turns, stream=False)
            document = {
                "type": "document",
                "source": {"type": "text", "media_type": "text/plain", "data": "x"},
            }
            result = {"type": "tool_result", "tool_use_id": "t1", "content": [document]}
            with pytest.raises(
                anthropic.BadRequestError, match=r"messages\.0\.content\.0\.content\.0\.type"
            ):
                await ask(llm, [{"role": "user", "content": [result]}], stream=True)
            turns = [{"role": "user", "content": "hi"}]
            with pytest.raises(anthropic.BadRequestError, match="container: Extra inputs"):
                await ask(llm, turns, stream=False, extra_body={"container": "c"})
            with pytest.raises(anthropic.BadRequestError, match=r"tools\.0\.type: server tool"):
                await ask(
                    llm,
                    turns,
                    stream=False,
                    tools=[{"type": "web_search_20250305", "name": "web_search"}],
                )
            with pytest.raises(anthropic.BadRequestError, match=r"tool_choice\.type"):
                await ask(llm, turns, stream=False, tool_choice={"type": "some"})
            with pytest.raises(anthropic.BadRequestError, match="max_tokens: must be an integer"):
                await ask(llm, turns, stream=False, max_tokens=0)
            # ignored: who calls and its thinking budget
            ok = await ask(
                llm, turns, stream=False, metadata={"user_id": "u"}, thinking={"type": "disabled"}
            )
            assert ok.stop_reason == "end_turn"
        async with claude(f"{stack.url}/sessions/unknown") as llm:
            with pytest.raises(anthropic.NotFoundError, match="unknown session"):
                await ask(llm, turns, stream=False)
        async with httpx.AsyncClient(base_url=stack.url) as http:
            body = {"model": "m", "messages": turns}
            response = await http.post("/v1/messages", json=body, headers={"x-api-key": "e1"})
            assert response.status_code == 400
            assert response.json() == {
                "type": "error",
                "error": {"type": "invalid_request_error", "message": "max_tokens: Field required"},
            }
            response = await http.post("/v1/messages", json={**body, "max_tokens": 8})
            assert response.status_code == 401
            assert response.json()["error"]["type"] == "authentication_error"
            ok_response = await http.post(
                "/v1/messages", json={**body, "max_tokens": 8}, headers={"x-api-key": "e1"}
            )
            assert ok_response.json()["type"] == "message"
        await stack.gateway.pause("reject")
        async with claude(f"{stack.url}/sessions/e1") as llm:
            with pytest.raises(anthropic.RateLimitError, match="paused"):
                await ask(llm, turns, stream=True)
        await stack.gateway.resume()
        trace = await stack.gateway.finish_session("e1")
    assert [r.status for r in trace.records] == [200, 200]  # refusals before a record are none


@TEMPLATE_MARKS[0]
@TEMPLATE_MARKS[1]
async def test_what_linear_history_cannot_serve_is_a_bad_request() -> None:
    async with template_stack("qwen2.5", history="linear") as rig:
        async with claude(f"{rig.url}/sessions/x1") as llm:
            turns: Any = [{"role": "user", "content": "hi"}]
            with pytest.raises(anthropic.BadRequestError, match="tool_choice 'auto'"):
                await ask(llm, turns, stream=False, tools=[TOOL], tool_choice={"type": "any"})
        trace = await rig.gateway.finish_session("x1")
    assert [r.status for r in trace.records] == [400]


async def test_a_stream_that_breaks_midway_raises_the_sdks_error() -> None:
    agent_saw_first = anyio.Event()
    async with BackgroundServer(_broken_upstream("drop", agent_saw_first)) as upstream:
        gateway = RolloutGateway(upstream.url + "/v1", admin_token=ADMIN)
        async with BackgroundServer(gateway) as server:
            async with claude(f"{server.url}/sessions/b1") as llm:
                options: Any = {
                    "model": "m",
                    "max_tokens": 8,
                    "messages": [{"role": "user", "content": "hi"}],
                }
                texts: list[str] = []

                async def read() -> None:
                    async with llm.messages.stream(**options) as events:
                        async for text in events.text_stream:
                            texts.append(text)
                            agent_saw_first.set()

                with pytest.raises(anthropic.APIStatusError, match="upstream http://127"):
                    await read()
            trace = await gateway.finish_session("b1")
    assert texts == ["Hi"]
    assert [r.status for r in trace.records] == [502]


def _vllm_upstream(pieces: list[dict[str, Any]], usage: dict[str, int]) -> Any:
    """A vLLM-shaped chat upstream that streams ``pieces`` (deltas) one token each, as vLLM
    streams reasoning, text and tool calls (a call's id and name first, then its arguments in
    parts), with the prompt ids on the first chunk and the usage last."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import StreamingResponse
    from starlette.routing import Route

    head = {"id": "chatcmpl-v1", "object": "chat.completion.chunk", "created": 0, "model": "m"}

    def chunk(delta: dict[str, Any], i: int, finish: str | None = None) -> str:
        logprobs = {
            "content": [{"token": "t", "logprob": -0.5, "bytes": [116], "top_logprobs": []}]
        }
        choice = {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        choice |= {"token_ids": [100 + i], "stop_reason": None}
        extra = {"prompt_token_ids": [1, 2, 3]} if i == 0 else {}
        return "data: " + json.dumps({**head, "choices": [choice], **extra}) + "\n\n"

    async def chat(request: Request) -> StreamingResponse:
        async def events() -> Any:
            for i, delta in enumerate(pieces):
                yield chunk(delta, i, "tool_calls" if i == len(pieces) - 1 else None)
            yield "data: " + json.dumps({**head, "choices": [], "usage": usage}) + "\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])


async def test_vllm_shaped_stream_deltas_become_the_sdks_blocks() -> None:
    def call(index: int, arguments: str, first: str | None = None) -> dict[str, Any]:
        head = {"id": first, "type": "function"} if first else {}
        function = (
            {"name": "calculator", "arguments": arguments} if first else {"arguments": arguments}
        )
        return {"tool_calls": [{"index": index, **head, "function": function}]}

    pieces = [
        {"role": "assistant", "content": ""},
        {"reasoning_content": "Two sums"},
        {"reasoning_content": ", both at once."},
        {"content": "Asking."},
        call(0, "", "call_a"),
        call(0, '{"expression": '),
        call(0, '"1 + 2"}'),
        call(1, '{"expression"', "call_b"),
        call(1, ': "3 + 4"}'),
    ]
    usage = {"prompt_tokens": 3, "completion_tokens": len(pieces), "total_tokens": 3 + len(pieces)}
    async with BackgroundServer(_vllm_upstream(pieces, usage)) as upstream:
        gateway = RolloutGateway(upstream.url + "/v1", admin_token=ADMIN)
        async with BackgroundServer(gateway) as server, claude(f"{server.url}/sessions/v1") as llm:
            kinds = []
            options: Any = {
                "model": "m",
                "max_tokens": 64,
                "messages": [{"role": "user", "content": "hi"}],
            }
            async with llm.messages.stream(**options, tools=[TOOL]) as events:
                async for event in events:
                    kinds.append(event.type)
                reply = await events.get_final_message()
            trace = await gateway.finish_session("v1")
    assert [
        (b.type, getattr(b, "thinking", None) or getattr(b, "text", None))
        for b in reply.content[:2]
    ] == [
        ("thinking", "Two sums, both at once."),
        ("text", "Asking."),
    ]
    calls = [(b.id, b.input) for b in reply.content if isinstance(b, ToolUseBlock)]
    assert calls == [("call_a", {"expression": "1 + 2"}), ("call_b", {"expression": "3 + 4"})]
    assert (reply.stop_reason, reply.usage.input_tokens, reply.usage.output_tokens) == (
        "tool_use",
        3,
        9,
    )
    assert kinds.count("content_block_start") == kinds.count("content_block_stop") == 4
    assert kinds[0] == "message_start"
    assert kinds[-2:] == ["message_delta", "message_stop"]
    (record,) = trace.records
    assert record.completions[0].token_ids.tolist() == [100 + i for i in range(len(pieces))]
