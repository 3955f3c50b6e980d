"""HealthTracker: the state behind ``GET /ping``.

AgentCore Runtime reclaims a session whose container reports ``Healthy`` for too long, and
keeps one that reports ``HealthyBusy``. ``time_of_last_update`` must change whenever the
status changes, so the tracker records the clock at each transition rather than at each
ping.

Example::

    health = HealthTracker(clock=time.time)
    health.set_busy(True)
    health.snapshot()   # {"status": "HealthyBusy", "time_of_last_update": 1767225600}
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from agentcore_rl.protocol import PingStatus

__all__ = ["HealthTracker"]

logger = logging.getLogger(__name__)


class HealthTracker:
    """The ping status and the (integer epoch seconds) time it last changed.

    ``clock`` returns epoch seconds; tests inject a fake one to see the time change
    without sleeping.

    Example::

        health = HealthTracker(clock=lambda: 1000.0)
        health.snapshot()["time_of_last_update"]   # 1000
    """

    def __init__(self, *, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._status = PingStatus.HEALTHY
        self._last_update = int(clock())

    def __repr__(self) -> str:
        return f"HealthTracker(status={self._status.value}, since={self._last_update})"

    @property
    def status(self) -> PingStatus:
        """The current status."""
        return self._status

    def set_busy(self, busy: bool) -> None:
        """Report whether work is in progress; a change of status is timestamped."""
        status = PingStatus.HEALTHY_BUSY if busy else PingStatus.HEALTHY
        if status is not self._status:
            self._status = status
            self._last_update = int(self._clock())
            logger.debug("ping status is now %s", status.value)

    def snapshot(self) -> dict[str, Any]:
        """The ``/ping`` body."""
        return {"status": self._status.value, "time_of_last_update": self._last_update}
