"""Token capture through the gateway, with the real OpenAI SDK as the agent's client."""

from __future__ import annotations

from typing import Any

import anyio
import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from agentcore_rl.gateway import RolloutGateway, dump_trace, load_trace
from agentcore_rl.local.background import BackgroundServer
from agentcore_rl.local.policy import ScriptedPolicy, Serving
from agentcore_rl.trajectory import build_trajectory
from tests.gateway.helpers import CALCULATOR, PROBLEM, Stack, chat, served, tool_rollout


def _captured_equals_served(trace: Any, answers: list[Any]) -> None:
    """Every record's ids and logprobs are exactly what the stand-in produced, in order."""
    assert len(trace.records) == len(answers)
    for record, (prompt_ids, choices) in zip(trace.records, answers, strict=True):
        assert record.ok, record.error
        assert record.prompt_ids.tolist() == prompt_ids
        assert [c.token_ids.tolist() for c in record.completions] == [ids for ids, _ in choices]
        assert [c.logprobs.tolist() for c in record.completions] == [lp for _, lp in choices]


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("bearer", [False, True], ids=["path", "bearer"])
async def test_tool_calling_rollout_is_one_segment_with_the_served_tokens(
    stream: bool, bearer: bool
) -> None:
    async with served() as stack:
        stack.gateway.open_session("sess-1", exp_id="e1", input_id="q1")
        async with stack.llm("sess-1", bearer=bearer) as llm:
            messages = await tool_rollout(llm, stream=stream)
        assert messages[-1]["content"] == "The answer is 14."
        trace = await stack.gateway.finish_session("sess-1")

    _captured_equals_served(trace, stack.policy.answers)
    assert [r.index for r in trace.records] == [0, 1]
    assert all(
        r.exp_id == "e1" and r.input_id == "q1" and r.stream == stream for r in trace.records
    )
    assert trace.records[0].completions[0].finish_reason == "tool_calls"
    assert trace.records[1].messages == messages[:-1]
    assert trace.records[1].tools == [CALCULATOR]

    trajectory = build_trajectory(trace, reward=1.0)
    assert (len(trajectory.segments), trajectory.merges, trajectory.splits) == (1, 1, 0)
    segment = trajectory.segments[0]
    last = trace.records[-1]
    full = last.prompt_ids.tolist() + last.completions[0].token_ids.tolist()
    assert segment.token_ids.tolist() == full
    generated = [i for i, m in enumerate(segment.loss_mask) if m]
    expected = sum(len(r.completions[0].token_ids) for r in trace.records)
    assert len(generated) == expected == trajectory.generated_tokens
    assert segment.logprobs[generated[-1]] == last.completions[0].logprobs[-1]


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
async def test_the_agent_gets_a_plain_openai_answer(stream: bool) -> None:
    async with served() as stack, httpx.AsyncClient(base_url=stack.url) as http:
        body = {"model": "m", "messages": [{"role": "user", "content": "What is 2 + 2?"}]}
        response = await http.post(
            "/sessions/s1/v1/chat/completions", json={**body, "stream": stream}
        )
        assert response.status_code == 200
        assert "token_ids" not in response.text
        assert '"logprob"' not in response.text
        assert "The answer" in response.text or "The" in response.text

        asked = await http.post("/sessions/s1/v1/chat/completions", json={**body, "logprobs": True})
        assert asked.json()["choices"][0]["logprobs"]["content"][0]["logprob"] <= 0
        assert "token_ids" not in asked.text
        trace = await stack.gateway.finish_session("s1")
    _captured_equals_served(trace, stack.policy.answers)


async def test_a_truncated_history_starts_a_new_segment() -> None:
    async with served() as stack:
        async with stack.llm("s2") as llm:
            messages: list[Any] = [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "What is 2 + 3?"},
            ]
            first, _ = await chat(llm, messages, stream=False)
            messages += [first, {"role": "user", "content": "And what is 4 + 4?"}]
            await chat(llm, messages, stream=True)
            await chat(llm, messages[1:], stream=False)  # the agent dropped the system prompt
        trace = await stack.gateway.finish_session("s2")
    trajectory = build_trajectory(trace)
    assert (len(trajectory.segments), trajectory.merges, trajectory.splits) == (2, 1, 1)
    assert [s.calls for s in trajectory.segments] == [[0, 1], [2]]


async def test_policy_versions_and_sampling_overrides_are_recorded() -> None:
    async with served(model="pinned-model") as stack:
        stack.gateway.open_session("s3", sampling={"temperature": 0.25, "seed": 7})
        async with stack.llm("s3") as llm:
            messages: list[Any] = [{"role": "user", "content": PROBLEM}]
            reply = await llm.chat.completions.create(
                model="whatever", messages=messages, temperature=1.0
            )
            assert reply.model == "pinned-model"  # the stand-in echoes the model it was asked
            stack.gateway.set_policy_version(5)
            await chat(llm, messages, stream=True)
        trace = await stack.gateway.finish_session("s3")
    versions = [(r.policy_version_start, r.policy_version_end) for r in trace.records]
    assert versions == [(0, 0), (5, 5)]
    assert trace.records[0].sampling["temperature"] == 0.25
    assert trace.records[0].sampling["seed"] == 7
    assert trace.records[0].request["model"] == "pinned-model"
    trajectory = build_trajectory(trace)
    assert {v for s in trajectory.segments for v in s.policy_versions} == {-1, 0, 5}
    assert trajectory.duplicates == 0


