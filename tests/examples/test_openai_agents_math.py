"""The OpenAI Agents SDK math agent served by a real AgentCoreRLApp (uvicorn on loopback): the
SDK's Agent on its default OpenAIResponsesModel calls the Responses API through the gateway,
in front of the stand-in policy; the result goes to moto S3, the tokens to the gateway's trace."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from agents import Runner

from agentcore_rl.gateway import RolloutGateway
from agentcore_rl.local.background import BackgroundServer
from agentcore_rl.protocol import SESSION_ID_HEADER, new_session_id
from agentcore_rl.s3 import ResultStore
from agentcore_rl.server import AgentCoreRLApp
from agentcore_rl.trajectory import build_trajectory
from examples.math_agent.agent import validate_payload
from examples.openai_agents_math import agent
from tests.conftest import FAST_RETRY
from tests.gateway.helpers import PROBLEM, served
from tests.gateway.test_capture import _captured_equals_served


def _payload(url: str, sid: str, bucket: str, model: str) -> dict[str, Any]:
    rollout = {"exp_id": "agents", "input_id": "q-1", "s3_bucket": bucket, "model_id": model}
    rollout["base_url"] = RolloutGateway.session_base_url(url, sid)
    return {"prompt": PROBLEM, "answer": "14", "_rollout": {**rollout, "seed": 7}}


def _one_exact_segment(trace: Any, answers: list[Any]) -> None:
    _captured_equals_served(trace, answers)
    assert [r.endpoint for r in trace.records] == ["responses", "responses"]
    assert trace.records[1].messages[2]["tool_calls"][0]["function"]["name"] == "calculator"
    trajectory = build_trajectory(trace, reward=1.0)
    assert (len(trajectory.segments), trajectory.merges, trajectory.splits) == (1, 1, 0)


async def test_a_rollout_through_the_gateway_earns_the_reward_with_exact_tokens(
    s3_endpoint: str, bucket: str
) -> None:
    store = ResultStore(endpoint_url=s3_endpoint, retry=FAST_RETRY)
    app = AgentCoreRLApp(store=store)
    app.rollout_entrypoint(agent.solve)
    app.payload_validator(validate_payload)
    sid = new_session_id()
    try:
        async with (
            served() as stack,
            BackgroundServer(app) as server,
            httpx.AsyncClient(base_url=server.url) as http,
        ):
            payload = _payload(stack.url, sid, bucket, stack.policy.model)
            response = await http.post(
                "/invocations", json=payload, headers={SESSION_ID_HEADER: sid}
            )
            assert response.status_code == 200, response.text
            assert await app.runner.wait(app.runner.jobs, 10)
            envelope = await store.get_json(bucket, response.json()["result_key"])
            trace = await stack.gateway.finish_session(sid)
    finally:
        await store.aclose()
    assert envelope is not None
    assert envelope["status_code"] == 200, envelope
    assert envelope["rewards"] == [1.0]
    assert envelope["answer"] == "The answer is 14."
    assert envelope["metrics"]["tool_calls"] == 1
    assert envelope["metrics"]["turns"] == 2
    usage = [len(r.prompt_ids) + len(r.completions[0].token_ids) for r in trace.records]
    assert envelope["metrics"]["prompt_tokens"] + envelope["metrics"]["completion_tokens"] == sum(
        usage
    )
    _one_exact_segment(trace, stack.policy.answers)
    assert trace.records[0].request["seed"] == 7


@pytest.mark.parametrize("stream", [False, True], ids=["run", "run_streamed"])
async def test_the_agent_streamed_or_not_through_the_gateway(stream: bool) -> None:
    async with served() as stack:
        task = validate_payload(_payload(stack.url, "a1", "b", stack.policy.model))
        async with agent.math_agent(task) as math:
            if stream:
                run = Runner.run_streamed(math, task.prompt, run_config=agent.RUN_CONFIG)
                kinds = {event.type async for event in run.stream_events()}
                assert "raw_response_event" in kinds
                final = run.final_output
            else:
                result = await Runner.run(math, task.prompt, run_config=agent.RUN_CONFIG)
                final = result.final_output
        trace = await stack.gateway.finish_session("a1")
    assert final == "The answer is 14."
    assert all(r.stream == stream for r in trace.records)
    _one_exact_segment(trace, stack.policy.answers)
