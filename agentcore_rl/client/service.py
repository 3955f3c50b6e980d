"""Service: the task group that owns an object's background work (watcher, stop workers,
batch runs), and closing it by cancelling one scope.

anyio wants a task group exited by the task that entered it. An object entered with
``async with`` opens its service there (:meth:`Service.__aenter__`), so the work belongs
to the caller's task. An object used without ``async with`` (created in one task, closed
from another, e.g. a fixture's teardown) opens it lazily with :meth:`Service.open_hosted`:
one host task enters the task group, and :meth:`Service.aclose` cancels the work and
joins that task, so it never outlives the object.

The task group is the object's own business: an exception raised in the caller's
``async with`` block leaves it as itself, never inside an ``ExceptionGroup``.

Example::

    service = Service("agentcore-rl client", setup=lambda s: s.start_soon(watcher.run, name="w"))
    async with service:
        ...
    # or, without ``async with``: service.open_hosted() ... await service.aclose()
"""

from __future__ import annotations

import asyncio
import enum
import sys
from collections.abc import Callable, Coroutine
from types import TracebackType
from typing import Any, TypeVar

import anyio
from anyio.abc import TaskGroup, TaskStatus

from agentcore_rl._unwrap import unwrap
from agentcore_rl.errors import ClientClosedError

if sys.version_info < (3, 11):
    from exceptiongroup import (  # type: ignore[import-not-found,unused-ignore]  # anyio's dependency there
        BaseExceptionGroup,
    )

__all__ = ["ClientState", "Service", "ServiceOwner"]

_Owner = TypeVar("_Owner", bound="ServiceOwner")


class Service:
    """One task group that runs ``start_soon``/``start`` work until :meth:`aclose`."""

    def __init__(self, name: str, *, setup: Callable[[Service], None] | None = None) -> None:
        self.name = name
        self.setup = setup  # starts the long-lived work once the task group is open
        self._outer: TaskGroup | None = None  # entered by ``async with``
        self._host: asyncio.Task[None] | None = None  # or by this task (``open_hosted``)
        self._workers: TaskGroup | None = None
        self._scope: anyio.CancelScope | None = None
        self._ended: anyio.Event | None = None
        self._ready: asyncio.Future[None] | None = None

    def __repr__(self) -> str:
        mode = "entered" if self._outer else "hosted" if self._host else "not open"
        return f"Service({self.name!r}, {mode}, running={self.running})"

    @property
    def running(self) -> bool:
        """Whether work can be started."""
        return self._workers is not None

    async def __aenter__(self) -> Service:
        outer = anyio.create_task_group()
        await outer.__aenter__()
        self._outer = outer
        try:
            await outer.start(self._serve)
        except BaseException:
            self._outer = None
            await _leave(outer)
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        outer, self._outer = self._outer, None
        try:
            await self.aclose()
        finally:
            if outer is not None:  # the task that entered it exits it
                await _leave(outer)
        return None  # the block's own exception, if any, goes on as itself

    def open_hosted(self) -> None:
        """Open without ``async with``: a host task owns the task group until ``aclose``.
        Returns at once; :meth:`wait_ready` waits until work can be started."""
        ready = self._ready = asyncio.get_running_loop().create_future()
        # The one task not started by a task group: it *is* the owner, and aclose joins it.
        self._host = asyncio.create_task(self._run_host(ready), name=self.name)

    async def wait_ready(self) -> None:
        """Wait until a hosted service runs (raise what stopped it from starting)."""
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
                ready.exception()  # retrieved here; wait_ready re-raises it
            raise

    async def _serve(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        self._ended = anyio.Event()
        try:
            with anyio.CancelScope() as self._scope:
                async with anyio.create_task_group() as workers:
                    self._workers = workers
                    if self.setup is not None:
                        self.setup(self)
                    task_status.started()
                    await anyio.sleep_forever()
        finally:
            self._workers = None
            self._ended.set()

    def start_soon(
        self, func: Callable[..., Coroutine[Any, Any, Any]], *args: Any, name: str
    ) -> None:
        """Run ``func(*args)`` in the service's task group."""
        if self._workers is None:
            raise RuntimeError(f"{self.name}: the service is not running")
        self._workers.start_soon(func, *args, name=name)

    async def start(
        self, func: Callable[..., Coroutine[Any, Any, Any]], *args: Any, name: str
    ) -> Any:
        """Run ``func(*args, task_status=...)`` in the task group; return what it reports
        through ``task_status.started()``."""
        if self._workers is None:
            raise RuntimeError(f"{self.name}: the service is not running")
        return await self._workers.start(func, *args, name=name)

    async def aclose(self) -> None:
        """Cancel the work and wait until it has ended (and the host task, if any). Idempotent."""
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


async def _leave(outer: TaskGroup) -> None:
    """Exit ``outer`` (its work has ended) without handing it the block's exception, which
    it would wrap in an ``ExceptionGroup``; a failure of its own leaves unwrapped when it
    is one exception."""
    try:
        await outer.__aexit__(None, None, None)
    except BaseExceptionGroup as group:
        raise unwrap(group) from None


class ClientState(enum.Enum):
    """Where a client is in its life: not opened yet, open (entered with ``async with``,
    or opened by its first rollout), or closed for good."""

    UNOPENED = 1
    OPENED = 2
    CLOSED = 3


class ServiceOwner:
    """The lifecycle of an object whose work runs in a :class:`Service`: entered once with
    ``async with`` (leaving closes it; the block's exception leaves as itself), or opened
    by its first use and hosted until ``aclose``. Subclasses give ``aclose`` and
    ``_opening`` (what entering prepares)."""

    def __init__(self, service: Service) -> None:
        self._service = service
        self._state = ClientState.UNOPENED
        self._entered = False  # the service was entered by ``async with`` (not hosted)
        self._in_block = False  # inside ``async with`` (entered once at a time)

    @property
    def state(self) -> ClientState:
        """Where the client is in its life (see :class:`ClientState`)."""
        return self._state

    async def aclose(self) -> None:
        raise NotImplementedError

    async def _opening(self) -> None:
        """Prepare what the first uses need (connections), once entered."""

    def _check_not_closed(self) -> None:
        if self._state is ClientState.CLOSED:
            raise ClientClosedError("the client is closed; create a new one")

    async def _ensure_open(self) -> None:
        """Open the task group if ``async with`` has not: the first use of an object used
        without it opens one, hosted until ``aclose``."""
        self._check_not_closed()
        if self._state is ClientState.UNOPENED:
            self._state = ClientState.OPENED
            self._service.open_hosted()
        await self._service.wait_ready()

    async def __aenter__(self: _Owner) -> _Owner:
        self._check_not_closed()
        if self._in_block:
            raise RuntimeError(
                f"this {type(self).__name__} is already entered with 'async with'; it is "
                "entered once (leaving a block closes it): use it inside the first block"
            )
        self._in_block = True
        if self._state is ClientState.UNOPENED:
            self._state = ClientState.OPENED
            try:
                await self._service.__aenter__()
                self._entered = True
                await self._opening()
            except BaseException:
                self._in_block = False
                await self._exit_service()
                raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._in_block = False
        await self._exit_service()
        # The block's exception, if any, goes on as itself.

    async def _exit_service(self) -> None:
        """Close, then leave the task group this task entered (anyio: the same task)."""
        try:
            await self.aclose()
        finally:
            if self._entered:
                self._entered = False
                await self._service.__aexit__(None, None, None)
