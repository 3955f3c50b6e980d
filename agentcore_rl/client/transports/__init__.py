"""How the client reaches agents: AgentCore Runtime (ACR) or plain HTTP."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from agentcore_rl.client.transports.acr import AcrTransport
from agentcore_rl.client.transports.http import DEFAULT_MAX_CONNECTIONS, HttpTransport
from agentcore_rl.client.transports.transport import RetryableError, Transport
from agentcore_rl.errors import ConfigurationError

if TYPE_CHECKING:
    from aiobotocore.session import AioSession

    from agentcore_rl.client.config import AwsConfig

__all__ = ["AcrTransport", "HttpTransport", "RetryableError", "Transport", "make_transport"]


def make_transport(
    arn: str | None,
    urls: str | Sequence[str] | None,
    aws: AwsConfig,
    sessions: int,
    *,
    session: AioSession | None = None,
) -> Transport:
    """The transport for a runtime ARN (its AWS clients from ``session``), else for agent
    URL(s); a connection per session that may be live, up to the pool's cap."""
    connections = min(sessions, DEFAULT_MAX_CONNECTIONS)
    if arn is not None and urls is None:
        return AcrTransport(
            arn,
            endpoint_url=aws.endpoint_url,
            qualifier=aws.qualifier,
            session=session,
            max_connections=connections,
        )
    if urls is None or arn is not None:
        raise ConfigurationError(
            "give exactly one of agent_runtime_arn (AgentCore Runtime) and agent_url "
            "(agent servers over HTTP)"
        )
    return HttpTransport(urls, max_connections=connections)
