"""The Strands agent on its default BedrockModel, trained through the local stack: the agent
server (real uvicorn) calls the stand-in policy in Bedrock Converse through a gateway, the
rollout client collects the result and the trace from embedded S3. Also its production form."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from agentcore_rl import AsyncRolloutClient, AwsConfig, GatewayConfig, RolloutGateway, Timeouts
from agentcore_rl.local.background import BackgroundServer
from agentcore_rl.local.policy import ScriptedPolicy, Serving
from agentcore_rl.local.stack import LocalStack, StackS3
from agentcore_rl.server import AgentCoreRLApp
from agentcore_rl.trajectory import build_trajectory
from examples.strands_bedrock import production_agent
from tests.gateway.helpers import ADMIN, PROBLEM


@contextlib.asynccontextmanager
async def _trained(s3_endpoint: str, accuracy: float) -> AsyncIterator[tuple[Any, ScriptedPolicy]]:
    policy = ScriptedPolicy(
        accuracy=accuracy, serving=Serving(token_ids="requested", keep_answers=100)
    )
    stack = LocalStack(
        "examples.strands_bedrock.agent:app",
        agents=1,
        s3=StackS3(endpoint_url=s3_endpoint, bucket=f"bedrock-{int(accuracy)}"),
        policy=policy,
        tps=None,
    )
    async with stack:
        assert stack.policy_base_url is not None
        assert stack.s3_endpoint_url is not None
        gateway = RolloutGateway(stack.policy_base_url, admin_token=ADMIN, model=policy.model)
        async with gateway, BackgroundServer(gateway) as server:
            client = AsyncRolloutClient(
                s3_bucket=stack.bucket,
                exp_id="bedrock",
                agent_url=stack.agent_urls,
                gateway=GatewayConfig(url=server.url, app=gateway),
                aws=AwsConfig(s3_endpoint_url=stack.s3_endpoint_url),
                timeouts=Timeouts(rollout=60),
            )
            async with client:
                yield client, policy


@pytest.mark.parametrize("accuracy", [1.0, 0.0], ids=["right", "wrong"])
async def test_a_strands_bedrock_rollout_is_trained_through_the_gateway(
    s3_endpoint: str, accuracy: float
) -> None:
    async with _trained(s3_endpoint, accuracy) as (client, policy):
        fut = await client.invoke({"prompt": PROBLEM, "answer": "14"}, input_id="q-1")
        result = await fut
    assert result["rewards"] == [accuracy]
    if accuracy:
        assert result["answer"] == "The answer is 14."
    trace = fut.trace
    assert trace is not None
    assert [(r.endpoint, r.stream, r.ok) for r in trace.records] == [("converse", True, True)] * 2
    assert {r.request["model"] for r in trace.records} == {policy.model}  # --model pins it
    for record, (prompt_ids, choices) in zip(trace.records, policy.answers, strict=True):
        assert record.prompt_ids.tolist() == prompt_ids
        assert record.completions[0].token_ids.tolist() == choices[0][0]
        assert record.completions[0].logprobs.tolist() == choices[0][1]
    trajectory = build_trajectory(trace, reward=result["rewards"][0])
    assert (len(trajectory.segments), trajectory.merges, trajectory.splits) == (1, 1, 0)
    assert result["metrics"]["prompt_tokens"] == sum(len(p) for p, _ in policy.answers)


async def test_the_production_agent_calls_bedrock_where_boto3_is_pointed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    policy = ScriptedPolicy(accuracy=1.0)
    app = AgentCoreRLApp()
    app.entrypoint(production_agent.answer)
    async with BackgroundServer(policy) as upstream:
        gateway = RolloutGateway(upstream.url + "/v1")
        async with BackgroundServer(gateway) as front:
            # boto3's standard variable, as a VPC endpoint would be configured
            monkeypatch.setenv("AWS_ENDPOINT_URL_BEDROCK_RUNTIME", f"{front.url}/sessions/prod")
            async with (
                BackgroundServer(app) as server,
                httpx.AsyncClient(base_url=server.url) as http,
            ):
                response = await http.post("/invocations", json={"prompt": PROBLEM})
                refused = await http.post("/invocations", json={"prompt": ""})
    assert response.status_code == 200, response.text
    assert response.json() == {"answer": "The answer is 14."}
    assert refused.status_code == 400
    assert "prompt" in refused.text
