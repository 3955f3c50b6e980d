"""Groups -> training rows, their files, and the trainer shapes."""

from __future__ import annotations

import importlib
import io
import json
import sys
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from agentcore_rl.errors import ConfigurationError
from agentcore_rl.group_tracker import GroupTracker, StartMember
from agentcore_rl.groups import GroupRules, RolloutGroup
from agentcore_rl.integrations import AgentCoreSettings
from agentcore_rl.training import (
    InvalidTrajectoryError,
    MissingTrajectoryError,
    SegmentLike,
    TrainingRow,
    TrajectoryLike,
    fit_rows,
    group_rows,
    read_jsonl,
    read_parquet,
    rows_from_groups,
    to_skyrl,
    to_slime,
    to_verl,
    trajectory_rows,
    write_jsonl,
    write_parquet,
)

# The shape agentcore_rl.trajectory produces, reduced to what rows read.


@dataclass
class Segment:
    token_ids: Sequence[int]
    loss_mask: Sequence[int]
    logprobs: Sequence[float] | None = None
    policy_versions: Sequence[int | None] = field(default_factory=list)


@dataclass
class Trajectory:
    segments: list[Segment]


def turn(prompt: list[int], completion: list[int], version: int = 0) -> Segment:
    """One call: prompt tokens (mask 0), then generated tokens (mask 1) with logprobs."""
    return Segment(
        token_ids=prompt + completion,
        loss_mask=[0] * len(prompt) + [1] * len(completion),
        logprobs=[0.0] * len(prompt) + [-0.1 * (i + 1) for i in range(len(completion))],
        policy_versions=[version] * (len(prompt) + len(completion)),
    )


def run_group(
    outcomes: list[tuple[str, float | None, Trajectory | None]],
    *,
    input_id: str = "q-1",
    tracker: GroupTracker | None = None,
    **rules: object,
) -> RolloutGroup:
    """Run a group through the real tracker: outcome per member, then the group."""
    tracker = tracker or GroupTracker(exp_id="e1", policy_version=2)
    actions = tracker.open(input_id, GroupRules(n=len(outcomes), retry=0, **rules))  # type: ignore[arg-type]
    sids = [a.session_id for a in actions if isinstance(a, StartMember)]
    result = []
    for sid, (kind, reward, trajectory) in zip(sids, outcomes, strict=True):
        if kind == "ok":
            assert reward is not None
            result = tracker.succeeded(sid, reward, trajectory=trajectory)
        else:
            result = tracker.failed(sid, "injected", trajectory=trajectory)
    assert isinstance(result[-1], RolloutGroup)
    return result[-1]


def test_protocols_bind_to_plain_and_array_backed_segments() -> None:
    assert isinstance(Segment([1], [1]), SegmentLike)
    compact = Segment(array("i", [1, 2]), array("b", [0, 1]), array("f", [0.0, -0.5]))
    assert isinstance(Trajectory([compact]), TrajectoryLike)
    group = run_group([("ok", 1.0, Trajectory([compact])), ("ok", 0.0, Trajectory([compact]))])
    assert group_rows(group)[0].logprobs == [-0.5]


def test_rows_split_prompt_and_response_and_carry_the_advantage() -> None:
    group = run_group(
        [
            ("ok", 1.0, Trajectory([turn([1, 2, 3], [4, 5], version=2)])),
            ("ok", 0.0, Trajectory([turn([1, 2, 3], [6], version=3)])),
        ]
    )
    rows = group_rows(group)
    assert [r.member for r in rows] == [0, 1]
    first = rows[0]
    assert (first.prompt_ids, first.response_ids, first.loss_mask) == ([1, 2, 3], [4, 5], [1, 1])
    assert first.logprobs == pytest.approx([-0.1, -0.2])
    assert (first.reward, first.advantage) == (1.0, 0.5)
    assert rows[1].advantage == -0.5
    assert first.policy_versions == [2]
    assert rows[1].policy_versions == [3]
    assert (first.exp_id, first.group_id, first.attempt) == ("e1", "q-1", 0)
    assert first.session_id == group.members[0].session_id
    assert (first.segment, first.num_segments, first.outcome) == (0, 1, "succeeded")
    scaled = group_rows(group, normalize="mean_std")
    assert scaled[0].advantage == pytest.approx(0.5 / (0.5**0.5 + 1e-6))


