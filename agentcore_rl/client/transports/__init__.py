"""How the client reaches agents: AgentCore Runtime (ACR) or plain HTTP.

Example::

    from agentcore_rl.client.transports import HttpTransport

    transport = HttpTransport("http://127.0.0.1:8080")
"""

from agentcore_rl.client.transports.acr import AcrTransport
from agentcore_rl.client.transports.base import RetryableError, Transport
from agentcore_rl.client.transports.http import HttpTransport

__all__ = ["AcrTransport", "HttpTransport", "RetryableError", "Transport"]
