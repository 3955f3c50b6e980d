"""What a rollout cost, in its envelope: wall seconds, the process's CPU seconds when the
rollout ran alone (one rollout per microVM on AgentCore Runtime), and peak memory."""

from __future__ import annotations

import time
from typing import Any

from agentcore_rl import protocol
from agentcore_rl.s3 import ResultStore

from .helpers import (
    SESSION,
    HeldRollout,
    accept,
    read_envelope,
    rollout_app,
    rollout_payload,
    served,
    session_headers,
    settle,
)

BURN = 0.05  # process CPU seconds the handler burns


def burn(payload: dict[str, Any]) -> dict[str, Any]:
    until = time.process_time() + BURN
    while time.process_time() < until:
        sum(i * i for i in range(1000))
    return {"rewards": [1.0]}


async def test_a_rollout_alone_reports_runtime_cpu_and_memory(
    store: ResultStore, bucket: str
) -> None:
    app = rollout_app(store, burn)
    async with served(app) as http:
        await accept(http, bucket)
        await settle(app)
    envelope = await read_envelope(store, bucket, f"exp/q-1/{SESSION}.json")
    cpu = envelope[protocol.CPU_SECONDS]
    assert isinstance(cpu, float)
    assert cpu >= BURN
    assert envelope[protocol.RUNTIME_SECONDS] > 0
    peak = envelope[protocol.PEAK_MEMORY_BYTES]
    assert isinstance(peak, int)
    assert peak > 10 * 1024 * 1024  # a Python process: more than 10 MB


async def test_overlapping_rollouts_report_no_cpu(store: ResultStore, bucket: str) -> None:
    held = HeldRollout()
    app = rollout_app(store, held.solve)
    other = "session-" + "b" * 40
    async with served(app) as http:
        await accept(http, bucket)
        await held.wait_entered()
        second = await http.post(
            "/invocations", json=rollout_payload(bucket), headers=session_headers(other)
        )
        assert second.status_code == 200
        held.release.set()
        await settle(app)
    for session in (SESSION, other):
        envelope = await read_envelope(store, bucket, f"exp/q-1/{session}.json")
        assert envelope[protocol.CPU_SECONDS] is None  # shared: not one rollout's CPU
        assert envelope[protocol.RUNTIME_SECONDS] >= 0
