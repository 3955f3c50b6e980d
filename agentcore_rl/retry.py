"""RetryPolicy: how a transient failure is retried, for S3 requests and agent calls alike.

Example::

    ResultStore(retry=RetryPolicy(attempts=3, initial=0.05))
    AsyncRolloutClient(..., retry=RetryPolicy(attempts=8, maximum=30))
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from tenacity import AsyncRetrying, stop_after_attempt, wait_exponential, wait_random
from tenacity.retry import retry_base

from agentcore_rl.errors import ConfigurationError

__all__ = ["RetryPolicy"]


@dataclass(frozen=True, kw_only=True)
class RetryPolicy:
    """``attempts`` tries in all, with exponential backoff from ``initial`` seconds up to
    ``maximum``, plus up to ``jitter`` seconds. ``sleep`` is injectable so tests need not
    wait. The defaults suit calls to the agent runtime; S3 requests default to
    :data:`agentcore_rl.s3.DEFAULT_S3_RETRY`.

    Example::

        RetryPolicy(attempts=3, initial=0.1)
    """

    attempts: int = 5
    initial: float = 0.5
    maximum: float = 10.0
    jitter: float = 0.5
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ConfigurationError(f"RetryPolicy.attempts must be >= 1, got {self.attempts}")
        if min(self.initial, self.maximum, self.jitter) < 0:
            raise ConfigurationError("RetryPolicy delays must be >= 0")

    def __repr__(self) -> str:
        return (
            f"RetryPolicy(attempts={self.attempts}, initial={self.initial}, "
            f"maximum={self.maximum}, jitter={self.jitter})"
        )

    def retrying(self, retry: retry_base) -> AsyncRetrying:
        """A tenacity loop that follows this policy, retrying what ``retry`` accepts."""
        return AsyncRetrying(
            stop=stop_after_attempt(self.attempts),
            wait=wait_exponential(multiplier=self.initial, max=self.maximum)
            + wait_random(0, self.jitter),
            retry=retry,
            sleep=self.sleep,
            reraise=True,
        )
