"""LimitsConfig: the quota a cluster shares and how it is leased out.

The numbers that matter to a user are ``tps`` and ``sessions``; the rest tunes leasing.
One derived figure is the heart of the rate guarantee: tokens are taken from the shared
bucket when they are *leased*, but spent up to ``token_ttl`` seconds later, so calls in
any window can come from tokens leased up to ``token_ttl`` earlier. The shared bucket
therefore holds at most ``burst - tps * token_ttl`` tokens (:attr:`LimitsConfig.capacity`),
and the calls the cluster makes conform to a ``tps``/``burst`` token bucket, the runtime's.

Example::

    config = LimitsConfig(tps=25, sessions=500)
    config.capacity        # 15.0: 25 (one second) - 25 * 0.4 s of lease lifetime
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

from agentcore_rl.errors import ConfigurationError

__all__ = ["LimitsConfig"]

#: A leased token must be spent within this many seconds.
DEFAULT_TOKEN_TTL: Final = 0.4
#: A session-slot lease lapses unless renewed within this many seconds.
DEFAULT_SLOT_TTL: Final = 30.0
#: Tokens accumulate for this long (at the current rate) before a grant, so grants are
#: batches and not one actor call per token.
DEFAULT_BATCH_WINDOW: Final = 0.5
DEFAULT_MAX_TOKEN_BATCH: Final = 16
DEFAULT_MAX_SLOT_BATCH: Final = 32
#: Free slots a process keeps for its next rollouts instead of giving them back.
DEFAULT_SPARE_SLOTS: Final = 8


@dataclass(frozen=True)
class LimitsConfig:
    """One shared quota: ``tps`` calls per second (burst ``burst``, default one second's
    worth) and ``sessions`` live sessions, plus the leasing parameters.

    AIMD on throttles as in the local token bucket: the rate is multiplied by
    ``throttle_factor`` (throttles within ``throttle_cooldown`` s are one), then regains
    ``recovery`` x ``tps`` per second; it never goes below ``min_rate``.

    Example::

        LimitsConfig(tps=25, sessions=500, slot_ttl=10)
    """

    tps: float
    sessions: int
    burst: float | None = None
    token_ttl: float = DEFAULT_TOKEN_TTL
    slot_ttl: float = DEFAULT_SLOT_TTL
    batch_window: float = DEFAULT_BATCH_WINDOW
    max_token_batch: int = DEFAULT_MAX_TOKEN_BATCH
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
        for name in ("token_ttl", "slot_ttl", "batch_window"):
            if not getattr(self, name) > 0:
                raise ConfigurationError(f"{name} must be > 0 seconds, got {getattr(self, name)}")
        for name in ("max_token_batch", "max_slot_batch"):
            if getattr(self, name) < 1:
                raise ConfigurationError(f"{name} must be >= 1, got {getattr(self, name)}")
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
        if self.capacity < 1:
            raise ConfigurationError(
                f"burst {self.quota_burst:g} leaves no room for leases: tokens live "
                f"token_ttl={self.token_ttl:g} s, worth {self.tps * self.token_ttl:g} calls "
                "at full rate; raise burst or lower token_ttl"
            )

    @property
    def quota_burst(self) -> float:
        """The burst of the quota the cluster must conform to (default: one second)."""
        return float(self.tps if self.burst is None else self.burst)

    @property
    def capacity(self) -> float:
        """The most tokens the shared bucket stores (the burst minus the lease slack)."""
        return self.quota_burst - self.tps * self.token_ttl

    @property
    def floor_rate(self) -> float:
        """The lowest rate AIMD goes to."""
        return self.tps * 0.02 if self.min_rate is None else self.min_rate

    def batch_target(self, rate: float) -> int:
        """How many tokens a grant waits for at ``rate`` (at least one)."""
        target = math.floor(rate * self.batch_window)
        return max(1, min(self.max_token_batch, target, math.floor(self.capacity)))
