"""RolloutClient: the synchronous facade over AsyncRolloutClient.

The async client runs on a private event-loop thread (an anyio blocking portal, as
Starlette's TestClient does). Each method here is made by :func:`_forward` from the async
client's own: its parameters, keyword checks and docstring, run on that thread and waited
for. No logic of its own: behaviour, errors and defaults are the async client's.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
from collections.abc import AsyncGenerator, Callable, Iterator
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar

from anyio.from_thread import BlockingPortal, start_blocking_portal

from agentcore_rl.client.client import AsyncRolloutClient
from agentcore_rl.client.future import RolloutFuture
from agentcore_rl.client.outcomes import ClientStats
from agentcore_rl.group_tracker import GroupCounters
from agentcore_rl.keywords import same_parameters

if TYPE_CHECKING:
    from agentcore_rl.trace import SessionTrace

__all__ = ["RolloutClient"]

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")


def _forward(
    source: Callable[Concatenate[AsyncRolloutClient, P], Any],
    adapt: Callable[[RolloutClient, Any], T],
) -> Callable[Concatenate[RolloutClient, P], T]:
    """Called (and awaited) on the loop thread, its value handed to ``adapt``."""
    name = source.__name__

    def method(self: RolloutClient, *args: P.args, **kwargs: P.kwargs) -> T:
        call = functools.partial(getattr(self._client, name), *args, **kwargs)
        return adapt(self, self._portal.call(call))

    method.__name__ = name
    method.__qualname__ = f"RolloutClient.{name}"
    method.__doc__ = f"As :meth:`AsyncRolloutClient.{name}`, on its thread.\n\n{source.__doc__}"
    return same_parameters(source)(method)


def _as_is(client: RolloutClient, value: R) -> R:
    return value


async def _outcome(fut: asyncio.Future[T]) -> T:
    # Cancelling the concurrent future cancels this task, and with it ``fut``.
    return await fut


class RolloutClient:
    """:class:`AsyncRolloutClient` for synchronous code: same constructor and methods.

    ``invoke`` and ``attach`` return a :class:`concurrent.futures.Future` (with ``session_id``,
    ``input_id``, ``s3_bucket`` and ``result_key`` attributes; ``cancel()`` stops the
    session); ``run_batch`` is a plain iterator. Use it as a context manager or call
    ``close()``. Through a gateway, prefer a remote one (an in-process gateway must run on
    this client's own loop thread).

    Example::

        client = RolloutClient(agent_url="http://127.0.0.1:8080", s3_bucket="rollouts",
                               exp_id="eval-1", limits=Limits(max_concurrent_sessions=32))
        try:
            futures = [client.invoke(p) for p in payloads]
            results = [f.result(timeout=900) for f in futures]
        finally:
            client.close()
    """

    @same_parameters(AsyncRolloutClient.__init__)
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._stack = contextlib.ExitStack()
        self._portal: BlockingPortal = self._stack.enter_context(start_blocking_portal())
        try:
            # Built on the loop thread: its primitives belong to that loop.
            self._client: AsyncRolloutClient = self._portal.call(
                functools.partial(AsyncRolloutClient, *args, **kwargs)
            )
            # Entered and exited by one task of the portal, as anyio's task groups require.
            self._stack.enter_context(self._portal.wrap_async_context_manager(self._client))
        except BaseException:
            self._stack.close()
            raise
        self._closed = False

    def __repr__(self) -> str:
        return f"RolloutClient({getattr(self, '_client', None)!r})"

    @property
    def stats(self) -> ClientStats:
        """See :attr:`AsyncRolloutClient.stats` (read on the loop thread, where it changes)."""
        stats: ClientStats = self._portal.call(getattr, self._client, "stats")
        return stats

    @property
    def group_stats(self) -> GroupCounters:
        counters: GroupCounters = self._portal.call(getattr, self._client, "group_stats")
        return counters

    def _future(self, fut: asyncio.Future[T]) -> concurrent.futures.Future[T]:
        outcome: concurrent.futures.Future[T] = self._portal.start_task_soon(_outcome, fut)
        for name in ("session_id", "input_id", "s3_bucket", "result_key", "session_ids"):
            if hasattr(fut, name):
                setattr(outcome, name, getattr(fut, name))
        outcome.source = fut  # type: ignore[attr-defined]  # for trace_of
        return outcome

    def _iterate(self, items: AsyncGenerator[T, None]) -> Iterator[T]:
        # Made and stepped on the loop thread; leaving the loop closes it there.
        try:
            while True:
                try:
                    item: T = self._portal.call(items.__anext__)
                except StopAsyncIteration:
                    return
                yield item
        finally:
            if not self._closed:
                self._portal.call(items.aclose)

    invoke = _forward(AsyncRolloutClient.invoke, _future)
    attach = _forward(AsyncRolloutClient.attach, _future)
    rollout = _forward(AsyncRolloutClient.rollout, _as_is)
    run_batch = _forward(AsyncRolloutClient.run_batch, _iterate)
    invoke_group = _forward(AsyncRolloutClient.invoke_group, _future)
    run_groups = _forward(AsyncRolloutClient.run_groups, _iterate)
    stop_session = _forward(AsyncRolloutClient.stop_session, _as_is)
    set_policy_version = _forward(AsyncRolloutClient.set_policy_version, _as_is)
    advance_policy = _forward(AsyncRolloutClient.advance_policy, _as_is)
    check_services = _forward(AsyncRolloutClient.check_services, _as_is)

    def trace_of(self, fut: concurrent.futures.Future[dict[str, Any]]) -> SessionTrace:
        """See :meth:`AsyncRolloutClient.trace_of`."""
        rollout_future = getattr(fut, "source", None)
        if not isinstance(rollout_future, RolloutFuture):
            raise TypeError("trace_of takes a future returned by this client's invoke/attach")
        fut.result()  # the rollout's own error, if it failed
        trace: SessionTrace = self._portal.call(self._client.trace_of, rollout_future)
        return trace

    def close(self) -> None:
        """Close the async client (stopping live sessions) and its thread."""
        if self._closed:
            return
        self._closed = True
        self._stack.close()  # leaves the client's ``async with`` (aclose), then the portal

    def __enter__(self) -> RolloutClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
