"""agentcore-rl: train and evaluate LLM agents with RL while they run as HTTP services.

Agent side: :class:`AgentCoreRLApp` turns an agent into a fire-and-forget rollout server
that writes each result to S3. Trainer side: :class:`AsyncRolloutClient` drives thousands
of rollouts and returns asyncio futures; :class:`RolloutClient` is its synchronous facade.

Example::

    from agentcore_rl import RolloutConfig

    cfg = RolloutConfig(exp_id="e1", input_id="q-1", s3_bucket="rollouts")
"""

from agentcore_rl.errors import (
    AgentCoreRLError,
    BucketNotAllowedError,
    ClientClosedError,
    ConfigurationError,
    InvalidPayloadError,
    InvalidRolloutConfig,
    InvocationError,
    RolloutError,
    RolloutTimeoutError,
    StorageError,
)
from agentcore_rl.protocol import PingStatus, RolloutConfig
from agentcore_rl.s3 import ResultStore, S3RetryPolicy

__version__ = "0.1.0"

__all__ = [
    "AgentCoreRLError",
    "BucketNotAllowedError",
    "ClientClosedError",
    "ConfigurationError",
    "InvalidPayloadError",
    "InvalidRolloutConfig",
    "InvocationError",
    "PingStatus",
    "ResultStore",
    "RolloutConfig",
    "RolloutError",
    "RolloutTimeoutError",
    "S3RetryPolicy",
    "StorageError",
]
