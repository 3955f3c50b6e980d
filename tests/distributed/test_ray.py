"""The shared limits on a real local Ray instance: one module starts Ray once.

Workers are separate processes (Ray actors), each with its own limiter clients; a
counter actor plays the runtime and records every call. Waits are real but bounded.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ray = pytest.importorskip("ray")

from agentcore_rl.distributed import DEFAULT_NAMESPACE, shared_limits  # noqa: E402
from agentcore_rl.errors import ConfigurationError  # noqa: E402
from tests.distributed.conformance import max_in_window, violations  # noqa: E402

# Starting Ray on a busy 2-core machine takes a while.
pytestmark = pytest.mark.timeout(180)

ROOT = Path(__file__).resolve().parents[2]
TPS = 25
SETTINGS: dict[str, Any] = {"tps": TPS, "sessions": 8, "slot_ttl": 3.0}


@pytest.fixture(scope="module")
def cluster() -> Iterator[None]:
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        # Workers import the test helpers from the repository.
        runtime_env={
            "env_vars": {
                "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
            }
        },
    )
    try:
        yield
    finally:
        ray.shutdown()


def _name() -> str:
    return f"test-{uuid.uuid4().hex[:12]}"


def _status(name: str) -> dict[str, Any]:
    actor = ray.get_actor(name, namespace=DEFAULT_NAMESPACE)
    status: dict[str, Any] = ray.get(actor.status.remote(), timeout=30)
    return status


def test_four_workers_share_one_rate_and_one_session_budget(cluster: None) -> None:
    from tests.distributed.cluster import CallCounter, Worker

    name, rollouts = _name(), 20
    counter = CallCounter.remote()  # type: ignore[attr-defined]
    workers = [Worker.remote() for _ in range(4)]  # type: ignore[attr-defined]
    runs = [
        w.run.remote(name, SETTINGS, counter, rollouts, (0.2, 0.6), seed)
        for seed, w in enumerate(workers)
    ]
    results = ray.get(runs, timeout=150)
    seen = ray.get(counter.report.remote())

    assert [r["done"] for r in results] == [rollouts] * 4
    assert len(seen["calls"]) == 4 * rollouts * 2
    # The runtime's limiter (25/s, one second of burst) would have throttled nothing.
    assert violations(seen["calls"], rate=TPS, burst=TPS) == 0
    assert seen["max_live"] <= SETTINGS["sessions"]
    assert seen["live"] == 0
    calls = sum(r["actor_calls"] for r in results)
    print(
        f"\nactor calls per call: {calls / len(seen['calls']):.2f}; "
        f"max calls in a 1 s window: {max_in_window(seen['calls'])}"
    )
    status = _status(name)
    assert status["slots_held"] == 0  # every worker gave its slots back on close


def test_a_killed_worker_s_leases_come_back_and_the_others_finish(cluster: None) -> None:
    from tests.distributed.cluster import CallCounter, Worker

    name = _name()
    counter = CallCounter.remote()  # type: ignore[attr-defined]
    doomed = Worker.remote()  # type: ignore[attr-defined]
    doomed_run = doomed.run.remote(name, SETTINGS, counter, 20, (30.0, 30.0), 99)
    deadline = time.monotonic() + 60
    while ray.get(doomed.progress.remote()) < 4 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ray.get(doomed.progress.remote()) >= 4  # it holds sessions now
    assert _status(name)["slots_held"] >= 4

    survivors = [Worker.remote() for _ in range(3)]  # type: ignore[attr-defined]
    runs = [
        w.run.remote(name, SETTINGS, counter, 10, (0.1, 0.3), seed)
        for seed, w in enumerate(survivors)
    ]
    ray.kill(doomed, no_restart=True)
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(doomed_run, timeout=30)

    results = ray.get(runs, timeout=120)
    assert [r["done"] for r in results] == [10] * 3
    status = _status(name)
    assert status["expired_holders"] >= 1
    assert status["slots_held"] == 0


async def test_different_settings_under_one_name_are_refused(cluster: None) -> None:
    name = _name()
    async with shared_limits(name, **SETTINGS) as limits:
        await limits.rate.acquire()
        with pytest.raises(ConfigurationError, match="other settings"):
            async with shared_limits(name, tps=50, sessions=8, slot_ttl=3.0):
                pass


def test_the_cluster_stays_within_the_quota_across_an_actor_restart(cluster: None) -> None:
    from tests.distributed.cluster import CallCounter, Worker

    name, rollouts = _name(), 20
    counter = CallCounter.remote()  # type: ignore[attr-defined]
    workers = [Worker.remote() for _ in range(4)]  # type: ignore[attr-defined]
    runs = [
        w.run.remote(name, SETTINGS, counter, rollouts, (0.2, 0.6), seed)
        for seed, w in enumerate(workers)
    ]
    deadline = time.monotonic() + 60
    while sum(ray.get([w.progress.remote() for w in workers])) < 10:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    # The actor's process dies; Ray starts it again, and it starts conservatively.
    ray.kill(ray.get_actor(name, namespace=DEFAULT_NAMESPACE), no_restart=False)

    results = ray.get(runs, timeout=150)
    seen = ray.get(counter.report.remote())
    assert [r["done"] for r in results] == [rollouts] * 4
    assert violations(seen["calls"], rate=TPS, burst=TPS) == 0
    assert seen["max_live"] <= SETTINGS["sessions"]
    assert _status(name)["restarted"] is True
