"""TraceJoiner: each rollout's token trace, joined to its outcome and kept in S3.

With a gateway, a rollout's session is opened at the gateway before the invocation, and
its ``_rollout`` block points the agent at that session (``base_url`` = the session's
gateway URL, ``api_key`` = its session id). When the result envelope arrives, the rollout's
task finishes the session at the gateway, writes the trace beside the envelope
(``exp/q-1/sid.json`` -> ``exp/q-1/sid.trace.json.gz``) and only then settles the future,
with the trace on it (``fut.trace``). A trace that cannot be had ends the rollout in
:class:`~agentcore_rl.errors.TraceLostError` (a trace already in S3, written by an earlier
process before it died, counts as had). Sessions whose rollouts end otherwise (timeout,
cancel, a failed invocation) are released at the gateway.

Example::

    joiner = TraceJoiner(link, store)
    await joiner.open(fut, body)              # before the invocation is sent
    error = await joiner.join(fut, envelope)  # when its envelope arrives: None, or why not
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Final

from agentcore_rl import protocol
from agentcore_rl.client.future import RolloutFuture
from agentcore_rl.client.gateway_link import GatewayLink, session_base_url
from agentcore_rl.errors import AgentCoreRLError, InvalidRolloutConfig, TraceLostError
from agentcore_rl.s3 import ResultStore

if TYPE_CHECKING:
    from agentcore_rl.gateway.record import SessionTrace

__all__ = ["API_KEY", "TraceJoiner", "trace_key_of"]

logger = logging.getLogger(__name__)

#: The ``_rollout`` field carrying the session id as the agent's OpenAI API key.
API_KEY: Final = "api_key"


def trace_key_of(result_key: str) -> str:
    """The trace beside a result: ``exp/q-1/sid.json`` -> ``exp/q-1/sid.trace.json.gz``."""
    stem = result_key[: -len(".json")] if result_key.endswith(".json") else result_key
    return stem + ".trace.json.gz"


class TraceJoiner:
    """Opens gateway sessions, finishes them when envelopes arrive, keeps the traces."""

    def __init__(self, link: GatewayLink, store: ResultStore) -> None:
        self.link = link
        self.store = store
        self._gateway_ids: dict[str, str | None] = {}  # sessions we owe a finish, by id

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

    async def release(self, sid: str) -> None:
        """``sid`` ended without its trace (timeout, cancel...): release its session."""
        self._gateway_ids.pop(sid, None)
        try:
            await self.link.finish(sid)
        except AgentCoreRLError as exc:
            logger.debug("releasing gateway session %s: %s", sid, exc)

    async def join(self, fut: RolloutFuture, envelope: dict[str, Any]) -> BaseException | None:
        """Fetch ``fut``'s trace (onto ``fut.trace``) and keep it beside its result; the
        error that leaves the rollout without one. An error envelope is its own outcome:
        its trace is a bonus, neither fetched with a retry nor kept."""
        failed = protocol.is_error_envelope(envelope)
        try:
            fut.trace = await self._trace(fut)
        except AgentCoreRLError as exc:
            if failed:
                return None
            if isinstance(exc, TraceLostError) and exc.envelope is None:
                exc.envelope = dict(envelope)
            return exc
        if failed:
            return None
        try:
            # Durable before the outcome is known: attach(), eval --resume and offline
            # SFT read it from there.
            await self.store.put_trace(fut.s3_bucket, trace_key_of(fut.result_key), fut.trace)
        except AgentCoreRLError as exc:
            return exc
        return None

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
