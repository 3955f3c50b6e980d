"""TraceJoiner: each rollout's token trace, joined to its outcome and kept in S3.

With a gateway, a rollout's session is opened at the gateway before the invocation, and
its ``_rollout`` block points the agent at that session (``base_url`` = the session's
gateway URL, ``api_key`` = its session id). When the result envelope arrives, the outcome
is held back: a worker finishes the session at the gateway, writes the trace beside the
envelope (``exp/q-1/sid.json`` -> ``exp/q-1/sid.trace.json.gz``) and only then settles the
future, with the trace on it (``fut.trace``). A trace that cannot be had ends the rollout
in :class:`~agentcore_rl.errors.TraceLostError` (a trace already in S3, written by an
earlier process before it died, counts as had). Sessions whose rollouts end otherwise
(timeout, cancel, a failed invocation) are released at the gateway in the background.

The workers run in the client's task group (:meth:`TraceJoiner.run`); jobs go to them
through a memory object stream, so done callbacks can queue them without blocking.

Example::

    joiner = TraceJoiner(link, store)
    service.start_soon(joiner.run, name="trace joiner")
    await joiner.open(fut, body)            # before the invocation is sent
    joiner.finish(fut, envelope, settle)    # when its envelope arrives
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream

from agentcore_rl import protocol
from agentcore_rl.client.future import RolloutFuture
from agentcore_rl.client.gateway_link import GatewayLink, session_base_url
from agentcore_rl.errors import AgentCoreRLError, InvalidRolloutConfig, TraceLostError
from agentcore_rl.s3 import ResultStore

if TYPE_CHECKING:
    from agentcore_rl.gateway.record import SessionTrace

__all__ = ["API_KEY", "Settle", "TraceJoiner", "trace_key_of"]

logger = logging.getLogger(__name__)

#: The ``_rollout`` field carrying the session id as the agent's OpenAI API key.
API_KEY: Final = "api_key"
_WORKERS: Final = 32

#: How a joined outcome is delivered: ``settle(fut, envelope, error)``.
Settle = Callable[[RolloutFuture, "dict[str, Any] | None", "BaseException | None"], None]


def trace_key_of(result_key: str) -> str:
    """The trace beside a result: ``exp/q-1/sid.json`` -> ``exp/q-1/sid.trace.json.gz``."""
    stem = result_key[: -len(".json")] if result_key.endswith(".json") else result_key
    return stem + ".trace.json.gz"


@dataclass(frozen=True)
class _Job:
    fut: RolloutFuture
    # The session the job is for: a retried rollout's ``fut.session_id`` moves on.
    session_id: str
    envelope: dict[str, Any] | None  # None: only release the session
    settle: Settle | None


class TraceJoiner:
    """Opens gateway sessions, finishes them when envelopes arrive, keeps the traces."""

    def __init__(self, link: GatewayLink, store: ResultStore, *, workers: int = _WORKERS):
        self.link = link
        self.store = store
        self.workers = workers
        self._gateway_ids: dict[str, str | None] = {}  # sessions we owe a finish, by id
        self._send, self._receive = anyio.create_memory_object_stream[_Job](math.inf)

    def __repr__(self) -> str:
        return f"TraceJoiner({self.link!r}, open={len(self._gateway_ids)})"

    async def open(self, fut: RolloutFuture, body: dict[str, Any]) -> None:
        """Open ``fut``'s session at the gateway and point ``body``'s ``_rollout`` at it."""
        sid = fut.session_id
        exp_id = _exp_id_of(fut)
        self._gateway_ids[sid] = await self.link.open(sid, exp_id=exp_id, input_id=fut.input_id)
        block = body[protocol.ROLLOUT_FIELD]
        block[protocol.BASE_URL] = session_base_url(self.link.url, sid)
        block[API_KEY] = sid

    def attached(self, fut: RolloutFuture) -> None:
        """Own the session of an attached rollout (opened by an earlier process)."""
        self._gateway_ids.setdefault(fut.session_id, None)

    def takes(self, fut: RolloutFuture) -> bool:
        """Whether ``fut``'s outcome waits for its trace."""
        return fut.session_id in self._gateway_ids

    def finish(self, fut: RolloutFuture, envelope: dict[str, Any], settle: Settle) -> None:
        """``fut``'s envelope arrived: fetch and keep its trace, then ``settle`` it."""
        self._queue(_Job(fut, fut.session_id, envelope, settle))

    def forget(self, fut: RolloutFuture) -> None:
        """``fut`` ended without its trace (timeout, cancel...): release its session."""
        if fut.session_id in self._gateway_ids:
            self._queue(_Job(fut, fut.session_id, None, None))

    def _queue(self, job: _Job) -> None:
        try:
            self._send.send_nowait(job)
        except anyio.ClosedResourceError:
            # Closing: the client ends the rollout itself; the gateway expires the session.
            self._gateway_ids.pop(job.session_id, None)

    async def run(self) -> None:
        """Join outcomes, ``workers`` at a time, until cancelled; then refuse new jobs."""
        try:
            async with anyio.create_task_group() as tg:
                for n in range(self.workers):
                    tg.start_soon(self._work, self._receive, name=f"trace joiner {n}")
        finally:
            self.close()

    def close(self) -> None:
        """Refuse new jobs and drop the queued ones. Idempotent."""
        self._send.close()
        self._receive.close()

    async def _work(self, receive: MemoryObjectReceiveStream[_Job]) -> None:
        async for job in receive:
            if job.envelope is None or job.settle is None:
                await self._release(job.session_id)
            elif job.fut.session_id == job.session_id:  # else retried meanwhile: drop it
                await self._join(job.fut, job.envelope, job.settle)
            else:
                await self._release(job.session_id)

    async def _release(self, sid: str) -> None:
        if sid not in self._gateway_ids:  # joined meanwhile
            return
        del self._gateway_ids[sid]
        try:
            await self.link.finish(sid)
        except AgentCoreRLError as exc:
            logger.debug("releasing gateway session %s: %s", sid, exc)

    async def _join(self, fut: RolloutFuture, envelope: dict[str, Any], settle: Settle) -> None:
        sid, bucket, key = fut.session_id, fut.s3_bucket, fut.result_key

        def deliver(envelope: dict[str, Any] | None, error: BaseException | None) -> None:
            # A rollout given up meanwhile (a probe's retry, a close) has its outcome.
            if fut.session_id == sid and not fut.done():
                settle(fut, envelope, error)

        failed = protocol.is_error_envelope(envelope)
        try:
            trace = await self._trace(fut)
        except AgentCoreRLError as exc:
            if failed:  # the rollout's own error is its outcome; the trace is a bonus
                deliver(envelope, None)
            else:
                if isinstance(exc, TraceLostError) and exc.envelope is None:
                    exc.envelope = dict(envelope)
                deliver(None, exc)
            return
        if fut.session_id == sid:
            fut.trace = trace
        if failed:
            deliver(envelope, None)
            return
        try:
            # Durable before the outcome is known: attach(), eval --resume and offline
            # SFT read it from there.
            await self.store.put_trace(bucket, trace_key_of(key), trace)
        except AgentCoreRLError as exc:
            deliver(None, exc)
            return
        deliver(envelope, None)

    async def _trace(self, fut: RolloutFuture) -> SessionTrace:
        """Finish the session at the gateway (or read the trace an earlier process kept)."""
        sid = fut.session_id
        expected = self._gateway_ids.pop(sid, None)
        try:
            trace = await self.link.finish(sid)
        except TraceLostError:
            saved = await self.store.get_trace(fut.s3_bucket, trace_key_of(fut.result_key))
            if saved is None:
                raise
            return saved
        if expected is not None and trace.gateway_id and trace.gateway_id != expected:
            raise TraceLostError(
                sid,
                f"the gateway restarted during the rollout (the session was opened at "
                f"gateway {expected}, finished at {trace.gateway_id}): the calls before the "
                "restart were not captured",
            )
        if trace.input_id != fut.input_id:
            raise TraceLostError(
                sid,
                "the gateway that holds it never saw it opened (it restarted during the "
                f"rollout; input {trace.input_id!r}, expected {fut.input_id!r})",
            )
        return trace


def _exp_id_of(fut: RolloutFuture) -> str | None:
    try:
        return protocol.parse_result_key(fut.result_key)[0]
    except InvalidRolloutConfig:
        return None
