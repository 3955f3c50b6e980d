"""GRPO groups on the real local stack: invoke_group, run_groups, the failure rules,
redundancy, the uniform filter, policy versions and staleness."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import Any, TypeVar

import pytest

from agentcore_rl.client import GroupFuture
from agentcore_rl.errors import ClientClosedError, ConfigurationError
from agentcore_rl.groups import (
    DropReason,
    GroupDroppedError,
    GroupRules,
    MemberOutcome,
    RolloutGroup,
    StaleGroupError,
    group_digest,
    parse_member_session_id,
)
from tests.client.agents import Recorder
from tests.client.conftest import ClientFactory

T = TypeVar("T")


async def bounded(awaitable: Awaitable[T]) -> T:
    return await asyncio.wait_for(awaitable, 10)


def member(**options: Any) -> dict[str, Any]:
    return {"mode": "group", **options}


async def test_a_group_holds_n_members_with_rewards_and_versions(
    make_client: ClientFactory, recorder: Recorder
) -> None:
    client = make_client()
    client.set_policy_version(3)
    fut = await client.invoke_group(
        member(rewards=[1.0, 0.0]),
        rules=GroupRules(n=4, member_seed=10),
        input_id="q-17",
        rollout={"temperature": 1.0},
    )
    assert isinstance(fut, GroupFuture)
    group = await bounded(fut)
    assert group.input_id == "q-17"
    assert group.rewards == [1.0, 0.0, 1.0, 0.0]
    assert group.advantages() == [0.5, -0.5, 0.5, -0.5]
    assert [m.index for m in group.members] == [0, 1, 2, 3]
    keys = [parse_member_session_id(sid) for sid in group.session_ids]
    assert [(k.index, k.attempt) for k in keys if k] == [(0, 0), (1, 0), (2, 0), (3, 0)]
    assert group.stats.policy_version_min == group.stats.policy_version_max == 3
    assert all(b["policy_version"] == 3 for b in recorder.rollout_blocks)
    assert all(b["temperature"] == 1.0 for b in recorder.rollout_blocks)
    assert all(b["input_id"] == "q-17" for b in recorder.rollout_blocks)
    assert sorted(b["seed"] for b in recorder.rollout_blocks) == [10, 11, 12, 13]
    assert client.group_stats.groups_ready == 1
    with pytest.raises(ConfigurationError, match="already had a group"):
        await client.invoke_group(member(), rules=GroupRules(n=2), input_id="q-17")


async def test_run_groups_yields_whole_groups_in_completion_order(
    make_client: ClientFactory, recorder: Recorder
) -> None:
    client = make_client()
    payloads = [member(gate=[0, 1]), member(rewards=[0.0, 1.0])]
    seen: list[RolloutGroup] = []
    async with contextlib.aclosing(
        client.run_groups(payloads, rules=GroupRules(n=2), timeout=10)
    ) as groups:
        async for group in groups:
            seen.append(group)
            if len(seen) == 1:
                recorder.open_gate()
    assert [g.input_id for g in seen] == ["000001", "000000"]
    assert all(len(g.members) == 2 for g in seen)


async def test_run_groups_names_a_group_by_its_payloads_id_as_eval_does(
    make_client: ClientFactory, caplog: pytest.LogCaptureFixture
) -> None:
    client = make_client()
    payloads = [member(rewards=[1.0], id="q-7"), member(rewards=[1.0], input_id=12), member()]
    rules = GroupRules(n=2, filter_uniform=True)
    groups = [g async for g in client.run_groups(payloads, rules=rules, timeout=10)]
    assert groups == []
    dropped = sorted(
        r.getMessage().split("'")[1] for r in caplog.records if "dropped" in r.getMessage()
    )
    assert dropped == ["000002", "12", "q-7"]


async def test_a_failed_member_is_retried_in_a_fresh_session(
    make_client: ClientFactory, recorder: Recorder
) -> None:
    client = make_client()
    fut = await client.invoke_group(
        member(fail=[1], bad_attempts=1), rules=GroupRules(n=3), input_id="retry"
    )
    group = await bounded(fut)
    assert [(m.index, m.attempt) for m in group.members] == [(0, 0), (1, 1), (2, 0)]
    assert [m.drop_reason for m in group.discarded] == [DropReason.RETRIED]
    assert group.stats.retried == 1
    assert client.group_stats.members_retried == 1


@pytest.mark.parametrize("on_failure", ["drop_member", "zero", "drop_group"])
async def test_each_failure_rule(make_client: ClientFactory, on_failure: Any) -> None:
    client = make_client()
    fut = await client.invoke_group(
        member(fail=[2], rewards=[1.0, 0.0]),
        rules=GroupRules(n=4, retry=1, on_failure=on_failure),
        input_id="f",
    )
    if on_failure == "drop_group":
        with pytest.raises(GroupDroppedError) as caught:
            await bounded(fut)
        assert caught.value.reason is DropReason.FAILED
        assert client.group_stats.groups_dropped == {"failed": 1}
        return
    group = await bounded(fut)
    if on_failure == "drop_member":
        assert [m.index for m in group.members] == [0, 1, 3]
        assert client.group_stats.members_dropped["failed"] == 1
    else:
        assert [m.index for m in group.members] == [0, 1, 2, 3]
        zeroed = group.members[2]
        assert zeroed.zeroed
        assert zeroed.reward == 0.0
        assert zeroed.outcome is MemberOutcome.FAILED
        assert client.group_stats.members_zeroed == 1
    assert client.group_stats.members_retried == 1  # member 2 ran twice, in two sessions


async def test_too_few_members_drops_the_group(make_client: ClientFactory) -> None:
    client = make_client()
    fut = await client.invoke_group(
        member(fail=[0, 1]), rules=GroupRules(n=3, retry=0), input_id="few"
    )
    with pytest.raises(GroupDroppedError) as caught:
        await bounded(fut)
    assert caught.value.reason is DropReason.TOO_FEW_MEMBERS
    assert len(caught.value.group.members) <= 1


async def test_redundancy_stops_the_extras_on_the_agent(
    make_client: ClientFactory, recorder: Recorder
) -> None:
    client = make_client()
    fut = await client.invoke_group(
        member(hang=[1]), rules=GroupRules(n=2, redundancy=1), input_id="spare"
    )
    group = await bounded(fut)
    assert [m.index for m in group.members] == [0, 2]
    [extra] = group.discarded
    assert extra.index == 1
    assert extra.drop_reason is DropReason.REDUNDANT
    await recorder.wait_for(lambda: extra.session_id in recorder.cancelled)
    assert client.group_stats.members_dropped == {"redundant": 1}


async def test_a_member_that_times_out_is_retried_then_dropped(
    make_client: ClientFactory, recorder: Recorder
) -> None:
    client = make_client()
    # The short timeout only has to outlast the quick members on a loaded machine.
    fut = await client.invoke_group(
        member(hang=[0]), rules=GroupRules(n=3), input_id="slow", timeout=2.0
    )
    group = await bounded(fut)
    assert [m.index for m in group.members] == [1, 2]
    assert [m.drop_reason for m in group.discarded] == [DropReason.RETRIED, DropReason.TIMED_OUT]
    assert client.group_stats.members_timed_out == 2
    hung = {m.session_id for m in group.discarded}
    await recorder.wait_for(lambda: hung <= recorder.cancelled)


async def test_uniform_groups_are_filtered(make_client: ClientFactory) -> None:
    client = make_client()
    payloads = [member(rewards=[1.0]), member(rewards=[1.0, 0.0])]
    groups = [
        g async for g in client.run_groups(payloads, rules=GroupRules(n=2, filter_uniform=True))
    ]
    assert [g.input_id for g in groups] == ["000001"]
    assert client.group_stats.groups_dropped == {"uniform": 1}
    assert client.group_stats.groups_ready == 1


async def test_advance_policy_stops_stale_groups(
    make_client: ClientFactory, recorder: Recorder
) -> None:
    client = make_client()
    client.set_policy_version(1)
    old = await client.invoke_group(member(gate=[0, 1]), rules=GroupRules(n=2), input_id="old")
    await recorder.wait_for(lambda: len(recorder.sessions) == 2)
    client.set_policy_version(2)
    new = await client.invoke_group(member(gate=[0, 1]), rules=GroupRules(n=2), input_id="new")
    assert client.advance_policy(3, max_staleness=1) == 1
    with pytest.raises(StaleGroupError) as caught:
        await bounded(old)
    assert (caught.value.policy_version, caught.value.current) == (1, 3)
    assert client.group_stats.groups_dropped == {"stale": 1}
    await recorder.wait_for(lambda: set(old.session_ids) <= recorder.cancelled)
    recorder.open_gate()
    group = await bounded(new)
    assert group.stats.policy_version_max == 2
    assert all(b["policy_version"] in (1, 2) for b in recorder.rollout_blocks)


async def test_cancelling_a_group_stops_its_members(
    make_client: ClientFactory, recorder: Recorder
) -> None:
    client = make_client()
    fut = await client.invoke_group(member(hang=[0, 1]), rules=GroupRules(n=2), input_id="gone")
    await recorder.wait_for(lambda: len(recorder.sessions) == 2)
    fut.cancel()
    await recorder.wait_for(lambda: set(fut.session_ids) <= recorder.cancelled)
    assert client.group_stats.groups_dropped == {"cancelled": 1}


async def test_closing_the_client_ends_open_groups(
    make_client: ClientFactory, recorder: Recorder
) -> None:
    client = make_client()
    fut = await client.invoke_group(member(hang=[0, 1]), rules=GroupRules(n=2), input_id="open")
    await recorder.wait_for(lambda: len(recorder.sessions) == 2)
    await client.aclose()
    with pytest.raises(ClientClosedError):
        await bounded(fut)
    with pytest.raises(ClientClosedError):
        await client.invoke_group(member(), rules=GroupRules(n=2))


async def test_leaving_run_groups_early_stops_the_groups_still_running(
    make_client: ClientFactory, recorder: Recorder
) -> None:
    client = make_client()
    payloads = [member(), member(hang=[0, 1])]
    async with contextlib.aclosing(client.run_groups(payloads, rules=GroupRules(n=2))) as groups:
        async for group in groups:
            assert group.input_id == "000000"
            await recorder.wait_for(lambda: len(recorder.sessions) == 4)
            break
    digest = group_digest("exp", "000001")
    hung = {sid for sid in recorder.sessions if digest in sid}
    assert len(hung) == 2
    await recorder.wait_for(lambda: hung <= recorder.cancelled)
    assert client.group_stats.groups_dropped == {"cancelled": 1}
