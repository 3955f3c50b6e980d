"""One rollout, one task (:meth:`Rollouts.run`); docs/architecture.md draws its way."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import anyio
from anyio.abc import TaskStatus

from agentcore_rl import protocol
from agentcore_rl.client.agent_calls import AgentCalls, as_repeat
from agentcore_rl.client.future import RolloutFuture
from agentcore_rl.client.liveness import LivenessConfig, LivenessProber
from agentcore_rl.client.outcomes import (
    UPSTREAM_FAILED,
    InfraWindow,
    count_outcome,
    is_agent_loss,
    is_retryable,
)
from agentcore_rl.client.traces import GatewayLink, TraceJoiner
from agentcore_rl.client.watcher import CompletionWatcher
from agentcore_rl.errors import (
    AgentLostError,
    AgentUnreachableError,
    ClientClosedError,
    ConfigurationError,
    InvalidRolloutConfig,
    InvocationError,
    RolloutError,
    RolloutTimeoutError,
    StorageError,
)
from agentcore_rl.ratelimit import Priority, SessionLimiter

__all__ = ["Rollout", "RolloutSpec", "Rollouts"]

logger = logging.getLogger(__name__)

_CLOSED: Final = "the client was closed before this rollout finished"


@dataclass(eq=False, kw_only=True)
class RolloutSpec:
    """What to run: the body and its ``_rollout`` config, and how (as ``invoke``'s and
    ``attach``'s parameters). ``key``: the first session's (bucket, key) when not the
    config's. ``retry`` False: a retryable outcome is final (a group retries its members
    itself). ``on_future`` is told of the future once: a failure before acceptance then
    settles it instead of being raised."""

    body: dict[str, Any]
    config: protocol.RolloutConfig
    timeout: float | None
    session_id: str | None = None
    key: tuple[str, str] | None = None
    index: int | None = None
    resume: bool = False
    attach: bool = False
    retry: bool = True
    started_at: float | None = None
    on_future: Callable[[RolloutFuture], None] | None = None
    on_session: Callable[[RolloutFuture], None] | None = None


@dataclass(eq=False)
class Rollout:
    """The state of one rollout, owned by its task; the watcher and the prober wake it."""

    spec: RolloutSpec
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    fut: RolloutFuture | None = None
    reported: bool = False
    waiter: asyncio.Future[tuple[str, Any]] | None = None
    to_stop: list[str] = field(default_factory=list)
    gateway: list[str] = field(default_factory=list)
    #: The heartbeat the current session's agent named (the crash detector reads it).
    beat: tuple[str, str, float] | None = None

    @property
    def waiting(self) -> bool:
        return self.waiter is not None and not self.waiter.done()

    def wake(self, kind: str, value: Any) -> None:
        """End the wait: ``("result", envelope)``, ``("error", exc)``, ``("lost", exc)`` or
        ``("timeout", None)``."""
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result((kind, value))

    def arrived(self, envelope: dict[str, Any] | None, error: BaseException | None) -> None:
        self.wake("error", error) if error is not None else self.wake("result", envelope)

    def cancelled(self, fut: asyncio.Future[Any]) -> None:
        """A cancelled future ends the task too."""
        if fut.cancelled():
            self.scope.cancel()


class Rollouts:
    """Runs the rollouts of one client; ``live`` maps each session waiting for an outcome
    (or being sent) to its rollout, for the prober and for session id checks."""

    def __init__(
        self,
        *,
        calls: AgentCalls,
        slots: SessionLimiter,
        watcher: CompletionWatcher,
        liveness: LivenessConfig,
        stop_finished_sessions: bool,
        link: GatewayLink | None,
        timeout: float | None,
        infra: InfraWindow | None = None,
    ) -> None:
        self.calls = calls
        self.transport = calls.transport
        self.limiter = calls.limiter
        self.counters = calls.counters
        self.slots = slots
        self.stop_finished_sessions = stop_finished_sessions
        self.timeout = timeout  # a rollout's, unless its call gives its own
        self.infra = infra  # the recent sessions' infrastructure failures (None: not watched)
        self.live: dict[str, Rollout] = {}
        self.watcher = watcher
        self.prober = LivenessProber(
            calls.transport,
            calls.limiter,
            self.live,
            calls.counters,
            config=liveness,
            read=watcher.heartbeats,
        )
        self.joiner = None if link is None else TraceJoiner(link, watcher.store)
        self.closing = False
        self._running: set[Rollout] = set()
        # No rollout task (asyncio's: clearable, made before the loop runs).
        self._idle = asyncio.Event()
        self._idle.set()

    def timeout_for(self, timeout: float | None) -> float | None:
        return self.timeout if timeout is None else timeout

    def check_session_id(self, session_id: object) -> str:
        sid = protocol.validate_session_id(session_id, name="session_id")
        if self.transport.name == "acr" and not protocol.is_acr_session_id(sid):
            raise InvalidRolloutConfig(
                f"session_id {sid!r} is {len(sid)} characters long; AgentCore Runtime needs "
                f"{protocol.ACR_MIN_SESSION_ID_LENGTH}-{protocol.MAX_SESSION_ID_LENGTH} "
                "(protocol.new_session_id() makes one)",
                field="session_id",
            )
        if sid in self.live:
            raise ConfigurationError(
                f"session_id {sid!r} belongs to a rollout of this client that has no outcome "
                "yet; wait for it (or cancel it) before reusing the id"
            )
        return sid

    async def admit(self, *, token: bool = True) -> None:
        """Take a slot, then (``token``) a token; ``ClientClosedError`` once closing,
        ``InfraFailureRateError`` once too many recent sessions failed for infrastructure."""
        if self.closing:
            raise ClientClosedError("the client is closed; create a new one")
        await self.slots.acquire()
        try:
            if token:
                await self.limiter.acquire(Priority.INVOKE)
            if self.closing:
                raise ClientClosedError("the client was closed while this invocation waited")
            if self.infra is not None:
                self.infra.check()
        except BaseException:
            self.slots.release()
            raise

    async def run(
        self,
        spec: RolloutSpec,
        *,
        admitted: bool = False,
        task_status: TaskStatus[RolloutFuture] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Run one rollout to its outcome. A failure before the agent accepted it is raised
        (to ``invoke``'s caller) unless ``on_future`` has the future it settles."""
        r = Rollout(spec)
        self._running.add(r)
        self._idle.clear()
        slot = admitted
        try:
            error: BaseException | None = None
            result: dict[str, Any] | None = None
            with r.scope:
                try:
                    if not slot:
                        await self.admit(token=not spec.attach)
                        slot = True
                    result, error = await self._attempts(r, task_status)
                except Exception as exc:  # a bug or a refusal: this rollout's outcome
                    error = exc
            if r.scope.cancelled_caught:
                error = ClientClosedError(_CLOSED) if self.closing else None
            self._settle(r, result, error)
            if not r.reported:
                if error is not None and not (spec.on_future and r.fut):
                    raise error
                task_status.started(r.fut)  # type: ignore[arg-type]  # cancelled: a future anyway
        finally:
            if r.fut is not None and not r.fut.done():  # cancelled from outside: the client closed
                self._settle(r, None, ClientClosedError(_CLOSED))
            if slot:
                self.slots.release()
            for sid in r.to_stop:
                self.calls.stop_soon(sid)
            self._running.discard(r)
            if not self._running:
                self._idle.set()
            if r.gateway and self.joiner is not None:
                await self._release_gateway(r)

    def _settle(
        self, r: Rollout, result: dict[str, Any] | None, error: BaseException | None
    ) -> None:
        """Neither result nor error: cancelled."""
        fut = r.fut
        if fut is None:
            return
        if not fut.done():  # else a later outcome (a result after a timeout...) is dropped
            if error is not None:
                fut.set_exception(error)
            elif result is not None:
                fut.set_result(result)
            else:
                fut.cancel()
        if not fut.resolved_at:
            fut.resolved_at = time.time()
        count_outcome(self.counters, fut)
        if not r.reported and not fut.cancelled():
            fut.exception()  # retrieved: raised to invoke's caller, or nobody has it

    async def _attempts(
        self, r: Rollout, task_status: TaskStatus[RolloutFuture]
    ) -> tuple[dict[str, Any] | None, BaseException | None]:
        spec = r.spec
        losses = 0
        attempt = 0
        while True:
            attempt += 1
            first = attempt == 1
            sid = spec.session_id if first and spec.session_id else protocol.new_session_id()
            if not first:
                await self.limiter.acquire(Priority.RETRY)
            result, error = await self._session(r, sid, attempt, task_status)
            if self.infra is not None:
                self.infra.record(error)
            if error is not None:  # also an invocation never accepted: no future tells
                setattr(error, "attempts", attempt)  # noqa: B010
            if error is None or not self._may_retry(r, error, attempt, losses):
                return result, error
            if is_agent_loss(error):
                losses += 1
                self.counters.lost_retries += 1
            assert r.fut is not None
            r.fut.losses = losses
            self.counters.rollout_retries += 1
            logger.warning(
                "rollout %s (input %s) ended retryably (%s); running it again in a new session",
                sid,
                spec.config.input_id,
                type(error).__name__,
            )

    def _may_retry(self, r: Rollout, exc: BaseException, attempt: int, losses: int) -> bool:
        if not r.spec.retry or self.closing or not is_retryable(exc):
            return False
        if is_agent_loss(exc):
            return losses < self.calls.retries.lost
        return attempt - losses <= self.calls.retries.rollouts

    def _future(self, r: Rollout, sid: str, attempt: int) -> RolloutFuture:
        spec = r.spec
        fut = r.fut
        bucket, key = spec.config.s3_bucket, spec.config.key_for(sid)
        if attempt == 1 and spec.key is not None:
            bucket, key = spec.key
        if fut is None:
            fut = r.fut = RolloutFuture(
                session_id=sid,
                input_id=spec.config.input_id,
                s3_bucket=bucket,
                result_key=key,
                index=spec.index,
            )
            if spec.started_at is not None:
                fut.invoked_at = spec.started_at
            fut.add_done_callback(r.cancelled)
            if spec.on_future is not None:
                spec.on_future(fut)
        else:
            fut.previous_sessions.append(fut.session_id)
            fut.session_id, fut.s3_bucket, fut.result_key = sid, bucket, key
            fut.trace = None  # only the final session's trace is the rollout's
        fut.attempts = attempt
        return fut

    async def _session(
        self, r: Rollout, sid: str, attempt: int, task_status: TaskStatus[RolloutFuture]
    ) -> tuple[dict[str, Any] | None, BaseException | None]:
        spec = r.spec
        fut = self._future(r, sid, attempt)
        self.live[sid] = r
        follow = attempt == 1 and (spec.resume or spec.attach)
        ended = False
        r.beat = None
        try:
            if follow and self.joiner is not None:
                r.gateway.append(sid)  # an earlier process opened it; its trace is ours
            # A session id of the caller's (a group member's, derived from exp_id and
            # input_id) may have ended in an earlier run: its result and trace are in S3.
            if attempt == 1 and spec.session_id is not None:
                found = await self._peek(fut)
                if found is not None:
                    ended = True
                    if not follow:
                        same_payload(found, spec.body, fut)
                        if self.joiner is not None:
                            r.gateway.append(sid)
                    return await self._ended(r, found, kept=True)
            # A resumed rollout past its deadline is not sent again: it is read and stopped.
            overdue = spec.timeout is not None and fut.invoked_at + spec.timeout <= time.time()
            if not (follow and (spec.attach or overdue)):
                error = await self._send(r, fut, repeat=attempt == 1 and spec.resume)
                if error is not None:
                    ended = True
                    return None, error
            r.waiter = asyncio.get_running_loop().create_future()
            self.watcher.track(fut.s3_bucket, fut.result_key, r.arrived)
            if not r.reported:
                r.reported = True
                task_status.started(fut)
            outcome = await self._wait(r, fut)
            ended = True
            return outcome
        finally:
            if not ended:  # cancelled or closed while it may run
                r.to_stop.append(sid)
            r.waiter = None
            self.live.pop(sid, None)
            self.watcher.untrack(fut.s3_bucket, fut.result_key)

    async def _peek(self, fut: RolloutFuture) -> dict[str, Any] | None:
        try:
            return await self.watcher.store.get_json(fut.s3_bucket, fut.result_key)
        except StorageError as exc:  # the watcher retries, and says so if it persists
            logger.warning("reading s3://%s/%s failed: %s", fut.s3_bucket, fut.result_key, exc)
            return None

    async def _send(self, r: Rollout, fut: RolloutFuture, *, repeat: bool) -> BaseException | None:
        body = r.spec.body
        # A result store that is down would read no result: hold rollouts until it answers.
        await self.watcher.outages.wait_reachable(fut.s3_bucket)
        try:
            if self.joiner is not None:
                body = {**body, protocol.ROLLOUT_FIELD: dict(body[protocol.ROLLOUT_FIELD])}
                await self.joiner.open(fut, body)  # before the agent can call it
                if fut.session_id not in r.gateway:
                    r.gateway.append(fut.session_id)
            if r.spec.on_session is not None:
                r.spec.on_session(fut)
            answer = await self.calls.invoke(fut.session_id, as_repeat(body) if repeat else body)
            check_answer(answer, fut)
            beat = protocol.parse_heartbeat(answer, r.spec.config.exp_id)
            r.beat = None if beat is None else (fut.s3_bucket, *beat)
        except Exception as exc:
            if may_have_started(exc):
                r.to_stop.append(fut.session_id)
            return exc
        return None

    async def _wait(
        self, r: Rollout, fut: RolloutFuture
    ) -> tuple[dict[str, Any] | None, BaseException | None]:
        assert r.waiter is not None
        limit = r.spec.timeout
        # The deadline is one more waker of the waiter (no cancel scope): a result that
        # arrived in time is not undone by a slow trace join.
        deadline = None
        if limit is not None:
            delay = fut.invoked_at + limit - time.time()
            deadline = asyncio.get_running_loop().call_later(delay, r.wake, "timeout", None)
        try:
            kind, value = await r.waiter
        finally:
            if deadline is not None:
                deadline.cancel()
        if kind == "result":
            return await self._ended(r, value)
        if kind == "lost" and self.stop_finished_sessions:
            r.to_stop.append(fut.session_id)  # e.g. the microVM a probe re-created
        if kind != "timeout":
            return None, value
        # Stopped first, then read: a result written meanwhile is the outcome, so what is
        # reported and what is in S3 agree.
        await self.calls.stop(fut.session_id)
        found = await self._peek(fut)
        if found is not None and found.get(protocol.ERROR_TYPE) != protocol.ERROR_CANCELLED:
            outcome = await self._ended(r, found)
            r.to_stop = [sid for sid in r.to_stop if sid != fut.session_id]
            return outcome
        # An S3 outage is no outcome of its own: the rollout ends at its timeout.
        outage = self.watcher.outages.describe(fut.s3_bucket)
        why = f" ({outage}: the result may be there and unread)" if outage else ""
        assert limit is not None
        return None, RolloutTimeoutError(
            f"rollout {fut.session_id} (input {fut.input_id}) gave no result within "
            f"{limit:g} s{why}; its session was stopped",
            session_id=fut.session_id,
            timeout=limit,
        )

    async def _ended(
        self, r: Rollout, envelope: dict[str, Any], *, kept: bool = False
    ) -> tuple[dict[str, Any] | None, BaseException | None]:
        """The outcome an envelope says (with a gateway: once its trace is kept; ``kept``:
        the envelope was in S3 before this process looked, and so may its trace be)."""
        fut = r.fut
        assert fut is not None
        if self.stop_finished_sessions:
            r.to_stop.append(fut.session_id)
        if protocol.is_error_envelope(envelope):
            if envelope.get(protocol.ERROR_TYPE) == protocol.ERROR_AGENT_LOST:
                self.counters.agents_lost += 1
                return None, AgentLostError(
                    f"the agent process running session {fut.session_id} (input "
                    f"{fut.input_id}) died: {envelope.get(protocol.STOP_REASON)}",
                    session_id=fut.session_id,
                    attempts=fut.attempts,
                    envelope=envelope,
                )
            if self.joiner is not None and fut.session_id in r.gateway:
                # Its trace is a bonus: the error is the outcome.
                await self.joiner.join(fut, envelope, kept=kept)
                r.gateway.remove(fut.session_id)
                calls = fut.trace.records if fut.trace else []
                upstream = [call.status for call in calls if call.status >= 500]
                if upstream and envelope.get(protocol.FAILURE_KIND) == protocol.FailureKind.AGENT:
                    # The agent failed because its model calls did: not the agent's failure.
                    envelope = {**envelope, UPSTREAM_FAILED: len(upstream)}
                    envelope[protocol.FAILURE_KIND] = protocol.FailureKind.INFRA.value
            return None, RolloutError(envelope, session_id=fut.session_id)
        if self.joiner is not None and fut.session_id in r.gateway:
            r.gateway.remove(fut.session_id)
            joined = await self.joiner.join(fut, envelope, kept=kept)
            if joined is not None:
                return None, joined
        return envelope, None

    async def _release_gateway(self, r: Rollout) -> None:
        assert self.joiner is not None
        with anyio.CancelScope(shield=True), anyio.move_on_after(10):
            for sid in r.gateway:
                await self.joiner.release(sid)

    def close(self) -> None:
        """End every rollout with ``ClientClosedError`` (waiting ones, sending ones and
        ones waiting for a slot alike); their tasks then stop their sessions."""
        self.closing = True
        for r in list(self._running):
            r.scope.cancel()

    async def wait_closed(self) -> None:
        """The caller bounds it."""
        await self._idle.wait()
        await self.calls.idle.wait()  # the rollouts' stops began before they ended


