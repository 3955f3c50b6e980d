"""Which rollout outcomes are final and which are worth a new session, the failure kind of
each (the tables are in docs/failure-model.md), the client's counters of them
(:class:`ClientStats`) and the share of recent infrastructure failures
(:class:`InfraWindow`)."""

from __future__ import annotations

import asyncio
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

from agentcore_rl import protocol
from agentcore_rl.errors import (
    AgentCoreRLError,
    AgentLostError,
    AgentUnreachableError,
    ClientClosedError,
    GatewayError,
    InfraFailureRateError,
    InvocationError,
    RewardError,
    RolloutError,
    RolloutTimeoutError,
    StorageError,
)
from agentcore_rl.protocol import FailureKind

#: Envelope field the client adds: the gateway's upstream failed this many of its calls.
UPSTREAM_FAILED = "gateway_upstream_failed"

__all__ = [
    "ClientStats",
    "InfraWindow",
    "count_outcome",
    "failure_cause",
    "failure_kind",
    "is_agent_loss",
    "is_retryable",
]


@dataclass(slots=True, kw_only=True)
class ClientStats:
    """A client's counters, written by its parts; ``client.stats`` is a snapshot (a copy).

    ``invocations`` counts every invocation request sent (retries included), ``retries``
    the repeated ones; ``stops_unsupported`` the stops an agent server without a stop
    route could not take. ``traces_lost``: through a gateway, the result arrived but its
    token trace could not be had. ``rollout_retries``: rollouts run again in a new session
    after a retryable outcome, ``lost_retries`` those after an agent loss;
    ``probes_escalated``: probes that waited ``escalate_after`` behind invocations and then
    queued among them. ``unstopped``: sessions ``aclose`` could not stop in time.
    ``store_unreachable``: the result store is down now (new invocations wait).
    ``failures``: the rollouts that did not succeed, by :class:`~agentcore_rl.FailureKind`.

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
    failures: dict[str, int] = field(default_factory=dict)

    @property
    def s3_total(self) -> int:
        return sum(self.s3_requests.values())


def _cancelled_by_server(exc: BaseException, words: str) -> bool:
    """A ``cancelled`` envelope of a server that says why (not a user's or client's cancel)."""
    if not isinstance(exc, RolloutError):
        return False
    envelope = exc.envelope
    reason = str(envelope.get(protocol.STOP_REASON, ""))
    return envelope.get(protocol.ERROR_TYPE) == protocol.ERROR_CANCELLED and words in reason


def is_agent_loss(exc: BaseException) -> bool:
    """The process running the rollout went away under it (crashed, restarted, shut down):
    retryable, on the ``Retries.lost`` budget."""
    return isinstance(exc, AgentLostError) or _cancelled_by_server(exc, "shutting down")


def is_retryable(exc: BaseException) -> bool:
    """Worth running again in a new session (the rule and its reasons:
    docs/failure-model.md)."""
    if isinstance(exc, AgentLostError):
        return True
    if isinstance(exc, AgentUnreachableError):
        return False  # every agent was tried for its window: a new session fares no better
    if isinstance(exc, InvocationError):
        status = exc.status_code
        # No status: the agent was not reached (connection refused, reset, timeout).
        return status is None or status in (424, 429) or status >= 500
    # An infra failure the agent reported: a shutdown, a lapsed lease (the client stalled or
    # lost S3 for the whole lease), InfraError, the gateway's upstream: not the input's fault.
    return isinstance(exc, RolloutError) and failure_kind(exc) is FailureKind.INFRA


def failure_kind(exc: BaseException | None) -> FailureKind | None:
    """An error envelope says its own kind; the client's own failures to run a rollout
    (invoking, S3, the agent lost, the gateway) are ``infra``; ``None``: a success."""
    if exc is None:
        return None
    if isinstance(exc, asyncio.CancelledError | ClientClosedError):
        return FailureKind.STOPPED
    if isinstance(exc, RolloutTimeoutError):
        return FailureKind.TIMEOUT
    if isinstance(exc, RolloutError):
        said = exc.envelope.get(protocol.FAILURE_KIND)
        if said in FailureKind._value2member_map_:
            return FailureKind(said)
        if exc.error_type == protocol.ERROR_CANCELLED:  # a writer that does not say
            ours = any(_cancelled_by_server(exc, w) for w in ("shutting down", "lease lapsed"))
            return FailureKind.INFRA if ours else FailureKind.STOPPED
        return FailureKind.AGENT
    if isinstance(exc, RewardError):
        return FailureKind.REWARD
    refused = isinstance(exc, InvocationError) and not is_retryable(exc) and exc.status_code
    if refused or isinstance(exc, ValueError):  # the agent refused the input (4xx), or we did
        return FailureKind.AGENT
    return FailureKind.INFRA


def failure_cause(exc: BaseException) -> str:
    if isinstance(exc, AgentLostError):
        return "agent lost"
    if isinstance(exc, AgentUnreachableError):
        return "agent unreachable"
    if isinstance(exc, InvocationError):
        status = exc.status_code
        return "throttled" if status == 429 else f"invocation failed ({status or 'no answer'})"
    if isinstance(exc, StorageError):
        return "result store failed"
    if isinstance(exc, GatewayError):
        return "trace lost"
    if isinstance(exc, RolloutError):
        if exc.error_type == protocol.ERROR_INFRA:
            return "InfraError"
        if exc.error_type == protocol.ERROR_CANCELLED:
            return "agent shut down" if "shutting down" in str(exc) else "lease lapsed"
        upstream = exc.envelope.get(UPSTREAM_FAILED)
        return "gateway upstream failed" if upstream else str(exc.error_type)
    return type(exc).__name__ if isinstance(exc, AgentCoreRLError) else "unexpected error"


class InfraWindow:
    """The outcomes of the last ``window`` rollout sessions: each an infrastructure
    failure's cause, or ``None``. :meth:`check` raises once the failures pass ``share``."""

    def __init__(self, *, share: float, window: int) -> None:
        self.share = share
        self.window = window
        self._recent: deque[str | None] = deque(maxlen=window)

    def record(self, exc: BaseException | None) -> None:
        """A stop is left out: it says nothing of the infrastructure."""
        kind = failure_kind(exc)
        if exc is not None and kind is FailureKind.INFRA:
            self._recent.append(failure_cause(exc))
        elif kind is not FailureKind.STOPPED:
            self._recent.append(None)

    def check(self) -> None:
        """Judged before the window is full too, against the share of a full window."""
        counts = Counter(cause for cause in self._recent if cause is not None)
        if sum(counts.values()) > self.share * self.window:
            raise InfraFailureRateError(counts, window=len(self._recent), share=self.share)


def count_outcome(counters: ClientStats, fut: asyncio.Future[Any]) -> None:
    if fut.cancelled():
        counters.cancelled += 1
        counters.failures["stopped"] = counters.failures.get("stopped", 0) + 1
        return
    exc = fut.exception()
    if (kind := failure_kind(exc)) is not None:
        counters.failures[kind.value] = counters.failures.get(kind.value, 0) + 1
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
