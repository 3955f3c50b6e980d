"""AsyncRolloutClient: start rollouts on agents and get asyncio futures for their results.

Example::

    async with AsyncRolloutClient(agent_url="http://127.0.0.1:8080", s3_bucket="rollouts",
                                  exp_id="step-17", max_concurrent_sessions=256) as client:
        fut = await client.invoke({"prompt": "2+2?"}, input_id="q-1", temperature=1.0)
        result = await fut
        async for item in client.run_batch(payloads, timeout=900):
            print(item.index, item.success)
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import AsyncGenerator, Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any

from agentcore_rl import protocol
from agentcore_rl.client.admission import Admission
from agentcore_rl.client.attach import AttachTarget, peek_result
from agentcore_rl.client.batch import BatchItem, run_batch
from agentcore_rl.client.bucket import TokenBucket
from agentcore_rl.client.config import (
    DEFAULT_CLOSE_TIMEOUT,
    DEFAULT_MAX_CONCURRENT_SESSIONS,
    DEFAULT_RETRY,
    DEFAULT_STOP_WORKERS,
    DEFAULT_TIMEOUT,
    RetryConfig,
)
from agentcore_rl.client.follow import OutcomeFollower
from agentcore_rl.client.future import RolloutFuture
from agentcore_rl.client.invocation import may_have_started, send_invocation
from agentcore_rl.client.payload import build_invocation
from agentcore_rl.client.sessions import PendingSessions
from agentcore_rl.client.stats import ClientStats
from agentcore_rl.client.stopper import SessionStopper
from agentcore_rl.client.transports.acr import AcrTransport
from agentcore_rl.client.transports.base import Transport
from agentcore_rl.client.transports.http import DEFAULT_MAX_CONNECTIONS, HttpTransport
from agentcore_rl.client.watcher import (
    DEFAULT_WATCHER,
    CompletionWatcher,
    WatcherConfig,
    lean_s3_session,
)
from agentcore_rl.errors import (
    ClientClosedError,
    ConfigurationError,
    InvalidRolloutConfig,
    InvocationError,
)
from agentcore_rl.s3 import ResultStore

__all__ = ["AsyncRolloutClient"]

logger = logging.getLogger(__name__)


class AsyncRolloutClient:
    """Drives rollouts on agents (AgentCore Runtime or plain HTTP) and collects results.

    Give exactly one of ``agent_runtime_arn`` (ACR; region from the ARN, endpoint from
    ``endpoint_url`` or ``AWS_ENDPOINT_URL_BEDROCK_AGENTCORE``) and ``agent_url`` (one URL
    or a list; sessions are spread across them). ``s3_bucket`` and ``exp_id`` locate the
    results; ``base_url``, ``model_id`` and any extra keyword go into every payload's
    ``_rollout`` block (per-call keywords override them).

    ``max_concurrent_sessions`` rollouts run at once: a slot is held from ``invoke`` (or
    ``attach``) until the outcome. Invocations and stop calls share one token bucket
    (``tps_limit`` per second, ``burst``); stops wait behind invocations. ``timeout`` (seconds from
    acceptance, ``None`` for none) applies to every rollout unless a call gives its own.
    ``stop_finished_sessions`` (default: the transport's choice, True for ACR) sends a stop
    call after each result. ``store`` (else one on ``s3_endpoint_url`` / the environment)
    reads the results; ``retry`` and ``watcher`` tune retries and the S3 watcher.

    Example::

        async with AsyncRolloutClient(
            agent_runtime_arn="arn:aws:bedrock-agentcore:us-west-2:123456789012:runtime/math",
            s3_bucket="my-rollouts", exp_id="grpo-step-17", tps_limit=25,
            base_url="http://gateway:9000/v1", model_id="qwen3", temperature=0.7,
        ) as client:
            results = await asyncio.gather(*(client.rollout(p) for p in payloads),
                                           return_exceptions=True)
    """

    def __init__(
        self,
        *,
        agent_runtime_arn: str | None = None,
        agent_url: str | Sequence[str] | None = None,
        s3_bucket: str,
        exp_id: str,
        max_concurrent_sessions: int = DEFAULT_MAX_CONCURRENT_SESSIONS,
        tps_limit: float = 25.0,
        burst: float | None = None,
        timeout: float | None = DEFAULT_TIMEOUT,
        base_url: str | None = None,
        model_id: str | None = None,
        endpoint_url: str | None = None,
        qualifier: str | None = None,
        s3_endpoint_url: str | None = None,
        store: ResultStore | None = None,
        retry: RetryConfig = DEFAULT_RETRY,
        watcher: WatcherConfig = DEFAULT_WATCHER,
        token_bucket: TokenBucket | None = None,
        stop_finished_sessions: bool | None = None,
        close_timeout: float = DEFAULT_CLOSE_TIMEOUT,
        stop_workers: int = DEFAULT_STOP_WORKERS,
        **rollout_extra: Any,
    ) -> None:
        if (agent_runtime_arn is None) == (agent_url is None):
            raise ConfigurationError(
                "give exactly one of agent_runtime_arn (AgentCore Runtime) and agent_url "
                "(agent servers over HTTP)"
            )
        if not isinstance(max_concurrent_sessions, int) or max_concurrent_sessions < 1:
            raise ConfigurationError(
                f"max_concurrent_sessions must be an int >= 1, got {max_concurrent_sessions!r}"
            )
        if timeout is not None and not timeout > 0:
            raise ConfigurationError(f"timeout must be > 0 seconds or None, got {timeout!r}")
        try:
            self.defaults = protocol.RolloutConfig(
                exp_id=exp_id,
                input_id="placeholder",
                s3_bucket=s3_bucket,
                base_url=base_url,
                model_id=model_id,
                extra=dict(rollout_extra),
            )
        except InvalidRolloutConfig as exc:
            raise ConfigurationError(str(exc)) from exc
        self.exp_id = exp_id
        self.s3_bucket = s3_bucket
        self.max_concurrent_sessions = max_concurrent_sessions
        self.timeout = timeout
        self.retry = retry
        self.close_timeout = close_timeout
        connections = min(max_concurrent_sessions, DEFAULT_MAX_CONNECTIONS)
        self.transport: Transport
        if agent_runtime_arn is not None:
            self.transport = AcrTransport(
                agent_runtime_arn,
                endpoint_url=endpoint_url,
                qualifier=qualifier,
                max_connections=connections,
            )
        else:
            assert agent_url is not None
            self.transport = HttpTransport(agent_url, max_connections=connections)
        self._owns_store = store is None
        self.store = store or ResultStore(endpoint_url=s3_endpoint_url, session=lean_s3_session())
        self.bucket = token_bucket or TokenBucket(tps_limit, burst)
        self._counters: Counter[str] = Counter()
        self._admission = Admission(max_concurrent_sessions, self.bucket)
        self._sessions = PendingSessions(acr=isinstance(self.transport, AcrTransport))
        self._watcher = CompletionWatcher(self.store, watcher)
        self._stopper = SessionStopper(
            self.transport, self.bucket, retry, self._counters, workers=stop_workers
        )
        self._follower = OutcomeFollower(
            sessions=self._sessions,
            admission=self._admission,
            watcher=self._watcher,
            stopper=self._stopper,
            counters=self._counters,
            stop_finished_sessions=(
                self.transport.stop_after_result
                if stop_finished_sessions is None
                else stop_finished_sessions
            ),
        )
        self._close_done: asyncio.Event | None = None

    def __repr__(self) -> str:
        return (
            f"AsyncRolloutClient(transport={self.transport!r}, exp_id={self.exp_id!r}, "
            f"s3_bucket={self.s3_bucket!r}, in_flight={self.in_flight})"
        )

    # --- public API ----------------------------------------------------------------------

    @property
    def stop_finished_sessions(self) -> bool:
        """Whether a stop call follows every result too (not only timeouts, cancels...).

        Example::

            client.stop_finished_sessions = False   # an HTTP agent frees finished sessions
        """
        return self._follower.stop_finished_sessions

    @stop_finished_sessions.setter
    def stop_finished_sessions(self, value: bool) -> None:
        self._follower.stop_finished_sessions = value

    @property
    def stats(self) -> ClientStats:
        """A snapshot of the counters (invocations, retries, stops, outcomes, S3 requests).

        Example::

            print(client.stats.as_dict())
        """
        return ClientStats.from_counters(
            self._counters, in_flight=self.in_flight, s3_requests=self.store.request_counts
        )

    @property
    def in_flight(self) -> int:
        """Accepted rollouts without an outcome yet.

        Example::

            print(client.in_flight)
        """
        return len(self._sessions.live)

    async def invoke(
        self,
        payload: Mapping[str, Any],
        *,
        input_id: str | None = None,
        session_id: str | None = None,
        timeout: float | None = None,
        **overrides: Any,
    ) -> RolloutFuture:
        """Start one rollout; return its future once the agent has accepted it.

        Waits for a concurrency slot, then a token. ``_rollout`` is the client's defaults,
        then the payload's own ``_rollout`` keys, then ``input_id`` and ``overrides``.
        ``input_id`` defaults to a fresh time-ordered id. ``session_id`` defaults to a fresh
        :func:`~agentcore_rl.protocol.new_session_id`; choose one to know the result key
        before the call (``config.key_for(session_id)``) or to retry an invocation the
        agent may already run (it runs one rollout per session and result key). It must
        be letters, digits and hyphens, 33-256 characters on AgentCore Runtime, and not
        belong to a pending rollout of this client. ``timeout`` (seconds from acceptance;
        ``math.inf`` for none) overrides the client's. Raises ``InvalidPayloadError``
        (``InvalidRolloutConfig``) for a bad payload, override or session id,
        ``ConfigurationError`` for a session id already pending here, ``InvocationError``
        when the agent refused or could not be reached, ``ClientClosedError`` after
        ``aclose``.

        Example::

            fut = await client.invoke({"prompt": "2+2?"}, input_id="q-1", temperature=1.0)
            result = await fut
            sid = protocol.new_session_id()          # journal it first, then:
            fut = await client.invoke({"prompt": "2+2?"}, input_id="q-2", session_id=sid)
        """
        body, config = self.prepare(payload, input_id=input_id, overrides=overrides)
        if session_id is not None:
            self.check_session_id(session_id)
        await self.admit()
        return await self.start(body, config, timeout=timeout, session_id=session_id)

    async def rollout(
        self,
        payload: Mapping[str, Any],
        *,
        input_id: str | None = None,
        session_id: str | None = None,
        timeout: float | None = None,
        **overrides: Any,
    ) -> dict[str, Any]:
        """``invoke`` and wait for the outcome: the result dict, or its exception.

        Example::

            result = await client.rollout({"prompt": "2+2?"}, timeout=600)
        """
        fut = await self.invoke(
            payload, input_id=input_id, session_id=session_id, timeout=timeout, **overrides
        )
        return await fut

    def run_batch(
        self,
        payloads: Iterable[Mapping[str, Any]],
        *,
        timeout: float | None = None,
        **overrides: Any,
    ) -> AsyncGenerator[BatchItem, None]:
        """Run many rollouts; iterate over :class:`BatchItem` in completion order.

        Never raises for one rollout (its item carries the error). The default
        ``input_id`` is the payload's index, zero-padded to 6 digits (``"000017"``),
        unless the payload's ``_rollout`` or ``overrides`` name one. Leaving the loop early
        stops every live session the batch started (at once with ``aclosing``, else when
        the dropped generator is finalized, which CPython does immediately).

        Example::

            async for item in client.run_batch(payloads, timeout=900):
                print(item.index, item.success, item.error)
        """
        self._admission.check_open()
        return run_batch(self, payloads, timeout=timeout, overrides=overrides)

    async def aclose(self) -> None:
        """Stop taking work, end pending rollouts with ``ClientClosedError``, stop their
        sessions (waiting up to ``close_timeout`` seconds), release everything. Idempotent.

        Example::

            await client.aclose()
        """
        if self._close_done is not None:
            await self._close_done.wait()
            return
        self._close_done = asyncio.Event()
        self._admission.close()
        try:
            # Invocations on the wire unwind first: each queues the stop of its session.
            await self._admission.wait_idle(self.close_timeout)
            self._follower.settle_all(
                ClientClosedError("the client was closed before this rollout finished")
            )
            # Done callbacks (which queue the stop calls) run on the next loop iteration.
            await asyncio.sleep(0)
            left = await self._stopper.drain(self.close_timeout)
            if left:
                logger.warning(
                    "%d session(s) not stopped within %s s of closing", left, self.close_timeout
                )
        finally:
            await self._stopper.aclose()
            await self._watcher.aclose()
            await self.transport.aclose()
            if self._owns_store:
                await self.store.aclose()
            self._close_done.set()

    async def __aenter__(self) -> AsyncRolloutClient:
        self._admission.check_open()
        # Create the S3 client now rather than in the first watcher round, so the first
        # results are not detected late (short timeouts would fire first).
        await self.store.__aenter__()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    # --- the steps of an invocation (used by invoke, Batch and the eval engine) ----------

    def check_session_id(self, session_id: object) -> str:
        """Return ``session_id`` if this client can use it for a new rollout, else raise.

        ``InvalidRolloutConfig`` when it is not a valid session id (on AgentCore Runtime:
        33-256 letters, digits and hyphens), ``ConfigurationError`` when a pending rollout
        of this client already uses it.

        Example::

            client.check_session_id(protocol.new_session_id())
        """
        return self._sessions.check(session_id)

    def prepare(
        self,
        payload: Mapping[str, Any],
        *,
        input_id: str | None,
        overrides: Mapping[str, Any],
        default_input_id: str | None = None,
    ) -> tuple[dict[str, Any], protocol.RolloutConfig]:
        """Build the body and its validated ``_rollout`` block (no I/O).

        Example::

            body, config = client.prepare({"prompt": "hi"}, input_id="q-1", overrides={})
        """
        return build_invocation(
            self.defaults,
            payload,
            input_id=input_id,
            overrides=overrides,
            default_input_id=default_input_id,
        )

    async def admit(self) -> None:
        """Wait for a concurrency slot, then a token (the caller then owns the slot).

        Example::

            await client.admit(); fut = await client.start(body, config)
        """
        await self._admission.acquire(token=True)

    def release(self) -> None:
        """Give back the slot of an :meth:`admit` that will not be followed by
        :meth:`start` (e.g. the caller found the result already there).

        Example::

            await client.admit()
            if await store.get_json(bucket, key) is not None:
                client.release()
        """
        self._admission.release()

    async def start(
        self,
        body: dict[str, Any],
        config: protocol.RolloutConfig,
        *,
        timeout: float | None = None,
        index: int | None = None,
        session_id: str | None = None,
    ) -> RolloutFuture:
        """Send an admitted invocation (with retries) and start watching for its result.

        ``session_id`` as in :meth:`invoke` (checked again here; the slot is given back
        when it is refused).

        Example::

            fut = await client.start(body, config, timeout=600)
        """
        if session_id is None:
            session_id = protocol.new_session_id()
        else:
            try:
                self.check_session_id(session_id)
            except BaseException:
                self._admission.release()
                raise
        fut = RolloutFuture(
            session_id=session_id,
            input_id=config.input_id,
            s3_bucket=config.s3_bucket,
            result_key=config.key_for(session_id),
            index=index,
        )
        with self._admission.sending() as task, self._sessions.reserving(session_id):
            try:
                await send_invocation(
                    self.transport,
                    fut,
                    body,
                    retry=self.retry,
                    bucket=self.bucket,
                    counters=self._counters,
                )
            except BaseException as exc:
                self._admission.release()
                if isinstance(exc, InvocationError):
                    self._counters["invocation_errors"] += 1
                if may_have_started(exc):
                    self._stopper.schedule(session_id)
                if isinstance(exc, asyncio.CancelledError):
                    self._admission.raise_if_closed_by_us(task)
                raise
        self._follower.follow(fut, self.timeout if timeout is None else timeout, elapsed=0.0)
        return fut

    async def attach(
        self,
        *,
        session_id: str,
        result_key: str,
        input_id: str | None = None,
        s3_bucket: str | None = None,
        timeout: float | None = None,
        started_at: float | None = None,
    ) -> RolloutFuture:
        """Follow a rollout that is already running (started by another client or an
        earlier process): return a future for the result at ``s3://s3_bucket/result_key``.

        Nothing is sent to the agent. The outcome, timeout and stop semantics are those of
        an invoked rollout: the result dict or ``RolloutError``; ``RolloutTimeoutError``
        ``timeout`` seconds (default: the client's) after ``started_at`` (epoch seconds,
        default now), then the session is stopped; cancelling the future or closing the
        client stops the session too. An attached rollout holds a concurrency slot until
        its outcome, like an invoked one (it does run on an agent), so ``attach`` first
        waits for a slot, but not for a token: it makes no call to the agent. The key is
        read at once: a result already there (even past the deadline) resolves the
        future before it is returned; then the client's completion watcher takes over.
        ``input_id`` defaults to the one in the key; ``s3_bucket`` to the client's.

        Example::

            fut = await client.attach(session_id=entry.session_id,
                                      result_key=entry.result_key,
                                      timeout=900, started_at=entry.started_at)
            result = await fut
        """
        self._admission.check_open()
        target = AttachTarget.resolve(
            session_id=session_id,
            result_key=result_key,
            input_id=input_id,
            s3_bucket=self.s3_bucket if s3_bucket is None else s3_bucket,
            check_session_id=self.check_session_id,
        )
        with self._sessions.reserving(target.session_id):
            await self._admission.acquire(token=False)
            try:
                found = await peek_result(self.store, target.s3_bucket, target.result_key)
            except BaseException:
                self._admission.release()
                raise
        fut = target.future(started_at=started_at)
        limit = self.timeout if timeout is None else timeout
        self._follower.follow(
            fut, limit, elapsed=max(0.0, time.time() - fut.invoked_at), found=found
        )
        return fut
