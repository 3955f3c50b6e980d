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
import contextlib
import dataclasses
import enum
import logging
import math
import time
from collections.abc import AsyncGenerator, AsyncIterator, Iterable, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any

import anyio

from agentcore_rl import protocol
from agentcore_rl.client.admission import Admission, Slot
from agentcore_rl.client.attach import AttachTarget, peek_result
from agentcore_rl.client.batch import BatchItem, BatchRun, Fed
from agentcore_rl.client.config import (
    CLOSE_STOP_WORKERS,
    DEFAULT_CLOSE_TIMEOUT,
    DEFAULT_MAX_CONCURRENT_SESSIONS,
    DEFAULT_RETRY,
    DEFAULT_STOP_WORKERS,
    DEFAULT_TIMEOUT,
)
from agentcore_rl.client.faults import DEFAULT_FAULTS, FaultConfig
from agentcore_rl.client.follow import OutcomeFollower
from agentcore_rl.client.future import RolloutFuture
from agentcore_rl.client.gateway_link import gateway_link
from agentcore_rl.client.groups import (
    GroupBatch,
    GroupFuture,
    GroupItem,
    GroupRunner,
    read_groups,
)
from agentcore_rl.client.handoff import Handoff
from agentcore_rl.client.invocation import may_have_started, send_invocation
from agentcore_rl.client.lease import ClientLease
from agentcore_rl.client.liveness import DEFAULT_LIVENESS, LivenessConfig, LivenessProber
from agentcore_rl.client.outcomes import (
    DEFAULT_RETRY_LOST,
    DEFAULT_RETRY_ROLLOUTS,
    is_agent_loss,
    is_retryable,
)
from agentcore_rl.client.payload import build_invocation
from agentcore_rl.client.service import Service
from agentcore_rl.client.sessions import PendingSessions
from agentcore_rl.client.stats import ClientCounters, ClientStats
from agentcore_rl.client.stopper import SessionStopper
from agentcore_rl.client.traces import TraceJoiner
from agentcore_rl.client.transports.acr import AcrTransport
from agentcore_rl.client.transports.base import Transport
from agentcore_rl.client.transports.http import DEFAULT_MAX_CONNECTIONS, HttpTransport
from agentcore_rl.client.watcher import DEFAULT_WATCHER, CompletionWatcher, WatcherConfig
from agentcore_rl.errors import (
    ClientClosedError,
    ConfigurationError,
    InvalidRolloutConfig,
    InvocationError,
    TraceLostError,
)
from agentcore_rl.group_tracker import GroupCounters
from agentcore_rl.groups import GroupRules, OnFailure, RolloutGroup
from agentcore_rl.ratelimit import DEFAULT_PACE_TICK, Priority, RateLimiter, TokenBucket
from agentcore_rl.retry import RetryPolicy
from agentcore_rl.s3 import ResultStore, lean_s3_session
from agentcore_rl.sessionlimit import LocalSessionLimiter, SessionLimiter

if TYPE_CHECKING:
    from agentcore_rl.gateway.app import RolloutGateway
    from agentcore_rl.gateway.record import SessionTrace

__all__ = ["AsyncRolloutClient", "ClientState", "run_batch"]

logger = logging.getLogger(__name__)


class ClientState(enum.Enum):
    """Where a client is in its life: not opened yet, open (entered with ``async with``,
    or opened by its first rollout), or closed for good."""

    UNOPENED = 1
    OPENED = 2
    CLOSED = 3


