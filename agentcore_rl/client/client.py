"""AsyncRolloutClient: start rollouts on agents and get asyncio futures for their results."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
from collections.abc import AsyncGenerator, Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import anyio

from agentcore_rl import protocol
from agentcore_rl.client import batch, preflight
from agentcore_rl.client.agent_calls import AgentCalls
from agentcore_rl.client.batch import BatchItem
from agentcore_rl.client.config import (
    DEFAULT_AWS,
    DEFAULT_INFRA_STOP,
    DEFAULT_LIMITS,
    DEFAULT_RETRIES,
    DEFAULT_TIMEOUTS,
    MOVED_CALL_OPTIONS,
    MOVED_CLIENT_OPTIONS,
    AwsConfig,
    GatewayConfig,
    InfraStop,
    Limits,
    Retries,
    Timeouts,
)
from agentcore_rl.client.future import RolloutFuture
from agentcore_rl.client.group_runner import GroupMethods, GroupRunner
from agentcore_rl.client.liveness import DEFAULT_LIVENESS, ClientLease, LivenessConfig
from agentcore_rl.client.outcomes import ClientStats, InfraWindow
from agentcore_rl.client.payload import (
    attached_config,
    build_invocation,
    client_defaults,
    rollout_extras,
)
from agentcore_rl.client.rollout import Rollouts, RolloutSpec
from agentcore_rl.client.service import ClientState, Service
from agentcore_rl.client.traces import gateway_link
from agentcore_rl.client.transports import AcrTransport, HttpTransport, Transport, make_transport
from agentcore_rl.client.watcher import DEFAULT_WATCHER, CompletionWatcher, WatcherConfig
from agentcore_rl.errors import (
    ClientClosedError,
    ConfigurationError,
    TraceLostError,
)
from agentcore_rl.keywords import check_config_types, checked
from agentcore_rl.ratelimit import (
    DEFAULT_PACE_TICK,
    LocalSessionLimiter,
    RateLimiter,
    SessionLimiter,
    TokenBucket,
)
from agentcore_rl.s3 import ResultStore

if TYPE_CHECKING:
    from agentcore_rl.trace import SessionTrace

__all__ = ["AsyncRolloutClient", "ClientState"]

_C = TypeVar("_C", bound="AsyncRolloutClient")


class AsyncRolloutClient(GroupMethods):
    """Drives rollouts on agents (AgentCore Runtime or plain HTTP) and collects results.

    Give exactly one of ``agent_runtime_arn`` (ACR; region from the ARN) and ``agent_url``
    (one URL or a list; sessions are spread across them). ``s3_bucket`` and ``exp_id``
    locate the results. ``rollout`` goes into every payload's ``_rollout`` block (the
    policy's ``base_url`` and ``model_id``, sampling parameters...); a call's own
    ``rollout=`` overrides its keys.

    The rest is in small config objects (every field: docs/client.md, "Configuration").
    ``store``, ``rate_limiter`` and ``session_limiter`` replace the ones built from them
    (e.g. limits shared by a cluster of clients). With ``gateway`` every rollout runs
    through its own session of a token-capturing gateway, whose trace is put on the
    outcome (``fut.trace``) and in S3 beside the result (docs/gateway.md).

    Each rollout is one task in the client's task group, entered by ``async with`` (once),
    else opened by the first rollout; ``aclose`` ends it.

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
        preflight: bool = True,
        infra_stop: InfraStop | None = DEFAULT_INFRA_STOP,
    ) -> None:
        check_config_types(
            ("limits", limits, Limits),
            ("timeouts", timeouts, Timeouts),
            ("retries", retries, Retries),
            ("watcher", watcher, WatcherConfig),
            ("liveness", liveness, LivenessConfig),
            ("aws", aws, AwsConfig),
            *((("infra_stop", infra_stop, InfraStop),) if infra_stop is not None else ()),
        )
        link = gateway_link(gateway)
        self._gateway, self._preflight = gateway, preflight
        self.defaults = client_defaults(
            rollout, exp_id=exp_id, s3_bucket=s3_bucket, gateway=link is not None
        )
        self._owns_store = store is None
        self.store = store or ResultStore(endpoint_url=aws.s3_endpoint_url)
        self._lease = (
            None if liveness.lease is None else ClientLease(self.store, s3_bucket, exp_id, liveness)
        )
        if self._lease is not None:  # every invocation names it
            extra = {**self.defaults.extra, protocol.LEASE: self._lease.reference}
            self.defaults = dataclasses.replace(self.defaults, extra=extra)
        self.exp_id, self.s3_bucket = exp_id, s3_bucket
        self.limits, self.timeouts, self.retries, self.aws = limits, timeouts, retries, aws
        self.liveness = liveness
        # One AWS session for S3 and the runtime: credentials and endpoint data load once.
        self.transport: Transport = make_transport(
            agent_runtime_arn,
            agent_url,
            aws,
            limits.max_concurrent_sessions,
            session=self.store.session,
        )
        self.rate_limiter: RateLimiter = rate_limiter or TokenBucket(
            limits.tps, limits.burst, tick=DEFAULT_PACE_TICK
        )
        self.session_limiter: SessionLimiter = session_limiter or LocalSessionLimiter(
            limits.max_concurrent_sessions
        )
        self._closed = asyncio.Event()
        self._counters = ClientStats()
        self._prepare: batch.Prepare = functools.partial(build_invocation, self.defaults)
        self._service = Service("agentcore-rl client", setup=self._start_workers)
        self._in_block = False  # inside ``async with`` (entered once at a time)
        calls = AgentCalls(
            transport=self.transport,
            limiter=self.rate_limiter,
            counters=self._counters,
            retries=self.retries,
            service=self._service,
            unreachable_after=liveness.unreachable_after,
        )
        if stop_finished_sessions is None:
            stop_finished_sessions = self.transport.stop_after_result
        self._rollouts = Rollouts(
            calls=calls,
            slots=self.session_limiter,
            watcher=CompletionWatcher(self.store, watcher),
            liveness=liveness,
            stop_finished_sessions=stop_finished_sessions,
            link=link,
            timeout=timeouts.rollout,
            infra=None if infra_stop is None else InfraWindow(**dataclasses.asdict(infra_stop)),
        )
        self._groups = GroupRunner(
            exp_id=self.exp_id,
            service=self._service,
            rollouts=self._rollouts,
            prepare=self._prepare,
        )

    @property
    def state(self) -> ClientState:
        return self._service.state

    @property
    def stop_finished_sessions(self) -> bool:
        return self._rollouts.stop_finished_sessions

    @property
    def stats(self) -> ClientStats:
        """A snapshot of the counters (see :class:`ClientStats`)."""
        outages = self._rollouts.watcher.outages
        return dataclasses.replace(
            self._counters,
            in_flight=self.in_flight,
            unstopped=len(self._rollouts.calls.unstopped),
            s3_requests=dict(self.store.request_counts),
            failures=dict(self._counters.failures),
            store_unreachable=outages.unreachable,
            store_outages=outages.outages,
            degraded_seconds=outages.degraded_seconds,
        )

    @property
    def in_flight(self) -> int:
        """Rollouts with a session under way (sent or accepted) and no outcome yet."""
        return len(self._rollouts.live)

    @checked(moved=MOVED_CALL_OPTIONS, extras="rollout")
    async def invoke(
        self,
        payload: Mapping[str, Any],
        *,
        input_id: str | None = None,
        session_id: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 (the rollout's deadline)
        rollout: Mapping[str, Any] | None = None,
        on_session: Callable[[RolloutFuture], None] | None = None,
        resume: bool = False,
        started_at: float | None = None,
    ) -> RolloutFuture:
        """Start one rollout; return its future once the agent has accepted it.

        Waits for a concurrency slot, then a token. ``_rollout`` is the client's
        ``rollout``, then the payload's own ``_rollout`` keys, then this call's ``rollout``
        and ``input_id`` (default: a fresh time-ordered id). ``session_id`` (the first
        session's; default :func:`~agentcore_rl.protocol.new_session_id`) must not belong to
        a pending rollout of this client. ``timeout``: seconds from the first invocation, or
        from ``started_at`` (epoch seconds); ``math.inf`` for none.

        A retryable outcome (see :class:`Retries`) runs the rollout again in a new
        session; the future's ``session_id`` and ``result_key`` then name the new one.
        ``on_session(fut)`` is called before each session's invocation is sent: journal
        ``fut.session_id`` and ``fut.result_key`` there to find the rollout again from
        another process. ``resume``: an earlier process may have sent this session already:
        its result is read first, else the invocation is sent marked as a repeat, which an
        agent still running it does not run twice.

        Raises ``InvalidPayloadError`` for a bad payload, ``rollout`` key or session id,
        ``ConfigurationError`` for a session id pending here, ``InvocationError`` when the
        agent refused or could not be reached, ``ClientClosedError`` after ``aclose``.
        """
        body, config = self._prepare(payload, input_id=input_id, overrides=rollout_extras(rollout))
        if session_id is not None:
            self._rollouts.check_session_id(session_id)
        spec = RolloutSpec(
            body=body,
            config=config,
            timeout=self._rollouts.timeout_for(timeout),
            session_id=session_id,
            resume=resume,
            started_at=started_at,
            on_session=on_session,
        )
        return await self._start(spec)

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

        Nothing is sent to the agent; outcome, timeout (from ``started_at``, default now)
        and stops are those of an invoked rollout. It holds a concurrency slot until its
        outcome (it does run on an agent), but takes no token. A result already there (even
        past the deadline) resolves the future before it is returned. ``input_id`` defaults
        to the one in the key; ``s3_bucket`` to the client's.
        """
        self._service.check_open()
        sid = self._rollouts.check_session_id(session_id)
        bucket = self.s3_bucket if s3_bucket is None else s3_bucket
        config = attached_config(self.defaults, sid, result_key, input_id, bucket)
        bucket = config.s3_bucket
        spec = RolloutSpec(
            body={},
            config=config,
            timeout=self._rollouts.timeout_for(timeout),
            session_id=sid,
            key=(bucket, result_key),
            attach=True,
            retry=False,
            started_at=started_at,
        )
        return await self._start(spec)

    @checked(moved=MOVED_CALL_OPTIONS, extras="rollout")
    def run_batch(
        self,
        payloads: Iterable[Mapping[str, Any]],
        *,
        timeout: float | None = None,
        rollout: Mapping[str, Any] | None = None,
    ) -> AsyncGenerator[BatchItem, None]:
        """Run many rollouts; iterate over :class:`BatchItem` in completion order.

        Never raises for one rollout (its item carries the error). Unless the payload's
        ``_rollout`` or ``rollout`` name one, ``input_id`` is the payload's ``input_id`` or
        ``id`` field, else its index zero-padded to 6 digits (``"000017"``). The work runs in
        the client's task group and the loop only reads its items: leaving the loop stops
        every live session the batch started (at once with ``aclosing``, else when the
        generator is finalized). Raises ``ClientClosedError`` when the client closes meanwhile.
        """
        self._service.check_open()
        prepare = functools.partial(self._prepare, input_id=None, overrides=rollout_extras(rollout))
        return batch.run_batch(
            self._service, self._rollouts, prepare, payloads, self._rollouts.timeout_for(timeout)
        )

    @property
    def gateway_url(self) -> str | None:
        return None if self._rollouts.joiner is None else self._rollouts.joiner.link.url

    def trace_of(self, fut: RolloutFuture) -> SessionTrace:
        """The token trace of a rollout that succeeded through this client's gateway (also in
        S3 beside the result). Raises ``ConfigurationError`` without a gateway,
        ``InvalidStateError`` while ``fut`` is pending, and the rollout's own error."""
        if self._rollouts.joiner is None:
            raise ConfigurationError(
                "this client runs no gateway (gateway=GatewayConfig(...)): no traces"
            )
        fut.result()  # raises InvalidStateError, CancelledError or the rollout's error
        if fut.trace is None:
            raise TraceLostError(fut.session_id, "this client did not collect it")
        return fut.trace

    async def check_services(self) -> None:
        """One cheap call to each service (the S3 bucket, the runtime or each agent's
        ``/ping``, a remote gateway's health and token), each connecting within
        ``timeouts.check`` seconds. Raises the ``StorageError``, ``InvocationError`` or
        ``GatewayError`` naming the one that fails."""
        within, session = self.timeouts.check, self.store.session
        store = self.store
        await preflight.check_bucket(
            self.s3_bucket, store.endpoint_url, store.region_name, session, within
        )
        if isinstance(self.transport, AcrTransport):
            arn, endpoint = self.transport.agent_runtime_arn, self.transport.endpoint_url
            await preflight.check_runtime(arn, endpoint, session, within)
        elif isinstance(self.transport, HttpTransport):
            await preflight.check_agents(self.transport.urls, within)
        if self._gateway is not None and self._gateway.app is None:
            await preflight.check_gateway(self._gateway.url, self._gateway.admin_token, within)

    def stop_session(self, session_id: str) -> None:
        """Stop ``session_id`` on its agent in the background (e.g. one an earlier process
        could not stop: see :attr:`unstopped_sessions`), behind every invocation."""
        self._rollouts.calls.stop_soon(session_id)

    @property
    def unstopped_sessions(self) -> list[str]:
        """Session ids this client meant to stop and could not (the stop failed, or
        ``aclose`` ran out of ``timeouts.close``): they may still run on their agents."""
        return list(self._rollouts.calls.unstopped)

    async def aclose(self) -> None:
        """End pending rollouts with ``ClientClosedError`` and stop their sessions within
        ``timeouts.close`` seconds (the rest are listed in :attr:`unstopped_sessions`), then
        release everything. Idempotent; a closed client cannot be used again."""
        if self._service.state is ClientState.CLOSED:
            await self._closed.wait()
            return
        self._service.state = ClientState.CLOSED
        self._rollouts.close()  # first: no group member starts again
        self._groups.close(ClientClosedError("the client was closed before this group finished"))
        try:
            with anyio.move_on_after(self.timeouts.close):
                await self._rollouts.wait_closed()
        finally:
            try:
                # Shielded: a close that was itself cancelled still ends the work it owns.
                with anyio.CancelScope(shield=True):
                    await self._service.aclose()
                    self._rollouts.calls.report_unstopped(self.timeouts.close)
                    await self.transport.aclose()
                    if self._rollouts.joiner is not None:
                        await self._rollouts.joiner.link.aclose()
                    if self._owns_store:
                        await self.store.aclose()
            finally:
                self._closed.set()

    def __repr__(self) -> str:
        return (
            f"AsyncRolloutClient(transport={self.transport!r}, exp_id={self.exp_id!r}, "
            f"s3_bucket={self.s3_bucket!r}, state={self._service.state.name}, "
            f"in_flight={len(self._rollouts.live)})"
        )

    async def __aenter__(self: _C) -> _C:
        self._service.check_open()
        if self._in_block:
            raise RuntimeError(
                "this AsyncRolloutClient is already entered with 'async with'; it is entered "
                "once (leaving a block closes it): use it inside the first block"
            )
        self._in_block = True
        try:
            if self._preflight:
                await self.check_services()
            if await self._service.enter():
                # The S3 client now rather than in the first watcher round, so the first
                # results are not detected late (short timeouts would fire first).
                await self.store.__aenter__()
                if isinstance(self.transport, AcrTransport):
                    await self.transport.connect()
        except BaseException:
            await self.__aexit__(None, None, None)
            raise
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self._in_block = False
        try:
            await self.aclose()
        finally:
            await self._service.leave()  # the task that entered the task group leaves it

    def _start_workers(self, service: Service) -> None:
        service.start_soon(self._rollouts.watcher.run, name="completion watcher")
        service.start_soon(self._rollouts.prober.run, name="liveness prober")
        if self._lease is not None:
            service.start_soon(self._lease.run, name="client lease")

    async def _start(self, spec: RolloutSpec) -> RolloutFuture:
        await self._service.ensure_open()
        fut: RolloutFuture = await self._service.start(self._rollouts.run, spec, name="rollout")
        return fut
