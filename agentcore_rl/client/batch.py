"""``run_batch``: many rollouts, one :class:`BatchItem` each, in completion order.

A feeder task in the client's task group walks the payloads, takes a slot and a token for
each (which paces it) and starts its rollout task (:meth:`Rollouts.run`) there too; each
outcome becomes an item in one memory stream, which is all the ``async for`` loop reads.
A loop that is left ends the feeding and cancels the batch's rollouts (their tasks stop
their sessions); a client that closes ends them with ``ClientClosedError``.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import AsyncGenerator, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio

from agentcore_rl.client.future import RolloutFuture
from agentcore_rl.client.rollout import Rollouts, RolloutSpec
from agentcore_rl.client.service import Service
from agentcore_rl.errors import ClientClosedError, InvalidPayloadError
from agentcore_rl.protocol import RolloutConfig

if TYPE_CHECKING:
    from agentcore_rl.gateway.record import SessionTrace

__all__ = ["BatchItem", "Prepare", "run_batch"]


@dataclass(frozen=True, kw_only=True)
class BatchItem:
    """The outcome of one payload of a batch.

    ``success`` is True when ``result`` holds the result dict; otherwise ``error`` holds
    the exception (``RolloutError``, ``RolloutTimeoutError``, ``InvocationError``,
    ``StorageError``, ``InvalidPayloadError``...). ``elapsed`` is seconds from the
    invocation to the outcome; ``resolved_at`` the epoch time the outcome was known.
    ``session_id`` and ``result_key`` are ``None`` when the payload never reached an agent.
    ``trace`` is the rollout's token trace when the client runs through a gateway.

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

    def __repr__(self) -> str:
        outcome = "ok" if self.success else f"{type(self.error).__name__}: {self.error}"
        return (
            f"BatchItem(index={self.index}, {outcome}, elapsed={self.elapsed:.2f}, "
            f"session_id={self.session_id!r})"
        )

    @classmethod
    def from_future(cls, fut: RolloutFuture) -> BatchItem:
        """The item of a resolved (or cancelled) rollout future."""
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


async def run_batch(
    service: Service,
    rollouts: Rollouts,
    prepare: Prepare,
    payloads: Iterable[Mapping[str, Any]],
    timeout: float | None,  # noqa: ASYNC109 (each rollout's deadline)
) -> AsyncGenerator[BatchItem, None]:
    """The loop of ``run_batch`` (see the module text)."""
    send, receive = anyio.create_memory_object_stream[BatchItem | tuple[int, BaseException | None]](
        math.inf
    )
    live: set[RolloutFuture] = set()
    watched: set[int] = set()

    def put(item: BatchItem | tuple[int, BaseException | None]) -> None:
        with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
            send.send_nowait(item)

    def finished(fut: asyncio.Future[dict[str, Any]]) -> None:
        assert isinstance(fut, RolloutFuture)
        live.discard(fut)
        put(BatchItem.from_future(fut))

    def watch(fut: RolloutFuture) -> None:
        live.add(fut)
        watched.add(fut.index if fut.index is not None else -1)
        fut.add_done_callback(finished)

    async def one(index: int, spec: RolloutSpec) -> None:
        if scope.cancel_called:  # the loop left before this task ran
            rollouts.slots.release()
            return
        try:
            await rollouts.run(spec, admitted=True)
        except Exception as exc:  # refused before acceptance: its future's item says so
            if index not in watched:
                put(_error_item(index, exc, spec.config.input_id))

    scope = anyio.CancelScope()

    async def feed(*, task_status: anyio.abc.TaskStatus[None]) -> None:
        started = 0
        error: BaseException | None = None
        try:
            with scope:
                task_status.started()
                try:
                    for index, payload in enumerate(payloads):
                        try:
                            body, config = prepare(payload, default_input_id=f"{index:06d}")
                        except InvalidPayloadError as exc:
                            put(_error_item(index, exc, None))
                            started += 1
                            continue
                        await rollouts.admit()
                        spec = RolloutSpec(
                            body=body, config=config, timeout=timeout, index=index, on_future=watch
                        )
                        service.start_soon(one, index, spec, name=f"rollout {index}")
                        started += 1
                except Exception as exc:  # closing, or the payloads' iterator failing
                    error = exc
        except BaseException:
            send.close()
            raise
        if scope.cancelled_caught:
            send.close()
        else:
            put((started, error))

    try:
        await service.start(feed, name="batch")
        yielded = 0
        fed: tuple[int, BaseException | None] | None = None
        while fed is None or yielded < fed[0]:
            try:
                item = await receive.receive()
            except anyio.EndOfStream:
                raise ClientClosedError("the client was closed during this batch") from None
            if isinstance(item, tuple):
                fed = item
                continue
            yielded += 1
            yield item
        if fed[1] is not None:
            raise fed[1]
    finally:
        scope.cancel()
        send.close()
        receive.close()
        for fut in list(live):
            fut.cancel()
