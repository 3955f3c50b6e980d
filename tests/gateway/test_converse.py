"""Bedrock Converse through the gateway, driven by the real boto3 ``bedrock-runtime`` client
(botocore's own event-stream parser reads ``converse-stream``) against the stand-in policy on
uvicorn: the math agent's tool loop recorded exactly, in proxy mode; typed errors."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anyio
import httpx
import pytest
from botocore.eventstream import EventStreamBuffer
from botocore.exceptions import ClientError, EventStreamError
from strands import Agent, tool
from strands.models.bedrock import BedrockModel

from agentcore_rl.gateway import RolloutGateway
from agentcore_rl.gateway.dialects.codec import Route
from agentcore_rl.gateway.dialects.converse import CONVERSE_DIALECT
from agentcore_rl.gateway.sessions import Session
from agentcore_rl.local.background import BackgroundServer
from agentcore_rl.local.policy import evaluate_arithmetic
from agentcore_rl.trajectory import build_trajectory
from tests.gateway.converse_agent import (
    CALCULATOR_SPEC,
    MODEL,
    SYSTEM,
    bedrock,
    close_clients,
    converse,
    keep,
    tool_loop,
)
from tests.gateway.helpers import CALCULATOR, PROBLEM, served
from tests.gateway.test_bad_input import _broken_upstream


@pytest.fixture(autouse=True)
def _close_clients() -> Iterator[None]:
    yield
    close_clients()


def session_url(url: str, sid: str) -> str:
    return f"{url}/sessions/{sid}"


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
async def test_a_tool_loop_is_recorded_exactly_and_answered_in_converse(stream: bool) -> None:
    async with served() as stack:
        stack.gateway.open_session("c1", exp_id="e1", input_id="q1")
        client = bedrock(session_url(stack.url, "c1"))
        messages, answers = await anyio.to_thread.run_sync(
            lambda: tool_loop(client, PROBLEM, stream=stream)
        )
        trace = await stack.gateway.finish_session("c1")

    # the tool call came back as botocore's toolUse block, its input an object
    first = answers[0]
    assert first["stopReason"] == "tool_use"
    (use,) = [b["toolUse"] for b in first["output"]["message"]["content"] if "toolUse" in b]
    assert use["name"] == "calculator"
    assert use["input"] == {"expression": "12 + 5 - 3"}
    assert use["toolUseId"].startswith("call_")
    assert answers[-1]["stopReason"] == "end_turn"
    assert answers[-1]["output"]["message"]["content"] == [{"text": "The answer is 14."}]
    if stream:
        assert answers[0]["events"] == [
            "messageStart",
            "contentBlockStart",
            "contentBlockDelta",
            "contentBlockStop",
            "messageStop",
            "metadata",
        ]

    # records: exact ids and logprobs, the dialect named, the request kept as chat
    records = trace.records
    assert [r.endpoint for r in records] == ["converse", "converse"]
    assert [r.stream for r in records] == [stream, stream]
    for record, answer, (prompt_ids, choices) in zip(
        records, answers, stack.policy.answers, strict=True
    ):
        assert record.ok, record.error
        assert record.prompt_ids.tolist() == prompt_ids
        assert record.completions[0].token_ids.tolist() == choices[0][0]
        assert record.completions[0].logprobs.tolist() == choices[0][1]
        usage = answer["usage"]
        assert usage["inputTokens"] == len(prompt_ids)
        assert usage["outputTokens"] == len(choices[0][0])
        assert usage["totalTokens"] == len(prompt_ids) + len(choices[0][0])
        assert answer["metrics"]["latencyMs"] >= 0
    assert records[0].request["model"] == MODEL  # URL-decoded from the path
    assert records[1].messages == [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": PROBLEM},
        {
            "role": "assistant",
            "tool_calls": [
                {
                    "id": use["toolUseId"],
                    "type": "function",
                    "function": {"name": "calculator", "arguments": '{"expression": "12 + 5 - 3"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": use["toolUseId"], "content": "14"},
    ]
    assert records[1].tools == [CALCULATOR]
    trajectory = build_trajectory(trace, reward=1.0)
    assert (len(trajectory.segments), trajectory.merges, trajectory.splits) == (1, 1, 0)
    assert len(messages) == 4


async def test_turn_one_feeds_the_upstream_what_chat_feeds_it() -> None:
    async with served() as stack:
        client = bedrock(session_url(stack.url, "c2"))
        question = [{"role": "user", "content": [{"text": PROBLEM}]}]
        await anyio.to_thread.run_sync(lambda: converse(client, question, stream=False))
        async with stack.llm("c2") as llm:
            await llm.chat.completions.create(
                model="policy",
                messages=[
                    {"role": "system", "content": SYSTEM},
                    {"role": "user", "content": PROBLEM},
                ],
                tools=[CALCULATOR],
            )
    (converse_prompt, _), (chat_prompt, _) = stack.policy.answers
    assert converse_prompt == chat_prompt


async def test_sampling_stops_and_tool_choice_translate_to_chat() -> None:
    async with served(model="pinned") as stack:
        stack.gateway.open_session("c3", sampling={"seed": 7})
        client = bedrock(session_url(stack.url, "c3"))
        question = [{"role": "user", "content": [{"text": "What is 2 + 2?"}]}]
        fields: dict[str, Any] = {
            "inferenceConfig": {
                "maxTokens": 50,
                "temperature": 0.5,
                "topP": 0.9,
                "stopSequences": ["###"],
            },
            "toolConfig": {
                "tools": [CALCULATOR_SPEC],
                "toolChoice": {"tool": {"name": "calculator"}},
            },
            "requestMetadata": {"team": "math"},
        }
        await anyio.to_thread.run_sync(lambda: converse(client, question, stream=False, **fields))
        trace = await stack.gateway.finish_session("c3")
    request = trace.records[0].request
    assert {k: request[k] for k in ("max_tokens", "temperature", "top_p", "stop", "seed")} == {
        "max_tokens": 50,
        "temperature": 0.5,
        "top_p": 0.9,
        "stop": ["###"],
        "seed": 7,
    }
    assert request["tool_choice"] == {"type": "function", "function": {"name": "calculator"}}
    assert request["model"] == "pinned"
    assert "team" not in json.dumps(request)  # requestMetadata: accepted, not forwarded


def _reasoning_history() -> list[Any]:
    return [
        {"role": "user", "content": [{"text": "Hi"}, {"cachePoint": {"type": "default"}}]},
        {
            "role": "assistant",
            "content": [
                {"reasoningContent": {"reasoningText": {"text": "Greet back.", "signature": "s"}}},
                {"text": "Hello!"},
            ],
        },
        {"role": "user", "content": [{"text": "What is 2 + 2?"}]},
    ]


async def test_reasoning_sent_back_becomes_reasoning_content() -> None:
    async with served() as stack:
        client = bedrock(session_url(stack.url, "c4"))
        await anyio.to_thread.run_sync(
            lambda: converse(client, _reasoning_history(), stream=True, system=[])
        )
        trace = await stack.gateway.finish_session("c4")
    assert trace.records[0].messages == [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!", "reasoning_content": "Greet back."},
        {"role": "user", "content": "What is 2 + 2?"},
    ]


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [{"image": {"format": "png", "source": {"bytes": b"x"}}}],
                    }
                ]
            },
            "messages[0].content[0].image",
        ),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"document": {"format": "txt", "name": "d", "source": {"bytes": b"x"}}}
                        ],
                    }
                ]
            },
            "messages[0].content[0].document",
        ),
        ({"additionalModelRequestFields": {"top_k": 5}}, "additionalModelRequestFields.top_k"),
        (
            {"guardrailConfig": {"guardrailIdentifier": "g", "guardrailVersion": "1"}},
            "guardrailConfig",
        ),
        ({"promptVariables": {"x": {"text": "y"}}}, "promptVariables"),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {
                                "toolResult": {
                                    "toolUseId": "t",
                                    "content": [
                                        {"image": {"format": "png", "source": {"bytes": b"x"}}}
                                    ],
                                }
                            }
                        ],
                    }
                ]
            },
            "messages[0].content[0].toolResult.content[0].image",
        ),
    ],
)
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
async def test_what_cannot_be_translated_is_a_validation_exception(
    fields: dict[str, Any], named: str, stream: bool
) -> None:
    async with served() as stack:
        client = bedrock(session_url(stack.url, "c5"))
        fields = dict(fields)
        question = fields.pop("messages", [{"role": "user", "content": [{"text": PROBLEM}]}])
        with pytest.raises(ClientError) as caught:
            await anyio.to_thread.run_sync(
                lambda: converse(client, question, stream=stream, **fields)
            )
        assert stack.policy.requests == 0
    error = caught.value.response["Error"]
    assert error["Code"] == "ValidationException"
    assert named in error["Message"]
    assert caught.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400


async def test_a_paused_gateway_is_a_throttling_exception() -> None:
    async with served() as stack:
        await stack.gateway.pause("reject")
        client = bedrock(session_url(stack.url, "c6"))
        question = [{"role": "user", "content": [{"text": PROBLEM}]}]
        with pytest.raises(ClientError) as caught:
            await anyio.to_thread.run_sync(lambda: converse(client, question, stream=False))
    assert caught.value.response["Error"]["Code"] == "ThrottlingException"
    assert "paused" in caught.value.response["Error"]["Message"]


async def test_a_stream_that_breaks_midway_raises_botocores_event_stream_error() -> None:
    agent_saw_first = anyio.Event()
    async with BackgroundServer(_broken_upstream("drop", agent_saw_first)) as upstream:
        gateway = RolloutGateway(upstream.url + "/v1")
        async with BackgroundServer(gateway) as server:
            client = bedrock(session_url(server.url, "c8"))
            request = {
                "modelId": MODEL,
                "messages": [{"role": "user", "content": [{"text": "Hi"}]}],
            }

            def read() -> list[Any]:
                events = []
                stream = client.converse_stream(**request)["stream"]
                try:
                    for event in stream:
                        events.append(event)
                        anyio.from_thread.run_sync(agent_saw_first.set)
                finally:  # its connection, left unread by the error, closed now
                    stream.close()
                return events

            seen: list[Any] = []
            with pytest.raises(EventStreamError) as caught:
                seen = await anyio.to_thread.run_sync(read)
            trace = await gateway.finish_session("c8")
    del seen
    error = caught.value.response["Error"]
    assert error["Code"] == "modelStreamErrorException"
    assert "upstream http://127.0.0.1" in error["Message"]
    assert [r.status for r in trace.records] == [502]


def test_the_event_stream_framing_is_what_botocore_reads() -> None:
    chat = CONVERSE_DIALECT.decode(
        {"messages": [{"role": "user", "content": [{"text": "Hi"}]}]},
        Route(CONVERSE_DIALECT, stream=True, model="m"),
        None,
    )
    assert chat["stream"] is True
    assert chat["stream_options"] == {"include_usage": True}
    encoder = CONVERSE_DIALECT.encoder({}, chat, Session("s"))
    delta = {"role": "assistant", "reasoning_content": "Hm.", "content": "Hé"}
    raw = encoder.chunk({"choices": [{"index": 0, "delta": delta, "finish_reason": None}]})
    raw += encoder.chunk({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]})
    raw += encoder.end()
    buffer = EventStreamBuffer()
    buffer.add_data(raw)
    messages: list[Any] = list(buffer)  # checks both CRCs of every message
    assert [m.headers[":event-type"] for m in messages] == [
        "messageStart",
        "contentBlockDelta",
        "contentBlockStop",
        "contentBlockDelta",
        "contentBlockStop",
        "messageStop",
        "metadata",
    ]
    assert all(m.headers[":content-type"] == "application/json" for m in messages)
    payloads = [json.loads(m.payload) for m in messages]
    assert payloads[1] == {"delta": {"reasoningContent": {"text": "Hm."}}, "contentBlockIndex": 0}
    assert payloads[3] == {"delta": {"text": "Hé"}, "contentBlockIndex": 1}
    assert payloads[5] == {"stopReason": "max_tokens"}


async def test_the_routes_take_post_and_a_model() -> None:
    async with served() as stack, httpx.AsyncClient(base_url=stack.url) as http:
        got = await http.get("/sessions/c7/model/m/converse")
        assert got.status_code == 405
        assert got.headers["x-amzn-errortype"].startswith("ValidationException")
        nothing = await http.post("/sessions/c7/model//converse", json={"messages": []})
        assert nothing.status_code == 404


@tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression.

    Args:
        expression: for example (12 + 5) * 3
    """
    return str(evaluate_arithmetic(expression))


