"""Defaults and small config objects of the rollout client.

Example::

    AsyncRolloutClient(..., retry=RetryConfig(attempts=8, maximum=30))
"""

from __future__ import annotations

from typing import Final

from agentcore_rl.protocol import DEFAULT_TPS
from agentcore_rl.retry import RetryPolicy

__all__ = [
    "CLOSE_STOP_WORKERS",
    "DEFAULT_CLOSE_TIMEOUT",
    "DEFAULT_MAX_CONCURRENT_SESSIONS",
    "DEFAULT_RETRY",
    "DEFAULT_STOP_WORKERS",
    "DEFAULT_TIMEOUT",
    "DEFAULT_TPS",
    "RetryConfig",
]

#: Rollouts in flight at once (a slot is held from invoke until the outcome).
DEFAULT_MAX_CONCURRENT_SESSIONS: Final = 100
#: Seconds a rollout may take, counted from when the agent accepted it.
DEFAULT_TIMEOUT: Final = 3600.0
#: Seconds ``aclose`` waits for the stop calls of live sessions before giving up on them.
DEFAULT_CLOSE_TIMEOUT: Final = 30.0
#: Concurrent stop calls (they also wait for tokens, behind invocations).
DEFAULT_STOP_WORKERS: Final = 8
#: Extra concurrent stop calls while closing: a stop call may take as long as the agent
#: takes to cancel, so closing is paced by the rate limiter, not by a few workers.
CLOSE_STOP_WORKERS: Final = 128

#: The client's name for :class:`~agentcore_rl.retry.RetryPolicy` (retries of one
#: invocation or stop call that hit throttling, a 5xx or a dropped connection; each retry
#: takes a token from the rate limiter).
RetryConfig = RetryPolicy

DEFAULT_RETRY: Final = RetryPolicy()
