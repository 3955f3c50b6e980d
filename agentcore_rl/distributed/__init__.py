"""Limits shared by many trainer processes on a Ray cluster (extra ``[ray]``).

One AgentCore Runtime quota (calls per second, live sessions) is shared by every process
that asks for the same name: a named, detached Ray actor keeps the books and leases each
process a share of the rate (spent by a local token bucket) and session slots in
batches, so a process pays an actor call every few seconds, not one per call. Importing
this package does not import Ray; ``shared_limits`` does.

Example::

    from agentcore_rl.distributed import shared_limits

    async with shared_limits("acr-math", tps=25, sessions=500) as limits:
        async with AsyncRolloutClient(..., rate_limiter=limits.rate,
                                      session_limiter=limits.sessions) as client:
            ...
"""

from agentcore_rl.distributed.actor import LimitsActor
from agentcore_rl.distributed.backend import LimitsBackend
from agentcore_rl.distributed.config import LimitsConfig
from agentcore_rl.distributed.limits import DEFAULT_NAMESPACE, SharedLimits, shared_limits
from agentcore_rl.distributed.rate import SharedRateLimiter
from agentcore_rl.distributed.slots import SharedSessionLimiter
from agentcore_rl.errors import SharedLimitsUnavailableError

__all__ = [
    "DEFAULT_NAMESPACE",
    "LimitsActor",
    "LimitsBackend",
    "LimitsConfig",
    "SharedLimits",
    "SharedLimitsUnavailableError",
    "SharedRateLimiter",
    "SharedSessionLimiter",
    "shared_limits",
]
