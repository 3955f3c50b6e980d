"""The group rules, fed events by hand: retries, failure rules, redundancy, filters, staleness."""

from __future__ import annotations

import random

import pytest

from agentcore_rl.errors import ConfigurationError, InvalidRolloutConfig
from agentcore_rl.group_tracker import Action, GroupTracker, StartMember, StopMember
from agentcore_rl.groups import (
    DropReason,
    GroupDroppedError,
    GroupRules,
    MemberOutcome,
    RolloutGroup,
    StaleGroupError,
    advantages,
    group_digest,
    member_session_id,
    parse_member_session_id,
)
from agentcore_rl.protocol import FailureKind, is_acr_session_id


def starts(actions: list[Action]) -> list[StartMember]:
    return [a for a in actions if isinstance(a, StartMember)]


def stops(actions: list[Action]) -> list[StopMember]:
    return [a for a in actions if isinstance(a, StopMember)]


def ready(actions: list[Action]) -> RolloutGroup:
    [last] = [a for a in actions if isinstance(a, RolloutGroup)]
    assert actions[-1] is last, "the resolution comes after the stops it leads to"
    return last


def dropped(actions: list[Action]) -> GroupDroppedError:
    [last] = [a for a in actions if isinstance(a, GroupDroppedError)]
    assert actions[-1] is last
    return last


def open_group(tracker: GroupTracker, input_id: str = "q-1", **rules: object) -> list[str]:
    actions = tracker.open(input_id, GroupRules(**rules))  # type: ignore[arg-type]
    return [a.session_id for a in starts(actions)]


# --- session ids ----------------------------------------------------------------------------


def test_member_session_ids_are_deterministic_distinct_and_valid_for_agentcore() -> None:
    ids = {
        member_session_id(exp, inp, index=i, attempt=a)
        for exp in ("e1", "e2")
        for inp in ("q-1", "q-1.json", "Q:1@x=y+z")
        for i in range(3)
        for a in range(2)
    }
    assert len(ids) == 2 * 3 * 3 * 2
    assert all(is_acr_session_id(sid) for sid in ids)
    assert member_session_id("e1", "q-1", index=2, attempt=1) == member_session_id(
        "e1", "q-1", index=2, attempt=1
    )


def test_member_session_id_parses_back() -> None:
    sid = member_session_id("e1", "q-17", index=11, attempt=3)
    key = parse_member_session_id(sid)
    assert key is not None
    assert (key.digest, key.index, key.attempt) == (group_digest("e1", "q-17"), 11, 3)
    assert parse_member_session_id("a" * 48) is None
    assert parse_member_session_id(sid + "x") is None


def test_member_session_id_rejects_bad_parts() -> None:
    with pytest.raises(InvalidRolloutConfig, match="input_id"):
        member_session_id("e1", "../x", index=0, attempt=0)
    with pytest.raises(ConfigurationError, match="index"):
        member_session_id("e1", "q", index=-1, attempt=0)
    with pytest.raises(ConfigurationError, match="attempt"):
        member_session_id("e1", "q", index=0, attempt=True)