def same_payload(envelope: Mapping[str, Any], body: Mapping[str, Any], fut: RolloutFuture) -> None:
    """``ConfigurationError`` when ``envelope``, found at ``fut``'s key before it was sent,
    is of another payload than ``body``: a new run under an experiment's old keys."""
    theirs = envelope.get(protocol.PAYLOAD)
    if not isinstance(theirs, Mapping) or protocol.PAYLOAD_SHA256 in theirs:
        return  # not kept, or too large to keep: taken as the same
    ours = json.loads(json.dumps({**body, protocol.ROLLOUT_FIELD: None}, default=str))
    if {**theirs, protocol.ROLLOUT_FIELD: None} != ours:
        raise ConfigurationError(
            f"s3://{fut.s3_bucket}/{fut.result_key} holds the result of another payload "
            f"(session {fut.session_id}, input {fut.input_id!r}): an input_id names one "
            "rollout (or group) per experiment; use a new exp_id (or input_id) for a new run"
        )


def check_answer(answer: Mapping[str, Any], fut: RolloutFuture) -> None:
    """``InvocationError`` unless the agent accepted the rollout; ``fut`` follows the bucket
    and key the agent says it writes to."""
    if answer.get(protocol.STATUS) != protocol.STATUS_PROCESSING:
        raise InvocationError(
            f"the agent answered {str(answer)[:200]} instead of "
            f'{{"{protocol.STATUS}": "{protocol.STATUS_PROCESSING}", ...}}: is its handler '
            "a rollout entrypoint (@app.rollout_entrypoint)?",
            session_id=fut.session_id,
        )
    key, bucket = answer.get(protocol.RESULT_KEY), answer.get(protocol.S3_BUCKET)
    if (key, bucket) != (fut.result_key, fut.s3_bucket):
        # The agent decides where it writes; follow it, but say so.
        logger.warning(
            "agent writes session %s to s3://%s/%s, not s3://%s/%s",
            fut.session_id,
            bucket,
            key,
            fut.s3_bucket,
            fut.result_key,
        )
        if isinstance(key, str) and isinstance(bucket, str):
            fut.result_key, fut.s3_bucket = key, bucket


def may_have_started(exc: BaseException) -> bool:
    """Whether the agent may run the session despite ``exc``: yes unless it clearly refused
    (an ``InvocationError`` with a status below 500) or was never reached."""
    if isinstance(exc, AgentUnreachableError):
        return False
    status = getattr(exc, "status_code", None)
    return not isinstance(exc, InvocationError) or status is None or status >= 500
