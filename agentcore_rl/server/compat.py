"""The part of AWS's ``BedrockAgentCoreApp`` surface that :class:`AgentCoreRLApp` keeps,
and the ``/ping`` status behind it (docs/server.md lists what is left out).

``time_of_last_update`` changes with the status only: AgentCore Runtime reclaims a session
that reports ``Healthy`` for too long.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import itertools
import logging
import threading
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

import anyio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from agentcore_rl import protocol
from agentcore_rl.errors import ConfigurationError
from agentcore_rl.protocol import PingStatus
from agentcore_rl.server.invoke import Handler, HandlerSpec, RequestContext, call_handler

__all__ = ["BedrockCompat", "PingHandler"]

logger = logging.getLogger(__name__)

#: A custom ping handler: returns a :class:`PingStatus` (ours or AWS's) or its value.
PingHandler = Callable[[], Any]

F = TypeVar("F", bound=Handler)
P = TypeVar("P", bound=PingHandler)
A = TypeVar("A", bound=Callable[..., Awaitable[Any]])


def _status(value: Any) -> PingStatus:
    # An enum of AWS's SDK or a plain string: both carry the wire value.
    return PingStatus(getattr(value, "value", value))


class BedrockCompat:
    """``BedrockAgentCoreApp``'s registration and health API (a mixin of the app)."""

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

    def _owes_results(self) -> bool:
        raise NotImplementedError

    def _init_compat(self, clock: Callable[[], float]) -> None:
        self.handlers = {}
        self._clock = clock
        self._forced: PingStatus | None = None
        self._ping_handler: PingHandler | None = None
        self._status = PingStatus.HEALTHY
        self._last_update = int(clock())
        # add/complete_async_task may be called from sync handlers' threads.
        self._tasks_lock = threading.Lock()
        self._async_tasks: dict[int, tuple[str, float]] = {}
        self._task_ids = itertools.count(1)

    def _registered(self, func: Handler, spec: HandlerSpec) -> None:
        async def main(payload: dict[str, Any], context: Any = None) -> Any:
            if context is None:
                context = RequestContext(session_id=protocol.new_session_id())
            return await call_handler(spec, payload, context, limiter=self._get_limiter())

        # No __wrapped__: inspect.signature reports (payload, context) like the SDK's.
        for name in ("__module__", "__name__", "__qualname__", "__doc__"):
            with contextlib.suppress(AttributeError):
                setattr(main, name, getattr(spec.func, name))
        self.handlers["main"] = main
        with contextlib.suppress(AttributeError, TypeError):
            func.run = self.run  # type: ignore[attr-defined]

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
        self._ping_handler = func
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
        with self._tasks_lock:
            task_id = next(self._task_ids)
            self._async_tasks[task_id] = (name, self._clock())
        logger.info("async task started: %s (id %d)", name, task_id)
        return task_id

    def complete_async_task(self, task_id: int) -> bool:
        """Stop tracking a task from :meth:`add_async_task`; False for an unknown id."""
        with self._tasks_lock:
            task = self._async_tasks.pop(task_id, None)
        if task is None:
            logger.warning("complete_async_task: unknown task id %r", task_id)
            return False
        name, started = task
        duration = self._clock() - started
        logger.info("async task completed: %s (id %d, %.2f s)", name, task_id, duration)
        return True

    def get_async_task_info(self) -> dict[str, Any]:
        """The tracked tasks: ``{"active_count": n, "running_jobs": [{"name", "duration"}]}``."""
        now = self._clock()
        with self._tasks_lock:
            tasks = list(self._async_tasks.values())
        return {
            "active_count": len(tasks),
            "running_jobs": [{"name": name, "duration": now - began} for name, began in tasks],
        }

    def force_ping_status(self, status: PingStatus | str) -> None:
        """Report ``status`` on ``/ping`` whatever else holds, until cleared."""
        self._forced = _status(status)
        self._refresh_ping()

    def clear_forced_ping_status(self) -> None:
        """Go back to the custom or automatic ``/ping`` status."""
        self._forced = None
        self._refresh_ping()

    def get_current_ping_status(self) -> PingStatus:
        """What ``/ping`` reports now: forced, else the custom handler's, else automatic."""
        return self._refresh_ping()

    def _refresh_ping(self) -> PingStatus:
        status = self._forced
        if status is None and self._ping_handler is not None:
            try:
                status = _status(self._ping_handler())
            except Exception as exc:
                logger.warning(
                    "the custom ping handler failed (%s: %s); reporting the automatic status",
                    type(exc).__name__,
                    exc,
                )
        if status is None:
            busy = self._owes_results() or bool(self._async_tasks)
            status = PingStatus.HEALTHY_BUSY if busy else PingStatus.HEALTHY
        if status is not self._status:
            self._status = status
            self._last_update = int(self._clock())
        return status

    async def _ping(self, request: Request) -> Response:
        status = self._refresh_ping()
        return JSONResponse({"status": status.value, "time_of_last_update": self._last_update})