def test_multi_turn_segment_keeps_tool_tokens_masked() -> None:
    # prompt, completion, tool output, completion: one merged segment.
    segment = Segment(
        token_ids=[1, 2, 10, 11, 20, 21, 12],
        loss_mask=[0, 0, 1, 1, 0, 0, 1],
        logprobs=[-0.5, -0.6, -0.7],  # generated tokens only
        policy_versions=[1, 1],
    )
    group = run_group([("ok", 1.0, Trajectory([segment])), ("ok", 0.0, Trajectory([segment]))])
    row = group_rows(group)[0]
    assert row.response_ids == [10, 11, 20, 21, 12]
    assert row.loss_mask == [1, 1, 0, 0, 1]
    assert row.logprobs == [-0.5, -0.6, 0.0, 0.0, -0.7]


def test_every_segment_of_a_member_is_a_row_with_its_reward() -> None:
    split = Trajectory([turn([1], [2]), turn([9], [8, 7])])
    group = run_group([("ok", 1.0, split), ("ok", 0.0, Trajectory([turn([1], [3])]))])
    rows = group_rows(group)
    assert [(r.member, r.segment, r.num_segments) for r in rows] == [
        (0, 0, 2),
        (0, 1, 2),
        (1, 0, 1),
    ]
    assert [r.advantage for r in rows] == [0.5, 0.5, -0.5]


def test_zeroed_members_train_nothing() -> None:
    partial = Trajectory([turn([1, 2], [3, 4])])
    group = run_group(
        [
            ("ok", 1.0, Trajectory([turn([1, 2], [5])])),
            ("fail", None, partial),
            ("fail", None, None),
        ],
        on_failure="zero",
    )
    rows = group_rows(group)
    assert [r.member for r in rows] == [0, 1, 2]
    assert rows[1].zeroed
    assert rows[1].reward == 0.0
    assert rows[1].response_ids == [3, 4]
    assert rows[1].loss_mask == [0, 0]
    assert rows[1].outcome == "failed"
    assert (rows[2].prompt_ids, rows[2].response_ids, rows[2].loss_mask) == ([], [], [])
    assert rows[2].logprobs == []  # never None: every trainer takes an empty list
    assert rows[2].policy_versions == [2]
    assert [r.advantage for r in rows] == pytest.approx([2 / 3, -1 / 3, -1 / 3])


def test_dropped_members_have_no_rows() -> None:
    traj = Trajectory([turn([1], [2])])
    group = run_group([("ok", 1.0, traj), ("fail", None, traj), ("ok", 0.0, traj)])
    assert [r.member for r in group_rows(group)] == [0, 2]


def test_a_kept_member_without_tokens_is_an_error_unless_allowed() -> None:
    group = run_group([("ok", 1.0, None), ("ok", 0.0, None)])
    with pytest.raises(MissingTrajectoryError, match="gateway"):
        group_rows(group)
    rows = group_rows(group, require_tokens=False)
    assert [(r.reward, r.response_ids) for r in rows] == [(1.0, []), (0.0, [])]


@pytest.mark.parametrize(
    ("segment", "match"),
    [
        (Segment([1, 2], [0]), "loss mask has 1 entries for 2 tokens"),
        (Segment([1, 2], [0, 2]), "0 or 1"),
        (Segment([1, 2, 3], [0, 1, 1], logprobs=[-1.0]), "1 logprobs fit neither"),
    ],
)
def test_inconsistent_segments_are_refused(segment: Segment, match: str) -> None:
    group = run_group([("ok", 1.0, Trajectory([segment])), ("ok", 0.0, Trajectory([segment]))])
    with pytest.raises(InvalidTrajectoryError, match=match) as info:
        group_rows(group)
    assert info.value.session_id == group.members[0].session_id


def test_a_trajectory_without_segments_attribute_is_refused() -> None:
    group = run_group([("ok", 1.0, "not a trajectory"), ("ok", 0.0, None)])  # type: ignore[list-item]
    with pytest.raises(InvalidTrajectoryError, match="no segments"):
        group_rows(group)


