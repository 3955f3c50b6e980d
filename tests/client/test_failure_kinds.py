"""Every failure classified once, on a real agent server and moto S3: the envelope's
``failure_kind``, the client's outcome (``failure_kind``, ``BatchItem.kind``, its
counters), a group's members and counters; and the stop once too many recent rollouts
failed for infrastructure."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agentcore_rl.client import InfraStop
from agentcore_rl.client.outcomes import InfraWindow, failure_cause, failure_kind
from agentcore_rl.errors import (
    AgentLostError,
    AgentUnreachableError,
    ClientClosedError,
    InfraFailureRateError,
    InvocationError,
    RewardError,
    RolloutError,
    RolloutTimeoutError,
    StorageError,
    TraceLostError,
)
from agentcore_rl.groups import DropReason, GroupRules
from agentcore_rl.protocol import FailureKind
from tests.client.conftest import ClientFactory, fast_limits, quick_retries


def envelope_error(error_type: str, reason: str = "", **extra: Any) -> RolloutError:
    envelope = {"status_code": 500, "error_type": error_type, "stop_reason": reason}
    return RolloutError({**envelope, **extra})


@pytest.mark.parametrize(
    ("error", "kind", "cause"),
    [
        (AgentLostError("gone"), "infra", "agent lost"),
        (AgentUnreachableError("refused"), "infra", "agent unreachable"),
        (InvocationError("429", status_code=429), "infra", "throttled"),
        (InvocationError("502", status_code=502), "infra", "invocation failed (502)"),
        (InvocationError("reset"), "infra", "invocation failed (no answer)"),
        (StorageError("denied", operation="put", bucket="b"), "infra", "result store failed"),
        (TraceLostError("s", "the gateway restarted"), "infra", "trace lost"),
        (envelope_error("infra_error", failure_kind="infra"), "infra", "InfraError"),
        (envelope_error("cancelled", "cancelled: the agent server is shutting down"), "infra",
         "agent shut down"),
        (envelope_error("handler_exception", failure_kind="agent"), "agent", None),
        (envelope_error("handler_exception"), "agent", None),  # a writer that does not say
        (InvocationError("bad prompt", status_code=400), "agent", None),
        (envelope_error("invalid_reward", failure_kind="reward"), "reward", None),
        (RewardError("no score"), "reward", None),
        (RolloutTimeoutError("late"), "timeout", None),
        (envelope_error("cancelled", "stopped by the trainer"), "stopped", None),
        (ClientClosedError("closed"), "stopped", None),
        (asyncio.CancelledError(), "stopped", None),
    ],
)  # fmt: skip
def test_each_outcome_has_one_kind_and_an_infra_failure_a_cause(
    error: BaseException, kind: str, cause: str | None
) -> None:
    assert failure_kind(error) is FailureKind(kind)
    if cause is not None:
        assert failure_cause(error) == cause
    assert failure_kind(None) is None


def test_the_window_stops_past_its_share_of_infra_failures_and_names_the_causes() -> None:
    window = InfraWindow(share=0.2, window=10)
    for number in range(10):
        window.record(AgentLostError("gone") if number >= 8 else None)
        window.check()  # 2 of 10: at the share, not past it
    window.record(asyncio.CancelledError())  # a stop says nothing of the infrastructure
    window.record(InvocationError("429", status_code=429))
    window.record(AgentLostError("gone"))
    with pytest.raises(InfraFailureRateError) as caught:
        window.check()
    assert caught.value.counts == {"agent lost": 3, "throttled": 1}
    assert "4 of the last 10 rollouts (3 agent lost, 1 throttled)" in str(caught.value)


async def test_outcomes_carry_their_kind_end_to_end(make_client: ClientFactory) -> None:
    client = make_client(retries=quick_retries(rollouts=0))
    payloads: list[dict[str, Any]] = [
        {"mode": "raise"},  # the agent's own failure
        {"mode": "infra"},  # the handler raised InfraError
        {"mode": "result", "result": {"rewards": ["1.0"]}},
        {"mode": "result", "result": {"rewards": 1.0}},
        {"mode": "result", "result": {"answer": 4}},  # no reward: not the server's business
        {"mode": "ok"},
    ]
    items = {item.index: item async for item in client.run_batch(payloads, timeout=10)}
    assert [items[i].kind for i in range(6)] == [
        FailureKind.AGENT,
        FailureKind.INFRA,
        FailureKind.REWARD,
        FailureKind.REWARD,
        None,
        None,
    ]
    for index, reason in ((2, "rewards[0] must be a number, got str '1.0'"),
                          (3, "rewards must be a list of numbers, got float")):  # fmt: skip
        error = items[index].error
        assert isinstance(error, RolloutError)
        assert error.envelope["failure_kind"] == "reward"
        assert error.envelope["stop_reason"] == reason
    assert client.stats.failures == {"agent": 1, "infra": 1, "reward": 2}


async def test_an_infra_failure_is_retried_in_a_new_session(make_client: ClientFactory) -> None:
    client = make_client(retries=quick_retries(rollouts=1))
    fut = await client.invoke({"mode": "infra"})
    with pytest.raises(RolloutError, match="sandbox is down"):
        await asyncio.wait_for(fut, 10)
    assert fut.attempts == 2


async def test_group_members_fail_by_kind_and_only_agent_failures_are_zeroed(
    make_client: ClientFactory,
) -> None:
    client = make_client()
    rules = GroupRules(n=5, retry=0, retry_infra=1, on_failure="zero", min_members=1)
    payload = {"mode": "group", "fail": [0], "infra": [1], "no_reward": [2], "nan": [3]}
    group = await asyncio.wait_for(await client.invoke_group(payload, rules=rules), 10)
    assert [(m.index, m.zeroed, m.failure_kind) for m in group.members] == [
        (0, True, FailureKind.AGENT),
        (4, False, None),
    ]
    left_out = {(m.index, m.attempt): (m.drop_reason, m.failure_kind) for m in group.discarded}
    assert left_out == {
        (1, 0): (DropReason.RETRIED, FailureKind.INFRA),
        (1, 1): (DropReason.INFRA, FailureKind.INFRA),
        (2, 0): (DropReason.REWARD, FailureKind.REWARD),
        (3, 0): (DropReason.REWARD, FailureKind.REWARD),
    }
    no_reward = next(m for m in group.discarded if m.index == 2)
    assert no_reward.error == "the result has no reward: return rewards: [r, ...] or reward: r"
    nan = next(m for m in group.discarded if m.index == 3)
    assert "rewards[0] must be finite, got nan" in str(nan.error)
    assert client.group_stats.failures == {"agent": 1, "infra": 2, "reward": 2}


async def _batch(client: Any, payloads: list[dict[str, Any]]) -> tuple[int, BaseException | None]:
    read = 0
    try:
        async for _ in client.run_batch(payloads, timeout=10):
            read += 1
    except InfraFailureRateError as exc:
        return read, exc
    return read, None


async def test_a_batch_losing_30_percent_stops_within_the_window_and_5_percent_goes_on(
    make_client: ClientFactory,
) -> None:
    # Four rollouts at a time, so admission follows the outcomes; no retries, so each
    # loss is one session.
    options = {
        "limits": fast_limits(max_concurrent_sessions=4),
        "retries": quick_retries(lost=0),
        "infra_stop": InfraStop(share=0.2, window=20),
    }
    lossy = [{"mode": "lost", "lose": n % 10 < 3} for n in range(200)]
    read, error = await _batch(make_client(**options), lossy)
    assert isinstance(error, InfraFailureRateError)
    assert set(error.counts) == {"agent lost"}
    assert error.counts["agent lost"] > 4
    assert read < 40  # stopped within about one window, not after 200 rollouts
    steady = [{"mode": "lost", "lose": n % 20 == 0} for n in range(100)]
    assert await _batch(make_client(**options), steady) == (100, None)


async def test_run_groups_stops_too_and_none_turns_the_stop_off(
    make_client: ClientFactory,
) -> None:
    limits = fast_limits(max_concurrent_sessions=4)
    stop = InfraStop(share=0.2, window=10)
    payloads = [{"mode": "group", "infra": [0, 1]} for _ in range(30)]
    rules = GroupRules(n=2, retry_infra=0, min_members=1)
    client = make_client(limits=limits, infra_stop=stop)
    with pytest.raises(InfraFailureRateError, match="InfraError"):
        async for _ in client.run_groups(payloads, rules=rules):
            pass
    unstoppable = make_client(limits=limits, infra_stop=None)
    groups = [g async for g in unstoppable.run_groups(payloads[:10], rules=rules)]
    assert groups == []  # every group dropped (too few members), none stopped the run
    assert unstoppable.group_stats.groups_dropped == {"too_few_members": 10}
