"""Limits shared by many trainer processes on a Ray cluster (extra ``[ray]``).

One AgentCore Runtime quota (calls per second, live sessions) is shared by every process
that asks for the same name: a named, detached Ray actor holds the state and leases
tokens and session slots in batches, so a process pays about one actor call per batch,
not per call. Importing this package does not import Ray; ``shared_limits`` does.

Example::

    from agentcore_rl.distributed import shared_limits

    async with shared_limits("acr-math", tps=25, sessions=500) as limits:
        async with AsyncRolloutClient(..., rate_limiter=limits.rate,
                                      session_limiter=limits.sessions) as client:
            ...
"""

from agentcore_rl.distributed.actor import LimitsActor
from agentcore_rl.distributed.backend import LimitsBackend, SharedLimitsUnavailableError
from agentcore_rl.distributed.config import LimitsConfig
from agentcore_rl.distributed.limits import DEFAULT_NAMESPACE, SharedLimits, shared_limits
from agentcore_rl.distributed.rate import SharedRateLimiter
from agentcore_rl.distributed.slots import SharedSessionLimiter

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
