"""The lean AWS request path: the client's hot calls without botocore's per-request cost.

:class:`LeanAgentCore` (InvokeAgentRuntime, StopRuntimeSession) and :class:`LeanS3`
(GetObject, ListObjectsV2) are built from a generic aiobotocore client and keep its
credentials chain, region and endpoint rules, SigV4 signer classes and error exceptions;
what they save is the per-request work that does not change between requests. Everything
else stays on the generic client, which is also the fallback (``lean=False``).

Example::

    from agentcore_rl.aws import LeanAgentCore, LeanS3

    runtime = await LeanAgentCore.create(agentcore_client, arn)
    reader = await LeanS3.create(s3_client)
"""

from agentcore_rl.aws.agentcore import LeanAgentCore
from agentcore_rl.aws.http import LeanHttp, LeanUnsupported
from agentcore_rl.aws.s3 import LeanS3, ListPage
from agentcore_rl.aws.signing import LeanSigner

__all__ = ["LeanAgentCore", "LeanHttp", "LeanS3", "LeanSigner", "LeanUnsupported", "ListPage"]