async def test_an_identical_retry_is_counted_once() -> None:
    async with served() as stack:
        async with stack.llm("s4") as llm:
            messages: list[Any] = [{"role": "user", "content": "What is 6 * 7?"}]
            await chat(llm, messages, stream=False)
            await chat(llm, messages, stream=False)
        trace = await stack.gateway.finish_session("s4")
    trajectory = build_trajectory(trace)
    assert (len(trace.records), trajectory.duplicates, len(trajectory.segments)) == (2, 1, 1)
    assert trajectory.segments[0].calls == [1]


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
async def test_completions_endpoint_is_captured(stream: bool) -> None:
    async with served() as stack:
        async with stack.llm("s5") as llm:
            if stream:
                chunks = await llm.completions.create(
                    model="m", prompt="What is 2 + 3?", stream=True
                )
                text = "".join([c.choices[0].text async for c in chunks])
            else:
                reply = await llm.completions.create(model="m", prompt="What is 2 + 3?")
                text = reply.choices[0].text
                assert "token_ids" not in reply.model_dump_json()
        assert text == "The answer is 5."
        trace = await stack.gateway.finish_session("s5")
    _captured_equals_served(trace, stack.policy.answers)
    assert trace.records[0].endpoint == "completions"


async def test_trace_round_trips_through_its_compressed_form() -> None:
    async with served() as stack:
        async with stack.llm("s6") as llm:
            await tool_rollout(llm, stream=False)
        trace = await stack.gateway.finish_session("s6")
    blob = dump_trace(trace)
    again = load_trace(blob)
    assert again.to_json() == trace.to_json()
    assert len(blob) < len(str(trace.to_json()))


async def test_models_route_and_sticky_upstreams() -> None:
    async with served() as stack:
        async with stack.llm("s7") as llm:
            models = await llm.models.list()
        assert [m.id for m in models.data] == [stack.policy.model]
    gateway_cls = type(stack.gateway)
    several = gateway_cls([f"http://127.0.0.1:{p}/v1" for p in (1, 2, 3)])
    async with several:
        picks = {several.calls.pool_for("sess-a").base for _ in range(5)}
    assert len(picks) == 1


async def test_every_choice_of_a_multi_choice_call_is_captured() -> None:
    async with served() as stack:
        async with stack.llm("s8") as llm:
            reply = await llm.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "What is 3 + 3?"}], n=2
            )
        assert len(reply.choices) == 2
        trace = await stack.gateway.finish_session("s8")
    _captured_equals_served(trace, stack.policy.answers)
    assert [c.index for c in trace.records[0].completions] == [0, 1]
    assert build_trajectory(trace, choice=1).segments[0].calls == [0]


@pytest.mark.parametrize("status", [404, 403])
async def test_an_upstream_without_the_render_route_is_proxied_through_its_chat_route(
    status: int, caplog: pytest.LogCaptureFixture
) -> None:
    # The stand-in has no /v1/chat/completions/render (404); a vLLM started without
    # --enable-scale-out refuses it (403). The calls that race to learn it all fall back.
    policy = ScriptedPolicy(accuracy=1.0, serving=Serving(token_ids="requested"))
    app: Any = policy
    if status == 403:
        refused = Starlette(
            routes=[Route("/v1/chat/completions/render", _forbidden, methods=["POST"])]
        )
        refused.mount("/", policy)
        app = refused
    async with BackgroundServer(app) as upstream:
        gateway = RolloutGateway(upstream.url + "/v1", admin_token="a")
        async with BackgroundServer(gateway) as front:
            stack = Stack(policy, gateway, front.url, upstream.url)
            llms = [stack.llm(f"s{n}") for n in range(4)]

            async def ask(llm: Any) -> None:
                async with llm:
                    await chat(llm, [{"role": "user", "content": PROBLEM}], stream=False)

            async with anyio.create_task_group() as tg:
                for llm in llms:
                    tg.start_soon(ask, llm)
            assert gateway.stats["proxy_versions"] == {gateway.upstreams[0]: "gateway"}
            traces = [await gateway.finish_session(f"s{n}") for n in range(4)]
    assert all(record.ok for trace in traces for record in trace.records)
    assert sum("--enable-scale-out" in r.message for r in caplog.records) == 1  # said once


async def _forbidden(request: Request) -> Response:
    return JSONResponse({"error": {"message": "scale-out routes are off", "code": 403}}, 403)
