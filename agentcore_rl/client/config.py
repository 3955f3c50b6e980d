"""Defaults and small config objects of the rollout client.

Example::

    from agentcore_rl.client.config import RetryConfig

    AsyncRolloutClient(..., retry=RetryConfig(attempts=8, maximum=30))
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Final

from agentcore_rl.errors import ConfigurationError

__all__ = [
    "DEFAULT_CLOSE_TIMEOUT",
    "DEFAULT_MAX_CONCURRENT_SESSIONS",
    "DEFAULT_RETRY",
    "DEFAULT_STOP_WORKERS",
    "DEFAULT_TIMEOUT",
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


@dataclass(frozen=True, kw_only=True)
class RetryConfig:
    """Retries of one invocation or stop call that hit throttling, a 5xx or a dropped
    connection: ``attempts`` tries in all (same session id), exponential backoff from
    ``initial`` seconds up to ``maximum``, plus up to ``jitter`` seconds. Each retry takes a
    token from the bucket. ``sleep`` is injectable for tests.

    Example::

        RetryConfig(attempts=3, initial=0.1)
    """

    attempts: int = 5
    initial: float = 0.5
    maximum: float = 10.0
    jitter: float = 0.5
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ConfigurationError(f"RetryConfig.attempts must be >= 1, got {self.attempts}")
        if min(self.initial, self.maximum, self.jitter) < 0:
            raise ConfigurationError("RetryConfig delays must be >= 0")

    def __repr__(self) -> str:
        return (
            f"RetryConfig(attempts={self.attempts}, initial={self.initial}, "
            f"maximum={self.maximum}, jitter={self.jitter})"
        )


DEFAULT_RETRY: Final = RetryConfig()
