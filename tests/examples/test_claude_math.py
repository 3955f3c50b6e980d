"""The Claude math agent through the local stack: the client invokes it on a local runtime
(uvicorn), its Anthropic SDK calls the stand-in policy through a gateway on uvicorn, the
result and the trace go to moto S3. Also its production (``@app.entrypoint``) form."""

from __future__ import annotations

import httpx
import pytest

from agentcore_rl import AsyncRolloutClient, AwsConfig, GatewayConfig, RolloutGateway, Timeouts
from agentcore_rl.local.background import BackgroundServer
from agentcore_rl.local.policy import ScriptedPolicy, Serving
from agentcore_rl.local.stack import LocalStack, StackS3
from agentcore_rl.protocol import ROLLOUT_FIELD
from agentcore_rl.s3 import ResultStore
from agentcore_rl.server import AgentCoreRLApp
from agentcore_rl.trajectory import build_trajectory
from examples.claude_math import production_agent
from tests.gateway.helpers import ADMIN, PROBLEM

ANSWER = {"prompt": PROBLEM, "answer": "14"}


async def test_a_claude_rollout_is_trained_on_its_exact_tokens(s3_endpoint: str) -> None:
    policy = ScriptedPolicy(accuracy=1.0, serving=Serving(token_ids="requested", keep_answers=100))
    stack = LocalStack(
        "examples.claude_math.agent:app",
        agents=1,
        s3=StackS3(endpoint_url=s3_endpoint, bucket="claude-math"),
        policy=policy,
        tps=None,
    )
    async with stack:
        assert stack.policy_base_url is not None
        gateway = RolloutGateway(stack.policy_base_url, admin_token=ADMIN)
        async with (
            BackgroundServer(gateway) as server,
            AsyncRolloutClient(
                s3_bucket=stack.bucket,
                exp_id="claude",
                agent_url=stack.agent_urls,
                aws=AwsConfig(s3_endpoint_url=s3_endpoint),
                gateway=GatewayConfig(url=server.url, admin_token=ADMIN),
                rollout={"model_id": policy.model},
                timeouts=Timeouts(rollout=60),
            ) as client,
        ):
            fut = await client.invoke(ANSWER, input_id="q-1")
            result = await fut

    assert result["rewards"] == [1.0]
    assert result["answer"] == "The answer is 14."
    assert result["metrics"]["tool_calls"] == 1
    assert result["payload"][ROLLOUT_FIELD]["api_key"] == fut.session_id
    tool_use = result["messages"][1]["content"][0]
    assert (tool_use["type"], tool_use["name"]) == ("tool_use", "calculator")
    assert result["messages"][2]["content"][0]["content"] == "14"

    trace = fut.trace
    assert trace is not None
    assert [r.endpoint for r in trace.records] == ["messages", "messages"]
    for record, (prompt_ids, choices) in zip(trace.records, policy.answers, strict=True):
        assert record.prompt_ids.tolist() == prompt_ids
        assert record.completions[0].token_ids.tolist() == choices[0][0]
        assert record.completions[0].logprobs.tolist() == choices[0][1]
    prompt_tokens = sum(len(prompt_ids) for prompt_ids, _ in policy.answers)
    assert result["metrics"]["prompt_tokens"] == prompt_tokens
    trajectory = build_trajectory(trace, reward=1.0)
    assert (len(trajectory.segments), trajectory.merges, trajectory.splits) == (1, 1, 0)


async def test_the_production_agent_answers_directly(
    store: ResultStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = AgentCoreRLApp(store=store)
    app.payload_validator(production_agent.validate)
    app.entrypoint(production_agent.answer)
    async with BackgroundServer(ScriptedPolicy(accuracy=1.0)) as policy:
        gateway = RolloutGateway(policy.url + "/v1", admin_token=ADMIN)
        async with BackgroundServer(gateway) as front, BackgroundServer(app) as server:
            monkeypatch.setenv("ANTHROPIC_BASE_URL", f"{front.url}/sessions/prod-1")
            monkeypatch.setenv("ANTHROPIC_API_KEY", "unused")
            async with httpx.AsyncClient(base_url=server.url) as http:
                response = await http.post("/invocations", json={"prompt": PROBLEM})
                refused = await http.post("/invocations", json={"prompt": ""})
    assert response.status_code == 200, response.text
    assert response.json() == {"answer": "The answer is 14."}
    assert refused.status_code == 400
    assert "prompt" in refused.text
