"""Rough edges a new user hit on day one, each pinned: partial credit and pass@k, a
forgotten --base-url, the cost line of one rollout, a failure's cause past its session id,
the sessions a rollout took, the report extra after ``make demo``, the progress bar's unit,
and the commands' help as docs/cli.md quotes it."""

from __future__ import annotations

import asyncio
import json
import logging
import re
from pathlib import Path

import pytest

from agentcore_rl.cli import main
from agentcore_rl.cli.eval import Progress
from agentcore_rl.cli.show import load_run
from agentcore_rl.cli.summary import EvalRun, group_figures, pass_at_k, render
from agentcore_rl.local.policy import ScriptedPolicy
from agentcore_rl.local.stack import LocalStack, StackS3
from tests.e2e.test_cli_eval import REPO, _common, _stack, _write_problems


def test_partial_credit_passes_only_at_the_threshold() -> None:
    partial = [0.05, 0.39, 0.2, 1.0]
    assert pass_at_k(partial, 1) == 1.0  # any reward above 0 passes by default
    assert pass_at_k(partial, 1, threshold=0.5) == 0.25
    lines = [{"outcome": "done", "rewards": partial, "pass_threshold": 0.5}]
    figures = group_figures(4, lines)
    assert figures["pass@1"] == 0.25
    assert figures["pass@4"] == 1.0


def test_pass_threshold_needs_groups(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    (tmp_path / "d.jsonl").write_text('{"id": "a"}\n')
    argv = ["eval", str(tmp_path / "d.jsonl"), "--agent-url", "http://127.0.0.1:9"]
    assert main([*argv, "--s3-bucket", "b-1", "--pass-threshold", "0.5"]) == 2
    assert "--pass-threshold needs --group-size" in capsys.readouterr().err


def test_one_rollouts_cost_line_has_no_empty_parts() -> None:
    figures = {
        **{k: 0 for k in ("done", "failed", "timeout", "reattached", "trajectories")},
        "done": 1,
        "failures": {},
        "failure_kinds": {},
        "rewards": [1.0],
        "mean_reward": 1.0,
        "latency_p50": 0.1,
        "latency_p95": 0.1,
        "groups": None,
        "cost": {"usd": 0.0, "cpu_usd": 0, "memory_usd": 0, "model_usd": 0, "rollouts": 1},
    }
    line = render(figures, EvalRun(wall_seconds=1.0)).splitlines()[-1]
    assert line.endswith("for 1 rollout (docs/cli.md)")


async def test_a_forgotten_base_url_is_named_before_the_first_rollout(
    s3_endpoint: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with _stack(s3_endpoint, ScriptedPolicy()) as stack:
        _write_problems(tmp_path / "in.jsonl", 1)
        argv = _common(stack, tmp_path / "in.jsonl", tmp_path / "out.jsonl", "nobase")
        at = argv.index("--base-url")
        del argv[at : at + 2]
        with caplog.at_level(logging.WARNING):
            await asyncio.to_thread(main, [*argv, "--agent-url", stack.agent_urls[0]])
    assert any("no --base-url or --gateway-url" in r.getMessage() for r in caplog.records)


def test_make_demo_installs_what_the_readmes_next_commands_need() -> None:
    makefile = (REPO / "Makefile").read_text()
    demo_install = re.search(
        r"\$\(DEMO_STAMP\):.*?pip install --quiet -e '\.\[(.*?)\]'", makefile, re.S
    )
    assert demo_install is not None
    extras = set(demo_install.group(1).split(","))
    readme = (REPO / "README.md").read_text()
    if "agentcore-rl report" in readme:
        assert "report" in extras
    assert "local" in extras


@pytest.mark.parametrize(
    "command", ["demo", "eval", "up", "serve", "local-runtime", "gateway", "show", "report"]
)
def test_docs_quote_each_options_default_as_help_says(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every option of the command is in docs/cli.md, and --out's default reads alike."""
    assert main([command, "--help"]) == 0
    help_text = capsys.readouterr().out
    docs = (REPO / "docs/cli.md").read_text()
    for option in set(re.findall(r"(--[a-z][a-z-]+)", help_text)) - {"--help"}:
        assert option in docs, f"{command} {option} is not in docs/cli.md"
    if command == "demo":
        assert "~/.local/state/agentcore-rl/demo/results.jsonl" in "".join(help_text.split())


def test_server_docs_name_every_rollout_field_the_client_sends() -> None:
    from agentcore_rl.client.traces import API_KEY

    table = (REPO / "docs/server.md").read_text()
    assert f"`{API_KEY}`" in table


def test_a_failure_reason_keeps_its_cause_past_the_session_id(tmp_path: Path) -> None:
    sid = "be474db4" + "0" * 40
    error = f"invoking session {sid} failed after 5 attempts: ConnectError: connection refused"
    out = tmp_path / "r.jsonl"
    line = {"input_id": "a", "outcome": "failed", "error_type": "InvocationError", "error": error}
    out.write_text(json.dumps(line) + "\n")
    table = render(load_run(out).summary(), EvalRun(wall_seconds=1.0))
    row = next(r for r in table.splitlines() if "InvocationError" in r)
    assert "be474db4..." in row
    assert sid not in row
    assert row.rstrip().endswith("ConnectError: connection refused)"), row


@pytest.mark.timeout(180)
async def test_the_results_line_counts_every_session_a_rollout_took(
    s3_endpoint: str, tmp_path: Path
) -> None:
    data = tmp_path / "in.jsonl"
    problem = {"id": "down", "prompt": "What is 2 + 2?", "answer": "4", "infra": True}
    data.write_text(json.dumps(problem) + "\n")
    async with LocalStack(
        "tests.e2e.failing_agent:app",
        agents=1,
        s3=StackS3(endpoint_url=s3_endpoint, bucket="first-day-attempts"),
        policy=ScriptedPolicy(),
        tps=None,
    ) as stack:
        argv = _common(stack, data, tmp_path / "out.jsonl", "attempts")
        argv += ["--agent-url", stack.agent_urls[0], "--retry-rollouts", "2", "--no-progress"]
        await asyncio.to_thread(main, argv)
    (line,) = [json.loads(x) for x in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert (line["outcome"], line["failure_kind"], line["attempts"]) == ("failed", "infra", 3)


def test_a_group_run_s_progress_counts_groups(capsys: pytest.CaptureFixture[str]) -> None:
    bar = Progress(2, 0, True, unit="group")  # eval --group-size: one step per input's group
    bar.update({"members": [{"outcome": "done", "reward": 1.0}] * 4})
    bar.close()
    shown = capsys.readouterr().err
    assert "1/2" in shown
    assert "group/s" in shown or "s/group" in shown
