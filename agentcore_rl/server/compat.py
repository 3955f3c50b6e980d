"""The part of AWS's ``BedrockAgentCoreApp`` surface that :class:`AgentCoreRLApp` keeps.

A mixin, so that the app's own module holds only the rollout server: ``handlers``,
``@app.entrypoint`` (plain request/response, whose function gets a ``.run()``),
``@app.ping``, ``@app.async_task``, ``add_async_task``/``complete_async_task``,
``get_async_task_info``, ``force_ping_status``/``clear_forced_ping_status`` and
``get_current_ping_status``. docs/server.md lists what is left out and why.

Example::

    app = AgentCoreRLApp()

    @app.ping
    def status() -> PingStatus:
        return PingStatus.HEALTHY_BUSY if indexing else PingStatus.HEALTHY
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

import anyio

from agentcore_rl import protocol
from agentcore_rl.errors import ConfigurationError
from agentcore_rl.protocol import PingStatus
from agentcore_rl.server.context import RequestContext
from agentcore_rl.server.health import HealthTracker, PingHandler
from agentcore_rl.server.invoke import Handler, HandlerSpec, call_handler

__all__ = ["BedrockCompat"]

F = TypeVar("F", bound=Handler)
P = TypeVar("P", bound=PingHandler)
A = TypeVar("A", bound=Callable[..., Awaitable[Any]])


class BedrockCompat:
    """``BedrockAgentCoreApp``'s registration and health API, over the app's
    :class:`~agentcore_rl.server.health.HealthTracker`.

    The app provides ``health``, ``_register``, ``_get_limiter`` and ``run``.
    """

    health: HealthTracker
    #: The registered entrypoint under ``"main"`` as a ``(payload, context)`` coroutine
    #: function named after it (as in ``BedrockAgentCoreApp``); for inspection and for
    #: calling the handler directly, not a way to replace it.
    handlers: dict[str, Callable[..., Awaitable[Any]]]

    def _register(self, func: Handler, *, rollout: bool) -> None:
        raise NotImplementedError

    def _get_limiter(self) -> anyio.CapacityLimiter:
        raise NotImplementedError

    def run(self, port: int = protocol.DEFAULT_PORT, host: str | None = None) -> None:
        raise NotImplementedError

    def _registered(self, func: Handler, spec: HandlerSpec) -> None:
        """Called by the app once ``func`` is its entrypoint."""
        self.handlers["main"] = self._main_handler(spec)
        # BedrockAgentCoreApp lets ``@app.entrypoint`` functions start the server themselves.
        with contextlib.suppress(AttributeError, TypeError):
            func.run = self.run  # type: ignore[attr-defined]

    def _main_handler(self, spec: HandlerSpec) -> Callable[..., Awaitable[Any]]:
        async def main(payload: dict[str, Any], context: Any = None) -> Any:
            if context is None:
                context = RequestContext(session_id=protocol.new_session_id())
            return await call_handler(spec, payload, context, limiter=self._get_limiter())

        # Named after the handler but without __wrapped__, so that inspect.signature
        # reports (payload, context) like the SDK's wrapper does.
        for name in ("__module__", "__name__", "__qualname__", "__doc__"):
            with contextlib.suppress(AttributeError):
                setattr(main, name, getattr(spec.func, name))
        return main

    def entrypoint(self, func: F) -> F:
        """Register a plain request/response handler (as with AWS's ``BedrockAgentCoreApp``).

        Its return value is the response body (JSON; a Starlette ``Response`` is passed
        through). If it raises, the answer is ``500 {"error": "<message>"}``.
        """
        self._register(func, rollout=False)
        return func

    def ping(self, func: P) -> P:
        """Register a custom ``/ping`` status: a function returning a ``PingStatus`` (ours or
        AWS's) or its string value. It is asked at every ping unless a status is forced;
        if it raises, the automatic status is reported.
        """
        if not callable(func):
            raise ConfigurationError(f"a ping handler must be callable, got {type(func).__name__}")
        self.health.ping_handler = func
        return func

    def async_task(self, func: A) -> A:
        """Decorate an async function so that ``/ping`` says ``HealthyBusy`` while it runs."""
        if not inspect.iscoroutinefunction(func):
            raise ConfigurationError("@app.async_task can only decorate async functions")

        @functools.wraps(func)
        async def tracked(*args: Any, **kwargs: Any) -> Any:
            task_id = self.add_async_task(func.__name__)
            try:
                return await func(*args, **kwargs)
            finally:
                self.complete_async_task(task_id)

        return tracked  # type: ignore[return-value]

    def add_async_task(self, name: str, metadata: Mapping[str, Any] | None = None) -> int:
        """Track background work the app does not run itself; ``HealthyBusy`` until it
        completes. Returns the id for :meth:`complete_async_task`. Thread-safe."""
        return self.health.add_task(name, metadata)

    def complete_async_task(self, task_id: int) -> bool:
        """Stop tracking a task from :meth:`add_async_task`; False for an unknown id."""
        return self.health.complete_task(task_id)

    def get_async_task_info(self) -> dict[str, Any]:
        """The tracked tasks: ``{"active_count": n, "running_jobs": [{"name", "duration"}]}``."""
        return self.health.task_info()

    def force_ping_status(self, status: PingStatus | str) -> None:
        """Report ``status`` on ``/ping`` whatever else holds, until cleared."""
        self.health.force(status)

    def clear_forced_ping_status(self) -> None:
        """Go back to the custom or automatic ``/ping`` status."""
        self.health.force(None)

    def get_current_ping_status(self) -> PingStatus:
        """What ``/ping`` reports now: forced, else the custom handler's, else automatic."""
        return self.health.status
