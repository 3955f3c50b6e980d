"""RequestContext: what a handler learns about the invocation besides its payload."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from agentcore_rl.protocol import RolloutConfig

__all__ = ["RequestContext"]


@dataclass(frozen=True, kw_only=True)
class RequestContext:
    """The invocation's session id, request id, HTTP headers and parsed ``_rollout`` block.

    ``session_id`` is the AgentCore Runtime session header, or a fresh id when the caller
    sent none. ``request_id`` is ``None`` when the caller sent no request id header.
    ``headers`` has lower-case names and, when it comes from a request, looks names up
    case-insensitively. ``rollout`` is the validated ``_rollout`` block of a rollout
    invocation (``None`` for plain entrypoints and payloads that name no S3 location).
    ``request`` is the Starlette request (its body is already read; a rollout outlives
    it). ``request_headers`` is ``headers`` under the name AWS's ``RequestContext`` uses.

    Example::

        def handler(payload: dict, context: RequestContext) -> dict:
            return {"session": context.session_id, "ua": context.headers.get("user-agent")}
    """

    session_id: str
    request_id: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    rollout: RolloutConfig | None = None
    # Any, not starlette's Request: contexts are also built by hand, in tests and tools.
    request: Any = field(default=None, compare=False)

    @property
    def request_headers(self) -> Mapping[str, str]:
        """The request headers (``BedrockAgentCoreApp``'s name for :attr:`headers`)."""
        return self.headers

    def __repr__(self) -> str:
        return (
            f"RequestContext(session_id={self.session_id!r}, request_id={self.request_id!r}, "
            f"rollout={self.rollout!r})"
        )
