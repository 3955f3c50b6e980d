"""RolloutClient, the sync facade, passes the async client's scenarios. The agent server
runs on its own event-loop thread; the client on its private one."""

from __future__ import annotations

import concurrent.futures
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import pytest
from anyio.from_thread import BlockingPortal, start_blocking_portal

from agentcore_rl.client import AwsConfig, RolloutClient
from agentcore_rl.errors import (
    ClientClosedError,
    ConfigurationError,
    InvocationError,
    RolloutError,
    RolloutTimeoutError,
)
from agentcore_rl.groups import GroupRules, StaleGroupError
from agentcore_rl.local.background import BackgroundServer
from agentcore_rl.s3 import ResultStore
from agentcore_rl.server.options import SpoolConfig
from tests.client.agents import Recorder, make_agent
from tests.client.conftest import FAST_WATCH, fast_limits, quick_retries, short_timeouts
from tests.conftest import FAST_RETRY

_numbers = itertools.count()


@dataclass
class Agent:
    portal: BlockingPortal
    recorder: Recorder
    url: str

    def wait_for(self, predicate: Callable[[], bool]) -> None:
        self.portal.call(self.recorder.wait_for, predicate)


@pytest.fixture
def agent(s3_endpoint: str, tmp_path: Path) -> Iterator[Agent]:
    with start_blocking_portal() as portal:
        recorder = Recorder()
        store = ResultStore(endpoint_url=s3_endpoint, retry=FAST_RETRY)
        portal.call(store.__aenter__)  # connect now: the first result is not written late
        server = BackgroundServer(
            make_agent(store, recorder, spool=SpoolConfig(directory=tmp_path / "spool"))
        )
        portal.call(server.start)
        try:
            yield Agent(portal, recorder, server.url)
        finally:
            portal.call(server.aclose)
            portal.call(store.aclose)


@pytest.fixture
def sync_bucket(s3_endpoint: str) -> str:
    name = f"sync-bucket-{next(_numbers)}"
    boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1").create_bucket(Bucket=name)
    return name


@pytest.fixture
def client(agent: Agent, sync_bucket: str, s3_endpoint: str) -> Iterator[RolloutClient]:
    with make(agent, sync_bucket, s3_endpoint) as rollout_client:
        yield rollout_client


def make(agent: Agent, bucket: str, s3_endpoint: str, **options: Any) -> RolloutClient:
    settings: dict[str, Any] = {
        "agent_url": agent.url,
        "s3_bucket": bucket,
        "exp_id": "exp",
        "limits": fast_limits(),
        "aws": AwsConfig(s3_endpoint_url=s3_endpoint),
        "watcher": FAST_WATCH,
        "retries": quick_retries(),
        "timeouts": short_timeouts(),
    }
    settings.update(options)
    return RolloutClient(**settings)


def test_rollout_returns_the_result_with_overrides(client: RolloutClient, agent: Agent) -> None:
    result = client.rollout({"n": 1}, input_id="q-1", rollout={"temperature": 0.2})
    assert result["n"] == 1
    assert agent.recorder.rollout_blocks[0]["temperature"] == 0.2
    assert agent.recorder.rollout_blocks[0]["input_id"] == "q-1"


def test_invoke_returns_a_concurrent_future(client: RolloutClient) -> None:
    futs = [client.invoke({"n": n}) for n in range(3)]
    assert all(isinstance(f, concurrent.futures.Future) for f in futs)
    assert len({f.session_id for f in futs}) == 3  # type: ignore[attr-defined]
    done = [f.result() for f in concurrent.futures.as_completed(futs, timeout=10)]
    assert sorted(r["n"] for r in done) == [0, 1, 2]
    assert futs[0].result(timeout=10)["n"] == 0


def test_error_outcomes(client: RolloutClient, agent: Agent) -> None:
    with pytest.raises(RolloutError, match="agent failed"):
        client.rollout({"mode": "raise"})
    with pytest.raises(RolloutError, match="answer unparseable"):
        client.rollout({"mode": "envelope"})
    fut = client.invoke({"mode": "hang"}, timeout=0.05)
    with pytest.raises(RolloutTimeoutError):
        fut.result(timeout=10)
    agent.wait_for(lambda: fut.session_id in agent.recorder.cancelled)  # type: ignore[attr-defined]


def test_unreachable_agent_is_an_invocation_error(
    agent: Agent, sync_bucket: str, s3_endpoint: str
) -> None:
    with (
        make(
            agent, sync_bucket, s3_endpoint, agent_url="http://127.0.0.1:9", preflight=False
        ) as client,
        pytest.raises(InvocationError, match="no connection to the agent"),
    ):
        client.invoke({})


