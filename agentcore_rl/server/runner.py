"""RolloutRunner: owned tasks that run rollout handlers to exactly one envelope each.

Without the lifespan's task group (an app mounted where no lifespan runs) the response's
background task runs the job. Jobs are indexed by session (for ``/sessions/{id}/stop``) and
by result key (so a retried invocation does not start a second copy).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Final

import anyio
from anyio.abc import TaskGroup

from agentcore_rl import protocol
from agentcore_rl.server.envelope import (
    SHUTDOWN_REASON,
    Failure,
    cancelled,
    envelope_bytes,
    judge,
    raised,
)
from agentcore_rl.server.invoke import HandlerSpec, RequestContext, call_handler
from agentcore_rl.server.spool import Spool

__all__ = ["RolloutJob", "RolloutRunner", "ShutdownReport"]

logger = logging.getLogger(__name__)

#: Finished sessions remembered for status probes: at 100 rollouts/s, the last 100 s.
DEFAULT_REMEMBERED_SESSIONS: Final = 10_000


@dataclass(eq=False)
class RolloutJob:
    """One accepted rollout: its inputs, its task and how far it got."""

    context: RequestContext
    payload: dict[str, Any]
    started_at: float
    spec: HandlerSpec
    limiter: anyio.CapacityLimiter
    # Cancelled once (edge-triggered), so a handler may catch it and await its cleanup.
    task: asyncio.Task[Any] | None = None
    cancel_reason: str | None = None
    # A digest for the envelope's "payload" field instead of the payload.
    envelope_payload: dict[str, Any] | None = None
    check_existing: bool = False
    checking: bool = False
    handler_done: bool = False
    # The envelope claimed for delivery, so no job is ever written twice.
    body: bytes | None = None
    delivered: bool = False
    # Cost fields; another start meanwhile means the process CPU is not this job's alone.
    began: float = field(default_factory=time.monotonic)
    cpu_began: float = field(default_factory=time.process_time)
    start_count: int | None = None
    _done: asyncio.Event = field(default_factory=asyncio.Event, repr=False)

    @property
    def session_id(self) -> str:
        return self.context.session_id

    @property
    def target(self) -> tuple[str, str] | None:
        """``(bucket, key)`` of its envelope, None if the payload named no S3 location."""
        config = self.context.rollout
        return None if config is None else (config.s3_bucket, config.key_for(self.session_id))

    def cancel(self, reason: str) -> bool:
        """Ask the handler to stop; True if it was still running."""
        if self.handler_done:
            return False
        if self.cancel_reason is None:
            self.cancel_reason = reason
            # An unstarted task checks cancel_reason itself; cancelling it would skip its envelope.
            if self.task is not None:
                self.task.cancel(reason)
        return True


@dataclass(frozen=True)
class ShutdownReport:
    """What :meth:`RolloutRunner.shutdown` did."""

    finished: int
    cancelled: int
    stuck: int


class RolloutRunner:
    """Runs rollout handlers as owned tasks and delivers one envelope per rollout.

    ``exists`` is asked before a marked re-send (``_rollout.repeat``) runs: an earlier run's
    envelope wins. The last ``remember`` finished sessions are kept so a status probe racing
    the client's read of a fresh envelope hears ``finished``.
    """

    def __init__(
        self,
        *,
        spool: Spool,
        clock: Callable[[], float],
        exists: Callable[[str, str], Awaitable[bool]],
        remember: int = DEFAULT_REMEMBERED_SESSIONS,
    ) -> None:
        self._spool = spool
        self._clock = clock
        self._exists = exists
        self._remember = remember
        self._finished: dict[str, tuple[str, ...]] = {}
        self._starts = 0
        self._jobs: set[RolloutJob] = set()
        self._by_session: dict[str, set[RolloutJob]] = {}
        self._tasks: TaskGroup | None = None
        self._closed = False

    @property
    def active(self) -> int:
        """Rollouts accepted and not yet delivered."""
        return len(self._jobs)

    @property
    def jobs(self) -> frozenset[RolloutJob]:
        return frozenset(self._jobs)

    def attach(self, tasks: TaskGroup | None) -> None:
        """Run future jobs in ``tasks``, which must outlive them; ``None`` detaches."""
        self._tasks = tasks

    def find(self, bucket: str, key: str) -> RolloutJob | None:
        """The running rollout that will write ``s3://bucket/key``, if any."""
        session_jobs = self._by_session.get(protocol.parse_result_key(key)[2], ())
        return next((job for job in session_jobs if job.target == (bucket, key)), None)

    def start(
        self,
        spec: HandlerSpec,
        payload: dict[str, Any],
        context: RequestContext,
        *,
        limiter: anyio.CapacityLimiter,
        envelope_payload: dict[str, Any] | None = None,
        check_existing: bool = False,
    ) -> RolloutJob:
        """Accept a rollout; without an attached task group the caller awaits ``run(job)``."""
        if self._closed:
            raise RuntimeError("the rollout runner is shut down")
        job = RolloutJob(
            context=context,
            payload=payload,
            started_at=self._clock(),
            spec=spec,
            limiter=limiter,
            envelope_payload=envelope_payload,
            check_existing=check_existing,
        )
        if self._tasks is not None:
            self._tasks.start_soon(self.run, job, name=f"rollout {context.session_id}")
        self._starts += 1
        job.start_count = self._starts if not self._jobs else None  # alone, so far
        self._jobs.add(job)
        self._by_session.setdefault(job.session_id, set()).add(job)
        return job

    def remember_finished(self, session_id: str, key: str) -> None:
        """Record that the session's rollout writing ``key`` has finished (or is spooled)."""
        keys = self._finished.pop(session_id, ())
        self._finished[session_id] = (*keys, key) if key not in keys else keys
        if len(self._finished) > self._remember:
            del self._finished[next(iter(self._finished))]

    def session_state(self, session_id: str) -> dict[str, Any]:
        """What this server knows of a session: the ``/sessions/{id}`` answer."""
        if session_id in self._by_session:
            running = sorted(
                target[1] for job in self._by_session[session_id] if (target := job.target)
            )
            return protocol.session_status(session_id, protocol.SessionState.RUNNING, running)
        finished = self._finished.get(session_id)
        if finished:
            state = protocol.SessionState.FINISHED
            return protocol.session_status(session_id, state, sorted(finished))
        return protocol.session_status(session_id, protocol.SessionState.UNKNOWN)

    def _forget(self, job: RolloutJob) -> None:
        target = job.target
        if job.delivered and target is not None:
            self.remember_finished(job.session_id, target[1])
        self._jobs.discard(job)
        session_jobs = self._by_session.get(job.session_id)
        if session_jobs is not None:
            session_jobs.discard(job)
            if not session_jobs:
                del self._by_session[job.session_id]
        job._done.set()

    def _envelope(
        self, job: RolloutJob, result: object, failure: Failure | None
    ) -> tuple[bytes | None, Failure | None]:
        """The envelope's bytes (None without an S3 location) and the failure it reports."""
        failure = failure or judge(result)
        config = job.context.rollout
        if config is None:
            return None, failure
        alone = job.start_count == self._starts
        metadata = {
            protocol.STARTED_AT: job.started_at,
            protocol.FINISHED_AT: self._clock(),
            protocol.PAYLOAD: dict(job.envelope_payload or job.payload),
            protocol.RUNTIME_SECONDS: round(time.monotonic() - job.began, 6),
            protocol.CPU_SECONDS: round(time.process_time() - job.cpu_began, 6) if alone else None,
        }
        return envelope_bytes(config, job.session_id, metadata, result, failure)

    async def run(self, job: RolloutJob) -> None:
        """Run an accepted job to its one envelope."""
        job.task = asyncio.current_task()
        foreign_cancel: asyncio.CancelledError | None = None
        result: object = None
        failure: Failure | None = None
        try:
            try:
                if job.cancel_reason is not None:
                    raise asyncio.CancelledError(job.cancel_reason)
                if await self._already_written(job):
                    return
                result = await call_handler(job.spec, job.payload, job.context, limiter=job.limiter)
            except asyncio.CancelledError as exc:
                if job.cancel_reason is None:
                    # Not our stop: the event loop is going away; re-raised at the end.
                    foreign_cancel = exc
                    job.cancel_reason = "the event loop is shutting down"
                elif uncancel := getattr(asyncio.current_task(), "uncancel", None):
                    uncancel()  # handled: timeouts in the envelope write must not count it
                if job.checking:
                    # An existing envelope still beats "cancelled"; shielded as the
                    # owner's task group may be the one cancelling.
                    with anyio.CancelScope(shield=True):
                        if await self._already_written(job):
                            return
                failure = cancelled(job.cancel_reason)
            except Exception as exc:
                failure = raised(exc)
                if failure.traceback is not None:
                    logger.error(
                        "rollout handler %s raised in session %s: %s\n%s",
                        job.spec.name,
                        job.session_id,
                        failure.reason,
                        failure.traceback,
                    )
            body, failure = self._envelope(job, result, failure)
            job.handler_done = True
            # Shielded so the envelope is written under cancellation; store retries bound it.
            with anyio.CancelScope(shield=True):
                if failure is not None and failure.error_type == protocol.ERROR_CANCELLED:
                    # On a mass cancel, let every handler end before the writes' CPU.
                    await anyio.lowlevel.checkpoint()
                await self._deliver(job, body, failure)
        finally:
            self._forget(job)
            if foreign_cancel is not None:
                raise foreign_cancel

    async def _already_written(self, job: RolloutJob) -> bool:
        """Whether the job's key already holds an envelope (the job is then done)."""
        if job.target is None or not job.check_existing:
            return False
        bucket, key = job.target
        # Left set if the check is cancelled, so the stop path knows to check again.
        job.checking = True
        try:
            found = self._spool.holds(bucket, key) or await self._exists(bucket, key)
        except Exception as exc:
            # Running twice beats never running: S3 trouble does not block the rollout.
            logger.warning("could not check s3://%s/%s before running: %s", bucket, key, exc)
            found = False
        job.checking = False
        if found:
            logger.info(
                "s3://%s/%s already holds this rollout's envelope (an earlier run's); "
                "not running it again",
                bucket,
                key,
            )
            job.handler_done = job.delivered = True
            job.body = b""
        return found

    async def _deliver(self, job: RolloutJob, body: bytes | None, failure: Failure | None) -> None:
        if job.body is not None or job.delivered:
            return  # the shutdown path already took care of this job
        elapsed = self._clock() - job.started_at
        outcome = "success" if failure is None else f"{failure.error_type}: {failure.reason}"
        if job.target is None or body is None:
            job.delivered = True
            logger.warning(
                "rollout in session %s ended (%s) after %.1f s, but its payload had no %s "
                "block, so the result was not written anywhere",
                job.session_id,
                outcome,
                elapsed,
                protocol.ROLLOUT_FIELD,
            )
            return
        job.body = body
        await self._spool.deliver(*job.target, body)
        job.delivered = True
        logger.log(
            logging.INFO if failure is None else logging.WARNING,
            "rollout %s ended (%s) after %.1f s -> s3://%s/%s",
            job.session_id,
            outcome,
            elapsed,
            *job.target,
        )

    def session_jobs(self, session_id: str) -> list[RolloutJob]:
        """The session's rollouts not yet delivered."""
        return list(self._by_session.get(session_id, ()))

    def stop_session(self, session_id: str, reason: str) -> list[RolloutJob]:
        """Cancel a session's running rollouts; return those that were still running."""
        return [job for job in self.session_jobs(session_id) if job.cancel(reason)]

    @staticmethod
    async def wait(jobs: Iterable[RolloutJob], within: float) -> bool:
        """Wait until the jobs have delivered their envelopes; False on timeout."""
        with anyio.move_on_after(within):
            for job in list(jobs):
                await job._done.wait()
            return True
        return False

    async def shutdown(self, grace: float, *, cancel_timeout: float) -> ShutdownReport:
        """Refuse new rollouts, give running ones ``grace`` seconds, then cancel the rest.

        A job still running ``cancel_timeout`` after its cancel has its envelope spooled.
        """
        self._closed = True
        before = len(self._jobs)
        if self._jobs and grace > 0:
            await self.wait(self._jobs, within=grace)
        finished = before - len(self._jobs)
        cancelled = [job for job in list(self._jobs) if job.cancel(SHUTDOWN_REASON)]
        stuck = []
        if self._jobs and not await self.wait(self._jobs, within=cancel_timeout):
            stuck = list(self._jobs)
            for job in stuck:
                await self._spool_stuck(job)
            logger.error(
                "%d rollout task(s) did not end within %.3g s of being cancelled; their "
                "envelopes were spooled",
                len(stuck),
                cancel_timeout,
            )
        return ShutdownReport(finished=finished, cancelled=len(cancelled), stuck=len(stuck))

    async def _spool_stuck(self, job: RolloutJob) -> None:
        if job.task is not None:
            job.task.cancel()
        if job.delivered:
            return
        body = job.body
        if body is None:
            reason = "the agent server shut down and the handler did not stop"
            body, _ = self._envelope(job, None, cancelled(reason))
        job.body = body if body is not None else b""
        job.delivered = True
        if body is not None and job.target is not None:
            await self._spool.add(*job.target, body, why="its rollout did not end at shutdown")
