"""The Strands math agent served by a real AgentCoreRLApp (uvicorn on loopback): Strands'
Agent and OpenAI-compatible model provider talk to the stand-in policy, and the result goes
to moto S3. Also its production (``@app.entrypoint``) form."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from agentcore_rl.local.background import BackgroundServer
from agentcore_rl.local.policy import ScriptedPolicy
from agentcore_rl.protocol import SESSION_ID_HEADER, new_session_id
from agentcore_rl.s3 import ResultStore
from agentcore_rl.server import AgentCoreRLApp
from examples.math_agent.agent import validate_payload
from examples.strands_math import agent, production_agent
from tests.conftest import FAST_RETRY

PROBLEM = "Maya has 12 apples. She buys 5 more apples. She eats 3. How many apples are left?"


@dataclass
class Stack:
    app: AgentCoreRLApp
    http: httpx.AsyncClient
    policy: ScriptedPolicy
    policy_url: str
    store: ResultStore
    bucket: str

    def payload(self) -> dict[str, Any]:
        return {
            "prompt": PROBLEM,
            "answer": "14",
            "_rollout": {
                "exp_id": "strands",
                "input_id": "q-1",
                "s3_bucket": self.bucket,
                "base_url": self.policy_url,
                "model_id": self.policy.model,
            },
        }

    async def rollout(self) -> dict[str, Any]:
        response = await self.http.post(
            "/invocations", json=self.payload(), headers={SESSION_ID_HEADER: new_session_id()}
        )
        assert response.status_code == 200, response.text
        assert await self.app.runner.wait(self.app.runner.jobs, 10)
        envelope = await self.store.get_json(self.bucket, response.json()["result_key"])
        assert envelope is not None
        return envelope


@contextlib.asynccontextmanager
async def _stack(store: ResultStore, bucket: str, accuracy: float) -> AsyncIterator[Stack]:
    policy = ScriptedPolicy(accuracy=accuracy)
    # A fresh app around the example's own handler and validator (see test_math_agent).
    app = AgentCoreRLApp(store=store)
    app.rollout_entrypoint(agent.solve)
    app.payload_validator(validate_payload)
    async with (
        BackgroundServer(policy) as policy_server,
        BackgroundServer(app) as server,
        httpx.AsyncClient(base_url=server.url) as http,
    ):
        yield Stack(app, http, policy, policy_server.url + "/v1", store, bucket)


@pytest.fixture
async def store(s3_endpoint: str) -> AsyncIterator[ResultStore]:
    result_store = ResultStore(endpoint_url=s3_endpoint, retry=FAST_RETRY)
    try:
        yield result_store
    finally:
        await result_store.aclose()


async def test_a_strands_rollout_uses_the_calculator_and_earns_the_reward(
    store: ResultStore, bucket: str
) -> None:
    async with _stack(store, bucket, accuracy=1.0) as stack:
        envelope = await stack.rollout()
    assert envelope["status_code"] == 200
    assert envelope["rewards"] == [1.0]
    assert envelope["answer"] == "The answer is 14."
    assert envelope["metrics"]["tool_calls"] == 1
    assert envelope["metrics"]["prompt_tokens"] > 0
    assert stack.policy.requests == 2
    tool_results = [
        block["toolResult"]
        for message in envelope["messages"]
        for block in message["content"]
        if "toolResult" in block
    ]
    assert [r["content"][0]["text"] for r in tool_results] == ["14"]


async def test_a_wrong_policy_earns_nothing(store: ResultStore, bucket: str) -> None:
    async with _stack(store, bucket, accuracy=0.0) as stack:
        envelope = await stack.rollout()
    assert envelope["status_code"] == 200
    assert envelope["rewards"] == [0.0]
    assert envelope["answer"] != "The answer is 14."


async def test_the_production_agent_answers_directly(
    store: ResultStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    policy = ScriptedPolicy(accuracy=1.0)
    app = AgentCoreRLApp(store=store)
    app.entrypoint(production_agent.answer)
    async with BackgroundServer(policy) as policy_server:
        monkeypatch.setenv("OPENAI_BASE_URL", policy_server.url + "/v1")
        async with BackgroundServer(app) as server, httpx.AsyncClient(base_url=server.url) as http:
            response = await http.post("/invocations", json={"prompt": PROBLEM})
    assert response.status_code == 200
    assert response.json() == {"answer": "The answer is 14."}