def two_groups() -> list[RolloutGroup]:
    tracker = GroupTracker(exp_id="e1", policy_version=1)
    a = run_group(
        [("ok", 1.0, Trajectory([turn([1], [2])])), ("fail", None, None)],
        tracker=tracker,
        input_id="q-a",
        on_failure="zero",
    )
    b = run_group(
        [
            ("ok", 0.5, Trajectory([turn([7], [8]), turn([9], [10, 11])])),
            ("ok", 0.0, Trajectory([turn([7], [12])])),
        ],
        tracker=tracker,
        input_id="q-b",
    )
    return [a, b]


def test_jsonl_round_trip(tmp_path: Path) -> None:
    rows = list(rows_from_groups(two_groups(), "mean_std"))
    path = tmp_path / "rows.jsonl"
    assert write_jsonl(rows, path) == len(rows) == 5
    assert read_jsonl(path) == rows
    assert write_jsonl(rows[:2], path, append=True) == 2
    assert read_jsonl(str(path)) == rows + rows[:2]
    buffer = io.StringIO()
    write_jsonl(rows, buffer)
    assert [json.loads(line)["group_id"] for line in buffer.getvalue().splitlines()] == [
        "q-a",
        "q-a",
        "q-b",
        "q-b",
        "q-b",
    ]
    buffer.seek(0)
    assert read_jsonl(buffer) == rows


