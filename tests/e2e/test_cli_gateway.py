"""``agentcore-rl gateway`` and ``agentcore-rl eval --gateway-url`` end to end: the gateway as
its own process (the CLI command), the math agent on the local stack, moto S3. Every done
rollout gets one trajectory line beside the results, also across a SIGKILL and ``--resume``."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from agentcore_rl.cli import main
from agentcore_rl.cli.journal import trajectories_path_for
from agentcore_rl.local.policy import ScriptedPolicy, Serving
from tests.e2e.test_cli_eval import REPO, Gate, _lines, _spawn_eval, _stack, _wait_until
from tests.e2e.test_cli_eval import _write_problems as write_problems

TOKEN = "e2e-admin-token"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextlib.asynccontextmanager
async def _gateway_process(upstream: str) -> AsyncIterator[str]:
    """``agentcore-rl gateway`` in its own process, until it answers ``GET /health``."""
    port = _free_port()
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "agentcore_rl.cli", "gateway", "--upstream", upstream,
        "--port", str(port), "--admin-token", TOKEN,
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient(timeout=2.0) as http:
            for _ in range(400):  # bounded: 20 s
                assert process.returncode is None, "the gateway exited during startup"
                with contextlib.suppress(httpx.HTTPError):
                    if (await http.get(url + "/health")).json()["status"] == "ok":
                        break
                await asyncio.sleep(0.05)
            else:
                pytest.fail("the gateway did not start")
        yield url
    finally:
        await _stop_cleanly(process)


async def _stop_cleanly(process: asyncio.subprocess.Process) -> None:
    """Ctrl-C the gateway (SIGKILL past 15 s); it must not have printed a traceback."""
    process.send_signal(signal.SIGINT)
    try:
        await asyncio.wait_for(process.wait(), 15)
    except TimeoutError:
        process.kill()
        await process.wait()
    assert process.stderr is not None
    err = (await process.stderr.read()).decode()
    assert "Traceback" not in err, err


def _argv(stack_bucket: str, s3: str, data: Path, out: Path, exp_id: str, gw: str) -> list[str]:
    return [
        "eval", str(data), "--s3-bucket", stack_bucket, "--exp-id", exp_id, "--out", str(out),
        "--s3-endpoint-url", s3, "--timeout", "30", "--tps", "0", "--no-progress",
        "--gateway-url", gw, "--gateway-admin-token", TOKEN,
    ]  # fmt: skip


def _check_trajectories(out: Path, n: int) -> list[dict[str, object]]:
    results = {r["session_id"]: r for r in _lines(out)}
    lines = _lines(trajectories_path_for(out))
    assert len(lines) == n
    assert {line["session_id"] for line in lines} == set(results)  # one each, no repeats
    for line in lines:
        result = results[line["session_id"]]
        assert line["input_id"] == result["input_id"]
        assert line["reward"] == result["reward"]
        assert line["tokens_captured"] > 0
        segments = line["segments"]
        assert isinstance(segments, list)
        assert segments
        assert all(len(s["token_ids"]) == len(s["loss_mask"]) for s in segments)
    return lines


async def test_eval_through_the_gateway_writes_one_trajectory_per_rollout(
    s3_endpoint: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = ScriptedPolicy(accuracy=0.5, seed=1)
    async with (
        _stack(s3_endpoint, policy) as stack,
        _gateway_process(str(stack.policy_base_url)) as gateway,
    ):
        write_problems(tmp_path / "in.jsonl", 6)
        out = tmp_path / "results.jsonl"
        argv = _argv(stack.bucket, s3_endpoint, tmp_path / "in.jsonl", out, "gw", gateway)
        argv += ["--agent-url", stack.agent_urls[0], "--model-id", policy.model]
        code = await asyncio.to_thread(main, argv)
    assert code == 0
    assert {r["outcome"] for r in _lines(out)} == {"done"}
    lines = _check_trajectories(out, 6)
    assert {line["merges"] for line in lines} <= {0, 1}
    printed = capsys.readouterr().out
    assert "tokens per rollout, all calls" in printed
    assert str(trajectories_path_for(out).resolve()) in printed


async def test_resume_after_sigkill_still_collects_every_trajectory(
    s3_endpoint: str, tmp_path: Path
) -> None:
    gate = Gate(free=4)  # two rollouts (two calls each) go through; the third blocks
    policy = ScriptedPolicy(accuracy=1.0, serving=Serving(latency=0.001), sleep=gate.sleep)
    n = 5
    async with (
        _stack(s3_endpoint, policy) as stack,
        _gateway_process(str(stack.policy_base_url)) as gateway,
    ):
        write_problems(tmp_path / "in.jsonl", n)
        out = tmp_path / "results.jsonl"
        journal = tmp_path / "results.jsonl.journal"
        argv = _argv(stack.bucket, s3_endpoint, tmp_path / "in.jsonl", out, "gwkill", gateway)
        argv += ["--agent-url", stack.agent_urls[0], "--concurrency", "1"]
        argv += ["--model-id", policy.model]
        process = await _spawn_eval(argv, stderr=subprocess.DEVNULL)
        try:
            await _wait_until(
                process,
                lambda: len(_lines(out)) == 2 and len(_lines(journal)) == 3 and gate.held > 0,
                "two outcomes and a third rollout running on the agent",
            )
        finally:
            process.send_signal(signal.SIGKILL)
            await asyncio.wait_for(process.wait(), 10)
        # The worst case, for certain: killed between the second results line and its
        # trajectory line (resume builds it from the trace in S3).
        trajectories = trajectories_path_for(out)
        kept = trajectories.read_text().splitlines(keepends=True)[:1]
        trajectories.write_text("".join(kept))

        gate.opened.set()  # the orphaned rollout finishes; its session is still open
        code = await asyncio.to_thread(main, [*argv, "--resume"])
        async with httpx.AsyncClient(headers={"x-admin-token": TOKEN}) as http:
            stats = (await http.get(gateway + "/admin/stats")).json()
        assert stats["live_sessions"] == 0  # the orphan's too: finished by the resumed run

    assert code == 0
    records = _lines(out)
    assert len(records) == n
    assert {r["outcome"] for r in records} == {"done"}
    assert sum(1 for r in records if r["reattached"]) == 1
    lines = _check_trajectories(out, n)
    reattached = next(r for r in records if r["reattached"])
    line = next(x for x in lines if x["session_id"] == reattached["session_id"])
    assert line["merges"] == 1  # the orphan's two calls, captured across the kill
    assert policy.requests == 2 * n


def test_gateway_help_and_bad_upstream(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["gateway", "--help"]) == 0
    assert "--upstream" in capsys.readouterr().out
    assert main(["gateway", "--upstream", "nope"]) == 2
    assert "expected an http(s):// URL" in capsys.readouterr().err


def test_eval_refuses_a_gateway_with_base_url(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "in.jsonl"
    data.write_text(json.dumps({"id": "q-1", "prompt": "2+2?", "answer": "4"}) + "\n")
    argv = ["eval", str(data), "--agent-url", "http://127.0.0.1:9", "--s3-bucket", "bkt"]
    argv += ["--exp-id", "e", "--gateway-url", "http://127.0.0.1:9000"]
    argv += ["--base-url", "http://127.0.0.1:8000/v1"]
    assert main(argv) == 2
    assert "--gateway-url or --base-url" in capsys.readouterr().err
