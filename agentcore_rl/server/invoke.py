"""Calling a user's handler however it is written: async or sync, with or without context.

Sync handlers run in worker threads bounded by a :class:`anyio.CapacityLimiter`, so a
handler that blocks (``time.sleep``, blocking I/O, a CPU loop) never freezes the event
loop that answers ``/ping``. Async handlers run on the event loop and must not block.

Example::

    spec = HandlerSpec.inspect(my_handler)
    result = await call_handler(spec, payload, context, limiter=anyio.CapacityLimiter(8))
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.to_thread

from agentcore_rl.errors import ConfigurationError
from agentcore_rl.server.context import RequestContext

__all__ = ["Handler", "HandlerSpec", "call_handler"]

#: A user's entrypoint: ``(payload)`` or ``(payload, context)``, sync or async.
Handler = Callable[..., Any]

_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def _is_async(func: Callable[..., Any]) -> bool:
    target: Any = func
    while isinstance(target, functools.partial):
        target = target.func
    if inspect.iscoroutinefunction(target):
        return True
    call = getattr(target, "__call__", None)  # noqa: B004 - an object with async __call__
    return call is not None and inspect.iscoroutinefunction(call)


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
    # A second parameter with a default is an option of the handler's own, unless its
    # name says it wants the context.
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
        """Inspect ``func``; raise :class:`ConfigurationError` if it cannot be a handler."""
        if not callable(func):
            raise ConfigurationError(f"an entrypoint must be callable, got {type(func).__name__}")
        name = getattr(func, "__qualname__", None) or repr(func)
        return cls(
            func=func,
            name=name,
            is_async=_is_async(func),
            takes_context=_takes_context(func, name),
        )


async def call_handler(
    spec: HandlerSpec,
    payload: dict[str, Any],
    context: RequestContext,
    *,
    limiter: anyio.CapacityLimiter,
) -> Any:
    """Call the handler and return what it returns (exceptions propagate).

    A sync handler runs in a worker thread taken from ``limiter``. If the calling task is
    cancelled, the thread is abandoned: Python cannot stop a thread, so the handler runs
    on until it returns and its result is discarded.
    """
    args: tuple[Any, ...] = (payload, context) if spec.takes_context else (payload,)
    if spec.is_async:
        return await spec.func(*args)
    result = await anyio.to_thread.run_sync(
        functools.partial(spec.func, *args), limiter=limiter, abandon_on_cancel=True
    )
    if inspect.isawaitable(result):
        # A sync wrapper around an async function (some decorators produce these).
        return await result
    return result
