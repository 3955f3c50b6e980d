"""The OpenAI Responses API through the gateway, with the real ``openai`` SDK as the agent's
client (``responses.create`` and ``responses.stream``): proxy and linear mode, streamed and
not, multi-turn with tools, ``previous_response_id``, errors as the SDK's typed errors."""

from __future__ import annotations

import json
from typing import Any

import anyio
import httpx
import openai
import pytest
from openai.types.responses import ResponseFunctionToolCall, ResponseReasoningItem

from agentcore_rl.gateway import RolloutGateway
from agentcore_rl.local.background import BackgroundServer
from agentcore_rl.trajectory import build_trajectory
from tests.gateway.helpers import CALCULATOR, PROBLEM, eval_plain, served
from tests.gateway.template_rig import (
    QUESTION,
    RENDER_MISSING,
    exactness,
    template_stack,
    trained_tokens_exact,
    trajectory_of,
)
from tests.gateway.test_bad_input import _broken_upstream
from tests.gateway.test_capture import _captured_equals_served

#: The calculator as a Responses function tool (chat's CALCULATOR, flat).
TOOL: Any = {"type": "function", **CALCULATOR["function"], "strict": False}
needs_render = pytest.mark.skipif(RENDER_MISSING is not None, reason=RENDER_MISSING or "")


async def respond(llm: openai.AsyncOpenAI, *, stream: bool, **options: Any) -> Any:
    """One call -> the SDK's ``Response`` (streamed: read through the SDK's accumulator, and
    its events checked: numbered in order, one lifecycle)."""
    options.setdefault("model", "policy")
    if not stream:
        return await llm.responses.create(**options)
    async with llm.responses.stream(**options) as events:
        kinds, numbers = [], []
        async for event in events:
            kinds.append(event.type)
            numbers.append(event.sequence_number)
        final = await events.get_final_response()
    assert numbers == list(range(len(numbers)))
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    assert kinds.count("response.output_item.added") == len(final.output)
    assert kinds.count("response.output_item.done") == len(final.output)
    return final


def run_tool(call: ResponseFunctionToolCall) -> str:
    arguments = json.loads(call.arguments)
    expression = arguments["expression"]
    if " + " in expression and arguments.get("step"):  # the template stand-in's sums
        a, _, b = expression.partition(" + ")
        return str(int(a) + int(b))
    return str(eval_plain(expression))


async def agent(
    llm: openai.AsyncOpenAI, question: str, *, stream: bool, chained: bool = False
) -> list[Any]:
    """A tool loop as Responses agents are written: the output items go back as input (or,
    ``chained``, only the new items with ``previous_response_id``). -> the responses."""
    items: list[Any] = [{"role": "user", "content": question}]
    responses: list[Any] = []
    previous = None
    for _ in range(6):
        response = await respond(
            llm,
            stream=stream,
            input=items,
            tools=[TOOL],
            instructions="Use the calculator.",
            previous_response_id=previous,
        )
        responses.append(response)
        calls = [item for item in response.output if item.type == "function_call"]
        if not calls:
            return responses
        outputs = [
            {"type": "function_call_output", "call_id": c.call_id, "output": run_tool(c)}
            for c in calls
        ]
        if chained:
            items, previous = outputs, response.id
        else:
            items += [item.model_dump(exclude_none=True) for item in response.output]
            items += outputs
    raise AssertionError("the agent did not finish in 6 turns")


