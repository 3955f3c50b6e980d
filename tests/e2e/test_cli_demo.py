"""``agentcore-rl demo`` as a user runs it (the real CLI in a subprocess): it leaves nothing
in the temp directory, keeps only the last run's files, and its example trajectory is a
typical one (the agent used its calculator), shown as ``agentcore-rl show`` does."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.test_cli_eval import REPO


def _demo(tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TMPDIR": str(tmp_path / "tmp"), "XDG_STATE_HOME": str(tmp_path / "st")}
    return subprocess.run(
        [sys.executable, "-m", "agentcore_rl.cli", "demo", "--n", "8", "--latency", "0",
         "--no-progress"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


# Two whole demo runs (each starts the local stack): the suite's 60 s is one run's bound.
@pytest.mark.timeout(240)
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
        "results.example.txt",
        "results.jsonl",
        "results.jsonl.journal",
        "results.trajectories.jsonl",
    ]
    assert len((demo / "results.jsonl").read_text().splitlines()) == 8  # the last run's only
    example = (demo / "results.example.txt").read_text()
    assert "\n  [tool]\n" in example  # it called the calculator, as most rollouts do
    assert "# generated" in example  # and its tokens are there
    assert f"one rollout to look at: {demo}/results.example.txt" in done.stdout
