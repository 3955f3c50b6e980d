"""LocalStack: embedded S3, stand-in policy, real agent servers and the local runtime.

Clients here get NO endpoint argument: they find the local runtime and S3 through the
environment the stack sets, exactly as code written for real AWS would.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import sys
from typing import Any

import httpx
import pytest
from aiobotocore.config import AioConfig
from aiobotocore.session import get_session

from agentcore_rl.errors import ConfigurationError
from agentcore_rl.local.policy import ScriptedPolicy
from agentcore_rl.local.stack import LocalStack, PolicyEndpoint, StackS3, load_app
from agentcore_rl.protocol import new_session_id
from agentcore_rl.s3 import ResultStore
from agentcore_rl.server import AgentCoreRLApp, RequestContext
from agentcore_rl.server.runner import RolloutRunner

NO_RETRY = AioConfig(retries={"total_max_attempts": 1})
MATH_AGENT = "examples.math_agent.agent:app"


class EchoAgents:
    """A factory of real agent servers whose rollouts return the payload's ``x``."""

    def __init__(self) -> None:
        self.apps: list[AgentCoreRLApp] = []

    def __call__(self) -> AgentCoreRLApp:
        app = AgentCoreRLApp()

        @app.rollout_entrypoint
        async def solve(payload: dict[str, Any], context: RequestContext) -> dict[str, Any]:
            return {"rewards": [1.0], "x": payload["x"], "seen_session": context.session_id}

        self.apps.append(app)
        return app

    async def wait_idle(self) -> None:
        """Until every accepted rollout has delivered its envelope."""
        for app in self.apps:
            assert await RolloutRunner.wait(app.runner.jobs, within=5)


async def invoke(stack: LocalStack, client: Any, session_id: str, payload: dict[str, Any]) -> Any:
    response = await client.invoke_agent_runtime(
        agentRuntimeArn=stack.agent_runtime_arn,
        runtimeSessionId=session_id,
        payload=json.dumps(payload).encode(),
    )
    async with response["response"] as stream:
        return json.loads(await stream.read())


async def refused(url: str) -> bool:
    async with httpx.AsyncClient(timeout=5) as http:
        try:
            await http.get(url)
        except httpx.ConnectError:
            return True
    return False


async def test_embedded_stack_round_trip_lands_the_result_in_its_s3() -> None:
    before = dict(os.environ)
    agents = EchoAgents()
    sid = new_session_id()
    async with LocalStack(app_factory=agents, agents=2, tps=None) as stack:
        assert stack.embedded_s3
        assert os.environ["AWS_ENDPOINT_URL_BEDROCK_AGENTCORE"] == stack.runtime_endpoint_url
        assert os.environ["AWS_ENDPOINT_URL_S3"] == stack.s3_endpoint_url
        assert len(stack.agent_urls) == 2
        assert len(agents.apps) == 2
        assert stack.policy_base_url is not None
        assert stack.policy_base_url.endswith("/v1")
        rollout = {"exp_id": "e1", "input_id": "q-1", "s3_bucket": stack.bucket}
        async with get_session().create_client(
            "bedrock-agentcore", region_name=stack.region, config=NO_RETRY
        ) as client:
            answer = await invoke(stack, client, sid, {"x": 41, "_rollout": rollout})
            assert answer["status"] == "processing"
            await agents.wait_idle()
            async with ResultStore() as store:
                envelope = await store.get_json(stack.bucket, answer["result_key"])
            await client.stop_runtime_session(
                agentRuntimeArn=stack.agent_runtime_arn, runtimeSessionId=sid
            )
        assert envelope is not None
        assert envelope["x"] == 41
        assert envelope["seen_session"] == sid
        assert envelope["status_code"] == 200
        assert stack.runtime is not None
        assert stack.runtime.counts["InvokeAgentRuntime"] == 1
        urls = [stack.runtime_endpoint_url, stack.s3_endpoint_url, *stack.agent_urls]
        urls.append(stack.policy_base_url + "/models")
    assert dict(os.environ) == before
    for url in urls:
        assert url is not None
        assert await refused(url)
    await stack.aclose()  # idempotent


async def test_import_string_math_agent_end_to_end(
    s3_endpoint: str, bucket: str, store: ResultStore
) -> None:
    """The example agent, imported afresh per server, solving problems with the policy."""
    sessions = [new_session_id() for _ in range(4)]
    keys = []
    async with LocalStack(
        MATH_AGENT, agents=2, s3=StackS3(endpoint_url=s3_endpoint, bucket=bucket), tps=None
    ) as stack:
        assert not stack.embedded_s3
        async with get_session().create_client(
            "bedrock-agentcore", region_name=stack.region, config=NO_RETRY
        ) as client:
            for n, sid in enumerate(sessions):
                payload = {
                    "prompt": f"Sam has {n} apples. He buys 3 more. How many apples now?",
                    "answer": str(n + 3),
                    "_rollout": {
                        "exp_id": "math",
                        "input_id": f"q-{n}",
                        "s3_bucket": bucket,
                        "base_url": stack.policy_base_url,
                        "model_id": stack.policy_model,
                    },
                }
                keys.append((await invoke(stack, client, sid, payload))["result_key"])
        assert stack.runtime is not None
        owners = {stack.runtime.session_agent(stack.agent_runtime_arn, s) for s in sessions}
        assert owners == set(stack.agent_urls)
    # Leaving the stack drained the agents: every result is in the (shared) moto S3.
    for key, sid in zip(keys, sessions, strict=True):
        envelope = await store.get_json(bucket, key)
        assert envelope is not None
        assert envelope["status_code"] == 200
        assert envelope["rewards"][0] in (0.0, 1.0)
        assert envelope["metrics"]["session_id"] == sid


