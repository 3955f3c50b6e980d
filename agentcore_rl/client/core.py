"""ClientCore: what an AsyncRolloutClient is built of and its life.

Once the client has set its public attributes (config, transport, store, limiters), it
wires the parts that run rollouts (watcher, liveness prober, rollouts, groups, gateway
traces), opens them on ``async with`` and closes them in order;
:mod:`agentcore_rl.client.client` puts the public API on top.
"""

from __future__ import annotations

import asyncio
import functools
from typing import TypeVar

import anyio

from agentcore_rl import protocol
from agentcore_rl.client import batch
from agentcore_rl.client.config import (
    Retries,
    Timeouts,
)
from agentcore_rl.client.future import RolloutFuture
from agentcore_rl.client.groups import GroupRunner
from agentcore_rl.client.liveness import (
    ClientLease,
    LivenessConfig,
    LivenessProber,
)
from agentcore_rl.client.outcomes import ClientStats
from agentcore_rl.client.payload import build_invocation
from agentcore_rl.client.rollout import Rollouts, RolloutSpec
from agentcore_rl.client.service import ClientState, Service
from agentcore_rl.client.traces import GatewayLink, TraceJoiner
from agentcore_rl.client.transports import AcrTransport, Transport
from agentcore_rl.client.watcher import CompletionWatcher, WatcherConfig
from agentcore_rl.errors import ClientClosedError
from agentcore_rl.ratelimit import (
    RateLimiter,
    SessionLimiter,
)
from agentcore_rl.s3 import ResultStore

__all__ = ["ClientCore"]

_C = TypeVar("_C", bound="ClientCore")


class ClientCore:
    """The parts and life of an :class:`~agentcore_rl.client.AsyncRolloutClient` (its
    constructor is documented there)."""

    exp_id: str
    s3_bucket: str
    timeouts: Timeouts
    retries: Retries
    liveness: LivenessConfig
    defaults: protocol.RolloutConfig
    store: ResultStore
    transport: Transport
    rate_limiter: RateLimiter
    session_limiter: SessionLimiter
    _owns_store: bool
    _lease: ClientLease | None

    def _build(
        self, link: GatewayLink | None, watcher: WatcherConfig, stop_finished_sessions: bool | None
    ) -> None:
        """Wire the parts that run the rollouts (after the public attributes are set)."""
        self._closed = asyncio.Event()
        self._counters = ClientStats()
        #: Builds a call's body and its validated ``_rollout`` block (no I/O).
        self._prepare: batch.Prepare = functools.partial(build_invocation, self.defaults)
        self._service = Service("agentcore-rl client", setup=self._start_workers)
        self._in_block = False  # inside ``async with`` (entered once at a time)
        self._watcher = CompletionWatcher(self.store, watcher)
        self._joiner = None if link is None else TraceJoiner(link, self.store)
        self._rollouts = Rollouts(
            transport=self.transport,
            limiter=self.rate_limiter,
            slots=self.session_limiter,
            watcher=self._watcher,
            counters=self._counters,
            retries=self.retries,
            service=self._service,
            stop_finished_sessions=stop_finished_sessions,
            unreachable_after=self.liveness.unreachable_after,
            joiner=self._joiner,
        )
        self._prober = LivenessProber(
            self.transport,
            self.rate_limiter,
            self._rollouts.live,
            self._counters,
            config=self.liveness,
        )
        self._groups = GroupRunner(
            exp_id=self.exp_id,
            service=self._service,
            rollouts=self._rollouts,
            prepare=self._prepare,
        )

    def __repr__(self) -> str:
        return (
            f"AsyncRolloutClient(transport={self.transport!r}, exp_id={self.exp_id!r}, "
            f"s3_bucket={self.s3_bucket!r}, state={self._service.state.name}, "
            f"in_flight={len(self._rollouts.live)})"
        )

    async def _close(self) -> None:
        """The body of ``AsyncRolloutClient.aclose``."""
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
                    self._counters.unstopped = self._rollouts.report_unstopped(self.timeouts.close)
                    await self.transport.aclose()
                    if self._joiner is not None:
                        await self._joiner.link.aclose()
                    if self._owns_store:
                        await self.store.aclose()
            finally:
                self._closed.set()

    async def __aenter__(self: _C) -> _C:
        self._service.check_open()
        if self._in_block:
            raise RuntimeError(
                "this AsyncRolloutClient is already entered with 'async with'; it is entered "
                "once (leaving a block closes it): use it inside the first block"
            )
        self._in_block = True
        try:
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
        """Close; the block's exception, if any, goes on as itself."""
        self._in_block = False
        try:
            await self._close()
        finally:
            await self._service.leave()  # the task that entered the task group leaves it

    def _start_workers(self, service: Service) -> None:
        service.start_soon(self._watcher.run, name="completion watcher")
        service.start_soon(self._prober.run, name="liveness prober")
        if self._lease is not None:
            service.start_soon(self._lease.run, name="client lease")

    async def _start(self, spec: RolloutSpec) -> RolloutFuture:
        """Run ``spec``'s rollout as a task of the client's; its future once accepted."""
        await self._service.ensure_open()
        fut: RolloutFuture = await self._service.start(self._rollouts.run, spec, name="rollout")
        return fut

    def _limit(self, timeout: float | None) -> float | None:
        return self.timeouts.rollout if timeout is None else timeout
