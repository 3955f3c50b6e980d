"""``run_batch`` and the feeder both batch and group loops use: a task in the client's task
group walks the payloads (waiting for slots paces it) and starts their work there; outcomes
go through one memory stream, all the ``async for`` loop reads. Leaving the loop cancels
the work (tasks stop their sessions); a closing client ends it in ``ClientClosedError``.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio
from anyio.streams.memory import MemoryObjectSendStream

from agentcore_rl.client.future import RolloutFuture
from agentcore_rl.client.outcomes import failure_kind
from agentcore_rl.client.payload import default_input_id
from agentcore_rl.client.rollout import Rollouts, RolloutSpec
from agentcore_rl.client.service import Service
from agentcore_rl.errors import ClientClosedError, InfraFailureRateError, InvalidPayloadError
from agentcore_rl.protocol import FailureKind, RolloutConfig

if TYPE_CHECKING:
    from agentcore_rl.trace import SessionTrace

__all__ = ["BatchItem", "Feed", "Prepare", "feed_and_read", "run_batch"]


@dataclass(frozen=True, kw_only=True)
class BatchItem:
    """The outcome of one payload of a batch: ``result`` on ``success``, else ``error``.

    ``elapsed`` is seconds from the invocation to the outcome; ``resolved_at`` the epoch
    time the outcome was known. ``session_id`` and ``result_key`` are ``None`` when the
    payload never reached an agent. ``trace``: the token trace, through a gateway.

    Example::

        for item in sorted(items, key=lambda i: i.index):
            print(item.index, item.success, item.elapsed)
    """

    index: int
    success: bool
    result: dict[str, Any] | None
    error: BaseException | None
    elapsed: float
    session_id: str | None
    input_id: str | None
    result_key: str | None = None
    resolved_at: float | None = None
    trace: SessionTrace | None = None

    @property
    def kind(self) -> FailureKind | None:
        return failure_kind(self.error)

    def __repr__(self) -> str:
        outcome = "ok" if self.success else f"{type(self.error).__name__}: {self.error}"
        return (
            f"BatchItem(index={self.index}, {outcome}, elapsed={self.elapsed:.2f}, "
            f"session_id={self.session_id!r})"
        )

    @classmethod
    def from_future(cls, fut: RolloutFuture) -> BatchItem:
        error: BaseException | None
        if fut.cancelled():
            error = asyncio.CancelledError(f"rollout {fut.session_id} was cancelled")
        else:
            error = fut.exception()
        return cls(
            index=fut.index if fut.index is not None else -1,
            success=error is None,
            result=fut.result() if error is None else None,
            error=error,
            elapsed=fut.elapsed,
            session_id=fut.session_id,
            input_id=fut.input_id,
            result_key=fut.result_key,
            resolved_at=fut.resolved_at,
            trace=fut.trace,
        )


#: Builds one payload's body and ``_rollout`` config (the client's ``_prepare``).
Prepare = Callable[..., "tuple[dict[str, Any], RolloutConfig]"]


def _error_item(index: int, error: BaseException, input_id: str | None) -> BatchItem:
    return BatchItem(
        index=index,
        success=False,
        result=None,
        error=error,
        elapsed=0.0,
        session_id=getattr(error, "session_id", None),
        input_id=input_id,
        resolved_at=time.time(),
    )


class Feed:
    """What a feeder's ``start`` gets: ``put`` an item for the loop, ``watch`` a future (its
    outcome becomes an item; leaving the loop cancels it), ``abandoned`` once the loop left."""

    def __init__(self, send: MemoryObjectSendStream[Any]) -> None:
        self.send = send
        self.scope = anyio.CancelScope()
        self.live: set[asyncio.Future[Any]] = set()

    @property
    def abandoned(self) -> bool:
        return self.scope.cancel_called

    def put(self, item: object) -> None:
        """Dropped once nobody reads."""
        with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
            self.send.send_nowait(item)

    def watch(self, fut: asyncio.Future[Any]) -> None:
        self.live.add(fut)
        fut.add_done_callback(self._done)

    def _done(self, fut: asyncio.Future[Any]) -> None:
        self.live.discard(fut)
        self.put(fut)


async def feed_and_read(
    service: Service,
    payloads: Iterable[Mapping[str, Any]],
    start: Callable[[Feed, int, Mapping[str, Any]], Awaitable[None]],
    *,
    name: str,
    what: str,
) -> AsyncGenerator[Any, None]:
    """The shape of ``run_batch`` and ``run_groups`` (see the module docstring): one item
    per payload, then what ended the feeding early (``InfraFailureRateError`` at once)."""
    send, receive = anyio.create_memory_object_stream[Any](math.inf)
    feed = Feed(send)

    async def feeder(*, task_status: anyio.abc.TaskStatus[None]) -> None:
        started = 0
        error: BaseException | None = None
        try:
            with feed.scope:
                task_status.started()
                try:
                    for index, payload in enumerate(payloads):
                        await start(feed, index, payload)
                        started += 1
                except Exception as exc:  # closing, or the payloads' iterator failing
                    error = exc
        except BaseException:
            send.close()
            raise
        if feed.scope.cancelled_caught:
            send.close()
        else:
            feed.put(_Fed(started, error))

    try:
        await service.ensure_open()
        await service.start(feeder, name=name)
        read = 0
        fed: _Fed | None = None
        while fed is None or read < fed.started:
            try:
                item = await receive.receive()
            except anyio.EndOfStream:
                raise ClientClosedError(f"the client was closed during {what}") from None
            if isinstance(item, _Fed):
                fed = item
                if isinstance(fed.error, InfraFailureRateError):
                    raise fed.error  # at once: what still runs meets the same infrastructure
                continue
            read += 1
            yield item
        if fed.error is not None:
            raise fed.error
    finally:
        feed.scope.cancel()
        send.close()
        receive.close()
        for fut in list(feed.live):
            fut.cancel()


@dataclass(frozen=True)
class _Fed:
    started: int
    error: BaseException | None


async def run_batch(
    service: Service,
    rollouts: Rollouts,
    prepare: Prepare,
    payloads: Iterable[Mapping[str, Any]],
    timeout: float | None,  # noqa: ASYNC109 (each rollout's deadline)
) -> AsyncGenerator[BatchItem, None]:

    async def one(feed: Feed, index: int, spec: RolloutSpec) -> None:
        if feed.abandoned:  # the loop left before this task ran
            rollouts.slots.release()
            return
        try:
            await rollouts.run(spec, admitted=True)
        except Exception as exc:  # refused before it had a future
            feed.put(_error_item(index, exc, spec.config.input_id))

    async def start(feed: Feed, index: int, payload: Mapping[str, Any]) -> None:
        try:
            body, config = prepare(payload, default_input_id=default_input_id(payload, index))
        except InvalidPayloadError as exc:
            feed.put(_error_item(index, exc, None))
            return
        await rollouts.admit()
        spec = RolloutSpec(body=body, config=config, timeout=timeout, index=index)
        spec.on_future = feed.watch
        service.start_soon(one, feed, index, spec, name=f"rollout {index}")

    async with contextlib.aclosing(
        feed_and_read(service, payloads, start, name="batch", what="this batch")
    ) as items:
        async for item in items:
            yield item if isinstance(item, BatchItem) else BatchItem.from_future(item)
