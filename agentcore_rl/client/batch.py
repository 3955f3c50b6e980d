"""run_batch: many rollouts, one BatchItem each, in completion order.

Example::

    async with contextlib.aclosing(client.run_batch(payloads, timeout=900)) as batch:
        async for item in batch:
            if item.success:
                rewards.append(item.result["rewards"])
            else:
                print(item.index, item.error)
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agentcore_rl.client.future import RolloutFuture
from agentcore_rl.errors import InvalidPayloadError
from agentcore_rl.protocol import RolloutConfig

if TYPE_CHECKING:
    from agentcore_rl.client.client import AsyncRolloutClient

__all__ = ["BatchItem", "run_batch"]


@dataclass(frozen=True, kw_only=True)
class BatchItem:
    """The outcome of one payload of a batch.

    ``success`` is True when ``result`` holds the result dict; otherwise ``error`` holds
    the exception (``RolloutError``, ``RolloutTimeoutError``, ``InvocationError``,
    ``StorageError``, ``InvalidPayloadError``...). ``elapsed`` is seconds from the
    invocation to the outcome; ``resolved_at`` the epoch time the outcome was known.
    ``session_id`` and ``result_key`` are ``None`` when the payload never reached an agent.

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

    def __repr__(self) -> str:
        outcome = "ok" if self.success else f"{type(self.error).__name__}: {self.error}"
        return (
            f"BatchItem(index={self.index}, {outcome}, elapsed={self.elapsed:.2f}, "
            f"session_id={self.session_id!r})"
        )

    @classmethod
    def from_future(cls, fut: RolloutFuture) -> BatchItem:
        """The item of a resolved (or cancelled) rollout future.

        Example::

            BatchItem.from_future(fut)
        """
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
        )


_FED = object()  # the feeder's end-of-input marker in the queue
_MAX_SENDING = 64


class _BatchRun:
    """The moving parts of one batch. It holds no reference to the generator that drives
    it, so a caller who breaks out of ``async for`` drops the generator at once and
    asyncio's async-generator finalizer closes it, which stops the live sessions."""

    def __init__(
        self,
        client: AsyncRolloutClient,
        payloads: Iterable[Mapping[str, Any]],
        timeout: float | None,
        overrides: Mapping[str, Any],
    ) -> None:
        self.client = client
        self.payloads = payloads
        self.timeout = timeout
        self.overrides = dict(overrides)
        self.queue: asyncio.Queue[Any] = asyncio.Queue()
        self.live: dict[int, RolloutFuture] = {}
        self.senders: set[asyncio.Task[None]] = set()
        self.feeder: asyncio.Task[None] | None = None
        self.started = 0
        # Invocations being sent at once: the rest wait in the feeder, not as tasks.
        self.sending = asyncio.Semaphore(_MAX_SENDING)

    async def cleanup(self) -> None:
        tasks = [t for t in (self.feeder, *self.senders) if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for fut in list(self.live.values()):
            fut.cancel()  # the client's done callback stops the session

    def put_error(self, index: int, error: BaseException, input_id: str | None) -> None:
        self.queue.put_nowait(
            BatchItem(
                index=index,
                success=False,
                result=None,
                error=error,
                elapsed=0.0,
                session_id=getattr(error, "session_id", None),
                input_id=input_id,
                resolved_at=time.time(),
            )
        )

    async def feed(self) -> None:
        client = self.client
        try:
            for index, payload in enumerate(self.payloads):
                try:
                    body, config = client.prepare(
                        payload,
                        input_id=None,
                        overrides=self.overrides,
                        default_input_id=f"{index:06d}",
                    )
                except InvalidPayloadError as exc:
                    self.started += 1
                    self.put_error(index, exc, None)
                    continue
                await self.sending.acquire()
                try:
                    await client.admit()
                except BaseException:
                    self.sending.release()
                    raise
                self.started += 1
                task = asyncio.create_task(self.send(index, body, config))
                self.senders.add(task)
                task.add_done_callback(self.senders.discard)
        finally:
            self.queue.put_nowait(_FED)

    async def send(self, index: int, body: dict[str, Any], config: RolloutConfig) -> None:
        try:
            fut = await self.client.start(body, config, timeout=self.timeout, index=index)
        except Exception as exc:  # InvocationError, ClientClosedError: this item's outcome
            self.put_error(index, exc, config.input_id)
            return
        finally:
            self.sending.release()
        self.live[index] = fut
        fut.add_done_callback(self.finished)

    def finished(self, fut: RolloutFuture) -> None:
        if fut.index is not None:
            self.live.pop(fut.index, None)
        self.queue.put_nowait(BatchItem.from_future(fut))


async def run_batch(
    client: AsyncRolloutClient,
    payloads: Iterable[Mapping[str, Any]],
    *,
    timeout: float | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> AsyncGenerator[BatchItem, None]:
    """Run ``payloads`` on ``client``; yield a :class:`BatchItem` per payload as each ends.

    One feeder task walks the payloads, waiting for a slot and a token for each, and hands
    each admitted payload to a short task that sends it; outcomes arrive through the
    futures' done callbacks. Never raises for one rollout; raises ``ClientClosedError`` if
    the client closes meanwhile. Closing the generator (``aclose``, ``aclosing``, or a
    ``break`` that drops it) cancels what still runs, which stops those sessions.

    Example::

        async with contextlib.aclosing(run_batch(client, payloads, timeout=600)) as items:
            async for item in items:
                print(item.index, item.success)
    """
    run = _BatchRun(client, payloads, timeout, overrides or {})
    run.feeder = asyncio.create_task(run.feed(), name="agentcore-rl batch feeder")
    yielded = 0
    fed = False
    try:
        while not (fed and yielded == run.started):
            item = await run.queue.get()
            if item is _FED:
                fed = True
                continue
            yielded += 1
            yield item
        # The feeder stopped early (the client closed): every started rollout has had its
        # item; now say why the rest never started.
        if run.feeder.done() and not run.feeder.cancelled():
            error = run.feeder.exception()
            if error is not None:
                raise error
    finally:
        await run.cleanup()
