"""Calling a user's handler however it is written, and the :class:`RequestContext` it gets.

Sync handlers run in bounded worker threads so a blocking one never freezes ``/ping``.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.to_thread

from agentcore_rl.errors import ConfigurationError
from agentcore_rl.protocol import RolloutConfig

__all__ = ["Handler", "HandlerSpec", "RequestContext", "call_handler"]


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


#: A user's entrypoint: ``(payload)`` or ``(payload, context)``, sync or async.
Handler = Callable[..., Any]

_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def _takes_context(func: Callable[..., Any], name: str) -> bool:
    try:
        signature = inspect.signature(func)
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(f"cannot inspect the signature of handler {name}: {exc}") from exc
    params = list(signature.parameters.values())
    positional = [p for p in params if p.kind in _POSITIONAL]
    if any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params):
        return True
    if not positional:
        raise ConfigurationError(
            f"handler {name} must take the payload as its first positional parameter: "
            "def handler(payload) or def handler(payload, context)"
        )
    if len(positional) == 1:
        return False
    second = positional[1]
    # A defaulted second parameter is the handler's own option unless named "context".
    return second.default is inspect.Parameter.empty or second.name == "context"


@dataclass(frozen=True)
class HandlerSpec:
    """A handler plus how to call it, worked out once at decoration time."""

    func: Handler
    name: str
    is_async: bool
    takes_context: bool

    @classmethod
    def inspect(cls, func: Handler) -> HandlerSpec:
        if not callable(func):
            raise ConfigurationError(f"an entrypoint must be callable, got {type(func).__name__}")
        name = getattr(func, "__qualname__", None) or repr(func)
        # iscoroutinefunction sees through a partial, not into an async __call__.
        call = getattr(func, "__call__", None)  # noqa: B004
        return cls(
            func=func,
            name=name,
            is_async=inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(call),
            takes_context=_takes_context(func, name),
        )


async def call_handler(
    spec: HandlerSpec,
    payload: dict[str, Any],
    context: RequestContext,
    *,
    limiter: anyio.CapacityLimiter,
) -> Any:
    """Call the handler; a cancelled sync one's thread is abandoned (it cannot be stopped)."""
    args: tuple[Any, ...] = (payload, context) if spec.takes_context else (payload,)
    if spec.is_async:
        return await spec.func(*args)
    result = await anyio.to_thread.run_sync(
        functools.partial(spec.func, *args), limiter=limiter, abandon_on_cancel=True
    )
    if inspect.isawaitable(result):
        # A sync wrapper around an async function, as some decorators make.
        return await result
    return result