def test_cancel_stops_the_session(client: RolloutClient, agent: Agent) -> None:
    fut = client.invoke({"mode": "hang"})
    sid = fut.session_id  # type: ignore[attr-defined]
    agent.wait_for(lambda: sid in agent.recorder.sessions)
    assert fut.cancel()
    agent.wait_for(lambda: sid in agent.recorder.cancelled)


def test_run_batch_is_a_plain_iterator(client: RolloutClient) -> None:
    # The timeout only has to outlast the quick rollouts, with room for a loaded CI machine.
    items = list(client.run_batch([{"n": 0}, {"mode": "raise"}, {"mode": "hang"}], timeout=2.0))
    by_index = {item.index: item for item in items}
    assert sorted(by_index) == [0, 1, 2]
    assert by_index[0].success
    assert isinstance(by_index[1].error, RolloutError)
    assert isinstance(by_index[2].error, RolloutTimeoutError)


def test_early_break_stops_live_sessions(agent: Agent, sync_bucket: str, s3_endpoint: str) -> None:
    with make(
        agent, sync_bucket, s3_endpoint, limits=fast_limits(max_concurrent_sessions=3)
    ) as client:
        for item in client.run_batch([{"n": 0}] + [{"mode": "hang"}] * 5):
            assert item.success
            first = item.session_id
            agent.wait_for(lambda: agent.recorder.running == 3)
            break
        hanging = set(agent.recorder.sessions) - {first}
        agent.wait_for(lambda: agent.recorder.cancelled == hanging)
        assert client.stats.in_flight == 0
        assert agent.recorder.max_running == 3


def test_close_is_idempotent_and_final(agent: Agent, sync_bucket: str, s3_endpoint: str) -> None:
    client = make(agent, sync_bucket, s3_endpoint)
    fut = client.invoke({"mode": "hang"})
    client.close()
    with pytest.raises(ClientClosedError):
        fut.result(timeout=5)
    client.close()
    assert agent.recorder.cancelled == set(agent.recorder.sessions)


def test_bad_arguments_raise_in_the_callers_thread() -> None:
    with pytest.raises(ConfigurationError, match="exactly one of"):
        RolloutClient(s3_bucket="bkt", exp_id="e")


def test_attach_follows_a_rollout_started_elsewhere(
    agent: Agent, sync_bucket: str, s3_endpoint: str
) -> None:
    with (
        make(agent, sync_bucket, s3_endpoint) as starter,
        make(agent, sync_bucket, s3_endpoint) as follower,
    ):
        started = starter.invoke({"mode": "gate", "n": 4}, session_id="sync-started-1")
        fut = follower.attach(session_id="sync-started-1", result_key=started.result_key)  # type: ignore[attr-defined]
        assert fut.session_id == "sync-started-1"  # type: ignore[attr-defined]
        agent.portal.call(agent.recorder.open_gate)
        assert fut.result(timeout=10)["n"] == 4
        assert started.result(timeout=10)["n"] == 4


def test_groups_through_the_sync_facade(client: RolloutClient, agent: Agent) -> None:
    client.set_policy_version(2)
    fut = client.invoke_group(
        {"mode": "group", "rewards": [1.0, 0.0]}, rules=GroupRules(n=2), input_id="g-1"
    )
    group = fut.result(timeout=10)
    assert group.rewards == [1.0, 0.0]
    assert group.stats.policy_version_max == 2
    payloads = [{"mode": "group", "rewards": [1.0]}, {"mode": "group", "rewards": [0.0, 1.0]}]
    groups = list(client.run_groups(payloads, rules=GroupRules(n=2, filter_uniform=True)))
    assert [g.input_id for g in groups] == ["000001"]
    stale = client.invoke_group(
        {"mode": "group", "hang": [0, 1]}, rules=GroupRules(n=2), input_id="g-2"
    )
    assert client.advance_policy(4, max_staleness=1) == 1
    with pytest.raises(StaleGroupError):
        stale.result(timeout=10)
    stats = client.group_stats
    assert stats.groups_ready == 2
    assert stats.groups_dropped == {"uniform": 1, "stale": 1}


def test_errors_leave_the_sync_facade_as_themselves(
    agent: Agent, sync_bucket: str, s3_endpoint: str
) -> None:
    def use(payload: dict[str, Any]) -> None:
        with make(agent, sync_bucket, s3_endpoint) as client:
            client.rollout(payload)
            raise ValueError("mine")

    with pytest.raises(ValueError, match="mine") as caught:
        use({"n": 1})
    assert type(caught.value) is ValueError
    with pytest.raises(RolloutError) as failed:
        use({"mode": "raise"})
    assert type(failed.value) is RolloutError
