"""LimitsConfig: the quota a cluster shares and how it is leased out.

The numbers that matter to a user are ``tps`` and ``sessions``; the rest tunes leasing.
The rate is leased as *shares*: a process holds ``r`` calls per second for the next
``lease_period`` seconds and makes its own tokens with a local bucket at ``r``, whose
burst is ``r`` x :attr:`LimitsConfig.burst_seconds`. The shares sum to at most ``tps``
and the local bursts to at most ``burst - tps * latency_margin``, so the calls of the
whole cluster conform to a ``tps``/``burst`` token bucket (the runtime's) even when the
network delays some calls by up to ``latency_margin`` seconds more than others.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from agentcore_rl.errors import ConfigurationError

__all__ = ["LimitsConfig"]

#: How long a rate share lasts unless renewed; a process renews at half of it.
DEFAULT_LEASE_PERIOD: Final = 4.0
#: Delay spread of calls on their way to the runtime that the burst must absorb.
DEFAULT_LATENCY_MARGIN: Final = 0.2
#: A session-slot lease lapses unless renewed within this many seconds.
DEFAULT_SLOT_TTL: Final = 30.0
DEFAULT_MAX_SLOT_BATCH: Final = 32
#: Free slots a process keeps for its next rollouts instead of giving them back.
DEFAULT_SPARE_SLOTS: Final = 8


@dataclass(frozen=True)
class LimitsConfig:
    """One shared quota: ``tps`` calls per second (burst ``burst``, default one second's
    worth) and ``sessions`` live sessions, plus the leasing parameters.

    AIMD on throttles as in the local token bucket: the shared rate is multiplied by
    ``throttle_factor`` (throttles within ``throttle_cooldown`` s are one), then regains
    ``recovery`` x ``tps`` per second; it never goes below ``min_rate``.

    Example::

        LimitsConfig(tps=25, sessions=500, slot_ttl=10)
    """

    tps: float
    sessions: int
    burst: float | None = None
    lease_period: float = DEFAULT_LEASE_PERIOD
    latency_margin: float = DEFAULT_LATENCY_MARGIN
    slot_ttl: float = DEFAULT_SLOT_TTL
    max_slot_batch: int = DEFAULT_MAX_SLOT_BATCH
    spare_slots: int = DEFAULT_SPARE_SLOTS
    throttle_factor: float = 0.5
    recovery: float = 0.05
    throttle_cooldown: float = 1.0
    min_rate: float | None = None

    def __post_init__(self) -> None:
        if not (isinstance(self.tps, (int, float)) and self.tps > 0):
            raise ConfigurationError(f"tps must be > 0 calls per second, got {self.tps!r}")
        if isinstance(self.sessions, bool) or not isinstance(self.sessions, int):
            raise ConfigurationError(f"sessions must be an int >= 1, got {self.sessions!r}")
        if self.sessions < 1:
            raise ConfigurationError(f"sessions must be an int >= 1, got {self.sessions!r}")
        for name in ("lease_period", "slot_ttl"):
            if not getattr(self, name) > 0:
                raise ConfigurationError(f"{name} must be > 0 seconds, got {getattr(self, name)}")
        if self.latency_margin < 0:
            raise ConfigurationError(f"latency_margin must be >= 0, got {self.latency_margin}")
        if self.max_slot_batch < 1:
            raise ConfigurationError(f"max_slot_batch must be >= 1, got {self.max_slot_batch}")
        if self.spare_slots < 0:
            raise ConfigurationError(f"spare_slots must be >= 0, got {self.spare_slots}")
        if not 0 < self.throttle_factor <= 1:
            raise ConfigurationError(
                f"throttle_factor must be in (0, 1], got {self.throttle_factor}"
            )
        if self.recovery < 0 or self.throttle_cooldown < 0:
            raise ConfigurationError("recovery and throttle_cooldown must be >= 0")
        if self.min_rate is not None and not 0 < self.min_rate <= self.tps:
            raise ConfigurationError(f"min_rate must be in (0, tps], got {self.min_rate}")
        if self.local_burst_budget < 1:
            raise ConfigurationError(
                f"burst {self.quota_burst:g} leaves no room for local buckets: "
                f"latency_margin={self.latency_margin:g} s takes "
                f"{self.tps * self.latency_margin:g} of it; raise burst or lower latency_margin"
            )

    @property
    def quota_burst(self) -> float:
        """The burst of the quota the cluster must conform to (default: one second)."""
        return float(self.tps if self.burst is None else self.burst)

    @property
    def local_burst_budget(self) -> float:
        """What the local buckets of all processes may store together."""
        return self.quota_burst - self.tps * self.latency_margin

    @property
    def burst_seconds(self) -> float:
        """A local bucket stores this many seconds of its share."""
        return self.local_burst_budget / self.tps

    def local_burst(self, rate: float) -> float:
        """The burst of a local bucket at ``rate`` (at least one token: else it never
        holds a whole one); 0 without a share."""
        return max(1.0, rate * self.burst_seconds) if rate > 0 else 0.0

    @property
    def floor_rate(self) -> float:
        """The lowest rate AIMD goes to."""
        return self.tps * 0.02 if self.min_rate is None else self.min_rate
