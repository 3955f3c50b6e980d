"""The trainer side: drive rollouts on agent servers and collect their results from S3.

Example::

    from agentcore_rl.client import AsyncRolloutClient, Limits

    async with AsyncRolloutClient(agent_url="http://127.0.0.1:8080", s3_bucket="rollouts",
                                  exp_id="e1", limits=Limits(max_concurrent_sessions=8)) as client:
        result = await client.rollout({"prompt": "2+2?"})
"""

from agentcore_rl._extras import require

require("client", "agentcore_rl.client", "httpx")  # first: a missing extra is named

from agentcore_rl.client.batch import BatchItem  # noqa: E402
from agentcore_rl.client.client import AsyncRolloutClient, ClientState  # noqa: E402
from agentcore_rl.client.config import (  # noqa: E402
    AwsConfig,
    GatewayConfig,
    InfraStop,
    Limits,
    Retries,
    Timeouts,
)
from agentcore_rl.client.future import RolloutFuture  # noqa: E402
from agentcore_rl.client.group_runner import GroupFuture  # noqa: E402
from agentcore_rl.client.liveness import LivenessConfig  # noqa: E402
from agentcore_rl.client.outcomes import ClientStats  # noqa: E402
from agentcore_rl.client.sync import RolloutClient  # noqa: E402
from agentcore_rl.client.watcher import CompletionWatcher, WatcherConfig  # noqa: E402
from agentcore_rl.ratelimit import (  # noqa: E402
    LocalSessionLimiter,
    Priority,
    RateLimiter,
    SessionLimiter,
    TokenBucket,
)
from agentcore_rl.retry import RetryPolicy  # noqa: E402

__all__ = [
    "AsyncRolloutClient",
    "AwsConfig",
    "BatchItem",
    "ClientState",
    "ClientStats",
    "CompletionWatcher",
    "GatewayConfig",
    "GroupFuture",
    "InfraStop",
    "Limits",
    "LivenessConfig",
    "LocalSessionLimiter",
    "Priority",
    "RateLimiter",
    "Retries",
    "RetryPolicy",
    "RolloutClient",
    "RolloutFuture",
    "SessionLimiter",
    "Timeouts",
    "TokenBucket",
    "WatcherConfig",
]
