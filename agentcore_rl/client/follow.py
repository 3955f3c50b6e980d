"""Following accepted rollouts to their outcome: the result key, the deadline, the cleanup.

Each accepted (or attached) rollout is followed by the client's completion watcher and, when
it has a finite timeout, by a loop timer. The first of the result, an error envelope, an S3
failure, the timeout, a cancel or the client's close settles its future; the future's done
callback then frees its slot and, when the session may still run (or the client stops
finished sessions), sends its session id to the stop workers (a memory object stream, so
nothing is scheduled from the callback). So every accepted rollout ends in exactly one
outcome, and nothing else needs to clean up after it.

Example::

    follower = OutcomeFollower(sessions=sessions, admission=admission, watcher=watcher,
                               stopper=stopper, counters=counters, stop_finished_sessions=True)
    follower.follow(fut, 600.0, elapsed=0.0)
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import math
import time
from collections.abc import Callable
from typing import Any

from agentcore_rl import protocol
from agentcore_rl.client.admission import Admission
from agentcore_rl.client.future import RolloutFuture
from agentcore_rl.client.sessions import PendingSessions
from agentcore_rl.client.stats import ClientCounters
from agentcore_rl.client.stopper import SessionStopper
from agentcore_rl.client.traces import TraceJoiner
from agentcore_rl.client.watcher import CompletionWatcher
from agentcore_rl.errors import (
    AgentLostError,
    ClientClosedError,
    GatewayError,
    InvocationError,
    RolloutError,
    RolloutTimeoutError,
)

__all__ = ["OutcomeFollower"]


def _count_outcome(counters: ClientCounters, exc: BaseException | None) -> None:
    if exc is None:
        counters.results += 1
    elif type(exc) is RolloutError:
        counters.rollout_errors += 1
    elif type(exc) is RolloutTimeoutError:
        counters.timeouts += 1
    elif type(exc) is ClientClosedError:
        counters.closed += 1
    elif isinstance(exc, GatewayError):  # TraceLostError: no success without tokens
        counters.traces_lost += 1
    elif isinstance(exc, AgentLostError):
        pass  # counted as agents_lost by the prober
    elif isinstance(exc, InvocationError):
        counters.invocation_errors += 1  # a retry's invocation failed
    else:  # StorageError, or anything unexpected that settled the future
        counters.storage_errors += 1


class OutcomeFollower:
    """Owns each followed rollout (and its slot) until its outcome.

    Followed futures live in ``sessions.live``; outcomes are counted in ``counters``
    (``results``, ``rollout_errors``, ``timeouts``, ``storage_errors``, ``closed``,
    ``cancelled``).
    """

    def __init__(
        self,
        *,
        sessions: PendingSessions,
        admission: Admission,
        watcher: CompletionWatcher,
        stopper: SessionStopper,
        counters: ClientCounters,
        stop_finished_sessions: bool,
        joiner: TraceJoiner | None = None,
    ) -> None:
        self.sessions = sessions
        self.admission = admission
        self.watcher = watcher
        self.stopper = stopper
        self.counters = counters
        self.stop_finished_sessions = stop_finished_sessions
        self.joiner = joiner  # with a gateway: outcomes wait for their traces
        self._timers: dict[str, asyncio.TimerHandle] = {}
        # Every rollout holds its callbacks until its outcome: one bound method and one
        # (empty) context for all of them instead of new ones per rollout, which the
        # cyclic GC would otherwise promote and walk (a full collection walks botocore's
        # loaded models too: tens of ms each).
        self._cb_context = contextvars.Context()
        self._on_done_cb = self._on_done
        self._arrived_cb = self._arrived
        self._expire_cb = self._expire
        #: ``retry(fut, exc)`` takes over a rollout with a retryable outcome (True) or
        #: leaves it to end with ``exc`` (False). Set by the client.
        self.retry: Callable[[RolloutFuture, BaseException], bool] | None = None

    def __repr__(self) -> str:
        return f"OutcomeFollower(live={len(self.sessions.live)}, timers={len(self._timers)})"

    def follow(
        self,
        fut: RolloutFuture,
        limit: float | None,
        *,
        elapsed: float,
        found: dict[str, Any] | None = None,
    ) -> None:
        """Own ``fut`` (and the slot its caller holds) until its outcome: watch its key
        and arm its timer (``limit`` seconds, ``elapsed`` of them already gone; ``None``
        or ``math.inf`` for none). ``found`` is a result envelope already read."""
        self.sessions.live[fut.session_id] = fut
        if not fut._followed:  # a retried rollout is followed again, with one callback
            fut._followed = True
            fut.add_done_callback(self._on_done_cb, context=self._cb_context)
        if self.admission.closed:  # closed while the answer was on its way: end it too
            fut._settle(None, ClientClosedError("the client was closed while starting this"))
            return
        if found is not None:
            self._arrived(fut, found, None)
            return
        self.watcher.track(fut.s3_bucket, fut.result_key, functools.partial(self._arrived_cb, fut))
        if limit is not None and math.isfinite(limit):
            if limit - elapsed <= 0:
                self._expire(fut, limit)
                return
            loop = asyncio.get_running_loop()
            self._timers[fut.session_id] = loop.call_later(
                limit - elapsed, self._expire_cb, fut, limit, context=self._cb_context
            )

    def settle_all(self, error: BaseException) -> None:
        """End every followed rollout with ``error`` (their done callbacks stop them)."""
        for fut in list(self.sessions.live.values()):
            fut._settle(None, error)

    def fail(self, fut: RolloutFuture, error: BaseException) -> None:
        """End ``fut`` with ``error``, unless the retry policy runs it again."""
        if fut.done():
            return
        if self.retry is not None and self.retry(fut, error):
            return
        fut._settle(None, error)

    def lost(self, fut: RolloutFuture) -> None:
        """The agent no longer knows ``fut``'s session (a probe said so)."""
        self.fail(
            fut,
            AgentLostError(
                f"the agent of session {fut.session_id} (input {fut.input_id}) no longer "
                "knows it: it crashed or restarted, and no result will come",
                session_id=fut.session_id,
                attempts=fut.attempts,
            ),
        )

    def detach(self, fut: RolloutFuture) -> None:
        """Stop following ``fut``'s current session (it will run in another one): no
        callback, timer or key of it remains; its slot stays held."""
        sid = fut.session_id
        self.sessions.live.pop(sid, None)
        timer = self._timers.pop(sid, None)
        if timer is not None:
            timer.cancel()
        self.watcher.untrack(fut.s3_bucket, fut.result_key)
        if self.stop_finished_sessions:  # e.g. the microVM a probe re-created
            self.stopper.schedule(sid)

    def _arrived(
        self, fut: RolloutFuture, envelope: dict[str, Any] | None, error: BaseException | None
    ) -> None:
        joiner = self.joiner
        if error is None and envelope is not None and joiner is not None and joiner.takes(fut):
            # The result came in time: the deadline no longer applies while its trace is
            # fetched from the gateway; the joiner settles the future when it has it.
            timer = self._timers.pop(fut.session_id, None)
            if timer is not None:
                timer.cancel()
            joiner.finish(fut, envelope, self._resolve)
            return
        self._resolve(fut, envelope, error)

    def _resolve(
        self, fut: RolloutFuture, envelope: dict[str, Any] | None, error: BaseException | None
    ) -> None:
        if error is not None:
            fut._settle(None, error)
        elif envelope is not None and protocol.is_error_envelope(envelope):
            if envelope.get(protocol.ERROR_TYPE) == protocol.ERROR_AGENT_LOST:
                # Its agent process died; a successor on the same disk said so.
                if not fut.done():
                    self.counters.agents_lost += 1
                self.fail(
                    fut,
                    AgentLostError(
                        f"the agent process running session {fut.session_id} (input "
                        f"{fut.input_id}) died: {envelope.get(protocol.STOP_REASON)}",
                        session_id=fut.session_id,
                        attempts=fut.attempts,
                        envelope=envelope,
                    ),
                )
                return
            self.fail(fut, RolloutError(envelope, session_id=fut.session_id))
        else:
            fut._settle(envelope, None)

    def _expire(self, fut: RolloutFuture, limit: float) -> None:
        # An S3 outage is no outcome of its own: the rollout ends at its timeout, and the
        # message says the result may exist but could not be read.
        outage = self.watcher.outages.describe(fut.s3_bucket)
        why = f" ({outage}: the result may be there and unread)" if outage else ""
        fut._settle(
            None,
            RolloutTimeoutError(
                f"rollout {fut.session_id} (input {fut.input_id}) gave no result within "
                f"{limit:g} s{why}; its session is being stopped",
                session_id=fut.session_id,
                timeout=limit,
            ),
        )

    def _on_done(self, fut: RolloutFuture) -> None:
        """Every outcome passes here once: free the slot, tidy up, maybe stop the session."""
        sid = fut.session_id
        self.sessions.live.pop(sid, None)
        timer = self._timers.pop(sid, None)
        if timer is not None:
            timer.cancel()
        self.watcher.untrack(fut.s3_bucket, fut.result_key)
        if self.joiner is not None:
            self.joiner.forget(fut)
        self.admission.release()
        if fut.cancelled():
            self.counters.cancelled += 1
            stop = True
        else:
            exc = fut.exception()
            _count_outcome(self.counters, exc)
            finished = exc is None or isinstance(exc, RolloutError)
            stop = self.stop_finished_sessions or not finished
        if fut.resolved_at is None:
            fut.resolved_at = time.time()
        if stop:
            self.stopper.schedule(sid)
