"""``agentcore-rl eval`` checks every service it was given before the first rollout: a
gateway that cannot be reached or refuses the token, a runtime that does not serve the ARN,
a gateway without a token. Each is one line on stderr, its exit code, and no file left
behind. The real CLI runs in a subprocess; the services are real servers on loopback."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from agentcore_rl import AsyncRolloutClient, AwsConfig
from agentcore_rl.errors import AgentCoreRLError
from agentcore_rl.gateway import RolloutGateway
from agentcore_rl.local.background import BackgroundServer
from agentcore_rl.local.policy import ScriptedPolicy
from agentcore_rl.local.stack import LocalStack
from tests.e2e.test_cli_eval import _stack, _write_problems

TOKEN = "preflight-token"
OTHER_ARN = "arn:aws:bedrock-agentcore:us-west-2:123456789012:runtime/not_served"


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def _cli(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "AGENTCORE_RL_GATEWAY_ADMIN_TOKEN"}
    return await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "agentcore_rl.cli", *argv],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture
def work(tmp_path: Path) -> Path:
    """The CLI's working directory (the test's own files live beside it)."""
    path = tmp_path / "run"
    path.mkdir()
    return path


@pytest.fixture
async def stack(s3_endpoint: str) -> AsyncIterator[LocalStack]:
    async with _stack(s3_endpoint, ScriptedPolicy(accuracy=1.0)) as value:
        yield value


@pytest.fixture
async def gateway(stack: LocalStack) -> AsyncIterator[str]:
    served = RolloutGateway(str(stack.policy_base_url), admin_token=TOKEN)
    async with BackgroundServer(served) as server:
        yield server.url


def _argv(stack: LocalStack, data: Path, *target: str) -> list[str]:
    assert stack.s3_endpoint_url is not None
    return [
        "eval", str(data), *target, "--s3-bucket", stack.bucket, "--exp-id", "pre",
        "--s3-endpoint-url", stack.s3_endpoint_url, "--timeout", "30",
    ]  # fmt: skip


def _one_line(done: subprocess.CompletedProcess[str], code: int, words: str) -> None:
    assert (done.returncode, words) == (code, words if words in done.stderr else done.stderr)
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr  # no progress bar either
    assert "Traceback" not in done.stderr


def _nothing_written(cwd: Path, data: Path) -> None:
    assert sorted(cwd.iterdir()) == [data]  # no results, journal or trajectories file


@pytest.mark.parametrize("problem", ["unreachable", "wrong token", "admin off"])
async def test_a_gateway_that_cannot_serve_the_run_exits_3_before_anything_starts(
    stack: LocalStack, gateway: str, work: Path, problem: str
) -> None:
    data = work / "in.jsonl"
    _write_problems(data, 3)
    argv = _argv(stack, data, "--agent-url", stack.agent_urls[0])
    if problem == "unreachable":
        argv += ["--gateway-url", f"http://127.0.0.1:{_closed_port()}"]
        argv += ["--gateway-admin-token", TOKEN]
        words = "cannot reach the gateway at http://127.0.0.1:"
    elif problem == "wrong token":
        argv += ["--gateway-url", gateway, "--gateway-admin-token", "not-the-token"]
        words = "refuses the admin token (--gateway-admin-token)"
    else:
        async with BackgroundServer(RolloutGateway(str(stack.policy_base_url))) as other:
            argv += ["--gateway-url", other.url, "--gateway-admin-token", TOKEN]
            done = await _cli(argv, work)
        _one_line(done, 3, "has its admin routes off")
        _nothing_written(work, data)
        return
    done = await _cli(argv, work)
    _one_line(done, 3, words)
    _nothing_written(work, data)


async def test_a_gateway_without_a_token_is_a_usage_error_naming_the_flag(work: Path) -> None:
    data = work / "in.jsonl"
    _write_problems(data, 2)
    done = await _cli(
        ["eval", str(data), "--agent-url", "http://127.0.0.1:9", "--s3-bucket", "b-1",
         "--exp-id", "e", "--gateway-url", "http://127.0.0.1:9"],
        work,
    )  # fmt: skip
    _one_line(done, 2, "--gateway-url needs the gateway's admin token: --gateway-admin-token")
    assert "gateway_admin_token" not in done.stderr
    _nothing_written(work, data)


async def test_a_runtime_that_does_not_serve_the_arn_exits_3(stack: LocalStack, work: Path) -> None:
    data = work / "in.jsonl"
    _write_problems(data, 2)
    assert stack.runtime_endpoint_url is not None
    target = ("--agent-runtime-arn", OTHER_ARN, "--endpoint-url", stack.runtime_endpoint_url)
    done = await _cli(_argv(stack, data, *target), work)
    _one_line(done, 3, f"does not serve runtime {OTHER_ARN}")
    _nothing_written(work, data)


async def test_the_served_runtime_and_a_good_gateway_pass_the_checks(
    stack: LocalStack, gateway: str, work: Path
) -> None:
    data = work / "in.jsonl"
    _write_problems(data, 2)
    assert stack.runtime_endpoint_url is not None
    target = ("--agent-runtime-arn", stack.agent_runtime_arn)
    argv = _argv(stack, data, *target, "--endpoint-url", stack.runtime_endpoint_url)
    argv += ["--gateway-url", gateway, "--gateway-admin-token", TOKEN, "--no-progress"]
    argv += ["--out", str(work / "out.jsonl")]
    done = await _cli(argv, work)
    assert done.returncode == 0, done.stderr
    assert "mean reward" in done.stdout


@pytest.mark.parametrize("wrong", ["runtime", "s3"])
async def test_entering_a_client_checks_as_eval_does_with_its_one_line_error(
    stack: LocalStack, work: Path, wrong: str
) -> None:
    """The Python client fails on entry with the very line eval prints (no retries, no
    sessions); ``preflight=False`` leaves the checks out."""
    data = work / "in.jsonl"
    _write_problems(data, 1)
    closed = f"http://127.0.0.1:{_closed_port()}"
    runtime = closed if wrong == "runtime" else stack.runtime_endpoint_url
    s3 = closed if wrong == "s3" else stack.s3_endpoint_url
    assert runtime is not None
    assert s3 is not None
    argv = [
        "eval", str(data), "--agent-runtime-arn", stack.agent_runtime_arn, "--endpoint-url",
        runtime, "--s3-bucket", stack.bucket, "--exp-id", "pre", "--s3-endpoint-url", s3,
    ]  # fmt: skip
    done = await _cli(argv, work)
    assert done.returncode == 3
    options: dict[str, Any] = {
        "agent_runtime_arn": stack.agent_runtime_arn,
        "s3_bucket": stack.bucket,
        "exp_id": "pre",
        "aws": AwsConfig(endpoint_url=runtime, s3_endpoint_url=s3),
    }
    client = AsyncRolloutClient(**options)
    with anyio.fail_after(30):  # a bound, not a figure: docs/benchmarks.md has the time
        with pytest.raises(AgentCoreRLError) as caught:
            async with client:
                pass
    assert done.stderr.strip() == f"agentcore-rl: error: {caught.value}"
    assert client.stats.invocations == 0
    async with AsyncRolloutClient(**options, preflight=False) as unchecked:
        assert unchecked.stats.invocations == 0