@pytest.mark.parametrize("streaming", [True, False], ids=["stream", "whole"])
async def test_a_strands_agent_on_its_default_bedrock_model(streaming: bool) -> None:
    async with served() as stack:
        model = BedrockModel(endpoint_url=session_url(stack.url, "c9"), streaming=streaming)
        keep(model.client)
        agent = Agent(model=model, tools=[calculator], system_prompt=SYSTEM, callback_handler=None)
        result = await agent.invoke_async(PROBLEM)
        trace = await stack.gateway.finish_session("c9")
    assert [b.get("text") for b in result.message["content"]] == ["The answer is 14."]
    assert result.metrics.tool_metrics["calculator"].success_count == 1
    usage = result.metrics.accumulated_usage
    assert usage["inputTokens"] == sum(len(p) for p, _ in stack.policy.answers)
    assert usage["outputTokens"] == sum(len(c[0][0]) for _, c in stack.policy.answers)
    assert [(r.endpoint, r.stream, r.ok) for r in trace.records] == [
        ("converse", streaming, True)
    ] * 2
    for record, (prompt_ids, choices) in zip(trace.records, stack.policy.answers, strict=True):
        assert record.prompt_ids.tolist() == prompt_ids
        assert record.completions[0].token_ids.tolist() == choices[0][0]
        assert record.completions[0].logprobs.tolist() == choices[0][1]
    assert trace.records[0].request["tool_choice"] == "auto"  # Strands always sends it
    trajectory = build_trajectory(trace, reward=1.0)
    assert (len(trajectory.segments), trajectory.merges, trajectory.splits) == (1, 1, 0)


async def test_strands_gets_botocores_validation_exception() -> None:
    async with served() as stack:
        model = BedrockModel(
            endpoint_url=session_url(stack.url, "c10"),
            additional_request_fields={"thinking": {"type": "enabled", "budget_tokens": 1024}},
        )
        keep(model.client)
        agent = Agent(model=model, callback_handler=None)
        with pytest.raises(ClientError) as caught:
            await agent.invoke_async(PROBLEM)
    assert caught.value.response["Error"]["Code"] == "ValidationException"
    assert "additionalModelRequestFields.thinking" in caught.value.response["Error"]["Message"]