# --- rules and advantages -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"n": 0}, "n must be"),
        ({"n": 2, "redundancy": -1}, "redundancy"),
        ({"n": 2, "retry": -1}, "retry"),
        ({"n": 2, "min_members": 0}, "min_members"),
        ({"n": True}, "n must be"),
        ({"n": 2, "on_failure": "ignore"}, "on_failure"),
    ],
)
def test_rules_reject_bad_values(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        GroupRules(**kwargs)  # type: ignore[arg-type]


def test_rules_cap_min_members_at_n() -> None:
    assert GroupRules(n=1).keep_at_least == 1
    assert GroupRules(n=8).keep_at_least == 2
    assert GroupRules(n=8, redundancy=2).starts == 10


def test_advantages_mean_and_mean_std() -> None:
    assert advantages([1.0, 0.0, 0.0, 1.0]) == [0.5, -0.5, -0.5, 0.5]
    scaled = advantages([1.0, 0.0], normalize="mean_std")
    # Sample std of [1, 0] is sqrt(0.5).
    assert scaled == pytest.approx([0.5 / (0.5**0.5 + 1e-6), -0.5 / (0.5**0.5 + 1e-6)])
    assert advantages([3.0, 3.0], normalize="mean_std") == [0.0, 0.0]
    # A group of one has no baseline: its reward is its advantage (veRL's and SkyRL's GRPO).
    assert advantages([0.7], normalize="mean_std") == [0.7]
    assert advantages([0.7]) == [0.7]
    assert advantages([]) == []
    with pytest.raises(ConfigurationError, match="normalize"):
        advantages([1.0], normalize="z")  # type: ignore[arg-type]


# --- the happy path -------------------------------------------------------------------------


def test_group_resolves_when_all_members_succeed() -> None:
    tracker = GroupTracker(exp_id="e1", policy_version=3)
    sids = open_group(tracker, n=3)
    assert len(sids) == 3
    assert tracker.succeeded(sids[2], 1.0, result={"rewards": [1.0]}) == []
    assert tracker.succeeded(sids[0], 0.0) == []
    group = ready(tracker.succeeded(sids[1], 0.5, trajectory="traj-1"))
    assert [m.index for m in group.members] == [0, 1, 2]
    assert group.rewards == [0.0, 0.5, 1.0]
    assert group.members[1].trajectory == "traj-1"
    assert group.members[2].result == {"rewards": [1.0]}
    assert group.advantages() == pytest.approx([-0.5, 0.0, 0.5])
    stats = group.stats
    assert (stats.n, stats.size, stats.succeeded, stats.discarded) == (3, 3, 3, 0)
    assert (stats.policy_version_min, stats.policy_version_max) == (3, 3)
    assert stats.reward_mean == pytest.approx(0.5)
    assert not tracker.is_open("q-1")
    counters = tracker.counters
    assert (counters.groups_opened, counters.groups_ready, counters.groups_open) == (1, 1, 0)
    assert counters.members_started == counters.members_succeeded == 3


def test_reward_must_be_a_finite_number() -> None:
    tracker = GroupTracker(exp_id="e1")
    [sid] = open_group(tracker, n=1)
    with pytest.raises(ValueError, match="number"):
        tracker.succeeded(sid, "1.0")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="finite"):
        tracker.succeeded(sid, float("nan"))


# --- retry ----------------------------------------------------------------------------------


@pytest.mark.parametrize("timed_out", [False, True])
def test_failed_or_timed_out_member_is_retried_once_in_a_fresh_session(timed_out: bool) -> None:
    tracker = GroupTracker(exp_id="e1")
    sids = open_group(tracker, n=2)
    actions = tracker.timed_out(sids[1]) if timed_out else tracker.failed(sids[1], "boom")
    [retry] = starts(actions)
    assert (retry.index, retry.attempt) == (1, 1)
    assert retry.session_id == member_session_id("e1", "q-1", index=1, attempt=1)
    assert retry.session_id not in sids
    tracker.succeeded(sids[0], 1.0)
    group = ready(tracker.succeeded(retry.session_id, 0.0))
    assert [(m.index, m.attempt) for m in group.members] == [(0, 0), (1, 1)]
    [first] = group.discarded
    assert first.drop_reason is DropReason.RETRIED
    assert first.outcome is (MemberOutcome.TIMED_OUT if timed_out else MemberOutcome.FAILED)
    assert group.stats.retried == 1
    counters = tracker.counters
    assert counters.members_retried == 1
    assert (counters.members_timed_out, counters.members_failed) == (
        (1, 0) if timed_out else (0, 1)
    )


def test_retry_zero_applies_the_rule_at_once() -> None:
    tracker = GroupTracker(exp_id="e1")
    sids = open_group(tracker, n=3, retry=0)
    actions = tracker.failed(sids[0], RuntimeError("agent raised"))
    assert actions == []
    tracker.succeeded(sids[1], 1.0)
    group = ready(tracker.succeeded(sids[2], 0.0))
    assert group.discarded[0].error == "RuntimeError: agent raised"
    assert group.discarded[0].drop_reason is DropReason.FAILED


# --- on_failure -----------------------------------------------------------------------------


def test_drop_member_keeps_the_survivors() -> None:
    tracker = GroupTracker(exp_id="e1")
    sids = open_group(tracker, n=3)
    [retry] = starts(tracker.failed(sids[0], "boom"))
    assert tracker.failed(retry.session_id, "boom again") == []
    tracker.succeeded(sids[1], 1.0)
    group = ready(tracker.succeeded(sids[2], 0.0))
    assert [m.index for m in group.members] == [1, 2]
    assert [(m.attempt, m.drop_reason) for m in group.discarded] == [
        (0, DropReason.RETRIED),
        (1, DropReason.FAILED),
    ]
    assert tracker.counters.members_dropped == {"retried": 1, "failed": 1}


