"""CLI errors: one clear line on stderr and an exit code scripts can use, never a traceback;
the demo end to end, and Ctrl-C during the demo."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from agentcore_rl.cli import main

REPO = Path(__file__).resolve().parents[2]
ARN = "arn:aws:bedrock-agentcore:us-west-2:123456789012:runtime/math"


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(argv)
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    return code, captured.err


@pytest.fixture
def data(tmp_path: Path) -> Path:
    path = tmp_path / "in.jsonl"
    path.write_text(json.dumps({"id": "q-1", "prompt": "What is 2 + 2?", "answer": "4"}) + "\n")
    return path


@pytest.mark.parametrize(
    "command", [[], ["demo"], ["eval"], ["serve"], ["local-runtime"], ["gateway"], ["up"]]
)
def test_every_command_has_help(command: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*command, "--help"]) == 0
    out = capsys.readouterr().out
    assert "usage: agentcore-rl" in out
    # The same exit codes in every help text, the internal error's included.
    assert "4 internal error (a bug" in " ".join(out.split())
    if command == ["local-runtime"]:
        assert "--log-level" in out
    if command == ["gateway"]:
        assert "inference server's kind" in " ".join(out.split())  # --backend has help


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["frobnicate"], "invalid choice: 'frobnicate'"),
        (["eval", "in.jsonl", "--agent-url", "http://a:1", "--exp-id", "e"], "--s3-bucket is"),
        (["eval", "in.jsonl", "--grup-size", "4"], "(did you mean --group-size?)"),
        (["up", "a:app", "--agnets", "3"], "(did you mean --agents?)"),
        (["eval", "x", "--agent-url", "nope", "--s3-bucket", "b", "--exp-id", "e"], "URL"),
        (["demo", "--accuracy", "1.5"], "must be between 0 and 1"),
        (["demo", "--n", "0"], "must be >= 1"),
        (["demo", "--concurrency", "many"], "expected a whole number"),
        (
            [
                *("eval", "x", "--agent-url", "http://127.0.0.1:9", "--s3-bucket", "bbb"),
                *("--exp-id", "e", "--retry-lost", "-1"),
            ],
            "must be >= 0",
        ),
        (["serve", "app:app", "--port", "70000"], "must be 0-65535"),
    ],
)
def test_bad_arguments_exit_2_with_one_clear_line(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = _run(argv, capsys)
    assert code == 2
    assert message in err
    assert len(err.strip().splitlines()) == 1


def test_no_command_shows_the_commands(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _run([], capsys)
    assert code == 2
    assert "local-runtime" in err
    assert "usage: agentcore-rl" in err


def test_bad_values_found_after_parsing_exit_2(
    data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["--agent-url", "http://127.0.0.1:9", "--exp-id", "e"]
    code, err = _run(["eval", str(tmp_path / "missing.jsonl"), *base, "--s3-bucket", "b-1"], capsys)
    assert (code, err.strip()) == (
        2,
        f"agentcore-rl: error: data file not found: {tmp_path}/missing.jsonl",
    )
    code, err = _run(["eval", str(data), *base, "--s3-bucket", "Bad_Bucket"], capsys)
    assert code == 2
    assert "not a valid S3 bucket name" in err
    code, err = _run(["eval", str(data), "--agent-runtime-arn", "arn:nope", "--s3-bucket",
                      "b-1", "--exp-id", "e"], capsys)  # fmt: skip
    assert code == 2
    assert "is not an AgentCore Runtime ARN" in err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a"}\n{"id": "a"}\n')
    code, err = _run(["eval", str(bad), *base, "--s3-bucket", "b-1"], capsys)
    assert code == 2
    assert "bad.jsonl:2: input id 'a' repeats line 1" in err
    for param in ("model_id=q", "input_id=x", "=3", "temperature"):
        code, err = _run(["eval", str(data), *base, "--s3-bucket", "b-1", "--param", param], capsys)
        assert code == 2
        assert "--param" in err
    code, err = _run(["serve", "no_such_module_here:app"], capsys)
    assert code == 2
    assert "cannot import 'no_such_module_here'" in err


def test_unreachable_agent_exits_3(
    data: Path, s3_endpoint: str, bucket: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = _run(
        ["eval", str(data), "--agent-url", "http://127.0.0.1:9", "--s3-bucket", bucket,
         "--exp-id", "e", "--s3-endpoint-url", s3_endpoint],
        capsys,
    )  # fmt: skip
    assert code == 3
    assert "cannot reach the agent at http://127.0.0.1:9" in err


def test_unreachable_or_missing_s3_exits_3(
    data: Path, s3_endpoint: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["eval", str(data), "--agent-runtime-arn", ARN, "--exp-id", "e",
            "--out", str(tmp_path / "out.jsonl")]  # fmt: skip
    code, err = _run([*argv, "--s3-bucket", "b-1", "--s3-endpoint-url", "http://127.0.0.1:9"],
                     capsys)  # fmt: skip
    assert code == 3
    assert "cannot use S3 bucket 'b-1' at http://127.0.0.1:9" in err
    code, err = _run([*argv, "--s3-bucket", "no-such-bucket", "--s3-endpoint-url", s3_endpoint],
                     capsys)  # fmt: skip
    assert code == 3
    assert "NoSuchBucket" in err


def test_unreachable_runtime_endpoint_exits_3(
    data: Path, s3_endpoint: str, bucket: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = _run(
        ["eval", str(data), "--agent-runtime-arn", ARN, "--s3-bucket", bucket, "--exp-id", "e",
         "--s3-endpoint-url", s3_endpoint, "--endpoint-url", "http://127.0.0.1:9"],
        capsys,
    )  # fmt: skip
    assert code == 3
    assert "cannot reach the AgentCore endpoint http://127.0.0.1:9" in err


def test_demo_runs_the_whole_stack(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "demo.jsonl"
    code = main(["demo", "--n", "12", "--latency", "0", "--no-progress", "--out", str(out)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(lines) == 12
    assert {line["outcome"] for line in lines} == {"done"}
    assert "S3 requests per rollout" in captured.out
    assert "over the ACR transport" in captured.err
    # Through the rollout gateway: tokens per rollout, one trajectory per rollout, and one
    # written out for a person to read.
    assert "tokens per rollout, all calls" in captured.out
    assert "segment merges / splits" in captured.out
    trajectories = tmp_path / "demo.trajectories.jsonl"
    assert len(trajectories.read_text().splitlines()) == 12
    # Two token counts, told apart: every call's prompt + completion vs the training segments.
    found = [json.loads(line) for line in trajectories.read_text().splitlines()]
    calls = sum(t["prompt_tokens"] + t["completion_tokens"] for t in found) / 12
    training = sum(len(s["token_ids"]) for t in found for s in t["segments"]) / 12
    assert re.search(rf"\ntokens per rollout, all calls +{calls:.1f}\n", captured.out)
    assert re.search(rf"\ntokens per rollout, training +{training:.1f}\n", captured.out)
    example = tmp_path / "demo.example.txt"
    assert f"one rollout to look at: {example}" in captured.out
    shown = example.read_text()
    assert "  [system]\n" in shown
    assert "tokens: segment 1 of 1" in shown
    # The stack put the environment back as it found it.
    assert "AWS_ENDPOINT_URL_BEDROCK_AGENTCORE" not in os.environ


async def test_ctrl_c_during_the_demo_exits_130_cleanly(tmp_path: Path) -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "agentcore_rl.cli", "demo", "--n", "300", "--latency", "0.2",
        "--no-progress", "--out", str(tmp_path / "out.jsonl"),
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    assert process.stderr is not None
    seen = b""
    try:
        while b"running 300 problems" not in seen:
            line = await asyncio.wait_for(process.stderr.readline(), 30)
            assert line, f"the demo exited early: {seen.decode()}"
            seen += line
        process.send_signal(signal.SIGINT)
        rest = await asyncio.wait_for(process.stderr.read(), 30)
        code = await asyncio.wait_for(process.wait(), 30)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    text = (seen + rest).decode()
    assert code == 130, text
    assert "Traceback" not in text
    assert "shutting down cleanly" in text


async def test_demo_base_url_uses_another_policy_server(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from agentcore_rl.local.background import BackgroundServer
    from agentcore_rl.local.policy import ScriptedPolicy, Serving

    # Any OpenAI-compatible server: here a second stand-in that is always right.
    policy = ScriptedPolicy(accuracy=1.0, serving=Serving(model="other-model"))
    out = tmp_path / "demo.jsonl"
    async with BackgroundServer(policy) as server:
        argv = ["demo", "--n", "4", "--no-progress", "--out", str(out)]
        argv += ["--base-url", server.url + "/v1", "--model-id", "other-model"]
        code = await asyncio.to_thread(main, argv)
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert f"the policy at {server.url}/v1" in captured.err
    # Two turns per rollout, all served by this policy: the 4 problems, then the same 4
    # as groups of 4 (the demo's line of group statistics).
    assert policy.requests == 2 * 4 + 2 * 4 * 4
    assert [json.loads(line)["reward"] for line in out.read_text().splitlines()] == [1.0] * 4


def test_a_missing_extra_is_told_from_a_user_s_missing_module() -> None:
    from agentcore_rl._extras import is_ours

    assert is_ours(ModuleNotFoundError("no httpx", name="httpx"))
    assert is_ours(ModuleNotFoundError("no moto", name="moto.server"))
    # A user's own module missing is not ours to explain.
    assert not is_ours(ModuleNotFoundError("no mylib", name="mylib"))


def test_eval_help_states_the_client_s_retry_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    # The CLI's parser must not import the client (the agent side shares it), so the help
    # text writes the defaults out: this keeps them equal to the client's constants.
    from agentcore_rl.client.config import DEFAULT_RETRY_LOST, DEFAULT_RETRY_ROLLOUTS

    assert main(["eval", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert f"(default: the client's, {DEFAULT_RETRY_LOST}; 0: record the loss)" in text
    assert f"(default: the client's, {DEFAULT_RETRY_ROLLOUTS})" in text
