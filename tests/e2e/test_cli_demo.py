"""``agentcore-rl demo`` as a user runs it (the real CLI in a subprocess): it leaves nothing
in the temp directory, keeps only the last run's files, and its example trajectory is a
typical one (the agent used its calculator)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.e2e.test_cli_eval import REPO


def _demo(tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TMPDIR": str(tmp_path / "tmp"), "XDG_STATE_HOME": str(tmp_path / "st")}
    return subprocess.run(
        [sys.executable, "-m", "agentcore_rl.cli", "demo", "--n", "8", "--latency", "0",
         "--no-progress"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_the_demo_leaves_no_temp_directory_and_shows_a_typical_trajectory(
    tmp_path: Path,
) -> None:
    (tmp_path / "tmp").mkdir()
    for _ in range(2):
        done = _demo(tmp_path)
        assert done.returncode == 0, done.stderr
    assert list((tmp_path / "tmp").iterdir()) == []
    demo = tmp_path / "st" / "agentcore-rl" / "demo"
    assert sorted(p.name for p in demo.iterdir()) == [
        "results.jsonl",
        "results.jsonl.journal",
        "results.trajectories.jsonl",
        "results.trajectory-example.json",
    ]
    assert len((demo / "results.jsonl").read_text().splitlines()) == 8  # the last run's only
    example = json.loads((demo / "results.trajectory-example.json").read_text())
    roles = [message["role"] for message in example["conversation"]]
    assert "tool" in roles  # it called the calculator, as most rollouts do
    assert f"one trajectory to look at: {demo}/results.trajectory-example.json" in done.stdout


def test_the_example_is_the_first_trajectory_that_used_a_tool(tmp_path: Path) -> None:
    from agentcore_rl.cli.demo import _write_example

    out = tmp_path / "results.jsonl"
    plain = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]
    tool = [plain[0], {"role": "assistant", "content": None}, {"role": "tool", "content": "4"}]
    out.write_text(
        json.dumps({"session_id": "a", "result": {"messages": plain}}) + "\n"
        + json.dumps({"session_id": "b", "result": {"messages": tool}}) + "\n"
    )  # fmt: skip
    trajectories = tmp_path / "results.trajectories.jsonl"
    trajectories.write_text(
        "".join(json.dumps({"session_id": s, "segments": []}) + "\n" for s in ("a", "b"))
    )
    path = _write_example(trajectories, out)
    assert path is not None
    example = json.loads(path.read_text())
    assert (example["session_id"], example["conversation"]) == ("b", tool)
