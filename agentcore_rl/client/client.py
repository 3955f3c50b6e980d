"""AsyncRolloutClient: start rollouts on agents and get asyncio futures for their results."""

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
    DEFAULT_AWS,
    DEFAULT_LIMITS,
    DEFAULT_RETRIES,
    DEFAULT_TIMEOUTS,
    MOVED_CALL_OPTIONS,
    MOVED_CLIENT_OPTIONS,
    MOVED_GROUP_OPTIONS,
    AwsConfig,
    GatewayConfig,
    Limits,
    Retries,
    Timeouts,
)
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
from agentcore_rl.client.outcomes import is_agent_loss, is_retryable
from agentcore_rl.client.payload import build_invocation, rollout_extras
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
from agentcore_rl.groups import GroupRules, RolloutGroup
from agentcore_rl.keywords import check_config_types, checked
from agentcore_rl.ratelimit import DEFAULT_PACE_TICK, Priority, RateLimiter, TokenBucket
from agentcore_rl.s3 import ResultStore
from agentcore_rl.sessionlimit import LocalSessionLimiter, SessionLimiter

if TYPE_CHECKING:
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

    Give exactly one of ``agent_runtime_arn`` (ACR; region from the ARN) and ``agent_url``
    (one URL or a list; sessions are spread across them). ``s3_bucket`` and ``exp_id``
    locate the results. ``rollout`` goes into every payload's ``_rollout`` block (the
    policy's ``base_url`` and ``model_id``, sampling parameters...); a call's own
    ``rollout=`` overrides its keys.

    The rest is grouped in small config objects (:mod:`agentcore_rl.client.config`):
    ``limits`` (:class:`Limits`: rollouts at once, the token bucket shared by invocations,
    probes and stop calls), ``timeouts`` (:class:`Timeouts`: a rollout's, closing's),
    ``retries`` (:class:`Retries`: of one call, of retryable rollouts, of lost ones),
    ``watcher`` (:class:`WatcherConfig`: polling S3 for results), ``liveness``
    (:class:`LivenessConfig`: probing for crashed agents, giving up on unreachable ones,
    the client's own lease that lets agents cancel its rollouts if it dies) and ``aws``
    (:class:`AwsConfig`: endpoints, the runtime qualifier). ``store`` (a
    :class:`~agentcore_rl.s3.ResultStore`, else one from ``aws``) reads the results;
    ``rate_limiter`` and ``session_limiter`` replace the local ones built from ``limits``,
    e.g. with limits shared by a cluster of clients. ``stop_finished_sessions`` (default:
    the transport's choice, True for ACR) sends a stop call after each result.

    Token capture: with ``gateway`` (:class:`GatewayConfig`) each rollout's session is
    opened at the gateway before the invocation and its ``_rollout`` gets ``base_url`` =
    the session's gateway URL and ``api_key`` = its session id. When the result arrives
    the session is finished, its trace written to S3 beside the result
    (``...{session_id}.trace.json.gz``) and put on the outcome (``fut.trace``,
    ``BatchItem.trace``, :meth:`trace_of`); a trace that cannot be had ends the rollout in
    ``TraceLostError``.

    Background work (the S3 watcher, stop calls, batches) belongs to the client's task
    group: entered by ``async with`` (once: nesting is refused), else opened by the first
    rollout; ``aclose`` ends it. An exception raised inside the block leaves it as itself.

    Example::

        async with AsyncRolloutClient(
            agent_runtime_arn="arn:aws:bedrock-agentcore:us-west-2:123456789012:runtime/math",
            s3_bucket="my-rollouts", exp_id="grpo-step-17",
            rollout={"base_url": "http://vllm:8000/v1", "model_id": "qwen3", "temperature": 0.7},
            limits=Limits(max_concurrent_sessions=500, tps=25.0),
        ) as client:
            fut = await client.invoke({"prompt": "2+2?"}, input_id="q-1")
            result = await fut                      # or client.rollout(payload) in one go
            async for item in client.run_batch(payloads, timeout=900):
                print(item.index, item.success, item.error)
            async for group in client.run_groups(payloads, rules=GroupRules(n=8)):
                rows.extend(group_rows(group, "mean_std"))
    """

    @checked(moved=MOVED_CLIENT_OPTIONS)
    def __init__(
        self,
        *,
        agent_runtime_arn: str | None = None,
        agent_url: str | Sequence[str] | None = None,
        s3_bucket: str,
        exp_id: str,
        rollout: Mapping[str, Any] | None = None,
        limits: Limits = DEFAULT_LIMITS,
        timeouts: Timeouts = DEFAULT_TIMEOUTS,
        retries: Retries = DEFAULT_RETRIES,
        watcher: WatcherConfig = DEFAULT_WATCHER,
        liveness: LivenessConfig = DEFAULT_LIVENESS,
        aws: AwsConfig = DEFAULT_AWS,
        store: ResultStore | None = None,
        rate_limiter: RateLimiter | None = None,
        session_limiter: SessionLimiter | None = None,
        stop_finished_sessions: bool | None = None,
        gateway: GatewayConfig | None = None,
    ) -> None:
        if (agent_runtime_arn is None) == (agent_url is None):
            raise ConfigurationError(
                "give exactly one of agent_runtime_arn (AgentCore Runtime) and agent_url "
                "(agent servers over HTTP)"
            )
        check_config_types(
            ("limits", limits, Limits),
            ("timeouts", timeouts, Timeouts),
            ("retries", retries, Retries),
            ("watcher", watcher, WatcherConfig),
            ("liveness", liveness, LivenessConfig),
            ("aws", aws, AwsConfig),
        )
        if gateway is not None and not isinstance(gateway, GatewayConfig):
            raise ConfigurationError(
                f"gateway must be a GatewayConfig, got {type(gateway).__name__} "
                "(an in-process gateway: GatewayConfig(url=..., app=gateway))"
            )
        try:
            extra = dict(rollout_extras(rollout))
        except InvalidRolloutConfig as exc:
            raise ConfigurationError(str(exc)) from exc
        for name in (protocol.EXP_ID, protocol.S3_BUCKET, protocol.INPUT_ID):
            if name in extra:
                where = "each call's input_id=" if name == protocol.INPUT_ID else f"{name}="
                raise ConfigurationError(f"rollout= cannot set {name!r}: give it as {where}")
        link = gateway_link(gateway)
        if link is not None and protocol.BASE_URL in extra:
            raise ConfigurationError(
                "give rollout={'base_url': ...} or a gateway, not both: through a gateway each "
                "rollout's base_url is its session's gateway URL (the gateway's --upstream "
                "is the policy)"
            )
        try:
            self.defaults = protocol.RolloutConfig.from_dict(
                {
                    **extra,
                    protocol.EXP_ID: exp_id,
                    protocol.INPUT_ID: "placeholder",
                    protocol.S3_BUCKET: s3_bucket,
                }
            )
        except InvalidRolloutConfig as exc:
            raise ConfigurationError(str(exc)) from exc
        self.exp_id = exp_id
        self.s3_bucket = s3_bucket
        self.limits = limits
        self.timeouts = timeouts
        self.retries = retries
        self.aws = aws
        connections = min(limits.max_concurrent_sessions, DEFAULT_MAX_CONNECTIONS)
        self.transport: Transport
        if agent_runtime_arn is not None:
            self.transport = AcrTransport(
                agent_runtime_arn,
                endpoint_url=aws.endpoint_url,
                qualifier=aws.qualifier,
                max_connections=connections,
            )
        else:
            assert agent_url is not None
            self.transport = HttpTransport(agent_url, max_connections=connections)
        self._owns_store = store is None
        self.store = store or ResultStore(endpoint_url=aws.s3_endpoint_url)
        self.liveness = liveness
        self._lease = (
            None if liveness.lease is None else ClientLease(self.store, s3_bucket, exp_id, liveness)
        )
        if self._lease is not None:  # every invocation names it
            extra = {**self.defaults.extra, protocol.LEASE: self._lease.reference}
            self.defaults = dataclasses.replace(self.defaults, extra=extra)
        self.rate_limiter: RateLimiter = rate_limiter or TokenBucket(
            limits.tps, limits.burst, tick=DEFAULT_PACE_TICK
        )
        self.session_limiter: SessionLimiter = session_limiter or LocalSessionLimiter(
            limits.max_concurrent_sessions
        )
        self._state = ClientState.UNOPENED
        self._entered = False  # the service was entered by ``async with`` (not hosted)
        self._in_block = False  # inside ``async with`` (entered once at a time)
        self._closed = asyncio.Event()
        self._counters = ClientCounters()
        self._admission = Admission(self.session_limiter, self.rate_limiter)
        self._sessions = PendingSessions(acr=isinstance(self.transport, AcrTransport))
        self._watcher = CompletionWatcher(self.store, watcher, run_by_owner=True)
        self._joiner = None if link is None else TraceJoiner(link, self.store)
        self._stopper = SessionStopper(
            self.transport,
            self.rate_limiter,
            retries.call,
            self._counters,
            workers=limits.stop_workers,
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

    @checked(moved=MOVED_CALL_OPTIONS, extras="rollout")
    async def invoke(
        self,
        payload: Mapping[str, Any],
        *,
        input_id: str | None = None,
        session_id: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 (the rollout's deadline)
        rollout: Mapping[str, Any] | None = None,
    ) -> RolloutFuture:
        """Start one rollout; return its future once the agent has accepted it.

        Waits for a concurrency slot, then a token. ``_rollout`` is the client's
        ``rollout``, then the payload's own ``_rollout`` keys, then this call's ``rollout``
        and ``input_id``.
        ``input_id`` defaults to a fresh time-ordered id. ``session_id`` defaults to a fresh
        :func:`~agentcore_rl.protocol.new_session_id`; choose one to know the result key
        before the call (``config.key_for(session_id)``) or to retry an invocation the
        agent may already run (it runs one rollout per session and result key). It must
        be letters, digits and hyphens, 33-256 characters on AgentCore Runtime, and not
        belong to a pending rollout of this client. ``timeout`` (seconds from acceptance;
        ``math.inf`` for none) overrides the client's. Raises ``InvalidPayloadError``
        (``InvalidRolloutConfig``) for a bad payload, ``rollout`` key or session id,
        ``ConfigurationError`` for a session id already pending here, ``InvocationError``
        when the agent refused or could not be reached, ``ClientClosedError`` after
        ``aclose``.
        """
        overrides = rollout_extras(rollout)
        body, config = self._prepare(payload, input_id=input_id, overrides=overrides)
        if session_id is not None:
            self.check_session_id(session_id)
        async with self._slot() as slot:
            return await self._launch(slot, body, config, timeout=timeout, session_id=session_id)

    @checked(moved=MOVED_CALL_OPTIONS, extras="rollout")
    async def rollout(
        self,
        payload: Mapping[str, Any],
        *,
        input_id: str | None = None,
        session_id: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 (the rollout's deadline)
        rollout: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """``invoke`` and wait for the outcome: the result dict, or its exception."""
        fut = await self.invoke(
            payload, input_id=input_id, session_id=session_id, timeout=timeout, rollout=rollout
        )
        return await fut

    @checked(moved=MOVED_CALL_OPTIONS, extras="rollout")
    def run_batch(
        self,
        payloads: Iterable[Mapping[str, Any]],
        *,
        timeout: float | None = None,
        rollout: Mapping[str, Any] | None = None,
    ) -> AsyncGenerator[BatchItem, None]:
        """Run many rollouts; iterate over :class:`BatchItem` in completion order.

        Never raises for one rollout (its item carries the error). The default
        ``input_id`` is the payload's index, zero-padded to 6 digits (``"000017"``),
        unless the payload's ``_rollout`` or ``rollout`` name one; ``rollout`` is as in
        :meth:`invoke`, for each payload. The work runs in the
        client's task group and the loop only reads its items: leaving the loop early
        stops every live session the batch started (at once with ``aclosing``, else when
        the dropped generator is finalized, which CPython does immediately); a loop
        abandoned without either leaves its rollouts to run until ``aclose``. Raises
        ``ClientClosedError`` (after the items of the rollouts already started) when the
        client closes meanwhile.
        """
        self._check_not_closed()
        return self._batch(payloads, timeout, rollout_extras(rollout))

    # --- GRPO groups (the work is in client/groups.py) -------------------------------------

    @checked(moved=MOVED_GROUP_OPTIONS, extras="rollout")
    async def invoke_group(
        self,
        payload: Mapping[str, Any],
        *,
        rules: GroupRules,
        input_id: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 (each member's deadline)
        rollout: Mapping[str, Any] | None = None,
    ) -> GroupFuture:
        """Start a GRPO group of ``rules.n`` rollouts of ``payload``; return its future once
        its members are admitted (``n + redundancy`` slots taken).

        ``input_id`` is the group key (default: a fresh id): member session ids derive
        from it, so each group of an experiment needs its own. ``rules``
        (:class:`~agentcore_rl.groups.GroupRules`) say how many members, how failures are
        retried and when the group counts as whole. The future ends in a
        :class:`~agentcore_rl.groups.RolloutGroup`, a ``GroupDroppedError``
        (``StaleGroupError`` after :meth:`advance_policy`) or ``ClientClosedError``;
        cancelling it stops the members. ``timeout`` and ``rollout`` are as in
        :meth:`invoke`, for each member.
        """
        _check_rules(rules)
        return await self._groups.open(
            payload,
            rules=rules,
            input_id=input_id,
            timeout=timeout,
            overrides=rollout_extras(rollout),
        )

    @checked(moved=MOVED_GROUP_OPTIONS, extras="rollout")
    def run_groups(
        self,
        payloads: Iterable[Mapping[str, Any]],
        *,
        rules: GroupRules,
        timeout: float | None = None,
        rollout: Mapping[str, Any] | None = None,
    ) -> AsyncGenerator[RolloutGroup, None]:
        """Run a group per payload (``rules`` as in :meth:`invoke_group`); yield the whole
        groups in completion order.

        Dropped groups are not yielded: each is counted by reason in :attr:`group_stats`
        (and logged). The default ``input_id`` is the payload's index, zero-padded to 6
        digits, unless its ``_rollout`` names one. The work runs in the client's task group,
        as :meth:`run_batch`'s does; leaving the loop stops the groups still running.
        """
        self._check_not_closed()
        _check_rules(rules)
        options = {"rules": rules, "timeout": timeout, "overrides": rollout_extras(rollout)}
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
        """
        self._groups.set_policy_version(version)

    def advance_policy(self, version: int, *, max_staleness: int) -> int:
        """Move to ``version`` and stop every open group with a member started under a
        version older than ``version - max_staleness``: their futures end in
        ``StaleGroupError`` (counted under ``groups_dropped["stale"]``). Returns how many.
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
        sessions (all within ``timeouts.close`` seconds, as fast as the rate limiter
        allows), end the client's background work and release everything. Sessions not
        stopped in time are not waited for: :attr:`unstopped_sessions` lists them (and
        ``stats.unstopped`` counts them). Idempotent; a closed client cannot be used
        again.
        """
        if self._state is ClientState.CLOSED:
            await self._closed.wait()
            return
        self._state = ClientState.CLOSED
        self._admission.close()
        self._groups.close(ClientClosedError("the client was closed before this group finished"))
        try:
            # One deadline for both waits: timeouts.close bounds the whole close.
            with anyio.move_on_after(self.timeouts.close) as waiting:
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
        ``aclose`` ran out of ``timeouts.close``): they may still run on their agents."""
        return list(self._stopper.unstopped)

    def _report_unstopped(self) -> None:
        unstopped = self._stopper.unstopped
        self._counters.unstopped = len(unstopped)
        if unstopped:
            logger.warning(
                "%d session(s) could not be stopped (within %s s of closing, or their stop "
                "failed) and may still run: client.unstopped_sessions lists them, e.g. %s",
                len(unstopped),
                self.timeouts.close,
                ", ".join(unstopped[:3]),
            )

    async def __aenter__(self) -> AsyncRolloutClient:
        self._check_not_closed()
        if self._in_block:
            raise RuntimeError(
                "this AsyncRolloutClient is already entered with 'async with'; a client is "
                "entered once (leaving a block closes it): use it inside the first block"
            )
        self._in_block = True
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
                self._in_block = False
                await self._exit_service()
                raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._in_block = False
        await self._exit_service()
        # The block's exception, if any, goes on as itself.

    async def _exit_service(self) -> None:
        """Close, then leave the task group this task entered (anyio: the same task)."""
        try:
            await self.aclose()
        finally:
            if self._entered:
                self._entered = False
                await self._service.__aexit__(None, None, None)

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
        tried again in a new session, up to ``retries.rollouts`` times, and so is a retryable
        outcome after acceptance (an agent loss up to ``retries.lost`` times; see
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
            return losses < self.retries.lost
        return attempt - losses <= self.retries.rollouts

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
        limit = self.timeouts.rollout if timeout is None else timeout
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
                retry=self.retries.call,
                limiter=self.rate_limiter,
                counters=self._counters,
                unreachable_after=self.liveness.unreachable_after,
                clock=self.liveness.clock,
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
        """
        if self._joiner is None:
            raise ConfigurationError(
                "this client runs no gateway (gateway=GatewayConfig(...)): no traces"
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
        limit = self.timeouts.rollout if timeout is None else timeout
        self._follower.follow(
            fut, limit, elapsed=max(0.0, time.time() - fut.invoked_at), found=found
        )
        return fut


@checked(moved=MOVED_CALL_OPTIONS, extras="rollout")
def run_batch(
    client: AsyncRolloutClient,
    payloads: Iterable[Mapping[str, Any]],
    *,
    timeout: float | None = None,
    rollout: Mapping[str, Any] | None = None,
) -> AsyncGenerator[BatchItem, None]:
    """``client.run_batch(payloads, timeout=timeout, rollout=rollout)``.

    Example::

        async with contextlib.aclosing(run_batch(client, payloads, timeout=600)) as items:
            async for item in items:
                print(item.index, item.success)
    """
    return client.run_batch(payloads, timeout=timeout, rollout=rollout)


def _check_rules(rules: object) -> None:
    if not isinstance(rules, GroupRules):
        raise ConfigurationError(
            f"rules must be a GroupRules, e.g. rules=GroupRules(n=8), got {rules!r:.80}"
        )
