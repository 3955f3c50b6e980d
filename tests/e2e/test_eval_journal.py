"""The pieces behind ``eval``: the results file and journal (re-attaching is tested with
``AsyncRolloutClient.attach`` in tests/client/test_attach.py), and the summary's arithmetic."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentcore_rl.cli.journal import EvalJournal, JournalEntry, journal_path_for
from agentcore_rl.cli.show import load_run
from agentcore_rl.cli.summary import EvalRun, percentile, render, reward_of
from agentcore_rl.errors import ConfigurationError


def _entry(input_id: str, session: str = "s1") -> JournalEntry:
    return JournalEntry(input_id, session, "bkt", f"e/{input_id}/{session}.json", 100.0)


def test_journal_replays_outcomes_and_in_flight_rollouts(tmp_path: Path) -> None:
    out = tmp_path / "results.jsonl"
    journal = EvalJournal.open(out, resume=False)
    journal.record_started(_entry("a"))
    journal.record_started(_entry("b"))
    journal.record_started(_entry("c"))
    journal.record_outcome({"input_id": "a", "outcome": "done"})
    journal.record_abandoned("c")  # stopped by Ctrl-C: run again, do not wait for it
    journal.close()
    journal.close()  # idempotent

    resumed = EvalJournal.open(out, resume=True)
    try:
        assert set(resumed.finished) == {"a"}
        assert resumed.in_flight == {"b": _entry("b")}
    finally:
        resumed.close()


def test_resume_runs_retryable_failures_again_and_keeps_one_line_per_input(
    tmp_path: Path,
) -> None:
    # A failure a crash or shutdown caused is not final for --resume.
    out = tmp_path / "results.jsonl"
    journal = EvalJournal.open(out, resume=False)
    for name in ("a", "b", "c"):
        journal.record_started(_entry(name))
    journal.record_outcome({"input_id": "a", "outcome": "done", "retryable": False})
    journal.record_outcome({"input_id": "b", "outcome": "failed", "retryable": True})
    journal.record_outcome({"input_id": "c", "outcome": "failed", "retryable": False})
    journal.record_unstopped(["s-left-running"])
    journal.close()

    resumed = EvalJournal.open(out, resume=True)
    try:
        assert set(resumed.finished) == {"a", "c"}
        assert resumed.retrying == {"b"}
        assert resumed.in_flight == {}  # b starts afresh, not re-attached to its old session
        assert resumed.unstopped == ["s-left-running"]
        lines = [json.loads(line) for line in out.read_text().splitlines()]
        assert [line["input_id"] for line in lines] == ["a", "c"]
        resumed.record_outcome({"input_id": "b", "outcome": "done"})
    finally:
        resumed.close()
    again = EvalJournal.open(out, resume=True)
    try:
        assert set(again.finished) == {"a", "b", "c"}
        assert again.in_flight == {}
    finally:
        again.close()


def test_a_torn_last_line_is_cut_before_appending(tmp_path: Path) -> None:
    out = tmp_path / "results.jsonl"
    out.write_text('{"input_id": "a", "outcome": "done"}\n{"input_id": "b", "outc')
    journal_path_for(out).write_text(json.dumps({"event": "started", **vars(_entry("b"))}))
    journal = EvalJournal.open(out, resume=True)
    try:
        assert set(journal.finished) == {"a"}
        assert journal.in_flight == {}  # the journal line had no newline: torn, dropped
        journal.record_outcome({"input_id": "b", "outcome": "failed"})
    finally:
        journal.close()
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [line["input_id"] for line in lines] == ["a", "b"]


def test_an_existing_results_file_needs_resume(tmp_path: Path) -> None:
    out = tmp_path / "results.jsonl"
    out.write_text('{"input_id": "a"}\n')
    with pytest.raises(ConfigurationError, match="pass --resume"):
        EvalJournal.open(out, resume=False)
    with pytest.raises(ConfigurationError, match="does not exist"):
        EvalJournal.open(tmp_path / "nowhere" / "r.jsonl", resume=False)


def test_percentile_and_reward_of() -> None:
    assert percentile([], 50) is None
    assert percentile([3.0], 95) == 3.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile([float(i) for i in range(1, 101)], 95) == pytest.approx(95.05)
    assert reward_of({"rewards": [0.5, 1.0]}) == 0.5
    assert reward_of({"reward": 1}) == 1.0
    assert reward_of({"rewards": [True]}) is None
    assert reward_of({"rewards": []}) is None
    assert reward_of(None) is None


def _summary(tmp_path: Path, lines: list[dict[str, object]], run: EvalRun) -> dict[str, str]:
    out = tmp_path / "results.jsonl"
    out.write_text(
        "".join(json.dumps({"input_id": f"i{n}", **x}) + "\n" for n, x in enumerate(lines))
    )
    table = render(load_run(out).summary(), run)
    return {line[:32].strip(): line[32:].strip() for line in table.splitlines()}


def test_summary_table(tmp_path: Path) -> None:
    lines: list[dict[str, object]] = [
        {"outcome": "done", "elapsed": 1.0, "reward": 1.0, "reattached": True},
        {"outcome": "done", "elapsed": 3.0, "reward": 0.0},
        {"outcome": "timeout", "elapsed": 5.0},
    ]
    rows = _summary(tmp_path, lines, EvalRun(wall_seconds=2.0, s3_requests=6))
    assert (rows["rollouts"], rows["timed out"]) == ("3", "1")
    assert rows["re-attached in-flight rollouts"] == "1"
    assert (rows["latency p50"], rows["latency p95"]) == ("3.00 s", "4.80 s")
    assert rows["mean reward"] == "0.500 (2 finished)"  # over the finished rollouts only
    assert (rows["throughput"], rows["S3 requests per rollout"]) == ("1.5 rollouts/s", "2.00")
    failed = {"outcome": "failed", "elapsed": 1.0, "error_type": "RolloutError"}
    lines += [
        {**failed, "error": "handler_exception: x"},
        {**failed, "error": "another reason"},
        {**failed, "error_type": "InvocationError", "error": "refused " * 40},
    ]
    rows = _summary(tmp_path, lines, EvalRun(wall_seconds=2.0))
    assert rows["RolloutError"] == "2  (handler_exception: x)"
    assert rows["InvocationError"].startswith("1  (refused refused")
    assert rows["InvocationError"].endswith("...)")
    assert rows["RolloutTimeoutError"] == "1"