def test_drop_member_below_min_members_drops_the_group() -> None:
    tracker = GroupTracker(exp_id="e1")
    sids = open_group(tracker, n=2, retry=0)
    tracker.succeeded(sids[0], 1.0)
    error = dropped(tracker.timed_out(sids[1]))
    assert error.reason is DropReason.TOO_FEW_MEMBERS
    assert [m.index for m in error.group.members] == [0]
    assert tracker.counters.groups_dropped == {"too_few_members": 1}


def test_drop_member_drops_early_once_min_members_is_out_of_reach() -> None:
    tracker = GroupTracker(exp_id="e1")
    sids = open_group(tracker, n=3, retry=0, min_members=3)
    actions = tracker.failed(sids[0], "boom")
    assert {s.session_id for s in stops(actions)} == set(sids[1:])
    assert dropped(actions).reason is DropReason.TOO_FEW_MEMBERS
    # The stopped members' outcomes arrive later and change nothing.
    assert tracker.succeeded(sids[1], 1.0) == []
    assert tracker.failed(sids[2], "cancelled") == []
    assert tracker.counters.ignored_events == 2


def test_zero_keeps_the_member_with_reward_zero() -> None:
    tracker = GroupTracker(exp_id="e1")
    sids = open_group(tracker, n=3, on_failure="zero")
    [retry] = starts(tracker.failed(sids[1], "boom"))
    assert tracker.timed_out(retry.session_id, trajectory="partial") == []
    tracker.succeeded(sids[0], 1.0)
    group = ready(tracker.succeeded(sids[2], 1.0))
    assert group.rewards == [1.0, 0.0, 1.0]
    zeroed = group.members[1]
    assert (zeroed.zeroed, zeroed.outcome, zeroed.attempt) == (True, MemberOutcome.TIMED_OUT, 1)
    assert zeroed.trajectory == "partial"
    assert group.stats.zeroed == 1
    assert tracker.counters.members_zeroed == 1


def test_zero_group_of_only_failures_resolves_all_zero() -> None:
    tracker = GroupTracker(exp_id="e1")
    sids = open_group(tracker, n=2, retry=0, on_failure="zero")
    tracker.failed(sids[0], "a")
    group = ready(tracker.failed(sids[1], "b"))
    assert group.rewards == [0.0, 0.0]


def test_drop_group_stops_the_rest_and_fails_the_group() -> None:
    tracker = GroupTracker(exp_id="e1")
    sids = open_group(tracker, n=3, on_failure="drop_group")
    tracker.succeeded(sids[0], 1.0)
    [retry] = starts(tracker.failed(sids[1], "boom"))
    actions = tracker.failed(retry.session_id, "boom again")
    assert [s.session_id for s in stops(actions)] == [sids[2]]
    assert stops(actions)[0].reason is DropReason.FAILED
    error = dropped(actions)
    assert error.reason is DropReason.FAILED
    assert "boom again" in str(error)
    assert error.group.rewards == [1.0]


# --- redundancy -----------------------------------------------------------------------------


def test_redundancy_keeps_the_first_n_and_stops_the_rest() -> None:
    tracker = GroupTracker(exp_id="e1")
    sids = open_group(tracker, n=2, redundancy=2)
    assert len(sids) == 4
    tracker.succeeded(sids[3], 1.0)
    actions = tracker.succeeded(sids[1], 0.0)
    assert {s.session_id for s in stops(actions)} == {sids[0], sids[2]}
    assert all(s.reason is DropReason.REDUNDANT for s in stops(actions))
    group = ready(actions)
    assert [m.index for m in group.members] == [1, 3]
    assert {m.drop_reason for m in group.discarded} == {DropReason.REDUNDANT}
    assert {m.outcome for m in group.discarded} == {MemberOutcome.STOPPED}
    assert tracker.counters.members_dropped == {"redundant": 2}
    assert tracker.counters.members_stopped == 2
    assert tracker.succeeded(sids[0], 1.0) == []  # finished after its stop: ignored


