"""Trajectories from call records: prefix merges, splits, retries, failures, versions."""

from __future__ import annotations

import json

from agentcore_rl.trace import (
    CallRecord,
    Completion,
    ids_array,
    logprob_array,
)
from agentcore_rl.training import trajectory_rows
from agentcore_rl.trajectory import NO_VERSION, build_trajectory


def _call(
    index: int,
    prompt: list[int],
    completion: list[int],
    *,
    version: int = 0,
    status: int = 200,
    body: object = None,
) -> CallRecord:
    return CallRecord(
        session_id="s",
        index=index,
        endpoint="chat.completions",
        policy_version_start=version,
        policy_version_end=version,
        request_body=json.dumps(body if body is not None else {"i": index}).encode(),
        prompt_ids=ids_array(prompt),
        completions=[
            Completion(
                token_ids=ids_array(completion),
                logprobs=logprob_array([-0.5] * len(completion)),
            )
        ],
        status=status,
        error=None if status == 200 else "boom",
    )


def test_prefix_extensions_merge_into_one_masked_segment() -> None:
    records = [
        _call(0, [1, 2], [10, 11]),
        _call(1, [1, 2, 10, 11, 3], [12], version=1),
    ]
    trajectory = build_trajectory(records, reward=1.0, session_id="s", input_id="q")
    assert (trajectory.merges, trajectory.splits, len(trajectory.segments)) == (1, 0, 1)
    segment = trajectory.segments[0]
    assert segment.token_ids.tolist() == [1, 2, 10, 11, 3, 12]
    assert segment.loss_mask.tolist() == [0, 0, 1, 1, 0, 1]
    assert segment.logprobs.tolist() == [0.0, 0.0, -0.5, -0.5, 0.0, -0.5]
    assert segment.policy_versions.tolist() == [NO_VERSION, NO_VERSION, 0, 0, NO_VERSION, 1]
    assert segment.calls == [0, 1]
    assert trajectory.min_policy_version == 0
    assert trajectory.generated_tokens == 3
    assert trajectory.to_json()["segments"][0]["loss_mask"] == [0, 0, 1, 1, 0, 1]


def test_a_prompt_that_does_not_extend_the_previous_turn_splits() -> None:
    records = [
        _call(0, [1, 2], [10]),
        _call(1, [1, 2, 10, 3], [11]),
        _call(2, [2, 10, 3, 11, 4], [12]),  # history truncated
        _call(3, [2, 10, 3, 11, 4, 12, 5], [13]),
    ]
    trajectory = build_trajectory(records)
    assert (trajectory.merges, trajectory.splits) == (2, 1)
    assert [s.calls for s in trajectory.segments] == [[0, 1], [2, 3]]


def test_identical_retries_keep_the_last_answer_and_failures_are_skipped() -> None:
    records = [
        _call(0, [1, 2], [10], body={"same": 1}),
        _call(1, [1, 2], [20], body={"same": 1}),  # retried: the agent used this answer
        _call(2, [1, 2, 20, 3], [], status=502),
        _call(3, [1, 2, 20, 3], [21]),
    ]
    trajectory = build_trajectory(records)
    assert (trajectory.duplicates, trajectory.failed_calls) == (1, 1)
    assert (trajectory.merges, trajectory.splits) == (1, 0)
    assert trajectory.segments[0].token_ids.tolist() == [1, 2, 20, 3, 21]


def test_out_of_order_records_are_sorted_and_no_records_give_no_segments() -> None:
    records = [_call(1, [1, 2, 10, 3], [11]), _call(0, [1, 2], [10])]
    assert build_trajectory(records).segments[0].calls == [0, 1]
    empty = build_trajectory([])
    assert (empty.segments, empty.min_policy_version, empty.generated_tokens) == ([], None, 0)


def test_a_completion_an_update_came_in_the_middle_of_keeps_each_tokens_version() -> None:
    first = _call(0, [1, 2], [10, 11, 12, 13], version=4)
    first.policy_version_end = 5
    first.completions[0].versions = [(0, 4), (3, 5)]  # tokens 0-2 by version 4, then 5
    again = CallRecord.from_json(json.loads(json.dumps(first.to_json())))
    assert again.completions[0].versions == [(0, 4), (3, 5)]
    assert again.straddled
    records = [again, _call(1, [1, 2, 10, 11, 12, 13, 3], [14], version=5)]
    trajectory = build_trajectory(records, reward=1.0)
    (segment,) = trajectory.segments
    assert segment.policy_versions.tolist() == [-1, -1, 4, 4, 4, 5, -1, 5]
    (row,) = trajectory_rows(trajectory, exp_id="e", group_id="g", session_id="s", reward=1.0)
    assert row.response_versions == [4, 4, 4, 5, -1, 5]
    assert row.policy_versions == [4, 5]
    assert row.masked_before(5).loss_mask == [0, 0, 0, 1, 0, 1]
    assert row.masked_before(4) == row
