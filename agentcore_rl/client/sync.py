"""RolloutClient: the synchronous facade over AsyncRolloutClient.

The async client runs on a private event-loop thread (an anyio blocking portal, as
Starlette's TestClient does); every method here forwards to it and waits. No logic of its
own: behaviour, errors and defaults are the async client's.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
from collections.abc import AsyncIterator, Callable, Iterator
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

from anyio.from_thread import BlockingPortal, start_blocking_portal

from agentcore_rl.client.batch import BatchItem
from agentcore_rl.client.client import AsyncRolloutClient
from agentcore_rl.client.future import RolloutFuture
from agentcore_rl.client.groups import GroupFuture
from agentcore_rl.client.stats import ClientStats
from agentcore_rl.group_tracker import GroupCounters
from agentcore_rl.groups import RolloutGroup
from agentcore_rl.keywords import same_parameters

if TYPE_CHECKING:
    from agentcore_rl.gateway.record import SessionTrace

__all__ = ["RolloutClient"]

T = TypeVar("T")


async def _create(*args: Any, **kwargs: Any) -> AsyncRolloutClient:
    # Built inside the loop thread: its primitives belong to that loop.
    return AsyncRolloutClient(*args, **kwargs)


async def _stats(client: AsyncRolloutClient) -> ClientStats:
    # Read on the loop thread: the counters change there.
    return client.stats


async def _trace_of(client: AsyncRolloutClient, fut: RolloutFuture) -> SessionTrace:
    return client.trace_of(fut)


async def _outcome(fut: RolloutFuture) -> dict[str, Any]:
    # Cancelling the concurrent future cancels this task, and with it ``fut``.
    return await fut


async def _group_outcome(fut: GroupFuture) -> RolloutGroup:
    # As _outcome: cancelling the concurrent future stops the group's members.
    return await fut


async def _aclose(items: AsyncIterator[Any]) -> None:
    aclose: Callable[[], Any] | None = getattr(items, "aclose", None)
    if aclose is not None:
        await aclose()


async def _group_stats(client: AsyncRolloutClient) -> GroupCounters:
    return client.group_stats


class RolloutClient:
    """:class:`AsyncRolloutClient` for synchronous code: same constructor and methods.

    ``invoke`` and ``attach`` return a :class:`concurrent.futures.Future` (with ``session_id``,
    ``input_id``, ``s3_bucket`` and ``result_key`` attributes; ``cancel()`` stops the
    session); ``rollout`` returns the result dict; ``run_batch`` is a plain iterator.
    Its parameters are the async client's, taken from it. Use it as a context manager or
    call ``close()``; an exception raised in the ``with`` block leaves it as itself.
    Through a gateway, prefer a remote one (an in-process gateway must run on this
    client's own loop thread); ``trace_of(fut)`` and ``BatchItem.trace`` give the traces.

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
        create = functools.partial(_create, *args, **kwargs)
        self._stack = contextlib.ExitStack()
        self._portal: BlockingPortal = self._stack.enter_context(start_blocking_portal())
        try:
            self._client: AsyncRolloutClient = self._portal.call(create)
            # Entered and exited by one task of the portal, as anyio's task groups require.
            self._stack.enter_context(self._portal.wrap_async_context_manager(self._client))
        except BaseException:
            self._stack.close()
            raise
        self._closed = False

    def __repr__(self) -> str:
        return f"RolloutClient({getattr(self, '_client', None)!r})"

    @property
    def async_client(self) -> AsyncRolloutClient:
        """The async client underneath (use it only through this object's portal)."""
        return self._client

    @property
    def stats(self) -> ClientStats:
        """See :attr:`AsyncRolloutClient.stats`."""
        return self._portal.call(_stats, self._client)

    @same_parameters(AsyncRolloutClient.invoke)
    def invoke(self, *args: Any, **kwargs: Any) -> concurrent.futures.Future[dict[str, Any]]:
        """Start a rollout (blocks until accepted); return a future for its outcome (see
        :meth:`AsyncRolloutClient.invoke`)."""
        call = functools.partial(self._client.invoke, *args, **kwargs)
        return self._outcome_future(self._portal.call(call))

    @same_parameters(AsyncRolloutClient.attach)
    def attach(self, *args: Any, **kwargs: Any) -> concurrent.futures.Future[dict[str, Any]]:
        """Follow a rollout already running (see :meth:`AsyncRolloutClient.attach`);
        return a future for its outcome."""
        call = functools.partial(self._client.attach, *args, **kwargs)
        return self._outcome_future(self._portal.call(call))

    def _outcome_future(
        self, rollout_future: RolloutFuture
    ) -> concurrent.futures.Future[dict[str, Any]]:
        fut = self._portal.start_task_soon(_outcome, rollout_future)
        for name in ("session_id", "input_id", "s3_bucket", "result_key"):
            setattr(fut, name, getattr(rollout_future, name))
        fut.rollout_future = rollout_future  # type: ignore[attr-defined]  # for trace_of
        return fut

    def trace_of(self, fut: concurrent.futures.Future[dict[str, Any]]) -> SessionTrace:
        """The token trace of a finished rollout run through the client's gateway (see
        :meth:`AsyncRolloutClient.trace_of`).
        """
        rollout_future: RolloutFuture | None = getattr(fut, "rollout_future", None)
        if rollout_future is None:
            raise TypeError("trace_of takes a future returned by this client's invoke/attach")
        fut.result()  # the rollout's own error, if it failed
        trace: SessionTrace = self._portal.call(_trace_of, self._client, rollout_future)
        return trace

    @same_parameters(AsyncRolloutClient.rollout)
    def rollout(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """Run one rollout and return its result dict (or raise its error)."""
        call = functools.partial(self._client.rollout, *args, **kwargs)
        result: dict[str, Any] = self._portal.call(call)
        return result

    @same_parameters(AsyncRolloutClient.run_batch)
    def run_batch(self, *args: Any, **kwargs: Any) -> Iterator[BatchItem]:
        """Yield a :class:`BatchItem` per payload in completion order; leaving the loop
        early stops the sessions still running (see :meth:`AsyncRolloutClient.run_batch`)."""
        return self._iterate(self._client.run_batch(*args, **kwargs))

    @same_parameters(AsyncRolloutClient.invoke_group)
    def invoke_group(self, *args: Any, **kwargs: Any) -> concurrent.futures.Future[RolloutGroup]:
        """Start a group (blocks until its members are admitted); return a future for the
        :class:`~agentcore_rl.groups.RolloutGroup` (see
        :meth:`AsyncRolloutClient.invoke_group`). It has ``input_id`` and ``session_ids``."""
        call = functools.partial(self._client.invoke_group, *args, **kwargs)
        group_future: GroupFuture = self._portal.call(call)
        fut = self._portal.start_task_soon(_group_outcome, group_future)
        fut.input_id = group_future.input_id  # type: ignore[attr-defined]
        fut.session_ids = group_future.session_ids  # type: ignore[attr-defined]
        return fut

    @same_parameters(AsyncRolloutClient.run_groups)
    def run_groups(self, *args: Any, **kwargs: Any) -> Iterator[RolloutGroup]:
        """Yield whole groups in completion order (see :meth:`AsyncRolloutClient.run_groups`);
        leaving the loop early stops the groups still running."""
        return self._iterate(self._client.run_groups(*args, **kwargs))

    def _iterate(self, items: AsyncIterator[T]) -> Iterator[T]:
        # The async generator is created here and stepped on the loop thread: its body
        # (the client's checks included) runs there.
        try:
            while True:
                try:
                    item: T = self._portal.call(items.__anext__)
                except StopAsyncIteration:
                    return
                yield item
        finally:
            if not self._closed:
                self._portal.call(_aclose, items)

    @same_parameters(AsyncRolloutClient.stop_session)
    def stop_session(self, *args: Any, **kwargs: Any) -> None:
        """See :meth:`AsyncRolloutClient.stop_session`."""
        self._portal.call(functools.partial(self._client.stop_session, *args, **kwargs))

    @same_parameters(AsyncRolloutClient.set_policy_version)
    def set_policy_version(self, *args: Any, **kwargs: Any) -> None:
        """See :meth:`AsyncRolloutClient.set_policy_version`."""
        self._portal.call(functools.partial(self._client.set_policy_version, *args, **kwargs))

    @same_parameters(AsyncRolloutClient.advance_policy)
    def advance_policy(self, *args: Any, **kwargs: Any) -> int:
        """See :meth:`AsyncRolloutClient.advance_policy`; returns the groups stopped."""
        call = functools.partial(self._client.advance_policy, *args, **kwargs)
        stopped: int = self._portal.call(call)
        return stopped

    @property
    def group_stats(self) -> GroupCounters:
        """See :attr:`AsyncRolloutClient.group_stats`."""
        return self._portal.call(_group_stats, self._client)

    def close(self) -> None:
        """Close the async client (stopping live sessions) and its thread. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._stack.close()  # leaves the client's ``async with`` (aclose), then the portal

    def __enter__(self) -> RolloutClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