def test_a_spare_covers_a_failure_without_a_retry() -> None:
    tracker = GroupTracker(exp_id="e1")
    sids = open_group(tracker, n=2, redundancy=1)
    assert tracker.failed(sids[0], "boom") == []  # two still running can fill both places
    tracker.succeeded(sids[1], 1.0)
    group = ready(tracker.succeeded(sids[2], 0.0))
    assert [m.index for m in group.members] == [1, 2]
    assert group.discarded[0].drop_reason is DropReason.FAILED
    assert tracker.counters.members_retried == 0


def test_retry_once_the_spares_are_used_up() -> None:
    tracker = GroupTracker(exp_id="e1")
    sids = open_group(tracker, n=2, redundancy=1)
    assert tracker.failed(sids[0], "a") == []
    [retry] = starts(tracker.failed(sids[1], "b"))
    assert (retry.index, retry.attempt) == (1, 1)


# --- uniform filter -------------------------------------------------------------------------


def test_filter_uniform_drops_groups_without_signal() -> None:
    tracker = GroupTracker(exp_id="e1")
    sids = open_group(tracker, n=2, filter_uniform=True)
    tracker.succeeded(sids[0], 1.0)
    error = dropped(tracker.succeeded(sids[1], 1.0))
    assert error.reason is DropReason.UNIFORM
    assert error.group.rewards == [1.0, 1.0]
    sids = open_group(tracker, "q-2", n=2, filter_uniform=True)
    tracker.succeeded(sids[0], 1.0)
    assert ready(tracker.succeeded(sids[1], 0.0)).rewards == [1.0, 0.0]
    assert tracker.counters.groups_dropped == {"uniform": 1}
    assert tracker.counters.groups_ready == 1


def test_filter_uniform_sees_zeroed_members() -> None:
    tracker = GroupTracker(exp_id="e1")
    sids = open_group(tracker, n=2, retry=0, on_failure="zero", filter_uniform=True)
    tracker.failed(sids[0], "a")
    assert dropped(tracker.succeeded(sids[1], 0.0)).reason is DropReason.UNIFORM


# --- staleness ------------------------------------------------------------------------------


def test_advance_policy_drops_groups_older_than_the_allowed_lag() -> None:
    tracker = GroupTracker(exp_id="e1", policy_version=0)
    old = open_group(tracker, "old", n=2)
    tracker.set_policy_version(1)
    recent = open_group(tracker, "recent", n=2)
    tracker.succeeded(old[0], 1.0)
    actions = tracker.advance_policy(2, max_staleness=1)
    assert [s.session_id for s in stops(actions)] == [old[1]]
    assert stops(actions)[0].reason is DropReason.STALE
    error = dropped(actions)
    assert isinstance(error, StaleGroupError)
    assert (error.input_id, error.policy_version, error.current, error.max_staleness) == (
        "old",
        0,
        2,
        1,
    )
    assert error.group.rewards == [1.0]
    assert tracker.is_open("recent")
    assert tracker.counters.groups_dropped == {"stale": 1}
    assert tracker.succeeded(old[1], 1.0) == []  # a late result of the stale group
    tracker.succeeded(recent[0], 1.0)
    group = ready(tracker.succeeded(recent[1], 0.0))
    assert (group.stats.policy_version_min, group.stats.policy_version_max) == (1, 1)


def test_retries_carry_the_new_version_and_the_group_reports_both() -> None:
    tracker = GroupTracker(exp_id="e1", policy_version=4)
    sids = open_group(tracker, n=2)
    tracker.set_policy_version(5)
    [retry] = starts(tracker.failed(sids[0], "boom"))
    assert retry.policy_version == 5
    tracker.succeeded(sids[1], 1.0)
    group = ready(tracker.succeeded(retry.session_id, 0.0))
    assert (group.stats.policy_version_min, group.stats.policy_version_max) == (4, 5)


def test_stale_uses_the_oldest_member() -> None:
    tracker = GroupTracker(exp_id="e1", policy_version=4)
    sids = open_group(tracker, n=2)
    tracker.set_policy_version(6)
    tracker.failed(sids[0], "boom")  # retried under 6; member 1 still runs under 4
    error = dropped(tracker.advance_policy(6, max_staleness=1))
    assert isinstance(error, StaleGroupError)
    assert error.policy_version == 4


def test_members_replaced_by_retries_no_longer_count_for_staleness() -> None:
    tracker = GroupTracker(exp_id="e1", policy_version=1)
    sids = open_group(tracker, n=2, retry=2)
    tracker.set_policy_version(5)
    retries = [starts(tracker.failed(sid, "boom"))[0] for sid in sids]
    assert {r.policy_version for r in retries} == {5}
    assert tracker.advance_policy(6, max_staleness=1) == []
    tracker.succeeded(retries[0].session_id, 1.0)
    group = ready(tracker.succeeded(retries[1].session_id, 0.0))
    assert (group.stats.policy_version_min, group.stats.policy_version_max) == (5, 5)


