"""``agentcore-rl show`` and the cost estimate on a run's files as eval writes them: a rollout
with tool calls and two segments (policy versions 3 and 4), and a failed one with a traceback."""

from __future__ import annotations

import json
import math
from array import array
from pathlib import Path
from typing import Any

import pytest

from agentcore_rl.cli import main
from agentcore_rl.cli.cost import Prices, price, usage_of
from agentcore_rl.cli.show import load_run
from agentcore_rl.trajectory import Segment, Trajectory

TRANSCRIPT = [
    {"role": "system", "content": "You solve arithmetic word problems."},
    {"role": "user", "content": "What is 6 times 7?"},
    {
        "role": "assistant",
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "calculator", "arguments": '{"expression": "6 * 7"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "42"},
    {"role": "assistant", "content": "The answer is 42."},
]


def _segment(prompt: list[int], generated: list[int], version: int) -> Segment:
    n, m = len(prompt), len(generated)
    return Segment(
        token_ids=array("i", prompt + generated),
        loss_mask=array("b", [0] * n + [1] * m),
        logprobs=array("d", [0.0] * n + [-0.5] * m),
        policy_versions=array("i", [-1] * n + [version] * m),
    )


def write_run(directory: Path) -> Path:
    """A results file and its trajectories: ``q-ok`` (tool calls, two segments) and
    ``q-bad`` (the agent raised)."""
    ok_envelope = {
        "status_code": 200, "rewards": [1.0], "messages": TRANSCRIPT,
        "started_at": 1000.0, "finished_at": 1120.0,  # 120 s
        "cpu_seconds": 30.0, "peak_memory_bytes": 512 * 1024**2,
    }  # fmt: skip
    bad_envelope = {
        "status_code": 500, "stop_reason": "ValueError: no calculator", "error_type": "error",
        "traceback": 'Traceback (most recent call last):\n  File "a.py"\nValueError: no calculator',
        "started_at": 1000.0, "finished_at": 1001.0,
    }  # fmt: skip
    lines = [
        {"input_id": "q-ok", "outcome": "done", "reward": 1.0, "elapsed": 121.5,
         "session_id": "s-ok", "attempts": 1, "losses": 0, "result": ok_envelope},
        {"input_id": "q-bad", "outcome": "failed", "reward": None, "elapsed": 1.5,
         "session_id": "s-bad", "attempts": 2, "losses": 1, "error_type": "RolloutError",
         "error": "the agent failed", "result": bad_envelope},
    ]  # fmt: skip
    out = directory / "run.jsonl"
    out.write_text("".join(json.dumps(line) + "\n" for line in lines))
    trajectory = Trajectory(
        [_segment([1, 2, 3], [40, 41], 3), _segment([9, 8], [50, 51, 52], 4)],
        reward=1.0,
        session_id="s-ok",
        input_id="q-ok",
        splits=1,
    )
    extra = {"prompt_tokens": 1000, "completion_tokens": 200, "tokens_captured": 1200}
    (directory / "run.trajectories.jsonl").write_text(
        json.dumps({**trajectory.to_json(), **extra}) + "\n"
    )
    return out


def _show(out: Path, key: str, capsys: pytest.CaptureFixture[str], *extra: str) -> str:
    assert main(["show", str(out), key, *extra]) == 0
    return capsys.readouterr().out


def test_show_prints_transcript_tool_calls_and_both_segments_without_colour(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NO_COLOR", "1")
    text = _show(write_run(tmp_path), "q-ok", capsys)

    assert "\x1b[" not in text
    assert "[tool]\n    42" in text
    assert '-> calculator({"expression": "6 * 7"})' in text
    assert "tokens: segment 1 of 2: 5 tokens, 2 generated (loss mask 1)" in text
    assert "tokens: segment 2 of 2: 5 tokens, 3 generated (loss mask 1)" in text
    assert "# generated     2  40 41  mean logprob -0.500  policy v3" in text
    assert "policy v4" in text
    assert ". prompt        2  9 8" in text


def test_show_prints_a_failure_with_its_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = _show(write_run(tmp_path), "s-bad", capsys)  # found by session id too

    assert "q-bad  failed  reward -" in text
    assert "error: RolloutError (ValueError): ValueError: no calculator" in text
    assert "ValueError: no calculator" in text.split("traceback")[-1]
    assert "tokens: none captured" in text


def test_show_names_a_missing_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["show", str(write_run(tmp_path)), "nope"]) == 2
    assert "has no rollout 'nope' (it has e.g. q-ok, q-bad)" in capsys.readouterr().err


def test_cost_of_a_known_rollout_is_seconds_times_rates() -> None:
    """120 s at 0.5 GB peak and 30 CPU-seconds, 1,000 prompt and 200 completion tokens at
    $0.5 / $2 per million: the figures docs/cli.md works through."""
    record: dict[str, Any] = {
        "result": {"started_at": 0.0, "finished_at": 120.0, "cpu_seconds": 30.0,
                   "peak_memory_bytes": 512 * 1024**2}
    }  # fmt: skip
    usage = usage_of(record, {"prompt_tokens": 1000, "completion_tokens": 200})
    cost = price(usage, Prices(input_mtok=0.5, output_mtok=2.0))

    assert usage["runtime_s"] == 120.0
    assert usage["peak_memory_gb"] == 0.5
    assert math.isclose(cost["cpu_usd"], 30 / 3600 * 0.0895)  # $0.000746
    assert math.isclose(cost["memory_usd"], 0.5 * 120 / 3600 * 0.00945)  # $0.000158
    assert math.isclose(cost["model_usd"], (1000 * 0.5 + 200 * 2.0) / 1e6)  # $0.0009
    assert math.isclose(cost["usd"], 0.000745833 + 0.0001575 + 0.0009, rel_tol=1e-6)
    # Unpriced tokens and unmeasured parts are left out, never guessed.
    assert price(usage_of({"result": {}}), Prices())["usd"] is None


def test_a_bad_price_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = write_run(tmp_path)
    assert main(["show", str(out), "q-ok", "--price", "vcpu_hour=-1"]) == 2
    assert "--price 'vcpu_hour=-1': the price must be a number >= 0" in capsys.readouterr().err
    assert main(["show", str(out), "q-ok", "--price", "gpu=1"]) == 2


def test_run_summary_counts_retries_losses_and_cost(tmp_path: Path) -> None:
    summary = load_run(write_run(tmp_path)).summary()

    assert (summary["rollouts"], summary["done"], summary["failed"]) == (2, 1, 1)
    assert (summary["retries"], summary["lost"]) == (1, 1)
    assert summary["failures"]["RolloutError (ValueError)"]["count"] == 1
    assert math.isclose(summary["cost"]["usd"], 0.000745833 + 0.0001575, rel_tol=1e-6)