class AsyncRolloutClient:
    """Drives rollouts on agents (AgentCore Runtime or plain HTTP) and collects results.

    Give exactly one of ``agent_runtime_arn`` (ACR; region from the ARN, endpoint from
    ``endpoint_url`` or ``AWS_ENDPOINT_URL_BEDROCK_AGENTCORE``) and ``agent_url`` (one URL
    or a list; sessions are spread across them). ``s3_bucket`` and ``exp_id`` locate the
    results; ``base_url``, ``model_id`` and any extra keyword go into every payload's
    ``_rollout`` block (per-call keywords override them).

    ``max_concurrent_sessions`` rollouts run at once: a slot is held from ``invoke`` (or
    ``attach``) until the outcome. Invocations and stop calls share one token bucket
    (``tps_limit`` per second, ``burst``); stops wait behind invocations. ``rate_limiter``
    (a :class:`~agentcore_rl.ratelimit.RateLimiter`; ``token_bucket`` is its older name)
    and ``session_limiter`` (a :class:`~agentcore_rl.sessionlimit.SessionLimiter`) replace
    the local ones, e.g. with limits shared by a cluster of clients. ``timeout`` (seconds from
    acceptance, ``None`` for none) applies to every rollout unless a call gives its own.
    ``stop_finished_sessions`` (default: the transport's choice, True for ACR) sends a stop
    call after each result. ``store`` (else one on ``s3_endpoint_url`` / the environment)
    reads the results; ``retry`` and ``watcher`` tune retries and the S3 watcher.
    ``retry_rollouts``: extra attempts, each in a new session, for a rollout whose outcome
    is retryable (an agent unreachable, restarting or throttling past the retries;
    :mod:`agentcore_rl.client.outcomes`), and ``retry_lost`` more for one whose agent
    process went away under it (a crash, a restart, a server shutdown), counted apart;
    ``liveness`` paces the probes that find crashed agents
    (:class:`~agentcore_rl.client.liveness.LivenessConfig`).
    ``lean`` (default) sends the hot AWS calls (invoke, stop, S3 reads) through
    :mod:`agentcore_rl.aws`, a fraction of botocore's CPU per request with the same
    settings and errors; ``lean=False`` sends every call through aiobotocore.

    Token capture: with ``gateway_url`` (a gateway in another process, driven with its
    admin token: ``gateway_admin_token`` or ``AGENTCORE_RL_GATEWAY_ADMIN_TOKEN``) or
    ``gateway`` (a :class:`~agentcore_rl.gateway.RolloutGateway` on this event loop, which
    agents reach at ``gateway_url``), each rollout's session is opened at the gateway
    before the invocation and its ``_rollout`` gets ``base_url`` = the session's gateway
    URL and ``api_key`` = its session id. When the result arrives the session is finished,
    its trace written to S3 beside the result (``...{session_id}.trace.json.gz``) and put
    on the outcome (``fut.trace``, ``BatchItem.trace``, :meth:`trace_of`); a trace that
    cannot be had ends the rollout in ``TraceLostError``.

    Background work (the S3 watcher, stop calls, batches) belongs to the client's task
    group: entered by ``async with``, else opened by the first rollout; ``aclose`` ends it.

    Example::

        async with AsyncRolloutClient(
            agent_runtime_arn="arn:aws:bedrock-agentcore:us-west-2:123456789012:runtime/math",
            s3_bucket="my-rollouts", exp_id="grpo-step-17", tps_limit=25,
            base_url="http://vllm:8000/v1", model_id="qwen3", temperature=0.7,
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
        tps_limit: float = protocol.DEFAULT_TPS,
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
        retry_rollouts: int = DEFAULT_RETRY_ROLLOUTS,
        retry_lost: int = DEFAULT_RETRY_LOST,
        liveness: LivenessConfig = DEFAULT_LIVENESS,
        faults: FaultConfig = DEFAULT_FAULTS,
        lean: bool = True,
        gateway_url: str | None = None,
        gateway: RolloutGateway | None = None,
        gateway_admin_token: str | None = None,
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
        if not isinstance(retry_rollouts, int) or retry_rollouts < 0:
            raise ConfigurationError(f"retry_rollouts must be an int >= 0, got {retry_rollouts!r}")
        if not isinstance(retry_lost, int) or retry_lost < 0:
            raise ConfigurationError(f"retry_lost must be an int >= 0, got {retry_lost!r}")
        if rate_limiter is not None and token_bucket is not None:
            raise ConfigurationError("give rate_limiter or token_bucket (its older name), not both")
        link = gateway_link(
            gateway=gateway, gateway_url=gateway_url, admin_token=gateway_admin_token
        )
        if link is not None and base_url is not None:
            raise ConfigurationError(
                "give base_url or a gateway, not both: through a gateway each rollout's "
                "base_url is its session's gateway URL (the gateway's --upstream is the policy)"
            )
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
        self.retry_rollouts = retry_rollouts
        self.retry_lost = retry_lost
        self.close_timeout = close_timeout
        connections = min(max_concurrent_sessions, DEFAULT_MAX_CONNECTIONS)
        self.transport: Transport
        if agent_runtime_arn is not None:
            self.transport = AcrTransport(
                agent_runtime_arn,
                endpoint_url=endpoint_url,
                qualifier=qualifier,
                max_connections=connections,
                lean=lean,
            )
        else:
            assert agent_url is not None
            self.transport = HttpTransport(agent_url, max_connections=connections)
        self._owns_store = store is None
        self.store = store or ResultStore(
            endpoint_url=s3_endpoint_url, session=lean_s3_session(), lean=lean
        )
        self.faults = faults
        self._lease = (
            None if faults.lease_ttl is None else ClientLease(self.store, s3_bucket, exp_id, faults)
        )
        if self._lease is not None:  # every invocation names it
            extra = {**self.defaults.extra, protocol.LEASE: self._lease.reference}
            self.defaults = dataclasses.replace(self.defaults, extra=extra)
        self.rate_limiter: RateLimiter = (
            rate_limiter or token_bucket or TokenBucket(tps_limit, burst, tick=DEFAULT_PACE_TICK)
        )
        self.session_limiter: SessionLimiter = session_limiter or LocalSessionLimiter(
            max_concurrent_sessions
        )
        self._state = ClientState.UNOPENED
        self._depth = 0  # nested ``async with`` blocks; the outermost one owns the service
        self._entered = False
        self._closed = asyncio.Event()
        self._counters = ClientCounters()
        self._admission = Admission(self.session_limiter, self.rate_limiter)
        self._sessions = PendingSessions(acr=isinstance(self.transport, AcrTransport))
        self._watcher = CompletionWatcher(self.store, watcher, run_by_owner=True)
        self._joiner = None if link is None else TraceJoiner(link, self.store)
        self._stopper = SessionStopper(
            self.transport, self.rate_limiter, retry, self._counters, workers=stop_workers
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
            joiner=self._joiner,
        )
        self._follower.retry = self._retry_rollout
        self._prober = LivenessProber(
            self.transport,
            self.rate_limiter,
            self._sessions.live,
            self._counters,
            on_lost=self._follower.lost,
            config=liveness,
        )
        self._service = Service("agentcore-rl client", setup=self._start_workers)
        self._groups = GroupRunner(self)

    def __repr__(self) -> str:
        return (
            f"AsyncRolloutClient(transport={self.transport!r}, exp_id={self.exp_id!r}, "
            f"s3_bucket={self.s3_bucket!r}, state={self._state.name}, in_flight={self.in_flight})"
        )

    # --- public API ----------------------------------------------------------------------

    @property
    def bucket(self) -> RateLimiter:
        """The rate limiter (a :class:`TokenBucket` unless ``rate_limiter`` was given)."""
        return self.rate_limiter

    @property
    def state(self) -> ClientState:
        """Where the client is in its life (see :class:`ClientState`)."""
        return self._state

    @property
    def stop_finished_sessions(self) -> bool:
        """Whether a stop call follows every result too (not only timeouts, cancels...)."""
        return self._follower.stop_finished_sessions

    @stop_finished_sessions.setter
    def stop_finished_sessions(self, value: bool) -> None:
        self._follower.stop_finished_sessions = value

    @property
    def stats(self) -> ClientStats:
        """A snapshot of the counters (invocations, retries, stops, outcomes, S3 requests)."""
        outages = self._watcher.outages
        self._counters.unstopped = len(self._stopper.unstopped)
        return ClientStats.from_counters(
            self._counters,
            in_flight=self.in_flight,
            s3_requests=self.store.request_counts,
            store_unreachable=outages.unreachable,
            store_outages=outages.outages,
            degraded_seconds=outages.degraded_seconds,
        )

    @property
    def in_flight(self) -> int:
        """Accepted rollouts without an outcome yet."""
        return len(self._sessions.live)

    async def invoke(
        self,
        payload: Mapping[str, Any],
        *,
        input_id: str | None = None,
        session_id: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 (the rollout's deadline)
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
        body, config = self._prepare(payload, input_id=input_id, overrides=overrides)
        if session_id is not None:
            self.check_session_id(session_id)
        async with self._slot() as slot:
            return await self._launch(slot, body, config, timeout=timeout, session_id=session_id)

    async def rollout(
        self,
        payload: Mapping[str, Any],
        *,
        input_id: str | None = None,
        session_id: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 (the rollout's deadline)
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
        unless the payload's ``_rollout`` or ``overrides`` name one. The work runs in the
        client's task group and the loop only reads its items: leaving the loop early
        stops every live session the batch started (at once with ``aclosing``, else when
        the dropped generator is finalized, which CPython does immediately); a loop
        abandoned without either leaves its rollouts to run until ``aclose``. Raises
        ``ClientClosedError`` (after the items of the rollouts already started) when the
        client closes meanwhile.

        Example::

            async for item in client.run_batch(payloads, timeout=900):
                print(item.index, item.success, item.error)
        """
        self._check_not_closed()
        return self._batch(payloads, timeout, overrides)

    # --- GRPO groups (the work is in client/groups.py) -------------------------------------

    async def invoke_group(
        self,
        payload: Mapping[str, Any],
        *,
        n: int,
        input_id: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 (each member's deadline)
        retry: int = 1,
        on_failure: OnFailure = "drop_member",
        min_members: int = 2,
        redundancy: int = 0,
        filter_uniform: bool = False,
        member_seed: int | None = None,
        **overrides: Any,
    ) -> GroupFuture:
        """Start a GRPO group of ``n`` rollouts of ``payload``; return its future once its
        members are admitted (``n + redundancy`` slots taken).

        ``input_id`` is the group key (default: a fresh id): member session ids derive
        from it, so each group of an experiment needs its own. The rules
        (:class:`~agentcore_rl.groups.GroupRules`): ``retry`` re-runs of a failed or
        timed-out member in a fresh session; then ``on_failure`` (``"drop_member"`` with at
        least ``min_members`` kept, ``"zero"`` or ``"drop_group"``); ``redundancy`` extra
        members whose late ones are stopped; ``filter_uniform`` drops groups whose rewards
        are all equal. The future ends in a :class:`~agentcore_rl.groups.RolloutGroup`, a
        ``GroupDroppedError`` (``StaleGroupError`` after :meth:`advance_policy`) or
        ``ClientClosedError``; cancelling it stops the members. ``timeout`` and
        ``overrides`` are as in :meth:`invoke`, for each member. ``member_seed`` gives each
        attempt its own ``_rollout.seed`` (``member_seed + attempt * (n + redundancy) +
        index``): a seed shared by every member would make them sample alike.

        Example::

            fut = await client.invoke_group(payload, n=8, input_id="q-17", temperature=1.0)
            group = await fut
            print(group.rewards, group.advantages("mean_std"))
        """
        rules = GroupRules(
            n=n,
            redundancy=redundancy,
            retry=retry,
            on_failure=on_failure,
            min_members=min_members,
            filter_uniform=filter_uniform,
        )
        return await self._groups.open(
            payload,
            rules=rules,
            input_id=input_id,
            timeout=timeout,
            overrides=overrides,
            member_seed=member_seed,
        )

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
    ) -> AsyncGenerator[RolloutGroup, None]:
        """Run a group per payload (rules as in :meth:`invoke_group`); yield the whole
        groups in completion order.

        Dropped groups are not yielded: each is counted by reason in :attr:`group_stats`
        (and logged). The default ``input_id`` is the payload's index, zero-padded to 6
        digits, unless its ``_rollout`` names one. The work runs in the client's task group,
        as :meth:`run_batch`'s does; leaving the loop stops the groups still running.

        Example::

            async for group in client.run_groups(payloads, n=8, timeout=900, redundancy=1):
                rows.extend(group_rows(group, "mean_std"))
        """
        self._check_not_closed()
        rules = GroupRules(
            n=n,
            redundancy=redundancy,
            retry=retry,
            on_failure=on_failure,
            min_members=min_members,
            filter_uniform=filter_uniform,
        )
        options = {
            "rules": rules,
            "timeout": timeout,
            "overrides": overrides,
            "member_seed": member_seed,
        }
        return self._run_groups(payloads, options)

    async def _run_groups(
        self, payloads: Iterable[Mapping[str, Any]], options: Mapping[str, Any]
    ) -> AsyncGenerator[RolloutGroup, None]:
        await self._ensure_open()
        send, receive = anyio.create_memory_object_stream[GroupItem](math.inf)
        batch = GroupBatch(self._groups, payloads, options, send)
        await self._service.start(batch.run, name="groups")
        async with contextlib.aclosing(read_groups(receive, batch)) as groups:
            async for group in groups:
                yield group

    def set_policy_version(self, version: int) -> None:
        """Stamp ``_rollout.policy_version = version`` into every member started from now
        on (retries included). Versions only move forward.

        Example::

            client.set_policy_version(step)
        """
        self._groups.set_policy_version(version)

    def advance_policy(self, version: int, *, max_staleness: int) -> int:
        """Move to ``version`` and stop every open group with a member started under a
        version older than ``version - max_staleness``: their futures end in
        ``StaleGroupError`` (counted under ``groups_dropped["stale"]``). Returns how many.

        Example::

            stale = client.advance_policy(step + 1, max_staleness=1)
        """
        return self._groups.advance_policy(version, max_staleness=max_staleness)

    @property
    def group_stats(self) -> GroupCounters:
        """Counters of the groups: opened, ready, dropped by reason, members by outcome."""
        return self._groups.counters

    async def _start(self, func: Any, *args: Any, name: str) -> Any:
        return await self._service.start(func, *args, name=name)

    def _stop_session(self, session_id: str) -> None:
        self._stopper.schedule(session_id)

    async def aclose(self) -> None:
        """Stop taking work, end pending rollouts with ``ClientClosedError``, stop their
        sessions (all within ``close_timeout`` seconds, as fast as the rate limiter
        allows), end the client's background work and release everything. Sessions not
        stopped in time are not waited for: :attr:`unstopped_sessions` lists them (and
        ``stats.unstopped`` counts them). Idempotent; a closed client cannot be used
        again.

        Example::

            await client.aclose()
        """
        if self._state is ClientState.CLOSED:
            await self._closed.wait()
            return
        self._state = ClientState.CLOSED
        self._admission.close()
        self._groups.close(ClientClosedError("the client was closed before this group finished"))
        try:
            # One deadline for both waits: close_timeout bounds the whole close.
            with anyio.move_on_after(self.close_timeout) as waiting:
                # Invocations on the wire unwind first: each queues the stop of its session.
                await self._admission.wait_idle()
                self._follower.settle_all(
                    ClientClosedError("the client was closed before this rollout finished")
                )
                # Done callbacks (which queue the stop calls) run on the next loop iteration.
                await asyncio.sleep(0)
                async with anyio.create_task_group() as burst:
                    burst.start_soon(self._stopper.burst, CLOSE_STOP_WORKERS)
                    await self._stopper.drain()
                    burst.cancel_scope.cancel()
            if waiting.cancelled_caught:
                self._follower.settle_all(
                    ClientClosedError("the client was closed before this rollout finished")
                )
        finally:
            try:
                # Shielded: a close that was itself cancelled still ends the work it owns.
                with anyio.CancelScope(shield=True):
                    await self._service.aclose()
                    self._stopper.close()
                    self._report_unstopped()
                    await self.transport.aclose()
                    if self._joiner is not None:
                        self._joiner.close()
                        await self._joiner.link.aclose()
                    if self._owns_store:
                        await self.store.aclose()
            finally:
                self._closed.set()

    @property
    def unstopped_sessions(self) -> list[str]:
        """Session ids this client meant to stop and could not (the stop failed, or
        ``aclose`` ran out of ``close_timeout``): they may still run on their agents."""
        return list(self._stopper.unstopped)

    def _report_unstopped(self) -> None:
        unstopped = self._stopper.unstopped
        self._counters.unstopped = len(unstopped)
        if unstopped:
            logger.warning(
                "%d session(s) could not be stopped (within %s s of closing, or their stop "
                "failed) and may still run: client.unstopped_sessions lists them, e.g. %s",
                len(unstopped),
                self.close_timeout,
                ", ".join(unstopped[:3]),
            )

    async def __aenter__(self) -> AsyncRolloutClient:
        self._check_not_closed()
        self._depth += 1
        if self._state is ClientState.UNOPENED:
            self._state = ClientState.OPENED
            try:
                await self._service.__aenter__()
                self._entered = True
                # Create the S3 client now rather than in the first watcher round, so the
                # first results are not detected late (short timeouts would fire first).
                await self.store.__aenter__()
                if isinstance(self.transport, AcrTransport):
                    await self.transport.connect()
            except BaseException:
                self._depth -= 1
                await self._exit_service(None, None, None)
                raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        self._depth -= 1
        if self._depth:
            await self.aclose()
            return None
        return await self._exit_service(exc_type, exc, tb)

    async def _exit_service(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        """Close, then leave the task group this task entered (anyio: the same task)."""
        suppress: bool | None = None
        try:
            await self.aclose()
        finally:
            if self._entered:
                self._entered = False
                suppress = await self._service.__aexit__(exc_type, exc, tb)
        return suppress

    # --- lifecycle and admission (private: used by invoke, attach, batches, the eval CLI) --

    def _check_not_closed(self) -> None:
        if self._state is ClientState.CLOSED:
            raise ClientClosedError("the client is closed; create a new one")

    async def _ensure_open(self) -> None:
        """Open the client's task group if ``async with`` has not: the first rollout of a
        client used without it opens one, hosted until ``aclose``."""
        self._check_not_closed()
        if self._state is ClientState.UNOPENED:
            self._state = ClientState.OPENED
            self._service.open_hosted()
        await self._service.wait_ready()

    def _start_workers(self, service: Service) -> None:
        service.start_soon(self._watcher.run, name="completion watcher")
        service.start_soon(self._stopper.run, name="session stopper")
        if self._joiner is not None:
            service.start_soon(self._joiner.run, name="trace joiner")
        service.start_soon(self._prober.run, name="liveness prober")
        service.start_soon(self._groups.run, name="group members")
        if self._lease is not None:
            service.start_soon(self._lease.run, name="client lease")

    async def _admit(self) -> Slot:
        """Take a concurrency slot and an INVOKE token for a rollout that another task will
        send (a batch's feeder admits, its sender launches): the caller hands the slot to
        :meth:`_launch` or gives it back with :meth:`_release_slot`."""
        await self._ensure_open()
        await self._admission.acquire(token=True)
        return Slot()

    def _release_slot(self, slot: Slot) -> None:
        """Give back an admitted slot that no follower took over."""
        if not slot.handed_over:
            slot.handed_over = True  # once
            self._admission.release()

    @contextlib.asynccontextmanager
    async def _slot(
        self, *, token: bool = True, priority: int = Priority.INVOKE
    ) -> AsyncIterator[Slot]:
        """Hold a concurrency slot (and, if ``token``, a token at ``priority``) for the block.

        A rollout handed to the follower (``_launch``, or ``slot.handed_over``) keeps the
        slot until its outcome; otherwise leaving the block gives it back.
        """
        await self._ensure_open()
        await self._admission.acquire(token=token, priority=priority)
        slot = Slot()
        try:
            yield slot
        finally:
            if not slot.handed_over:
                self._admission.release()

    def _prepare(
        self,
        payload: Mapping[str, Any],
        *,
        input_id: str | None,
        overrides: Mapping[str, Any],
        default_input_id: str | None = None,
    ) -> tuple[dict[str, Any], protocol.RolloutConfig]:
        """Build the body and its validated ``_rollout`` block (no I/O)."""
        return build_invocation(
            self.defaults,
            payload,
            input_id=input_id,
            overrides=overrides,
            default_input_id=default_input_id,
        )

    async def _launch(
        self,
        slot: Slot,
        body: dict[str, Any],
        config: protocol.RolloutConfig,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 (the rollout's deadline)
        index: int | None = None,
        session_id: str | None = None,
    ) -> RolloutFuture:
        """Send an admitted invocation (with retries); on acceptance hand its ``slot`` to
        the follower, which watches for the result. ``session_id`` as in :meth:`invoke`.

        A session id chosen here (``session_id`` None) may be replaced: a retryable
        failure (the agent unreachable, restarting or throttling past the retries) is
        tried again in a new session, up to ``retry_rollouts`` times, and so is a retryable
        outcome after acceptance (an agent loss up to ``retry_lost`` times; see
        :mod:`agentcore_rl.client.outcomes`). A caller's session id is never replaced
        (the caller may have journaled it)."""
        attempt = 1
        while True:
            try:
                return await self._launch_once(
                    slot,
                    body,
                    config,
                    timeout=timeout,
                    index=index,
                    session_id=session_id,
                    attempt=attempt,
                )
            except InvocationError as exc:
                if session_id is not None or not self._may_retry(exc, attempt):
                    self._counters.invocation_errors += 1
                    raise
                logger.warning("invocation failed, trying a new session: %s", exc)
                attempt += 1
                self._counters.rollout_retries += 1
                await self.rate_limiter.acquire(Priority.RETRY)

    def _may_retry(self, exc: BaseException, attempt: int, losses: int = 0) -> bool:
        """Whether a rollout that ended with ``exc`` after ``attempt`` sessions, ``losses``
        of them lost with their agent, runs again: each kind has its own budget."""
        if self._admission.closed or not is_retryable(exc):
            return False
        if is_agent_loss(exc):
            return losses < self.retry_lost
        return attempt - losses <= self.retry_rollouts

    async def _launch_once(
        self,
        slot: Slot,
        body: dict[str, Any],
        config: protocol.RolloutConfig,
        *,
        timeout: float | None,  # noqa: ASYNC109 (the rollout's deadline)
        index: int | None,
        session_id: str | None,
        attempt: int,
    ) -> RolloutFuture:
        chosen = session_id is None
        if session_id is None:
            session_id = protocol.new_session_id()
        else:
            self.check_session_id(session_id)
        fut = RolloutFuture(
            session_id=session_id,
            input_id=config.input_id,
            s3_bucket=config.s3_bucket,
            result_key=config.key_for(session_id),
            index=index,
        )
        fut.attempts = attempt
        with self._admission.sending() as task, self._sessions.reserving(session_id):
            try:
                await self._send_in_session(fut, body, task)
            except BaseException:
                if self._joiner is not None:
                    self._joiner.forget(fut)
                raise
        slot.handed_over = True
        limit = self.timeout if timeout is None else timeout
        if chosen:
            fut._resend = (body, config, limit)
        self._follower.follow(fut, limit, elapsed=0.0)
        return fut

    async def _send_in_session(
        self,
        fut: RolloutFuture,
        body: dict[str, Any],
        task: asyncio.Task[Any],
        *,
        priority: Priority | None = None,
    ) -> bool:
        """Send ``fut``'s invocation in its current session: first a token at ``priority``
        (a resend; a first send got its token with its slot), then, once the result store
        answers, its gateway session. False when ``fut`` ended meanwhile (nothing sent).
        On failure a stop is scheduled when the agent may run the session anyway, and
        ``close``'s cancellation of ``task`` becomes ``ClientClosedError``."""
        try:
            if priority is not None:
                await self.rate_limiter.acquire(priority)
            # A result store that is down would read no result: hold rollouts until it
            # answers (the watcher checks it and logs the outage).
            await self._watcher.wait_reachable(fut.s3_bucket)
            if fut.done():
                return False
            if self._joiner is not None:
                await self._joiner.open(fut, body)  # before the agent can call it
            await send_invocation(
                self.transport,
                fut,
                body,
                retry=self.retry,
                limiter=self.rate_limiter,
                counters=self._counters,
                unreachable_after=self.faults.unreachable_after,
                clock=self.faults.clock,
            )
        except BaseException as exc:
            if may_have_started(exc):
                self._stopper.schedule(fut.session_id)
            if isinstance(exc, asyncio.CancelledError):
                self._admission.raise_if_closed_by_us(task)
            raise
        return True

    def _retry_rollout(self, fut: RolloutFuture, error: BaseException) -> bool:
        """The follower's retry policy: run ``fut`` again in a new session when ``error``
        is retryable, the client chose its session id and attempts remain."""
        if fut._resend is None or not self._may_retry(error, fut.attempts, fut.losses):
            return False
        if not self._service.running:
            return False
        body, config, limit = fut._resend
        self._follower.detach(fut)
        if self._joiner is not None:
            self._joiner.forget(fut)  # the given-up session's; the new one opens on resend
        fut.trace = None  # only the final attempt's trace is the rollout's
        logger.warning(
            "rollout %s (input %s) ended retryably (%s); running it again in a new session",
            fut.session_id,
            fut.input_id,
            type(error).__name__,
        )
        fut.previous_sessions.append(fut.session_id)
        fut.session_id = protocol.new_session_id()
        fut.s3_bucket, fut.result_key = config.s3_bucket, config.key_for(fut.session_id)
        fut.attempts += 1
        if is_agent_loss(error):
            fut.losses += 1
            self._counters.lost_retries += 1
        self._counters.rollout_retries += 1
        self._sessions.live[fut.session_id] = fut  # settled by a close meanwhile
        self._service.start_soon(self._resend, fut, body, limit, name="rollout retry")
        return True

    async def _resend(self, fut: RolloutFuture, body: dict[str, Any], limit: float | None) -> None:
        """Send a retried rollout's invocation in its new session, then follow it again."""
        try:
            with self._admission.sending() as task:
                # The new session's own gateway session is opened: its trace is the one kept.
                fut._sending = True
                try:
                    sent = await self._send_in_session(fut, body, task, priority=Priority.RETRY)
                finally:
                    fut._sending = False
                if not sent:
                    return
        except Exception as exc:  # ClientClosedError too: the rollout ends with it
            self._sessions.live.pop(fut.session_id, None)
            self._follower.fail(fut, exc)
            return
        if fut.done():  # cancelled while sending: the session may run
            self._stopper.schedule(fut.session_id)
            if self._joiner is not None:
                self._joiner.forget(fut)  # opened after its outcome's own release
            return
        self._follower.follow(fut, limit, elapsed=max(0.0, time.time() - fut.invoked_at))

    async def _batch(
        self,
        payloads: Iterable[Mapping[str, Any]],
        timeout: float | None,  # noqa: ASYNC109 (the rollout's deadline)
        overrides: Mapping[str, Any],
    ) -> AsyncGenerator[BatchItem, None]:
        """The loop of :meth:`run_batch`: start a :class:`BatchRun` in the client's task
        group and read its items; whatever ends the loop ends the run."""
        await self._ensure_open()
        # Items already queued are taken without a checkpoint, a wait is one plain future:
        # the loop's caller awaits between items anyway.
        items: Handoff[BatchItem | Fed] = Handoff()
        run = BatchRun(self, payloads, timeout, overrides, items)
        try:
            await self._service.start(run.run, name="batch")
            yielded = 0
            fed: Fed | None = None
            while fed is None or yielded < fed.started:
                item = await items.get()
                if item is None:  # the run ended early: the client closed
                    raise ClientClosedError("the client was closed during this batch")
                if isinstance(item, Fed):
                    fed = item
                    continue
                yielded += 1
                yield item
            if fed.error is not None:
                raise fed.error
        finally:
            run.abandon()

    @property
    def gateway_url(self) -> str | None:
        """The URL of the gateway rollouts run through (None without one)."""
        return None if self._joiner is None else self._joiner.link.url

    def trace_of(self, fut: RolloutFuture) -> SessionTrace:
        """The token trace of a rollout run through this client's gateway.

        Available once ``fut`` has succeeded (the trace is then also in S3 beside the
        result, see :meth:`ResultStore.get_trace`). Raises ``ConfigurationError`` when
        the client has no gateway, ``InvalidStateError`` while ``fut`` is pending, and
        the rollout's own error when it failed.

        Example::

            fut = await client.invoke(payload)
            result = await fut
            trajectory = build_trajectory(client.trace_of(fut), reward=result["rewards"][0])
        """
        if self._joiner is None:
            raise ConfigurationError(
                "this client runs no gateway (gateway_url= or gateway=): no traces"
            )
        fut.result()  # raises InvalidStateError, CancelledError or the rollout's error
        if fut.trace is None:
            raise TraceLostError(fut.session_id, "this client did not collect it")
        return fut.trace

    def check_session_id(self, session_id: object) -> str:
        """Return ``session_id`` if this client can use it for a new rollout, else raise.

        ``InvalidRolloutConfig`` when it is not a valid session id (on AgentCore Runtime:
        33-256 letters, digits and hyphens), ``ConfigurationError`` when a pending rollout
        of this client already uses it.

        Example::

            client.check_session_id(protocol.new_session_id())
        """
        return self._sessions.check(session_id)

    async def attach(
        self,
        *,
        session_id: str,
        result_key: str,
        input_id: str | None = None,
        s3_bucket: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 (the rollout's deadline)
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
        self._check_not_closed()
        target = AttachTarget.resolve(
            session_id=session_id,
            result_key=result_key,
            input_id=input_id,
            s3_bucket=self.s3_bucket if s3_bucket is None else s3_bucket,
            check_session_id=self.check_session_id,
        )
        with self._sessions.reserving(target.session_id):
            async with self._slot(token=False) as slot:
                found = await peek_result(self.store, target.s3_bucket, target.result_key)
                slot.handed_over = True  # to the follower, below (no await in between)
        fut = target.future(started_at=started_at)
        if self._joiner is not None:
            self._joiner.attached(fut)  # its trace is collected like an invoked one's
        limit = self.timeout if timeout is None else timeout
        self._follower.follow(
            fut, limit, elapsed=max(0.0, time.time() - fut.invoked_at), found=found
        )
        return fut


def run_batch(
    client: AsyncRolloutClient,
    payloads: Iterable[Mapping[str, Any]],
    *,
    timeout: float | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> AsyncGenerator[BatchItem, None]:
    """``client.run_batch(payloads, timeout=timeout, **overrides)``.

    Example::

        async with contextlib.aclosing(run_batch(client, payloads, timeout=600)) as items:
            async for item in items:
                print(item.index, item.success)
    """
    return client.run_batch(payloads, timeout=timeout, **dict(overrides or {}))
