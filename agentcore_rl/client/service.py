"""Service: the task group that owns the client's work, its life (unopened, open, closed),
and closing it by cancelling one scope (docs/architecture.md, "Who owns which task").

anyio wants a task group exited by the task that entered it: ``async with`` enters it in
the caller's task (:meth:`Service.enter`); a client used without it (created in one task,
closed from another, e.g. a fixture's teardown) gets one host task (:meth:`ensure_open`).
"""

from __future__ import annotations

import asyncio
import enum
import sys
from collections.abc import Callable, Coroutine
from typing import Any

import anyio
from anyio.abc import TaskGroup, TaskStatus

from agentcore_rl._unwrap import unwrap
from agentcore_rl.errors import ClientClosedError

if sys.version_info < (3, 11):
    from exceptiongroup import (  # type: ignore[import-not-found,unused-ignore]  # anyio's dependency there
        BaseExceptionGroup,
    )

__all__ = ["ClientState", "Service"]


class ClientState(enum.Enum):
    """Open: entered with ``async with``, or opened by its first rollout."""

    UNOPENED = 1
    OPENED = 2
    CLOSED = 3


class Service:
    """One task group that runs ``start_soon``/``start`` work until :meth:`aclose`;
    ``setup`` starts the long-lived work once it is open."""

    def __init__(self, name: str, *, setup: Callable[[Service], None]) -> None:
        self.name = name
        self.setup = setup
        self.state = ClientState.UNOPENED
        self._outer: TaskGroup | None = None  # entered by ``async with``
        self._host: asyncio.Task[None] | None = None  # or by this task (first use)
        self._ready: asyncio.Future[None] | None = None
        self._workers: TaskGroup | None = None
        self._scope: anyio.CancelScope | None = None
        self._ended: anyio.Event | None = None

    @property
    def running(self) -> bool:
        return self._workers is not None

    def check_open(self) -> None:
        if self.state is ClientState.CLOSED:
            raise ClientClosedError("the client is closed; create a new one")

    async def enter(self) -> bool:
        """In this task (``async with``); False when already open."""
        self.check_open()
        if self.state is not ClientState.UNOPENED:
            return False
        self.state = ClientState.OPENED
        outer = anyio.create_task_group()
        await outer.__aenter__()
        self._outer = outer
        await outer.start(self._serve)
        return True

    async def leave(self) -> None:
        outer, self._outer = self._outer, None
        try:
            await self.aclose()
        finally:
            if outer is not None:
                # Not handed the block's exception, which it would wrap in a group.
                try:
                    await outer.__aexit__(None, None, None)
                except BaseExceptionGroup as group:
                    raise unwrap(group) from None

    async def ensure_open(self) -> None:
        """Unless ``async with`` did, one host task opens the task group until :meth:`aclose`."""
        self.check_open()
        if self.state is ClientState.UNOPENED:
            self.state = ClientState.OPENED
            self._ready = asyncio.get_running_loop().create_future()
            # The one task not started by a task group: it *is* the owner; aclose joins it.
            self._host = asyncio.create_task(self._run_host(self._ready), name=self.name)
        if self._ready is not None:
            await asyncio.shield(self._ready)

    async def _run_host(self, ready: asyncio.Future[None]) -> None:
        try:
            async with anyio.create_task_group() as outer:
                await outer.start(self._serve)
                ready.set_result(None)
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(exc)
                ready.exception()  # retrieved here; ensure_open re-raises it
            raise

    async def _serve(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        self._ended = anyio.Event()
        try:
            with anyio.CancelScope() as self._scope:
                async with anyio.create_task_group() as workers:
                    self._workers = workers
                    self.setup(self)
                    task_status.started()
                    await anyio.sleep_forever()
        finally:
            self._workers = None
            self._ended.set()

    def start_soon(
        self, func: Callable[..., Coroutine[Any, Any, Any]], *args: Any, name: str
    ) -> None:
        if self._workers is None:
            raise RuntimeError(f"{self.name}: the service is not running")
        self._workers.start_soon(func, *args, name=name)

    async def start(
        self, func: Callable[..., Coroutine[Any, Any, Any]], *args: Any, name: str
    ) -> Any:
        """What ``func(*args, task_status=...)`` reports through ``task_status.started()``."""
        if self._workers is None:
            raise ClientClosedError("the client is closed; create a new one")
        return await self._workers.start(func, *args, name=name)

    async def aclose(self) -> None:
        if self._ready is not None and not self._ready.done():
            await asyncio.wait([self._ready])  # a host not running yet: let it start first
        if self._scope is not None:
            self._scope.cancel()
        if self._ended is not None:
            await self._ended.wait()
        host, self._host = self._host, None
        if host is not None:
            try:
                await host
            except BaseExceptionGroup as group:
                raise unwrap(group) from None
