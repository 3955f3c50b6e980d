"""FaultChecks: the agent server's checks of the result bucket and of its clients' leases."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from agentcore_rl.errors import ConfigurationError
from agentcore_rl.server.overload import DEFAULT_OVERLOAD_LAG

__all__ = ["DEFAULT_FAULT_CHECKS", "FaultChecks"]


@dataclass(frozen=True, kw_only=True)
class FaultChecks:
    """How the agent server tells final faults from passing ones.

    **Result bucket.** Before accepting a rollout the server checks its bucket once
    (HeadBucket) and remembers the answer: ``bucket_ttl`` seconds when the bucket is
    usable, ``bucket_miss_ttl`` when it is not (it may be created meanwhile). A bucket
    that does not exist or refuses the server's credentials gets the invocation refused
    with a 4xx naming the bucket and the cause, so the client fails at once instead of
    waiting for a result that cannot come. An S3 outage (no answer within ``bucket_wait``
    seconds, 5xx, throttling) is not a verdict: the rollout is accepted and its envelope
    spooled until S3 is back, as without the check. ``check_buckets=False``: no check.

    **Leases.** Every ``lease_interval`` seconds the server reads the lease of each client
    with running rollouts (one GET per lease) and cancels, with a ``cancelled`` envelope,
    the rollouts of a client whose lease went unrenewed for its ``ttl``. A lease that
    cannot be read (S3 down) or is missing counts as renewed. ``check_leases=False``: no
    check.

    **Overload.** While the event loop runs more than ``overload_lag`` seconds behind,
    new invocations are answered 503 with ``Retry-After: 1`` before their body is read
    (the client waits and sends again) rather than queued for seconds. ``None``: never.

    Example::

        FaultChecks(lease_interval=2.0)
    """

    check_buckets: bool = True
    bucket_ttl: float = 300.0
    bucket_miss_ttl: float = 10.0
    bucket_wait: float = 2.0
    check_leases: bool = True
    lease_interval: float = 10.0
    overload_lag: float | None = DEFAULT_OVERLOAD_LAG

    def __post_init__(self) -> None:
        for name in ("bucket_ttl", "bucket_miss_ttl", "bucket_wait", "lease_interval"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and value > 0):
                raise ConfigurationError(f"FaultChecks.{name} must be > 0, got {value!r}")
        if self.overload_lag is not None and not self.overload_lag > 0:
            raise ConfigurationError(
                f"FaultChecks.overload_lag must be > 0 or None, got {self.overload_lag!r}"
            )

    def __repr__(self) -> str:
        return (
            f"FaultChecks(check_buckets={self.check_buckets}, bucket_ttl={self.bucket_ttl}, "
            f"bucket_miss_ttl={self.bucket_miss_ttl}, check_leases={self.check_leases}, "
            f"lease_interval={self.lease_interval}, overload_lag={self.overload_lag})"
        )


DEFAULT_FAULT_CHECKS: Final = FaultChecks()
