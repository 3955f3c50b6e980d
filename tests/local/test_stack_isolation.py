"""A local stack keeps to itself: its own S3 unless told otherwise, its own spool.

Every test here runs with HTTPS/HTTP proxies pointed at a closed loopback port, so a
request meant for anything but loopback fails at once instead of leaving the machine.
"""

from __future__ import annotations

import json
import logging
import socket
from pathlib import Path
from typing import Any

import httpx
import pytest

from agentcore_rl import protocol
from agentcore_rl.errors import ConfigurationError
from agentcore_rl.local.stack import LocalStack, StackS3
from agentcore_rl.protocol import new_session_id
from agentcore_rl.s3 import ResultStore
from agentcore_rl.server import AgentCoreRLApp, RequestContext
from agentcore_rl.server.options import default_spool_dir, handler_app_name


async def solve(payload: dict[str, Any], context: RequestContext) -> dict[str, Any]:
    return {"rewards": [1.0], "x": payload["x"]}


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


@pytest.fixture(autouse=True)
def nothing_leaves_loopback(monkeypatch: pytest.MonkeyPatch) -> None:
    proxy = f"http://127.0.0.1:{closed_port()}"
    for name in ("HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy"):
        monkeypatch.setenv(name, proxy)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")


def agent() -> AgentCoreRLApp:
    app = AgentCoreRLApp()
    app.rollout_entrypoint(solve)
    return app


async def run_one(stack: LocalStack, app: AgentCoreRLApp, x: int) -> dict[str, Any]:
    """One rollout through the first agent server; its envelope from the stack's S3."""
    rollout = {"exp_id": "e1", "input_id": f"q-{x}", "s3_bucket": stack.bucket}
    async with httpx.AsyncClient(timeout=10) as http:
        answer = await http.post(
            f"{stack.agent_urls[0]}{protocol.INVOCATIONS_PATH}",
            json={"x": x, "_rollout": rollout},
            headers={protocol.SESSION_ID_HEADER: new_session_id()},
        )
    assert answer.status_code == 200
    assert await app.runner.wait(app.runner.jobs, within=10)
    async with ResultStore(endpoint_url=stack.s3_endpoint_url) as store:
        envelope = await store.get_json(stack.bucket, answer.json()["result_key"])
    assert envelope is not None
    return envelope


async def test_naming_a_bucket_keeps_the_embedded_s3() -> None:
    app = agent()
    async with LocalStack(app, agents=1, s3=StackS3(bucket="mine"), tps=None) as stack:
        assert stack.embedded_s3
        assert stack.s3_endpoint_url is not None
        assert stack.s3_endpoint_url.startswith("http://127.0.0.1:")
        envelope = await run_one(stack, app, 7)
    assert envelope["x"] == 7
    assert envelope[protocol.STATUS_CODE] == 200


async def test_an_app_built_before_the_stack_writes_to_the_stacks_s3() -> None:
    app = agent()  # its store exists before the stack has set any S3 endpoint
    async with LocalStack(app, agents=1, tps=None) as stack:
        envelope = await run_one(stack, app, 8)
        assert app.spool.pending == 0
    assert envelope["x"] == 8


def test_real_s3_only_when_asked_for() -> None:
    with pytest.raises(ConfigurationError, match="needs the bucket"):
        StackS3(aws=True)
    with pytest.raises(ConfigurationError, match="not both"):
        StackS3(endpoint_url="http://127.0.0.1:9", bucket="mine", aws=True)
    with pytest.raises(ConfigurationError, match="s3 must be a StackS3"):
        LocalStack(agent(), s3="aws")  # type: ignore[arg-type]
    assert not LocalStack(agent(), s3=StackS3(bucket="mine", aws=True)).embedded_s3


def foreign_record(owner: str | None) -> bytes:
    """An envelope another agent spooled for an S3 that is not this stack's."""
    key = f"exp/q-9/session-{'f' * 40}.json"
    record: dict[str, Any] = {"bucket": "agentcore-rl-local", "key": key, "body": "{}"}
    if owner is not None:
        record["owner"] = owner
        record["destination"] = {"endpoint_url": "http://127.0.0.1:9", "region": "us-east-1"}
    return json.dumps(record).encode()


async def test_a_stack_run_neither_delivers_nor_reports_foreign_envelopes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Left in the user's default spool by other agents (one with no owner at all).
    base = default_spool_dir()
    name = handler_app_name(solve)
    foreign = {
        base / "00000000000000000001-aaaa.json": foreign_record(None),
        base / name / "00000000000000000002-bbbb.json": foreign_record(name),
        base / name / "00000000000000000003-cccc.json": foreign_record(None),
    }
    for path, data in foreign.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    app = agent()
    with caplog.at_level(logging.INFO):
        async with LocalStack(app, agents=1, tps=None) as stack:
            private = stack.spool_dir
            assert private is not None
            assert app.spool.directory == private
            await run_one(stack, app, 9)
            async with ResultStore(endpoint_url=stack.s3_endpoint_url) as store:
                assert not await store.head(stack.bucket, f"exp/q-9/session-{'f' * 40}.json")
    assert {path: path.read_bytes() for path in foreign} == foreign
    assert not private.exists()
    assert "could not be written" not in caplog.text
    assert "undelivered" not in caplog.text


def test_private_spool_is_removed_even_when_envelopes_are_left(tmp_path: Path) -> None:
    # Embedded S3 is gone with the stack: what waits for it can never be delivered.
    stack = LocalStack(agent())
    leftover = tmp_path / "spool"
    leftover.mkdir()
    (leftover / "00000000000000000001-aaaa.json").write_bytes(foreign_record("x"))
    stack._remove_spool(leftover)
    assert not leftover.exists()
