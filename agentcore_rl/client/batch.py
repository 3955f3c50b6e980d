"""The work of ``run_batch``: many rollouts, one BatchItem each, in completion order.

A :class:`BatchRun` runs in the client's task group, never in the caller's generator:
a feeder walks the payloads, waiting for a slot and a token for each, and hands each
admitted payload to a sender (long-lived worker tasks in the run's own task group, as many
as sends are under way at once, at most 64: no task per rollout); the outcomes arrive
through the futures' done callbacks. Every item goes into one :class:`Handoff`, which is
all the ``async for`` loop reads. So a loop that is left, dropped or simply
abandoned strands nothing: the run ends when the loop closes the handoff (its sessions are
then stopped) or when the client closes.
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Protocol

import anyio
from anyio.abc import TaskGroup, TaskStatus

from agentcore_rl.client.admission import Slot
from agentcore_rl.client.future import RolloutFuture
from agentcore_rl.client.handoff import Handoff
from agentcore_rl.errors import InvalidPayloadError
from agentcore_rl.protocol import RolloutConfig

if TYPE_CHECKING:
    from agentcore_rl.gateway.record import SessionTrace

__all__ = ["BatchItem", "BatchRun", "Fed", "Launcher"]


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


_MAX_SENDING: Final = 64


class Launcher(Protocol):
    """What a batch needs from the client: build, admit and send one rollout."""

    def _prepare(
        self,
        payload: Mapping[str, Any],
        *,
        input_id: str | None,
        overrides: Mapping[str, Any],
        default_input_id: str | None = None,
    ) -> tuple[dict[str, Any], RolloutConfig]: ...

    async def _admit(self) -> Slot: ...

    def _release_slot(self, slot: Slot) -> None: ...

    async def _launch(
        self,
        slot: Slot,
        body: dict[str, Any],
        config: RolloutConfig,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 (the rollout's deadline)
        index: int | None = None,
        session_id: str | None = None,
    ) -> RolloutFuture: ...


@dataclass(frozen=True)
class Fed:
    """The feeder's last message: every payload was started (``error`` None), or why the
    rest never started (e.g. ``ClientClosedError``)."""

    started: int
    error: BaseException | None


class BatchRun:
    """One batch, run in the client's task group; items go to ``send``."""

    def __init__(
        self,
        launcher: Launcher,
        payloads: Iterable[Mapping[str, Any]],
        timeout: float | None,
        overrides: Mapping[str, Any],
        send: Handoff[BatchItem | Fed],
    ) -> None:
        self.launcher = launcher
        self.payloads = payloads
        self.timeout = timeout
        self.overrides = dict(overrides)
        self.send = send
        self.live: dict[int, RolloutFuture] = {}
        self.scope = anyio.CancelScope()
        # Invocations being sent at once (so senders at most): the rest wait in the feeder.
        self.sending = anyio.Semaphore(_MAX_SENDING, fast_acquire=True)
        self.handoff: Handoff[tuple[int, dict[str, Any], RolloutConfig, Slot]] = Handoff()
        # One bound method and one context for every rollout's done callback (see
        # OutcomeFollower: fewer objects per rollout for the cyclic GC to promote).
        self._finished_cb = self._finished
        self._cb_context = contextvars.Context()

    def __repr__(self) -> str:
        return f"BatchRun(live={len(self.live)}, cancelled={self.scope.cancel_called})"

    def abandon(self) -> None:
        """The loop is gone: stop feeding and sending, and end the live rollouts (their
        done callbacks stop the sessions)."""
        self.scope.cancel()
        self.send.close()
        for fut in list(self.live.values()):
            fut.cancel()

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Feed every payload, then end; the futures deliver the rest of the items.

        Cancelled (the loop left, or the client's task group closing) it closes the
        stream, so a loop still reading it ends instead of waiting."""
        started = 0
        error: BaseException | None = None
        try:
            with self.scope:
                task_status.started()
                async with anyio.create_task_group() as senders:
                    try:
                        for index, payload in enumerate(self.payloads):
                            await self._feed_one(senders, index, payload)
                            started += 1
                    except Exception as exc:  # closing, or the payloads' iterator failing
                        error = exc  # the payloads already handed over are still sent
                    finally:
                        self.handoff.close()  # the senders end once the queue is empty
        except BaseException:
            self.send.close()
            raise
        finally:
            for _, _, _, slot in self.handoff.drain():  # cancelled before a sender took it
                self.launcher._release_slot(slot)
                self.sending.release()
        if self.scope.cancelled_caught:
            self.send.close()
        else:
            self._put(Fed(started, error))

    async def _feed_one(self, senders: TaskGroup, index: int, payload: Mapping[str, Any]) -> None:
        try:
            body, config = self.launcher._prepare(
                payload,
                input_id=None,
                overrides=self.overrides,
                default_input_id=f"{index:06d}",
            )
        except InvalidPayloadError as exc:
            self._put_error(index, exc, None)
            return
        # Admitted here, in the feeder (a failure to admit, such as the client closing,
        # ends the feeding), then sent by a sender: a new one only when none is idle.
        await self.sending.acquire()
        try:
            slot = await self.launcher._admit()
        except BaseException:
            self.sending.release()
            raise
        if not self.handoff.idle:
            senders.start_soon(self._sender, name="batch sender")
        self.handoff.put((index, body, config, slot))

    async def _sender(self) -> None:
        """Send handed-over payloads until the feeding ends and the queue is empty."""
        handoff = self.handoff
        while (work := await handoff.get()) is not None:
            await self._send_one(*work)

    async def _send_one(
        self, index: int, body: dict[str, Any], config: RolloutConfig, slot: Slot
    ) -> None:
        """Send an admitted payload; its failure is this item's outcome."""
        try:
            fut = await self.launcher._launch(slot, body, config, timeout=self.timeout, index=index)
        except Exception as exc:  # InvocationError, ClientClosedError: this item's outcome
            self._put_error(index, exc, config.input_id)
            return
        finally:
            self.launcher._release_slot(slot)  # unless the follower took it over
            self.sending.release()
        if self.scope.cancel_called:
            # Abandoned while the answer was on its way (anyio delivers the cancellation
            # at this task's next wait, which never comes): end it here, which stops it.
            fut.cancel()
            return
        self.live[index] = fut
        fut.add_done_callback(self._finished_cb, context=self._cb_context)

    def _finished(self, fut: RolloutFuture) -> None:
        if fut.index is not None:
            self.live.pop(fut.index, None)
        self._put(BatchItem.from_future(fut))

    def _put_error(self, index: int, error: BaseException, input_id: str | None) -> None:
        self._put(
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

    def _put(self, item: BatchItem | Fed) -> None:
        # Unbounded; once the loop has gone (or the run ended), nobody wants the item.
        if not self.send.closed:
            self.send.put(item)
