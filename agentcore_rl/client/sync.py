"""RolloutClient: the synchronous facade over AsyncRolloutClient.

The async client runs on a private event-loop thread (an anyio blocking portal, as
Starlette's TestClient does); every method here forwards to it and waits. No logic of its
own: behaviour, errors and defaults are the async client's.

Example::

    with RolloutClient(agent_url="http://127.0.0.1:8080", s3_bucket="rollouts",
                       exp_id="eval-1") as client:
        result = client.rollout({"prompt": "2+2?"})
        for item in client.run_batch(payloads, timeout=600):
            print(item.index, item.success)
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
from collections.abc import Iterable, Iterator, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any

from anyio.from_thread import BlockingPortal, start_blocking_portal

from agentcore_rl.client.batch import BatchItem
from agentcore_rl.client.client import AsyncRolloutClient
from agentcore_rl.client.config import (
    DEFAULT_CLOSE_TIMEOUT,
    DEFAULT_MAX_CONCURRENT_SESSIONS,
    DEFAULT_RETRY,
    DEFAULT_STOP_WORKERS,
    DEFAULT_TIMEOUT,
)
from agentcore_rl.client.future import RolloutFuture
from agentcore_rl.client.groups import GroupFuture
from agentcore_rl.client.stats import ClientStats
from agentcore_rl.client.watcher import DEFAULT_WATCHER, WatcherConfig
from agentcore_rl.group_tracker import GroupCounters
from agentcore_rl.groups import OnFailure, RolloutGroup
from agentcore_rl.protocol import DEFAULT_TPS
from agentcore_rl.ratelimit import RateLimiter, TokenBucket
from agentcore_rl.retry import RetryPolicy
from agentcore_rl.s3 import ResultStore
from agentcore_rl.sessionlimit import SessionLimiter

if TYPE_CHECKING:
    from agentcore_rl.gateway.app import RolloutGateway
    from agentcore_rl.gateway.record import SessionTrace

__all__ = ["RolloutClient"]


async def _create(**kwargs: Any) -> AsyncRolloutClient:
    # Built inside the loop thread: its primitives belong to that loop.
    return AsyncRolloutClient(**kwargs)


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


async def _group_stats(client: AsyncRolloutClient) -> GroupCounters:
    return client.group_stats


class RolloutClient:
    """:class:`AsyncRolloutClient` for synchronous code: same constructor and methods.

    ``invoke`` and ``attach`` return a :class:`concurrent.futures.Future` (with ``session_id``,
    ``input_id``, ``s3_bucket`` and ``result_key`` attributes; ``cancel()`` stops the
    session); ``rollout`` returns the result dict; ``run_batch`` is a plain iterator.
    Use it as a context manager or call ``close()``. Through a gateway, prefer
    ``gateway_url`` (an in-process ``gateway`` must run on this client's own loop thread);
    ``trace_of(fut)`` and ``BatchItem.trace`` give the traces.

    Example::

        client = RolloutClient(agent_url="http://127.0.0.1:8080", s3_bucket="rollouts",
                               exp_id="eval-1", max_concurrent_sessions=32)
        try:
            futures = [client.invoke(p) for p in payloads]
            results = [f.result(timeout=900) for f in futures]
        finally:
            client.close()
    """

    def __init__(
        self,
        *,
        agent_runtime_arn: str | None = None,
        agent_url: str | Sequence[str] | None = None,
        s3_bucket: str,
        exp_id: str,
        max_concurrent_sessions: int = DEFAULT_MAX_CONCURRENT_SESSIONS,
        tps_limit: float = DEFAULT_TPS,
        burst: float | None = None,
        timeout: float | None = DEFAULT_TIMEOUT,
        base_url: str | None = None,
        model_id: str | None = None,
        endpoint_url: str | None = None,
        qualifier: str | None = None,
        s3_endpoint_url: str | None = None,
        store: ResultStore | None = None,
        retry: RetryPolicy = DEFAULT_RETRY,
        watcher: WatcherConfig = DEFAULT_WATCHER,
        rate_limiter: RateLimiter | None = None,
        session_limiter: SessionLimiter | None = None,
        token_bucket: TokenBucket | None = None,
        stop_finished_sessions: bool | None = None,
        close_timeout: float = DEFAULT_CLOSE_TIMEOUT,
        stop_workers: int = DEFAULT_STOP_WORKERS,
        gateway_url: str | None = None,
        gateway: RolloutGateway | None = None,
        gateway_admin_token: str | None = None,
        **rollout_extra: Any,
    ) -> None:
        create = functools.partial(
            _create,
            agent_runtime_arn=agent_runtime_arn,
            agent_url=agent_url,
            s3_bucket=s3_bucket,
            exp_id=exp_id,
            max_concurrent_sessions=max_concurrent_sessions,
            tps_limit=tps_limit,
            burst=burst,
            timeout=timeout,
            base_url=base_url,
            model_id=model_id,
            endpoint_url=endpoint_url,
            qualifier=qualifier,
            s3_endpoint_url=s3_endpoint_url,
            store=store,
            retry=retry,
            watcher=watcher,
            rate_limiter=rate_limiter,
            session_limiter=session_limiter,
            token_bucket=token_bucket,
            stop_finished_sessions=stop_finished_sessions,
            close_timeout=close_timeout,
            stop_workers=stop_workers,
            gateway_url=gateway_url,
            gateway=gateway,
            gateway_admin_token=gateway_admin_token,
            **rollout_extra,
        )
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
        return f"RolloutClient({self._client!r})"

    @property
    def async_client(self) -> AsyncRolloutClient:
        """The async client underneath (use it only through this object's portal)."""
        return self._client

    @property
    def stats(self) -> ClientStats:
        """See :attr:`AsyncRolloutClient.stats`."""
        return self._portal.call(_stats, self._client)

    def invoke(
        self,
        payload: Mapping[str, Any],
        *,
        input_id: str | None = None,
        session_id: str | None = None,
        timeout: float | None = None,
        **overrides: Any,
    ) -> concurrent.futures.Future[dict[str, Any]]:
        """Start a rollout (blocks until accepted); return a future for its outcome.

        ``session_id``: see :meth:`AsyncRolloutClient.invoke`.

        Example::

            fut = client.invoke({"prompt": "2+2?"}, input_id="q-1")
            print(fut.session_id, fut.result(timeout=600))
        """
        call = functools.partial(
            self._client.invoke,
            payload,
            input_id=input_id,
            session_id=session_id,
            timeout=timeout,
            **overrides,
        )
        return self._outcome_future(self._portal.call(call))

    def attach(
        self,
        *,
        session_id: str,
        result_key: str,
        input_id: str | None = None,
        s3_bucket: str | None = None,
        timeout: float | None = None,
        started_at: float | None = None,
    ) -> concurrent.futures.Future[dict[str, Any]]:
        """Follow a rollout already running (see :meth:`AsyncRolloutClient.attach`);
        return a future for its outcome.

        Example::

            fut = client.attach(session_id=sid, result_key=key, timeout=900)
            print(fut.result(timeout=900))
        """
        call = functools.partial(
            self._client.attach,
            session_id=session_id,
            result_key=result_key,
            input_id=input_id,
            s3_bucket=s3_bucket,
            timeout=timeout,
            started_at=started_at,
        )
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

        Example::

            fut = client.invoke(payload)
            fut.result(timeout=600)
            trace = client.trace_of(fut)
        """
        rollout_future: RolloutFuture | None = getattr(fut, "rollout_future", None)
        if rollout_future is None:
            raise TypeError("trace_of takes a future returned by this client's invoke/attach")
        fut.result()  # the rollout's own error, if it failed
        trace: SessionTrace = self._portal.call(_trace_of, self._client, rollout_future)
        return trace

    def rollout(
        self,
        payload: Mapping[str, Any],
        *,
        input_id: str | None = None,
        session_id: str | None = None,
        timeout: float | None = None,
        **overrides: Any,
    ) -> dict[str, Any]:
        """Run one rollout and return its result dict (or raise its error).

        Example::

            result = client.rollout({"prompt": "2+2?"}, timeout=600)
        """
        call = functools.partial(
            self._client.rollout,
            payload,
            input_id=input_id,
            session_id=session_id,
            timeout=timeout,
            **overrides,
        )
        result: dict[str, Any] = self._portal.call(call)
        return result

    def run_batch(
        self,
        payloads: Iterable[Mapping[str, Any]],
        *,
        timeout: float | None = None,
        **overrides: Any,
    ) -> Iterator[BatchItem]:
        """Yield a :class:`BatchItem` per payload in completion order; leaving the loop
        early stops the sessions still running.

        Example::

            for item in client.run_batch(payloads, timeout=600):
                print(item.index, item.success)
        """
        batch = self._client.run_batch(payloads, timeout=timeout, **overrides)
        try:
            while True:
                try:
                    item: BatchItem = self._portal.call(batch.__anext__)
                except StopAsyncIteration:
                    return
                yield item
        finally:
            if not self._closed:
                self._portal.call(batch.aclose)

    def invoke_group(
        self,
        payload: Mapping[str, Any],
        *,
        n: int,
        input_id: str | None = None,
        timeout: float | None = None,
        retry: int = 1,
        on_failure: OnFailure = "drop_member",
        min_members: int = 2,
        redundancy: int = 0,
        filter_uniform: bool = False,
        member_seed: int | None = None,
        **overrides: Any,
    ) -> concurrent.futures.Future[RolloutGroup]:
        """Start a group (blocks until its members are admitted); return a future for the
        :class:`~agentcore_rl.groups.RolloutGroup` (see
        :meth:`AsyncRolloutClient.invoke_group`). It has ``input_id`` and ``session_ids``.

        Example::

            fut = client.invoke_group(payload, n=8, input_id="q-17")
            print(fut.result(timeout=900).rewards)
        """
        call = functools.partial(
            self._client.invoke_group,
            payload,
            n=n,
            input_id=input_id,
            timeout=timeout,
            retry=retry,
            on_failure=on_failure,
            min_members=min_members,
            redundancy=redundancy,
            filter_uniform=filter_uniform,
            member_seed=member_seed,
            **overrides,
        )
        group_future: GroupFuture = self._portal.call(call)
        fut = self._portal.start_task_soon(_group_outcome, group_future)
        fut.input_id = group_future.input_id  # type: ignore[attr-defined]
        fut.session_ids = group_future.session_ids  # type: ignore[attr-defined]
        return fut

    def run_groups(
        self,
        payloads: Iterable[Mapping[str, Any]],
        *,
        n: int,
        timeout: float | None = None,
        retry: int = 1,
        on_failure: OnFailure = "drop_member",
        min_members: int = 2,
        redundancy: int = 0,
        filter_uniform: bool = False,
        member_seed: int | None = None,
        **overrides: Any,
    ) -> Iterator[RolloutGroup]:
        """Yield whole groups in completion order (see :meth:`AsyncRolloutClient.run_groups`);
        leaving the loop early stops the groups still running.

        Example::

            for group in client.run_groups(payloads, n=8, timeout=900):
                print(group.input_id, group.rewards)
        """
        groups = self._client.run_groups(
            payloads,
            n=n,
            timeout=timeout,
            retry=retry,
            on_failure=on_failure,
            min_members=min_members,
            redundancy=redundancy,
            filter_uniform=filter_uniform,
            member_seed=member_seed,
            **overrides,
        )
        try:
            while True:
                try:
                    group: RolloutGroup = self._portal.call(groups.__anext__)
                except StopAsyncIteration:
                    return
                yield group
        finally:
            if not self._closed:
                self._portal.call(groups.aclose)

    def set_policy_version(self, version: int) -> None:
        """See :meth:`AsyncRolloutClient.set_policy_version`."""
        self._portal.call(self._client.set_policy_version, version)

    def advance_policy(self, version: int, *, max_staleness: int) -> int:
        """See :meth:`AsyncRolloutClient.advance_policy`; returns the groups stopped."""
        call = functools.partial(self._client.advance_policy, version, max_staleness=max_staleness)
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
