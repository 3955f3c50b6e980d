"""FaultConfig: how soon the client gives up on an agent it cannot reach, and its lease.

Example::

    AsyncRolloutClient(..., faults=FaultConfig(unreachable_after=2.0, lease_ttl=60.0))
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Final

from agentcore_rl import protocol
from agentcore_rl.errors import ConfigurationError, InvalidPayloadError

__all__ = [
    "DEFAULT_FAULTS",
    "DEFAULT_LEASE_RENEW",
    "DEFAULT_LEASE_TTL",
    "DEFAULT_UNREACHABLE_AFTER",
    "FaultConfig",
]

#: Seconds of failed connection attempts (refused, or the connect timed out) after which
#: an invocation ends in ``AgentUnreachableError``: an agent that is down stays down for
#: longer than a retry can wait out, and a typo in a URL is never cured.
DEFAULT_UNREACHABLE_AFTER: Final = 3.0
#: Seconds without a renewal after which agent servers cancel the client's rollouts.
DEFAULT_LEASE_TTL: Final = 180.0
#: Seconds between two renewals of the lease (one small S3 PUT each).
DEFAULT_LEASE_RENEW: Final = 5.0


@dataclass(frozen=True, kw_only=True)
class FaultConfig:
    """What the client does when an agent or the client itself goes away.

    ``unreachable_after``: seconds of failed connection attempts before an invocation
    ends in :class:`~agentcore_rl.errors.AgentUnreachableError` (nothing was started, so
    nothing is stopped). ``lease_ttl``: the client keeps a lease (one small S3 object under
    the experiment's prefix, renewed every ``lease_renew`` seconds) and names it in every
    invocation; agent servers cancel, with a ``cancelled`` envelope, the rollouts whose
    lease was not renewed for ``lease_ttl`` seconds, so a crashed trainer leaves nothing
    running for long. ``None``: no lease (rollouts run to their end whatever happens to the
    client). ``lease_id``: renew an existing lease (a process taking over the rollouts an
    earlier one started, e.g. after ``attach``), else a new one per client. ``clock`` is
    monotonic seconds and ``sleep`` the renewal pause: injectable for tests.

    Example::

        FaultConfig(lease_ttl=600.0)      # a trainer with long pauses between steps
    """

    unreachable_after: float = DEFAULT_UNREACHABLE_AFTER
    lease_ttl: float | None = DEFAULT_LEASE_TTL
    lease_renew: float = DEFAULT_LEASE_RENEW
    lease_id: str | None = None
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep

    def __post_init__(self) -> None:
        if not self.unreachable_after >= 0:
            raise ConfigurationError(
                f"FaultConfig.unreachable_after must be >= 0, got {self.unreachable_after!r}"
            )
        if not self.lease_renew > 0:
            raise ConfigurationError(
                f"FaultConfig.lease_renew must be > 0, got {self.lease_renew!r}"
            )
        if self.lease_ttl is not None and not self.lease_ttl >= 2 * self.lease_renew:
            raise ConfigurationError(
                f"FaultConfig.lease_ttl ({self.lease_ttl!r}) must be at least twice "
                f"lease_renew ({self.lease_renew!r}), or one late renewal would cancel "
                "every rollout; None turns the lease off"
            )
        if self.lease_id is not None:
            try:
                protocol.validate_key_part("lease_id", self.lease_id)
            except InvalidPayloadError as exc:
                raise ConfigurationError(f"FaultConfig: {exc.message}") from None

    def __repr__(self) -> str:
        return (
            f"FaultConfig(unreachable_after={self.unreachable_after}, "
            f"lease_ttl={self.lease_ttl}, lease_renew={self.lease_renew}, "
            f"lease_id={self.lease_id!r})"
        )


DEFAULT_FAULTS: Final = FaultConfig()