def test_unversioned_groups_count_as_version_zero() -> None:
    tracker = GroupTracker(exp_id="e1")
    open_group(tracker, n=2)
    assert tracker.advance_policy(1, max_staleness=1) == []
    assert dropped(tracker.advance_policy(2, max_staleness=1)).reason is DropReason.STALE


def test_policy_versions_only_move_forward() -> None:
    tracker = GroupTracker(exp_id="e1", policy_version=3)
    with pytest.raises(ConfigurationError, match="older"):
        tracker.set_policy_version(2)
    with pytest.raises(ConfigurationError, match="max_staleness"):
        tracker.advance_policy(4, max_staleness=-1)
    with pytest.raises(ConfigurationError, match="policy version"):
        tracker.set_policy_version(-1)
    assert tracker.policy_version == 3


# --- cancel, bad events, reuse --------------------------------------------------------------


def test_cancel_stops_every_running_member() -> None:
    tracker = GroupTracker(exp_id="e1")
    sids = open_group(tracker, n=3)
    tracker.succeeded(sids[0], 1.0)
    actions = tracker.cancel("q-1")
    assert {s.session_id for s in stops(actions)} == set(sids[1:])
    assert dropped(actions).reason is DropReason.CANCELLED
    assert tracker.cancel("q-1") == []
    assert not tracker.is_open("q-1")


def test_unknown_sessions_and_reused_input_ids_are_refused() -> None:
    tracker = GroupTracker(exp_id="e1")
    open_group(tracker, n=1)
    with pytest.raises(KeyError, match="not a member"):
        tracker.succeeded("a" * 48, 1.0)
    with pytest.raises(KeyError, match="not a member"):
        tracker.failed(member_session_id("e1", "other", index=0, attempt=0), "x")
    with pytest.raises(ConfigurationError, match="q-1@step3"):
        open_group(tracker, n=1)
    with pytest.raises(InvalidRolloutConfig):
        GroupTracker(exp_id="a/b")


def test_counters_count_drops_by_reason_and_are_a_snapshot() -> None:
    tracker = GroupTracker(exp_id="e1")
    sids = open_group(tracker, n=2, filter_uniform=True)
    tracker.succeeded(sids[0], 1.0)
    before = tracker.counters
    tracker.succeeded(sids[1], 1.0)
    counters = tracker.counters
    assert counters.groups_dropped == {"uniform": 1}
    assert counters.members_dropped.get("redundant", 0) == 0
    assert (counters.members_succeeded, counters.groups_open) == (2, 0)
    assert (before.groups_dropped, before.members_succeeded, before.groups_open) == ({}, 1, 1)


# --- every group ends once, every attempt is accounted for ----------------------------------