def _usage_is_the_ids(trace: Any, responses: list[Any]) -> None:
    for record, response in zip(trace.records, responses, strict=True):
        completion = len(record.completions[0].token_ids)
        assert response.usage.input_tokens == len(record.prompt_ids)
        assert response.usage.output_tokens == completion
        assert response.usage.total_tokens == len(record.prompt_ids) + completion


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("bearer", [False, True], ids=["path", "bearer"])
async def test_a_tool_loop_in_proxy_mode_is_one_exact_segment(stream: bool, bearer: bool) -> None:
    async with served() as stack:
        stack.gateway.open_session("r1", exp_id="e1", input_id="q1")
        async with stack.llm("r1", bearer=bearer) as llm:
            responses = await agent(llm, PROBLEM, stream=stream)
        trace = await stack.gateway.finish_session("r1")

    first, last = responses
    (call,) = first.output
    assert isinstance(call, ResponseFunctionToolCall)
    assert (call.name, json.loads(call.arguments)) == ("calculator", {"expression": "12 + 5 - 3"})
    assert first.status == last.status == "completed"
    assert last.output_text == "The answer is 14."
    _captured_equals_served(trace, stack.policy.answers)
    _usage_is_the_ids(trace, responses)
    assert all(r.endpoint == "responses" and r.stream == stream for r in trace.records)
    second = trace.records[1]
    assert second.tools == [CALCULATOR]
    assert second.messages == [
        {"role": "system", "content": "Use the calculator."},
        {"role": "user", "content": PROBLEM},
        {
            "role": "assistant",
            "tool_calls": [
                {
                    "id": call.call_id,
                    "type": "function",
                    "function": {"name": "calculator", "arguments": call.arguments},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call.call_id, "content": "14"},
    ]
    trajectory = build_trajectory(trace, reward=1.0)
    assert (len(trajectory.segments), trajectory.merges, trajectory.splits) == (1, 1, 0)


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
async def test_previous_response_id_continues_the_sessions_conversation(stream: bool) -> None:
    async with served() as stack:
        async with stack.llm("r2") as llm:
            chained = await agent(llm, PROBLEM, stream=stream, chained=True)
            with pytest.raises(openai.BadRequestError, match="previous_response_id"):
                await llm.responses.create(
                    model="p", input="hi", previous_response_id=chained[0].id + "x"
                )
        async with stack.llm("r3") as llm:  # another session holds none of them
            with pytest.raises(openai.BadRequestError, match="no such response in this session"):
                await llm.responses.create(
                    model="p", input="hi", previous_response_id=chained[0].id
                )
            await agent(llm, PROBLEM, stream=stream)
        chain = await stack.gateway.finish_session("r2")
        full = await stack.gateway.finish_session("r3")
    assert chained[-1].output_text == "The answer is 14."
    assert chained[-1].previous_response_id == chained[0].id
    # the chained calls fed the upstream what the full-history agent sent
    assert [r.messages for r in chain.records] == [r.messages for r in full.records]
    assert [r.prompt_ids for r in chain.records] == [r.prompt_ids for r in full.records]


async def test_store_false_keeps_no_response() -> None:
    async with served() as stack, stack.llm("r4") as llm:
        first = await llm.responses.create(model="p", input="What is 2 + 3?", store=False)
        assert first.output_text == "The answer is 5."
        with pytest.raises(openai.BadRequestError, match="previous_response_id"):
            await llm.responses.create(model="p", input="and?", previous_response_id=first.id)
        assert stack.gateway.sessions.live["r4"].dialect == {}


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
         "input[0].content[0] of type 'input_image': images are not supported"),
        ({"input": "hi", "tools": [{"type": "web_search"}]}, "tools[0].type 'web_search'"),
        ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0].type 'item_reference'"),
        ({"input": "hi", "background": True}, "background is not supported"),
        ({"input": "hi", "reasoning": {"effort": "high"}}, "reasoning"),
        ({"input": "hi", "reasoning": 5}, "reasoning must be an object"),
        ({"input": "hi", "previous_response_id": [1]}, "previous_response_id must be a string"),
        ({"input": "hi", "tool_choice": {"type": "web_search"}}, "tool_choice"),
        ({"input": "hi", "text": {"format": {"type": "xml"}}}, "text.format"),
        ({"input": []}, "input: the request has no input"),
        ({"input": 5}, "input must be a string or a list"),
        ({"input": [{"type": "function_call", "name": "f"}]}, "input[0]: a function_call needs"),
    ],
)  # fmt: skip
async def test_what_cannot_be_honoured_is_a_400_naming_the_field(
    options: dict[str, Any], words: str
) -> None:
    async with served() as stack, stack.llm("r5") as llm:
        with pytest.raises(openai.BadRequestError) as caught:
            await llm.responses.create(model="p", **options)
        assert words in caught.value.message
        with pytest.raises(openai.BadRequestError, match="frobnicate is not supported"):
            await llm.responses.create(model="p", input="hi", extra_body={"frobnicate": 1})
        assert stack.policy.requests == 0


async def test_harmless_fields_are_accepted_and_nothing_else_is_forwarded() -> None:
    async with served(model="pinned") as stack, stack.llm("r6") as llm:
        stack.gateway.open_session("r6", sampling={"temperature": 0.5})
        response = await llm.responses.create(
            model="p",
            input=[
                {"role": "developer", "content": "Be brief."},
                {"role": "user", "content": "2 + 3?"},
            ],
            store=True,
            metadata={"k": "v"},
            parallel_tool_calls=False,
            truncation="disabled",
            include=["reasoning.encrypted_content"],
            text={"format": {"type": "text"}},
            max_output_tokens=64,
            top_p=0.9,
            user="u",
            prompt_cache_key="c",
            extra_body={"seed": 3, "top_k": 5},
        )
        assert response.model == "pinned"
        assert response.metadata == {"k": "v"}
        assert response.max_output_tokens == 64
        trace = await stack.gateway.finish_session("r6")
    assert trace.records[0].request == {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "2 + 3?"},
        ],
        "model": "pinned",
        "parallel_tool_calls": False,
        "max_tokens": 64,
        "top_p": 0.9,
        "seed": 3,
        "top_k": 5,
        "temperature": 0.5,
    }  # fmt: skip


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
async def test_an_upstream_failure_is_the_sdks_error(stream: bool) -> None:
    async with served() as stack:
        gateway = RolloutGateway("http://127.0.0.1:9/v1")  # nothing listens there
        async with BackgroundServer(gateway) as server:
            llm = openai.AsyncOpenAI(
                base_url=f"{server.url}/sessions/x/v1", api_key="k", max_retries=0
            )
            with pytest.raises(openai.InternalServerError, match="upstream"):
                await respond(llm, stream=stream, input="What is 2 + 3?")
            await llm.close()
        del stack


