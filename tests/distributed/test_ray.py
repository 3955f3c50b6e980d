"""The shared limits on a real local Ray instance: one module starts Ray once.

Four workers (Ray actors, so separate processes) each drive rollouts through their own
AsyncRolloutClient against ONE local AgentCore Runtime (served from the test's event loop,
with embedded S3 and two sleeping agents) whose own token bucket answers 429 beyond the
quota. Waits are real but bounded.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

try:
    import ray
except ImportError:  # the `ray` extra (in `dev`) is not installed
    pytest.skip(
        "ray is not importable: pip install 'agentcore-rl[ray]' to run the shared-limits "
        "tests on a local Ray instance",
        allow_module_level=True,
    )

from agentcore_rl.distributed import DEFAULT_NAMESPACE, shared_limits
from agentcore_rl.errors import ConfigurationError
from tests.distributed.cluster import Stack, Worker, serve_stack
from tests.distributed.conformance import max_in_window, violations

# Starting Ray and four worker processes on a busy 2-core machine takes a while.
pytestmark = pytest.mark.timeout(150)

ROOT = Path(__file__).resolve().parents[2]
TPS = 25
SESSIONS = 8
SETTINGS: dict[str, Any] = {"tps": TPS, "sessions": SESSIONS, "slot_ttl": 3.0}
FAKE_AWS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-west-2",
    "AWS_EC2_METADATA_DISABLED": "true",
}


@pytest.fixture(scope="module")
def cluster() -> Iterator[list[Any]]:
    """Ray, and four worker processes started once for the module."""
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={
            "env_vars": {
                **FAKE_AWS,
                # Workers import the test helpers from the repository.
                "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
            }
        },
    )
    try:
        workers = [Worker.remote() for _ in range(4)]  # type: ignore[attr-defined]
        ray.get([w.ready.remote() for w in workers], timeout=120)
        yield workers
    finally:
        ray.shutdown()


@pytest.fixture
async def stack(s3_endpoint: str, bucket: str) -> AsyncIterator[Stack]:
    async with serve_stack(s3_endpoint, bucket, TPS) as served:
        yield served


def _name() -> str:
    return f"test-{uuid.uuid4().hex[:12]}"


async def _status(name: str) -> dict[str, Any]:
    actor = ray.get_actor(name, namespace=DEFAULT_NAMESPACE)
    status: dict[str, Any] = await actor.status.remote()
    return status


def _sleeps(n: int, low: float, high: float, seed: int) -> list[float]:
    rng = random.Random(seed)
    return [rng.uniform(low, high) for _ in range(n)]


def _check_runtime(stack: Stack, calls: int) -> None:
    counts = stack.runtime.counts
    assert counts["InvokeAgentRuntime"] + counts["StopRuntimeSession"] == calls
    # The runtime's own bucket (25/s, one second of burst) answered no 429.
    assert counts["ThrottlingException"] == 0
    assert violations(stack.arrivals, rate=TPS, burst=TPS) == 0


async def test_four_workers_share_one_rate_and_one_session_budget(
    cluster: list[Any], stack: Stack
) -> None:
    name, rollouts = _name(), 12
    runs = [
        w.run.remote(name, SETTINGS, stack.endpoint(), _sleeps(rollouts, 0.2, 0.6, seed))
        for seed, w in enumerate(cluster)
    ]
    with anyio.fail_after(120):
        results = [await run for run in runs]

    assert [r["ok"] for r in results] == [rollouts] * 4
    assert sum(r["invocations"] for r in results) == 4 * rollouts
    assert sum(r["throttles"] for r in results) == 0
    _check_runtime(stack, sum(r["invocations"] + r["stops"] for r in results))
    assert stack.agents.max_running <= SESSIONS
    calls = sum(r["actor_calls"] for r in results)
    print(
        f"\nactor calls per invocation: {calls / (4 * rollouts):.2f}; "
        f"max calls in a 1 s window: {max_in_window(stack.arrivals)}"
    )
    assert (await _status(name))["slots_held"] == 0  # every worker gave its slots back


async def test_a_killed_worker_s_slots_come_back_and_the_others_finish(
    cluster: list[Any], stack: Stack
) -> None:
    name = _name()
    doomed = Worker.remote()  # type: ignore[attr-defined]
    doomed_run = doomed.run.remote(name, SETTINGS, stack.endpoint(), [4.0] * 12)
    for _ in range(300):  # 60 s at most
        if await doomed.progress.remote() >= SESSIONS:
            break
        await anyio.sleep(0.2)
    status = await _status(name)
    assert status["slots_held"] == SESSIONS  # it holds the whole budget

    survivors = cluster[:3]
    runs = [
        w.run.remote(name, SETTINGS, stack.endpoint(), _sleeps(6, 0.1, 0.3, seed))
        for seed, w in enumerate(survivors)
    ]
    os.kill(await doomed.pid.remote(), signal.SIGKILL)
    with pytest.raises(ray.exceptions.RayActorError):
        await doomed_run

    with anyio.fail_after(90):
        results = [await run for run in runs]
    assert [r["ok"] for r in results] == [6] * 3
    assert stack.runtime.counts["ThrottlingException"] == 0
    status = await _status(name)
    assert status["expired_holders"] == 1  # the dead worker's slots lapsed
    assert status["slots_held"] == 0


async def test_the_cluster_stays_within_the_quota_across_an_actor_restart(
    cluster: list[Any], stack: Stack
) -> None:
    name, rollouts = _name(), 10
    runs = [
        w.run.remote(name, SETTINGS, stack.endpoint(), _sleeps(rollouts, 0.5, 1.5, seed))
        for seed, w in enumerate(cluster)
    ]
    for _ in range(600):  # 60 s at most: until rollouts hold slots
        with contextlib.suppress(ValueError):  # no actor yet
            if (await _status(name))["slots_held"] >= 4:
                break
        await anyio.sleep(0.1)
    # The actor's process dies with most rollouts still to run (their slots are asked
    # of the restarted actor); Ray starts it again, and it starts conservatively.
    ray.kill(ray.get_actor(name, namespace=DEFAULT_NAMESPACE), no_restart=False)

    with anyio.fail_after(120):
        results = [await run for run in runs]
    assert [r["ok"] for r in results] == [rollouts] * 4
    _check_runtime(stack, sum(r["invocations"] + r["stops"] for r in results))
    assert stack.agents.max_running <= SESSIONS
    # The workers' calls after the restart told the actor it had lost its books.
    assert (await _status(name))["restarted"] is True


async def test_different_settings_under_one_name_are_refused(cluster: list[Any]) -> None:
    name = _name()
    async with shared_limits(name, **SETTINGS) as limits:
        await limits.rate.acquire()
        with pytest.raises(ConfigurationError, match="other settings"):
            async with shared_limits(name, tps=50, sessions=8, slot_ttl=3.0):
                pass
