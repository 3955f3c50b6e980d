"""ClientStats: what a rollout client has done so far, for logs and benchmarks."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["ClientStats"]


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
    ``client.unstopped_sessions``). ``in_flight``: accepted rollouts without an outcome yet.
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

    def as_dict(self) -> dict[str, Any]:
        """Plain dict (JSON-ready), with ``s3_total``."""
        out = asdict(self)
        out["s3_total"] = self.s3_total
        return out