def test_jsonl_names_the_bad_line(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    write_jsonl(rows_from_groups(two_groups()), path)
    with path.open("a") as file:
        file.write("\n" + json.dumps({"group_id": "x"}) + "\n")
    with pytest.raises(ConfigurationError, match=r"rows\.jsonl:7 is not a training row"):
        read_jsonl(path)


def test_parquet_round_trip(tmp_path: Path) -> None:
    pytest.importorskip("pyarrow")
    rows = list(rows_from_groups(two_groups(), "mean_std"))
    path = tmp_path / "rows.parquet"
    assert write_parquet(rows, path) == 5
    assert read_parquet(path) == rows


def test_parquet_without_pyarrow_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # None in sys.modules makes the import fail as it does where pyarrow is not installed.
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    with pytest.raises(ConfigurationError, match="pip install pyarrow"):
        write_parquet([], tmp_path / "rows.parquet")


# --- trainer shapes -------------------------------------------------------------------------

# Field names as declared in each project's source (see agentcore_rl/training/formats.py).
VERL_AGENT_LOOP_OUTPUT_FIELDS = {
    "prompt_ids",
    "response_ids",
    "response_mask",
    "response_logprobs",
    "routed_experts",
    "multi_modal_data",
    "reward_score",
    "num_turns",
    "metrics",
    "extra_fields",
}
SLIME_SAMPLE_FIELDS = {
    "group_index",
    "index",
    "rollout_id",
    "prompt",
    "tokens",
    "response",
    "response_length",
    "label",
    "reward",
    "loss_mask",
    "weight_versions",
    "rollout_log_probs",
    "remove_sample",
    "status",
    "metadata",
    "session_id",
}
SKYRL_GENERATOR_OUTPUT_KEYS = {
    "prompt_token_ids",
    "response_ids",
    "rewards",
    "loss_masks",
    "stop_reasons",
    "rollout_metrics",
    "rollout_logprobs",
    "trajectory_ids",
    "trajectory_generation_times",
    "trajectory_time_splits",
    "rollout_expert_indices",
    "rollout_sample_support",
    "is_last_step",
    "env_metrics",
    "pixel_values",
    "image_grid_thw",
}


def test_verl_agent_loop_output() -> None:
    rows = list(rows_from_groups(two_groups()))
    out = to_verl(rows[0])
    assert set(out) <= VERL_AGENT_LOOP_OUTPUT_FIELDS
    assert (out["prompt_ids"], out["response_ids"], out["response_mask"]) == ([1], [2], [1])
    assert out["response_logprobs"] == pytest.approx([-0.1])
    assert out["reward_score"] == 1.0
    extra = out["extra_fields"]
    assert (extra["group_id"], extra["session_id"]) == ("q-a", rows[0].session_id)
    assert extra["advantage"] == rows[0].advantage
    assert extra["reward_extra_info"] == {"agentcore_reward": 1.0}
    assert (extra["min_global_steps"], extra["max_global_steps"]) == (0, 0)
    # The token-less zeroed member: one masked pad token, so veRL can place its reward.
    zeroed = to_verl(rows[1], pad_token_id=5, global_steps=3)
    assert (zeroed["prompt_ids"], zeroed["response_ids"], zeroed["response_mask"]) == (
        [5],
        [5],
        [0],
    )
    assert (zeroed["reward_score"], zeroed["response_logprobs"]) == (0.0, [0.0])
    assert zeroed["extra_fields"]["zeroed"] is True
    assert zeroed["extra_fields"]["placeholder"] is True
    # Its version is the member's (1), not the step passed for unknown ones.
    assert zeroed["extra_fields"]["min_global_steps"] == 1


def test_slime_samples() -> None:
    rows = list(rows_from_groups(two_groups()))
    samples = to_slime(rows)
    for sample in samples:
        assert set(sample) <= SLIME_SAMPLE_FIELDS
        assert len(sample["loss_mask"]) == sample["response_length"]
    assert [s["group_index"] for s in samples] == [0, 0, 1, 1, 1]
    assert [s["index"] for s in samples] == [0, 1, 2, 3, 4]
    # The two segments of one rollout share its rollout_id.
    assert [s["rollout_id"] for s in samples] == [0, 1, 2, 2, 3]
    assert samples[2]["tokens"] == [7, 8]
    assert samples[3]["tokens"] == [9, 10, 11]
    assert samples[3]["response_length"] == 2
    assert samples[0]["weight_versions"] == ["0"]
    assert [s["status"] for s in samples] == ["completed", "failed"] + ["completed"] * 3
    assert samples[1]["remove_sample"] is True
    assert (samples[1]["tokens"], samples[1]["loss_mask"]) == ([0, 0], [0])
    assert samples[1]["rollout_log_probs"] == [0.0]
    assert samples[1]["reward"] == 0.0
    assert samples[0]["metadata"]["advantage"] == rows[0].advantage


def test_skyrl_generator_output() -> None:
    rows = list(rows_from_groups(two_groups()))
    out = to_skyrl(rows)
    assert set(out) == SKYRL_GENERATOR_OUTPUT_KEYS
    assert out["prompt_token_ids"] == [[1], [0], [7], [9], [7]]
    assert out["response_ids"][1] == [0]  # the token-less member's placeholder
    assert out["rewards"] == [1.0, 0.0, 0.5, 0.5, 0.0]
    assert [len(m) for m in out["loss_masks"]] == [len(r) for r in out["response_ids"]]
    # The zeroed member captured none, yet the batch keeps everyone's logprobs.
    assert [len(lp) for lp in out["rollout_logprobs"]] == [1, 1, 1, 2, 1]
    assert out["trajectory_ids"][3] == {"instance_id": "q-b", "repetition_id": 0}
    assert out["is_last_step"] == [True, True, False, True, True]
    # Without any split, every row is a last step (SkyRL's step-wise validation needs it).
    assert to_skyrl([rows[0], rows[4]])["is_last_step"] == [True, True]


def test_rows_to_dict_round_trip() -> None:
    for row in rows_from_groups(two_groups()):
        assert TrainingRow.from_dict(json.loads(json.dumps(row.to_dict()))) == row


def test_a_group_of_one_has_its_reward_as_advantage() -> None:
    group = run_group([("ok", 0.75, Trajectory([turn([1], [2]), turn([3], [4])]))])
    assert [r.advantage for r in group_rows(group, "mean_std")] == [0.75, 0.75]
    assert group.advantages() == [0.75]


def test_a_member_with_several_segments_counts_once() -> None:
    # Rewards 1, 0, 0 (the first member split in two): the mean is 1/3, not 1/2.
    split = Trajectory([turn([1], [2]), turn([9], [8])])
    one = Trajectory([turn([1], [3])])
    group = run_group([("ok", 1.0, split), ("ok", 0.0, one), ("ok", 0.0, one)])
    rows = group_rows(group, "mean_std")
    assert len(rows) == 4
    expected = 2 / 3 / ((1 / 3) ** 0.5 + 1e-6)
    assert [r.advantage for r in rows[:2]] == pytest.approx([expected, expected])


def test_trajectory_rows_need_no_group() -> None:
    rows = trajectory_rows(
        Trajectory([turn([1, 2], [3], version=4), turn([5], [6, 7], version=5)]),
        exp_id="e",
        group_id="uid-1",
        session_id="s",
        reward=1.0,
    )
    assert [(r.prompt_ids, r.response_ids, r.segment, r.num_segments) for r in rows] == [
        ([1, 2], [3], 0, 2),
        ([5], [6, 7], 1, 2),
    ]
    assert [(r.min_policy_version, r.max_policy_version) for r in rows] == [(4, 4), (5, 5)]
    empty = trajectory_rows(None, exp_id="e", group_id="g", session_id="s", reward=0.0, zeroed=True)
    assert (empty[0].response_ids, empty[0].logprobs) == ([], [])


def test_fitting_cuts_long_responses_and_masks_rows_with_long_prompts() -> None:
    group = run_group(
        [
            ("ok", 1.0, Trajectory([turn([1, 2, 3, 4], [5, 6])])),
            ("ok", 0.0, Trajectory([turn([1], [7, 8, 9, 10])])),
            ("ok", 0.0, Trajectory([turn([1], [7])])),
        ]
    )
    rows = group_rows(group)
    report = fit_rows(rows, max_prompt_length=3, max_response_length=3)
    long_prompt, long_response, fits = report.rows
    assert (long_prompt.prompt_ids, long_prompt.loss_mask) == ([2, 3, 4], [0, 0])
    assert long_prompt.response_ids == [5, 6]  # kept, masked: its reward still counts
    assert (long_response.response_ids, long_response.loss_mask) == ([7, 8, 9], [1, 1, 1])
    assert long_response.logprobs == pytest.approx([-0.1, -0.2, -0.3])
    assert fits is rows[2]
    assert (report.responses_truncated, report.prompts_masked) == (1, 1)
    assert (report.response_tokens_cut, report.prompt_tokens_cut) == (1, 1)
    with pytest.raises(ConfigurationError, match="max_prompt_length"):
        fit_rows(rows, max_prompt_length=0, max_response_length=3)


# --- trainer adapters (their behaviour is tested against the trainers in tests/trainers) ----


@pytest.mark.parametrize(
    ("module", "extra"),
    [("verl", "verl"), ("skyrl", "skyrl"), ("slime", "slime")],
)
def test_an_adapter_without_its_trainer_names_its_extra(
    module: str, extra: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # None in sys.modules makes the import fail as it does where the trainer is missing.
    for name in ("verl", "skyrl", "slime"):
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.delitem(sys.modules, f"agentcore_rl.integrations.{module}", raising=False)
    with pytest.raises(ImportError, match=rf"pip install 'agentcore-rl\[{extra}\]'"):
        importlib.import_module(f"agentcore_rl.integrations.{module}")


def test_adapter_settings_refuse_unknown_keys_and_need_a_gateway() -> None:
    base = {"agent_url": ["http://127.0.0.1:1"], "s3_bucket": "b", "exp_id": "e"}
    settings = AgentCoreSettings.from_mapping({**base, "gateway_url": "http://127.0.0.1:2"})
    assert settings.agent_url == ("http://127.0.0.1:1",)
    assert settings.on_failure == "zero"
    with pytest.raises(ConfigurationError, match="did you mean 'gateway_url'"):
        AgentCoreSettings.from_mapping({**base, "gateway_ur": "http://127.0.0.1:2"})
    with pytest.raises(ConfigurationError, match="gateway_url is required"):
        AgentCoreSettings.from_mapping(base)
    with pytest.raises(ConfigurationError, match="on_failure"):
        AgentCoreSettings.from_mapping(
            {**base, "gateway_url": "http://127.0.0.1:2", "on_failure": "drop_member"}
        )
