"""Which rollout outcomes are final and which are worth a new session (the table is in
docs/failure-model.md), and the client's counters of them (:class:`ClientStats`)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from agentcore_rl import protocol
from agentcore_rl.errors import (
    AgentLostError,
    AgentUnreachableError,
    ClientClosedError,
    GatewayError,
    InvocationError,
    RolloutError,
    RolloutTimeoutError,
)

__all__ = [
    "ClientStats",
    "count_outcome",
    "is_agent_loss",
    "is_retryable",
]


@dataclass(slots=True, kw_only=True)
class ClientStats:
    """A client's counters, written by its parts; ``client.stats`` is a snapshot (a copy).

    ``invocations`` counts every invocation request sent (retries included), ``retries``
    the repeated ones, ``throttles`` the 429 / ThrottlingException answers; ``stops`` the
    stop calls that completed, ``stop_failures`` those given up and ``stops_unsupported``
    those an agent server without a stop route could not take. Outcomes: ``results``,
    ``rollout_errors``, ``timeouts``, ``invocation_errors``, ``storage_errors``,
    ``cancelled``, ``closed``, ``traces_lost`` (through a gateway: the result arrived
    but its token trace could not be had), ``agents_lost`` (a probe found the session unknown
    to its agent, or its agent unreachable for ``lost_after``, or an ``agent_lost``
    envelope came: crashed).
    ``rollout_retries``: rollouts run again in a new session after a retryable outcome,
    ``lost_retries`` those of them after an agent loss (``Retries.lost``); ``probes`` /
    ``probe_failures``: liveness probes sent / unanswered, ``probes_escalated`` those that
    waited ``escalate_after`` behind invocations and then queued among them;
    ``unstopped``: sessions ``aclose`` could not stop in time (their ids are in
    ``client.unstopped_sessions``). ``in_flight``: rollouts sent or accepted, no outcome yet.
    ``s3_requests``: all S3 requests of the client's ResultStore, by operation.
    ``store_unreachable``: whether the result store is down now (new invocations wait);
    ``store_outages`` and ``degraded_seconds``: how often and how long it was.

    Example::

        stats = client.stats
        print(stats.results, stats.in_flight, stats.s3_total)
    """

    invocations: int = 0
    retries: int = 0
    throttles: int = 0
    stops: int = 0
    stop_failures: int = 0
    stops_unsupported: int = 0
    results: int = 0
    rollout_errors: int = 0
    timeouts: int = 0
    invocation_errors: int = 0
    storage_errors: int = 0
    cancelled: int = 0
    closed: int = 0
    traces_lost: int = 0
    agents_lost: int = 0
    rollout_retries: int = 0
    lost_retries: int = 0
    probes: int = 0
    probe_failures: int = 0
    probes_escalated: int = 0
    unstopped: int = 0
    in_flight: int = 0
    s3_requests: dict[str, int] = field(default_factory=dict)
    store_unreachable: bool = False
    store_outages: int = 0
    degraded_seconds: float = 0.0

    @property
    def s3_total(self) -> int:
        """All S3 requests."""
        return sum(self.s3_requests.values())


def _cancelled_by_server(exc: BaseException, words: str) -> bool:
    """Whether ``exc`` is the ``cancelled`` envelope of a server whose stop reason says
    ``words`` (not a user's or client's cancel)."""
    if not isinstance(exc, RolloutError):
        return False
    envelope = exc.envelope
    reason = str(envelope.get(protocol.STOP_REASON, ""))
    return envelope.get(protocol.ERROR_TYPE) == protocol.ERROR_CANCELLED and words in reason


def is_agent_loss(exc: BaseException) -> bool:
    """Whether ``exc`` says the process running the rollout went away under it (a crash
    or restart found by a probe or a successor's ``agent_lost`` envelope, or the server's
    shutdown cancelling it): retryable, on the ``Retries.lost`` budget."""
    return isinstance(exc, AgentLostError) or _cancelled_by_server(exc, "shutting down")


def is_retryable(exc: BaseException) -> bool:
    """Whether a rollout that ended with ``exc`` is worth running again with a new session
    (the rule and its reasons: docs/failure-model.md)."""
    if isinstance(exc, AgentLostError):
        return True
    if isinstance(exc, AgentUnreachableError):
        return False  # every agent was tried for its window: a new session fares no better
    if isinstance(exc, InvocationError):
        status = exc.status_code
        # No status: the agent was not reached (connection refused, reset, timeout).
        return status is None or status in (424, 429) or status >= 500
    # A lapsed lease: the client stalled or lost S3 for the whole lease, not the input's fault.
    return _cancelled_by_server(exc, "shutting down") or _cancelled_by_server(exc, "lease lapsed")


def count_outcome(counters: ClientStats, fut: asyncio.Future[Any]) -> None:
    """Count the outcome of a settled rollout future in ``counters``."""
    if fut.cancelled():
        counters.cancelled += 1
        return
    exc = fut.exception()
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
        pass  # counted as agents_lost where the loss was found
    elif isinstance(exc, InvocationError):
        counters.invocation_errors += 1
    else:  # StorageError, or anything unexpected
        counters.storage_errors += 1
