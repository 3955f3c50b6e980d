"""RolloutFuture: an asyncio.Future for one rollout's outcome, with its coordinates."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from agentcore_rl.groups import result_reward
from agentcore_rl.trajectory import Trajectory, build_trajectory

if TYPE_CHECKING:
    from agentcore_rl.trace import SessionTrace

__all__ = ["RolloutFuture"]


class RolloutFuture(asyncio.Future[dict[str, Any]]):
    """The outcome of one accepted rollout: a result dict, or an exception.

    It carries where the result will appear (``s3_bucket``, ``result_key``) and which
    session runs it (``session_id``; a retryable outcome runs it again in a new session,
    named then). ``invoked_at`` and ``resolved_at`` are epoch seconds. Cancelling it stops
    the session. ``trace``: the final session's token trace, through a gateway (set
    before a successful outcome); ``trajectory`` the training data built from it.

    Example::

        fut = await client.invoke(payload)
        try:
            result = await asyncio.wait_for(fut, 60)   # a timeout cancels and stops it
        except asyncio.TimeoutError:
            print("gave up on", fut.session_id)
    """

    def __init__(
        self,
        *,
        session_id: str,
        input_id: str,
        s3_bucket: str,
        result_key: str,
        index: int | None = None,
    ) -> None:
        super().__init__(loop=asyncio.get_running_loop())
        self.session_id = session_id
        self.input_id = input_id
        self.s3_bucket = s3_bucket
        self.result_key = result_key
        self.index = index
        self.invoked_at = time.time()
        self.resolved_at: float | None = None
        self.trace: SessionTrace | None = None
        self._trajectory: Trajectory | None = None
        self.attempts = 1  # sessions it ran in; previous_sessions: the ones given up
        self.losses = 0  # sessions its agent lost (crash, restart, shutdown)
        self.previous_sessions: list[str] = []

    def __repr__(self) -> str:
        if self.cancelled():
            state = "cancelled"
        elif not self.done():
            state = "pending"
        elif self.exception() is not None:
            state = f"failed: {type(self.exception()).__name__}"
        else:
            state = "finished"
        return (
            f"<RolloutFuture {state} session_id={self.session_id!r} result_key={self.result_key!r}>"
        )

    @property
    def elapsed(self) -> float:
        """Seconds from the invocation to the outcome (or to now)."""
        end = self.resolved_at if self.resolved_at is not None else time.time()
        return end - self.invoked_at

    @property
    def trajectory(self) -> Trajectory | None:
        """With the result's reward and metrics, once succeeded (built once)."""
        if self._trajectory is not None:
            return self._trajectory
        if self.trace is None or not self.done() or self.cancelled() or self.exception():
            return None
        result = self.result()
        metrics = result.get("metrics")
        self._trajectory = build_trajectory(
            self.trace,
            reward=result_reward(result),
            metrics=metrics if isinstance(metrics, dict) else None,
        )
        return self._trajectory