async def test_a_stream_that_breaks_midway_ends_with_response_failed() -> None:
    agent_saw_first = anyio.Event()
    async with BackgroundServer(_broken_upstream("drop", agent_saw_first)) as upstream:
        gateway = RolloutGateway(upstream.url + "/v1")
        async with BackgroundServer(gateway) as server, httpx.AsyncClient() as http:
            url = f"{server.url}/sessions/b1/v1/responses"
            events: list[dict[str, Any]] = []
            body = {"model": "m", "input": "hi", "stream": True}
            async with http.stream("POST", url, json=body) as response:
                async for line in response.aiter_lines():
                    if line.startswith("data: "):
                        events.append(json.loads(line[6:]))
                        agent_saw_first.set()
            trace = await gateway.finish_session("b1")
    kinds = [e["type"] for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert "response.output_text.delta" in kinds
    assert kinds[-1] == "response.failed"
    assert events[-1]["response"]["error"]["code"] == "server_error"
    assert [r.status for r in trace.records] == [502]


@needs_render
@pytest.mark.timeout(600)
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("history", ["linear", "proxy"])
async def test_a_thinking_template_with_reasoning_sent_back(stream: bool, history: str) -> None:
    """Qwen3 reasons: the agent sends its reasoning items back, so even proxy mode keeps one
    sequence, and linear mode extends its served ids without a fork."""
    async with template_stack("qwen3", history=history, tool_rounds=3) as rig:
        async with rig.llm("t1") as llm:
            responses = await agent(llm, QUESTION, stream=stream)
        trace = await rig.gateway.finish_session("t1")
    assert len(responses) == 4
    reasoning = responses[0].output[0]
    assert isinstance(reasoning, ResponseReasoningItem)
    assert reasoning.content is not None
    assert reasoning.content[0].text == "Step 1: I ask the calculator."
    (call,) = responses[0].output[1:]
    assert isinstance(call, ResponseFunctionToolCall)
    assert responses[-1].output_text == "The answer is 33."
    assert trace.records[1].messages[2]["reasoning_content"] == "Step 1: I ask the calculator."
    assert exactness(trace, rig.policy) == (4, 4)
    _usage_is_the_ids(trace, responses)
    trajectory = trajectory_of(trace)
    assert (len(trajectory.segments), trajectory.splits) == (1, 0)
    assert trained_tokens_exact(trajectory, trace)
    if rig.render is not None:
        assert rig.render.forks == 0


@needs_render
@pytest.mark.timeout(600)
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
async def test_a_cut_off_answer_is_incomplete(stream: bool) -> None:
    async with template_stack("qwen2.5", history="linear") as rig, rig.llm("t2") as llm:
        options: Any = {"model": "p", "input": QUESTION, "max_output_tokens": 3}
        if stream:
            events = [e async for e in await llm.responses.create(**options, stream=True)]
            assert events[-1].type == "response.incomplete"
            response = events[-1].response
        else:
            response = await llm.responses.create(**options)
        trace = await rig.gateway.finish_session("t2")
    assert response.status == "incomplete"
    assert response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.usage is not None
    assert response.usage.output_tokens == len(trace.records[0].completions[0].token_ids) == 3


@needs_render
@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", ["qwen3", "llama3.1"])
async def test_turn_one_feeds_the_same_prompt_ids_as_chat(name: str) -> None:
    async with template_stack(name, history="proxy") as rig:
        async with rig.llm("c1") as llm:
            await llm.chat.completions.create(
                model="p",
                messages=[
                    {"role": "system", "content": "Use the calculator."},
                    {"role": "user", "content": QUESTION},
                ],
                tools=[CALCULATOR],
            )
        async with rig.llm("c2") as llm:
            await llm.responses.create(
                model="p", instructions="Use the calculator.", input=QUESTION, tools=[TOOL]
            )
        chat = await rig.gateway.finish_session("c1")
        responses = await rig.gateway.finish_session("c2")
    assert chat.records[0].prompt_ids == responses.records[0].prompt_ids
    assert len(chat.records[0].prompt_ids) > 0
