"""The math agent served by a real AgentCoreRLApp (uvicorn on loopback), talking to the
scripted policy through the OpenAI SDK and writing its result to moto S3."""

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
from examples.math_agent import agent
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

    def payload(self, **fields: Any) -> dict[str, Any]:
        body: dict[str, Any] = {"prompt": PROBLEM, "answer": "14"}
        body.update(fields)
        body["_rollout"] = {
            "exp_id": "math",
            "input_id": "q-1",
            "s3_bucket": self.bucket,
            "base_url": self.policy_url,
            "model_id": self.policy.model,
        }
        return body

    async def rollout(self, payload: dict[str, Any]) -> tuple[httpx.Response, dict[str, Any]]:
        """Invoke, wait for the background rollout to deliver, read its envelope."""
        response = await self.http.post(
            "/invocations", json=payload, headers={SESSION_ID_HEADER: new_session_id()}
        )
        assert response.status_code == 200, response.text
        assert await self.app.runner.wait(self.app.runner.jobs, 10)
        envelope = await self.store.get_json(self.bucket, response.json()["result_key"])
        assert envelope is not None
        return response, envelope


@contextlib.asynccontextmanager
async def _stack(store: ResultStore, bucket: str, accuracy: float) -> AsyncIterator[Stack]:
    policy = ScriptedPolicy(accuracy=accuracy)
    # A fresh app per test around the example's own handler: an app is closed with its
    # server, and the module-level one belongs to whoever serves the module.
    app = AgentCoreRLApp(store=store)
    app.rollout_entrypoint(agent.solve)
    app.payload_validator(agent.validate_payload)
    async with (
        BackgroundServer(policy) as policy_server,
        BackgroundServer(app) as server,
        httpx.AsyncClient(base_url=server.url) as http,
    ):
        yield Stack(app, http, policy, policy_server.url + "/v1", store, bucket)


@pytest.fixture
async def stack(s3_endpoint: str, bucket: str) -> AsyncIterator[Stack]:
    store = ResultStore(endpoint_url=s3_endpoint, retry=FAST_RETRY)
    try:
        async with _stack(store, bucket, accuracy=1.0) as value:
            yield value
    finally:
        await store.aclose()


@pytest.fixture
async def wrong_stack(s3_endpoint: str, bucket: str) -> AsyncIterator[Stack]:
    store = ResultStore(endpoint_url=s3_endpoint, retry=FAST_RETRY)
    try:
        async with _stack(store, bucket, accuracy=0.0) as value:
            yield value
    finally:
        await store.aclose()


async def test_rollout_uses_the_calculator_and_earns_the_reward(stack: Stack) -> None:
    _, envelope = await stack.rollout(stack.payload())
    assert envelope["status_code"] == 200
    assert envelope["rewards"] == [1.0]
    assert envelope["answer"] == "The answer is 14."
    assert envelope["metrics"]["tool_calls"] == 1
    assert envelope["turns"] == 2
    assert envelope["metrics"]["prompt_tokens"] > 0
    tool_message = next(m for m in envelope["messages"] if m["role"] == "tool")
    assert tool_message["content"] == "14"
    assert stack.policy.requests == 2


async def test_a_wrong_policy_earns_nothing(wrong_stack: Stack) -> None:
    _, envelope = await wrong_stack.rollout(wrong_stack.payload())
    assert envelope["status_code"] == 200
    assert envelope["rewards"] == [0.0]
    assert envelope["answer"] != "The answer is 14."


@pytest.mark.parametrize(
    ("fields", "field", "message"),
    [
        ({"prompt": 42}, "prompt", "prompt must be a string, got int"),
        ({"answer": 14}, "answer", "answer must be a string, got int"),
        ({"answer": None}, "answer", "answer must be a string, got nothing"),
        ({"prompt": ["a"]}, "prompt", "prompt must be a string, got list"),
        ({"prompt": "   "}, "prompt", "prompt must not be empty"),
    ],
)
async def test_bad_payloads_get_a_400_and_never_reach_the_model(
    stack: Stack, fields: dict[str, Any], field: str, message: str
) -> None:
    response = await stack.http.post(
        "/invocations",
        json=stack.payload(**fields),
        headers={SESSION_ID_HEADER: new_session_id()},
    )
    assert response.status_code == 400
    assert response.json() == {"error": message, "field": field}
    assert stack.app.runner.active == 0
    assert stack.policy.requests == 0
    assert await stack.store.list_keys(stack.bucket, "math/") == []


async def test_a_payload_without_a_policy_address_is_refused(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    payload = stack.payload()
    del payload["_rollout"]["base_url"]
    response = await stack.http.post("/invocations", json=payload)
    assert response.status_code == 400
    assert "_rollout.base_url is required" in response.json()["error"]
    assert stack.policy.requests == 0


def test_validate_payload_reads_the_policy_address_from_rollout() -> None:
    task = agent.validate_payload(
        {
            "prompt": "What is 2 + 2?",
            "answer": "4",
            "_rollout": {"base_url": "http://h/v1", "model_id": "m", "temperature": 0.5},
        }
    )
    assert (task.base_url, task.model_id, dict(task.sampling)) == (
        "http://h/v1",
        "m",
        {"temperature": 0.5},
    )


async def test_the_production_agent_answers_directly(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    from examples.math_agent import production_agent

    monkeypatch.setenv("OPENAI_BASE_URL", stack.policy_url)
    app = AgentCoreRLApp(store=stack.store)
    app.entrypoint(production_agent.answer)
    app.payload_validator(lambda payload: agent.validate_payload(payload, require_answer=False))
    async with BackgroundServer(app) as server, httpx.AsyncClient(base_url=server.url) as http:
        response = await http.post("/invocations", json={"prompt": PROBLEM})
        assert response.status_code == 200
        assert response.json() == {"answer": "The answer is 14."}
        refused = await http.post("/invocations", json={"question": PROBLEM})
        assert refused.status_code == 400
        assert refused.json()["field"] == "prompt"
