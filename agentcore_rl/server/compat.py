"""The part of AWS's ``BedrockAgentCoreApp`` surface that :class:`AgentCoreRLApp` keeps:
``handlers``, ``/ping`` with its custom, forced and automatic status, and the tracked async
tasks that keep it ``HealthyBusy`` (docs/server.md lists what is left out)."""

from __future__ import annotations

import functools
import inspect
import itertools
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from agentcore_rl.errors import ConfigurationError, InvalidPayloadError
from agentcore_rl.protocol import PingStatus
from agentcore_rl.server.invoke import HandlerSpec, RequestContext, call_handler
from agentcore_rl.server.routes import error_response, refused

__all__ = ["BedrockSurface", "PingHandler", "plain_answer"]

logger = logging.getLogger("agentcore_rl.server")

#: A custom ping handler: returns a :class:`PingStatus` (ours or AWS's) or its value.
PingHandler = Callable[[], Any]

P = TypeVar("P", bound=PingHandler)
A = TypeVar("A", bound=Callable[..., Awaitable[Any]])


def _status(value: Any) -> PingStatus:
    # An enum of AWS's SDK or a plain string: both carry the wire value.
    return PingStatus(getattr(value, "value", value))


async def plain_answer(
    spec: HandlerSpec, payload: dict[str, Any], context: RequestContext, limiter: Any
) -> Response:
    """A plain ``@app.entrypoint``'s answer, as ``BedrockAgentCoreApp`` gives it: the
    handler's value as JSON (a ``Response`` as it is), ``500 {"error": <message>}`` if it
    raised."""
    try:
        result = await call_handler(spec, payload, context, limiter=limiter)
    except InvalidPayloadError as exc:
        return refused(exc)
    except Exception as exc:
        logger.exception("entrypoint %s raised in session %s", spec.name, context.session_id)
        # The message alone, as BedrockAgentCoreApp's clients parse it.
        return error_response(str(exc) or type(exc).__name__, 500)
    if isinstance(result, Response):
        return result
    try:
        return JSONResponse(result)
    except (TypeError, ValueError) as exc:
        logger.error("entrypoint %s returned a value JSON cannot hold: %s", spec.name, exc)
        return error_response(f"handler result is not JSON-serialisable: {exc}", 500)


class BedrockSurface:
    """``BedrockAgentCoreApp``'s ping and async-task API, as a base of the app.

    ``clock`` (epoch seconds) stamps ``/ping`` and the tasks' durations; the app says
    whether its own work keeps it busy (:meth:`_busy`).
    """

    clock: Callable[[], float] = time.time

    def __init__(self) -> None:
        #: The registered entrypoint under ``"main"`` as a ``(payload, context)`` coroutine
        #: function named after it (as in ``BedrockAgentCoreApp``); for inspection and for
        #: calling the handler directly, not a way to replace it.
        self.handlers: dict[str, Callable[..., Awaitable[Any]]] = {}
        self._forced: PingStatus | None = None
        self._ping_handler: PingHandler | None = None
        self._status = PingStatus.HEALTHY
        self._last_update: int | None = None
        # add/complete_async_task may be called from sync handlers' threads.
        self._tasks_lock = threading.Lock()
        self._async_tasks: dict[int, tuple[str, float]] = {}
        self._task_ids = itertools.count(1)

    def _busy(self) -> bool:
        return bool(self._async_tasks)

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
            self._async_tasks[task_id] = (name, self.clock())
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
        duration = self.clock() - started
        logger.info("async task completed: %s (id %d, %.2f s)", name, task_id, duration)
        return True

    def get_async_task_info(self) -> dict[str, Any]:
        """The tracked tasks: ``{"active_count": n, "running_jobs": [{"name", "duration"}]}``."""
        now = self.clock()
        with self._tasks_lock:
            tasks = list(self._async_tasks.values())
        return {
            "active_count": len(tasks),
            "running_jobs": [{"name": name, "duration": now - began} for name, began in tasks],
        }

    def force_ping_status(self, status: PingStatus | str) -> None:
        """Report ``status`` on ``/ping`` whatever else holds, until cleared."""
        self._forced = _status(status)
        self.get_current_ping_status()

    def clear_forced_ping_status(self) -> None:
        """Go back to the custom or automatic ``/ping`` status."""
        self._forced = None
        self.get_current_ping_status()

    def get_current_ping_status(self) -> PingStatus:
        """What ``/ping`` reports now: forced, else the custom handler's, else automatic."""
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
            status = PingStatus.HEALTHY_BUSY if self._busy() else PingStatus.HEALTHY
        # Changed with the status only: ACR reclaims a session that says Healthy for too long.
        if status is not self._status or self._last_update is None:
            self._status = status
            self._last_update = int(self.clock())
        return status

    async def _ping(self, request: Request) -> Response:
        status = self.get_current_ping_status()
        return JSONResponse({"status": status.value, "time_of_last_update": self._last_update})
