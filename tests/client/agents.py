"""Test agents: a real AgentCoreRLApp whose handler does what each payload asks, and a
recorder of what the agent side saw (sessions, _rollout blocks, concurrency, stops)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agentcore_rl.errors import InfraError
from agentcore_rl.groups import parse_member_session_id
from agentcore_rl.s3 import ResultStore
from agentcore_rl.server import AgentCoreRLApp, RequestContext
from agentcore_rl.server.options import ShutdownConfig


@dataclass
class Recorder:
    """What the agents did. Lives on the agent server's event loop."""

    sessions: list[str] = field(default_factory=list)
    rollout_blocks: list[dict[str, Any]] = field(default_factory=list)
    cancelled: set[str] = field(default_factory=set)
    finished: set[str] = field(default_factory=set)
    running: int = 0
    max_running: int = 0
    gate: asyncio.Event = field(default_factory=asyncio.Event)
    _changed: asyncio.Event = field(default_factory=asyncio.Event)

    def _touch(self) -> None:
        self._changed.set()

    async def wait_for(self, predicate: Callable[[], bool], timeout: float = 5.0) -> None:
        """Wait (bounded) until ``predicate()`` holds; re-checked on every agent event."""

        async def loop() -> None:
            while not predicate():
                self._changed.clear()
                await self._changed.wait()

        await asyncio.wait_for(loop(), timeout)

    def open_gate(self) -> None:
        self.gate.set()


def make_agent(store: ResultStore, recorder: Recorder, **app_options: Any) -> AgentCoreRLApp:
    """An agent server; ``payload["mode"]`` picks the behaviour:

    ok (default): return rewards at once; gate: wait until the test opens the gate;
    hang: never finish; late: finish only when cancelled (with its result); raise: raise
    ValueError; envelope: return status_code 422;
    group: a GRPO member (its index and attempt read from the session id) that raises when
    its index is in ``fail``, never finishes when in ``hang``, waits for the gate when in
    ``gate`` (each only for attempts below ``bad_attempts``, default all), and otherwise
    returns ``rewards[index % len(rewards)]`` (default 1.0).
    stubborn: like gate, and a cancel waits for the gate too;
    shutdown: the first ``payload["shutdowns"]`` (default 1) rollouts end like one
    cancelled by a server shutting down (with ``hold``, once the test opens the gate).
    lost: with ``lose``, end as a rollout whose agent process died (an ``agent_lost``
    envelope), else return rewards; infra: raise InfraError; result: return
    ``payload["result"]``. A group member raises InfraError when its index is in ``infra``,
    returns no reward when in ``no_reward`` and a NaN reward when in ``nan``.
    """
    app = AgentCoreRLApp(
        store=store, **app_options, shutdown=ShutdownConfig(grace=0.0, cancel_timeout=1.0)
    )

    @app.rollout_entrypoint
    async def handler(payload: dict[str, Any], context: RequestContext) -> dict[str, Any]:
        recorder.sessions.append(context.session_id)
        recorder.rollout_blocks.append(dict(payload["_rollout"]))
        recorder.running += 1
        recorder.max_running = max(recorder.max_running, recorder.running)
        recorder._touch()
        try:
            mode = payload.get("mode", "ok")
            if mode in ("gate", "stubborn"):
                await recorder.gate.wait()
            elif mode == "hang":
                await asyncio.Event().wait()
            elif mode == "late":  # finishes as it is stopped: its result, not "cancelled"
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.Event().wait()
            elif mode == "raise":
                raise ValueError(f"agent failed on {payload.get('n')}")
            elif mode == "envelope":
                return {"status_code": 422, "stop_reason": "answer unparseable"}
            elif mode == "shutdown" and len(recorder.sessions) <= payload.get("shutdowns", 1):
                if payload.get("hold"):  # a slow first session: the test opens the gate
                    await recorder.gate.wait()
                # What a server cancelling on SIGTERM writes: a retryable outcome.
                return {
                    "status_code": 503,
                    "error_type": "cancelled",
                    "stop_reason": "cancelled: the agent server is shutting down",
                }
            elif mode == "group":
                return await _member(payload, context.session_id, recorder)
            elif mode == "lost" and payload.get("lose"):
                return {"status_code": 503, "error_type": "agent_lost", "stop_reason": "killed"}
            elif mode == "infra":
                raise InfraError("the sandbox is down")
            elif mode == "result":
                return dict(payload["result"])
            return {"rewards": [1.0], "n": payload.get("n")}
        except asyncio.CancelledError:
            recorder.cancelled.add(context.session_id)
            if payload.get("mode") == "stubborn":  # slow to cancel: waits for the gate
                await recorder.gate.wait()
            raise
        finally:
            recorder.running -= 1
            recorder.finished.add(context.session_id)
            recorder._touch()

    return app


async def _member(payload: dict[str, Any], session_id: str, recorder: Recorder) -> dict[str, Any]:
    key = parse_member_session_id(session_id)
    assert key is not None, f"not a member session: {session_id}"
    bad = key.attempt < payload.get("bad_attempts", 1_000)
    if bad and key.index in payload.get("fail", ()):
        raise ValueError(f"member {key.index} failed")
    if bad and key.index in payload.get("hang", ()):
        await asyncio.Event().wait()
    if bad and key.index in payload.get("gate", ()):
        await recorder.gate.wait()
    if bad and key.index in payload.get("infra", ()):
        raise InfraError(f"member {key.index}'s sandbox is down")
    if key.index in payload.get("no_reward", ()):
        return {"answer": "4"}
    if key.index in payload.get("nan", ()):
        return {"rewards": [float("nan")]}
    rewards = payload.get("rewards") or [1.0]
    return {"rewards": [rewards[key.index % len(rewards)]]}
