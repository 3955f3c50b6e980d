"""What makes one machine a whole stack: embedded S3, a local AgentCore Runtime stand-in and
a scripted policy server for demos and tests.

Example::

    from agentcore_rl.local import EmbeddedS3

    with EmbeddedS3() as s3:
        print(s3.endpoint_url)
"""

from agentcore_rl.local.embedded_s3 import EmbeddedS3

__all__ = ["EmbeddedS3"]