async def test_cancellation_stops_everything_and_restores_the_environment() -> None:
    before = dict(os.environ)
    up = asyncio.Event()
    seen: list[str] = []

    async def run() -> None:
        async with LocalStack(app_factory=EchoAgents(), agents=1, tps=None) as stack:
            assert stack.runtime_endpoint_url is not None
            assert stack.s3_endpoint_url is not None
            seen.extend([stack.runtime_endpoint_url, stack.s3_endpoint_url, *stack.agent_urls])
            up.set()
            await asyncio.Event().wait()

    task = asyncio.create_task(run())
    await asyncio.wait_for(up.wait(), 20)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert dict(os.environ) == before
    for url in seen:
        assert await refused(url)


async def test_a_failed_start_cleans_up_what_had_started() -> None:
    before = dict(os.environ)
    calls = 0

    def broken_factory() -> Any:
        nonlocal calls
        calls += 1
        raise RuntimeError("agent import failed")

    stack = LocalStack(app_factory=broken_factory)
    with pytest.raises(RuntimeError, match="agent import failed"):
        await stack.start()
    assert calls == 1
    assert dict(os.environ) == before
    assert stack.s3_endpoint_url is not None
    assert await refused(stack.s3_endpoint_url)


async def test_external_policy_and_s3_endpoint_leave_credentials_alone(
    s3_endpoint: str, bucket: str
) -> None:
    async with LocalStack(
        app_factory=EchoAgents(),
        agents=1,
        s3=StackS3(endpoint_url=s3_endpoint, bucket=bucket),
        policy=PolicyEndpoint("http://127.0.0.1:9/v1", model="my-model"),
    ) as stack:
        assert stack.policy is None
        assert stack.policy_base_url == "http://127.0.0.1:9/v1"
        assert stack.policy_model == "my-model"
        assert os.environ["AWS_ENDPOINT_URL_S3"] == s3_endpoint
        assert os.environ["AWS_ACCESS_KEY_ID"] == "testing"  # the caller's, untouched
        assert stack.environment["AWS_ENDPOINT_URL_BEDROCK_AGENTCORE"] == (
            stack.runtime_endpoint_url
        )
        assert "AWS_ACCESS_KEY_ID" not in stack.environment


def test_load_app_makes_a_fresh_app_each_time() -> None:
    before = sys.modules.get("examples.math_agent.agent")
    first, second = load_app(MATH_AGENT), load_app(MATH_AGENT)
    assert isinstance(first, AgentCoreRLApp)
    assert first is not second
    assert sys.modules.get("examples.math_agent.agent") is before


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({}, "exactly one of app or app_factory"),
        ({"app": MATH_AGENT, "app_factory": EchoAgents()}, "exactly one"),
        ({"app": MATH_AGENT, "agents": 0}, "agents must be >= 1"),
        ({"app": "examples.math_agent.agent"}, "package.module:attribute"),
        ({"app": "no_such_module_here:app"}, "no module 'no_such_module_here'"),
        ({"app": 42}, "ASGI app"),
        ({"app": MATH_AGENT, "agent_runtime_arn": "arn:nope"}, "not an AgentCore Runtime ARN"),
    ],
)
def test_bad_configuration_is_refused(kwargs: dict[str, Any], words: str) -> None:
    with pytest.raises(ConfigurationError, match=words):
        LocalStack(**kwargs)
    with pytest.raises(ConfigurationError, match="not a valid S3 bucket"):
        StackS3(bucket="Bad_Bucket")


def test_a_moved_keyword_says_where_it_lives_now() -> None:
    with pytest.raises(TypeError, match=r"policy=PolicyEndpoint\(\.\.\.\)"):
        LocalStack(MATH_AGENT, policy_base_url="http://127.0.0.1:9/v1")  # type: ignore[call-arg]
    with pytest.raises(TypeError, match=r"serving=Serving\(latency=\.\.\.\)"):
        ScriptedPolicy(latency=1.0)  # type: ignore[call-arg]


# --- the embedded S3 on its own (the session's server, tests/conftest.py) ------------------


def test_embedded_s3_keeps_the_connection_alive(s3_endpoint: str) -> None:
    """Two requests on one connection, both answered, none saying ``Connection: close``:
    clients reuse connections as with real S3 (werkzeug's dev server closed every one)."""
    url = httpx.URL(s3_endpoint)
    assert url.port is not None
    conn = http.client.HTTPConnection(url.host, url.port, timeout=5)
    try:
        sockets = []
        for _ in range(2):
            conn.request("GET", "/")  # ListBuckets
            response = conn.getresponse()
            response.read()
            assert response.status == 200
            assert response.getheader("Connection") is None
            assert not response.will_close
            sockets.append(conn.sock)  # http.client drops a socket the server closes
        assert sockets[0] is not None
        assert sockets[0] is sockets[1]
    finally:
        conn.close()


async def test_embedded_s3_keeps_underscores_in_metadata_keys(
    s3_endpoint: str, bucket: str
) -> None:
    # WSGI folds "_" and "-" into one environ key; S3 tells my_key from my-key.
    metadata = {"foo_bar": "1", "plain-key": "2"}
    async with get_session().create_client("s3", endpoint_url=s3_endpoint, config=NO_RETRY) as s3:
        await s3.put_object(Bucket=bucket, Key="meta", Body=b"x", Metadata=metadata)
        head = await s3.head_object(Bucket=bucket, Key="meta")
    assert head["Metadata"] == metadata