@pytest.mark.parametrize("seed", range(40))
def test_random_event_orders_resolve_every_group_exactly_once(seed: int) -> None:
    rng = random.Random(seed)
    tracker = GroupTracker(exp_id="e1", policy_version=0)
    live: set[str] = set()
    resolved: dict[str, int] = {}
    rules_of: dict[str, GroupRules] = {}

    def apply(actions: list[Action]) -> None:
        for action in actions:
            if isinstance(action, StartMember):
                live.add(action.session_id)
            elif isinstance(action, StopMember):
                live.remove(action.session_id)
            else:
                group = action if isinstance(action, RolloutGroup) else action.group
                resolved[group.input_id] = resolved.get(group.input_id, 0) + 1
                rules = rules_of[group.input_id]
                assert len(group.members) <= rules.n
                if isinstance(action, RolloutGroup):
                    assert len(group.members) >= rules.keep_at_least
                    if rules.on_failure != "drop_member":
                        assert len(group.members) == rules.n
                assert not tracker.is_open(group.input_id)

    for g in range(6):
        rules = GroupRules(
            n=rng.randint(1, 4),
            redundancy=rng.randint(0, 2),
            retry=rng.randint(0, 2),
            on_failure=rng.choice(["drop_member", "zero", "drop_group"]),
            filter_uniform=rng.random() < 0.3,
        )
        rules_of[f"q-{g}"] = rules
        apply(tracker.open(f"q-{g}", rules))
    for step in range(500):
        if not live:
            break
        roll = rng.random()
        if roll < 0.02:
            apply(tracker.advance_policy(step // 50, max_staleness=2))
            continue
        sid = rng.choice(sorted(live))
        live.remove(sid)
        if roll < 0.6:
            apply(tracker.succeeded(sid, rng.choice([0.0, 1.0])))
        elif roll < 0.8:
            apply(tracker.failed(sid, "injected"))
        else:
            apply(tracker.timed_out(sid))
    assert not live
    assert resolved == dict.fromkeys(rules_of, 1)
    counters = tracker.counters
    assert counters.groups_open == 0
    assert counters.groups_ready + sum(counters.groups_dropped.values()) == len(rules_of)
    ended = counters.members_succeeded + counters.members_failed + counters.members_timed_out
    assert ended + counters.members_stopped == counters.members_started


# --- failure kinds --------------------------------------------------------------------------


def test_infra_failures_have_their_own_retries_and_are_never_zeroed() -> None:
    tracker = GroupTracker(exp_id="e1")
    sids = open_group(tracker, n=3, retry=1, retry_infra=2, on_failure="zero")
    # Member 1: an agent failure and two infra failures are all retried (two budgets).
    [a1] = starts(tracker.failed(sids[1], "ValueError: bad tool call"))
    [a2] = starts(tracker.failed(a1.session_id, "agent lost", kind=FailureKind.INFRA))
    [a3] = starts(tracker.failed(a2.session_id, "throttled", kind=FailureKind.INFRA))
    # An infra retry is the same draw again (its seed's): it never got a fair run.
    assert [a1.draw, a2.draw, a3.draw] == [1, 1, 1]
    # The infra budget is spent: left out, not zeroed, though the rule is "zero".
    assert tracker.failed(a3.session_id, "InfraError", kind=FailureKind.INFRA) == []
    tracker.succeeded(sids[0], 1.0)
    group = ready(tracker.succeeded(sids[2], 0.0))
    assert group.rewards == [1.0, 0.0]
    assert [m.index for m in group.members] == [0, 2]
    left_out = group.discarded[-1]
    assert (left_out.failure_kind, left_out.drop_reason, left_out.zeroed) == (
        FailureKind.INFRA,
        DropReason.INFRA,
        False,
    )
    assert tracker.counters.failures == {"agent": 1, "infra": 3}
    assert tracker.counters.members_zeroed == 0


@pytest.mark.parametrize("on_failure", ["zero", "drop_group"])
def test_reward_and_infra_failures_leave_the_member_out_whatever_on_failure_says(
    on_failure: str,
) -> None:
    tracker = GroupTracker(exp_id="e1")
    sids = open_group(tracker, n=4, retry=0, retry_infra=0, on_failure=on_failure)
    assert tracker.failed(sids[0], "rewards[0] must be finite", kind=FailureKind.REWARD) == []
    assert tracker.failed(sids[1], "agent lost", kind="infra") == []  # type: ignore[arg-type]
    tracker.succeeded(sids[2], 1.0)
    group = ready(tracker.succeeded(sids[3], 0.0))
    assert [m.index for m in group.members] == [2, 3]
    assert [m.drop_reason for m in group.discarded] == [DropReason.REWARD, DropReason.INFRA]
    assert tracker.counters.members_dropped == {"reward": 1, "infra": 1}


def test_an_agent_failure_follows_on_failure_and_a_timeout_on_timeout() -> None:
    tracker = GroupTracker(exp_id="e1")
    sids = open_group(tracker, n=3, retry=0, on_failure="zero", on_timeout="drop_member")
    tracker.failed(sids[0], "KeyError: 'tool'")
    tracker.failed(sids[1], "no result", kind=FailureKind.TIMEOUT)
    group = ready(tracker.succeeded(sids[2], 1.0))
    assert [(m.index, m.zeroed, m.failure_kind) for m in group.members] == [
        (0, True, FailureKind.AGENT),
        (2, False, None),
    ]
    assert [(m.drop_reason, m.failure_kind) for m in group.discarded] == [
        (DropReason.TIMED_OUT, FailureKind.TIMEOUT)
    ]
    with pytest.raises(ConfigurationError, match="on_timeout must be one of"):
        GroupRules(n=2, on_timeout="skip")  # type: ignore[arg-type]
