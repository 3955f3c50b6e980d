"""HealthTracker: the state behind ``GET /ping``.

AgentCore Runtime reclaims a session whose container reports ``Healthy`` for too long, and
keeps one that reports ``HealthyBusy``. ``time_of_last_update`` must change whenever the
status changes, so the tracker records the clock at each transition rather than at each
ping.

The status is, as in AWS's ``BedrockAgentCoreApp``: a forced status if one is set, else
what a custom ping handler says, else ``HealthyBusy`` while rollouts run, envelopes wait
in the spool or tracked async tasks are open, else ``Healthy``.

Example::

    health = HealthTracker(clock=time.time)
    health.set_busy(True)
    health.snapshot()   # {"status": "HealthyBusy", "time_of_last_update": 1767225600}
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from agentcore_rl.protocol import PingStatus

__all__ = ["HealthTracker", "PingHandler"]

logger = logging.getLogger(__name__)

#: A custom ping handler: returns a :class:`PingStatus` or its string value.
PingHandler = Callable[[], Any]


@dataclass(frozen=True)
class _Task:
    name: str
    started_at: float
    metadata: Mapping[str, Any] | None


class HealthTracker:
    """The ping status and the (integer epoch seconds) time it last changed.

    ``clock`` returns epoch seconds; tests inject a fake one to see the time change
    without sleeping.
    """

    def __init__(self, *, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._busy = False
        self._status = PingStatus.HEALTHY
        self._last_update = int(clock())
        self._forced: PingStatus | None = None
        self.ping_handler: PingHandler | None = None
        # add_task/complete_task may be called from handler threads (sync handlers).
        self._tasks_lock = threading.Lock()
        self._tasks: dict[int, _Task] = {}
        self._task_ids = itertools.count(1)

    def __repr__(self) -> str:
        return f"HealthTracker(status={self._status.value}, since={self._last_update})"

    @property
    def status(self) -> PingStatus:
        """The current status (forced, else custom, else automatic)."""
        return self._refresh()

    def _custom_status(self) -> PingStatus | None:
        handler = self.ping_handler
        if handler is None:
            return None
        try:
            answer = handler()
            # An enum of AWS's SDK or a plain string: both carry the wire value.
            return PingStatus(getattr(answer, "value", answer))
        except Exception as exc:
            logger.warning(
                "the custom ping handler failed (%s: %s); reporting the automatic status",
                type(exc).__name__,
                exc,
            )
            return None

    def _refresh(self) -> PingStatus:
        status = self._forced or self._custom_status()
        if status is None:
            busy = self._busy or bool(self._tasks)
            status = PingStatus.HEALTHY_BUSY if busy else PingStatus.HEALTHY
        if status is not self._status:
            self._status = status
            self._last_update = int(self._clock())
            logger.debug("ping status is now %s", status.value)
        return status

    def _automatic_changed(self) -> None:
        # A custom handler is asked at ping time only: it may be slow, and the runner
        # reports every rollout start and end.
        if self._forced is None and self.ping_handler is None:
            self._refresh()

    def set_busy(self, busy: bool) -> None:
        """Report whether rollouts run or envelopes wait; a change of status is timestamped."""
        self._busy = busy
        self._automatic_changed()

    def force(self, status: PingStatus | str | None) -> None:
        """Report ``status`` whatever else holds (``None``: back to the usual rule)."""
        self._forced = None if status is None else PingStatus(getattr(status, "value", status))
        self._refresh()

    def add_task(self, name: str, metadata: Mapping[str, Any] | None = None) -> int:
        """Track one piece of background work (``HealthyBusy`` until it completes); its id."""
        with self._tasks_lock:
            task_id = next(self._task_ids)
            self._tasks[task_id] = _Task(name, self._clock(), metadata)
        logger.info("async task started: %s (id %d)", name, task_id)
        self._automatic_changed()
        return task_id

    def complete_task(self, task_id: int) -> bool:
        """Stop tracking a task; False (and a warning) for an unknown id."""
        with self._tasks_lock:
            task = self._tasks.pop(task_id, None)
        if task is None:
            logger.warning("complete_async_task: unknown task id %r", task_id)
            return False
        logger.info(
            "async task completed: %s (id %d, %.2f s)",
            task.name,
            task_id,
            self._clock() - task.started_at,
        )
        self._automatic_changed()
        return True

    def task_info(self) -> dict[str, Any]:
        """The tracked tasks: ``{"active_count": n, "running_jobs": [{"name", "duration"}]}``."""
        now = self._clock()
        with self._tasks_lock:
            tasks = list(self._tasks.values())
        return {
            "active_count": len(tasks),
            "running_jobs": [{"name": t.name, "duration": now - t.started_at} for t in tasks],
        }

    def snapshot(self) -> dict[str, Any]:
        """The ``/ping`` body."""
        status = self._refresh()
        return {"status": status.value, "time_of_last_update": self._last_update}
