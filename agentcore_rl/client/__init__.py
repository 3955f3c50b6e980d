"""The trainer side: drive rollouts on agent servers and collect their results from S3.

Example::

    from agentcore_rl.client import TokenBucket

    bucket = TokenBucket(rate=25, burst=25)
"""

from agentcore_rl.client.bucket import Priority, TokenBucket

__all__ = ["Priority", "TokenBucket"]
