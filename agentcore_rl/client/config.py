"""The rollout client's configuration: small frozen keyword-only objects, one per concern,
and their defaults (every field: docs/client.md, "Configuration")."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

from agentcore_rl.errors import ConfigurationError
from agentcore_rl.keywords import check_config_types, check_numbers, checked_init
from agentcore_rl.protocol import DEFAULT_TPS
from agentcore_rl.retry import RetryPolicy

if TYPE_CHECKING:
    from agentcore_rl.gateway.gateway import RolloutGateway

__all__ = [
    "DEFAULT_AWS",
    "DEFAULT_INFRA_STOP",
    "DEFAULT_LIMITS",
    "DEFAULT_RETRIES",
    "DEFAULT_RETRY_LOST",
    "DEFAULT_RETRY_ROLLOUTS",
    "DEFAULT_TIMEOUTS",
    "GATEWAY_TOKEN_ENV",
    "MOVED_CALL_OPTIONS",
    "MOVED_CLIENT_OPTIONS",
    "AwsConfig",
    "GatewayConfig",
    "InfraStop",
    "Limits",
    "Retries",
    "Timeouts",
]

DEFAULT_RETRY_ROLLOUTS: Final = 2
#: With one loss in five rollouts, six in a row happen once in 15,000.
DEFAULT_RETRY_LOST: Final = 5
#: Where the command line and the trainer adapters read a gateway's admin token when given none.
GATEWAY_TOKEN_ENV: Final = "AGENTCORE_RL_GATEWAY_ADMIN_TOKEN"


@checked_init
@dataclass(frozen=True, kw_only=True)
class Limits:
    """How much the client asks of the agents at once: ``max_concurrent_sessions`` rollouts
    (a slot is held from ``invoke`` until the outcome); invocations, probes and stop calls
    share one token bucket of ``tps`` tokens per second and ``burst`` tokens.

    Example::

        Limits(max_concurrent_sessions=500, tps=25.0)
    """

    max_concurrent_sessions: int = 100
    tps: float = DEFAULT_TPS
    burst: float | None = None

    def __post_init__(self) -> None:
        check_numbers(self, "max_concurrent_sessions", at_least=1, integer=True)
        check_numbers(self, "tps", above=0, finite=True)
        check_numbers(self, "burst", above=0, finite=True, optional=True)


@checked_init
@dataclass(frozen=True, kw_only=True)
class Timeouts:
    """Seconds the client waits: ``rollout`` for a rollout's outcome (``None``: no limit),
    ``close`` for ``aclose`` to stop the live sessions, ``check`` for the connection to
    each service the client checks when entered (a connected one has five seconds to answer).

    Example::

        Timeouts(rollout=900.0, close=60.0)
    """

    rollout: float | None = 3600.0
    close: float = 30.0
    # A wrong endpoint then fails the client's entry well within two seconds on a loaded
    # machine (docs/benchmarks.md); a loopback or regional service connects in milliseconds.
    check: float = 1.0

    def __post_init__(self) -> None:
        check_numbers(self, "rollout", above=0, optional=True)
        check_numbers(self, "close", "check", above=0)


@checked_init
@dataclass(frozen=True, kw_only=True)
class Retries:
    """What the client tries again: ``call``, one invocation or stop call that hit
    throttling, a 5xx or a dropped connection (each retry takes a token); ``rollouts``,
    extra attempts in new sessions after a retryable outcome; ``lost``, extra attempts for
    a rollout whose agent process went away under it, counted apart.

    Example::

        Retries(call=RetryPolicy(attempts=8, maximum=30.0), rollouts=1, lost=3)
    """

    call: RetryPolicy = field(default_factory=RetryPolicy)
    rollouts: int = DEFAULT_RETRY_ROLLOUTS
    lost: int = DEFAULT_RETRY_LOST

    def __post_init__(self) -> None:
        check_config_types(("Retries.call", self.call, RetryPolicy))
        check_numbers(self, "rollouts", "lost", at_least=0, integer=True)


@checked_init
@dataclass(frozen=True, kw_only=True)
class InfraStop:
    """When a run stops for its infrastructure: once more than ``share`` of the last
    ``window`` rollout sessions failed with kind ``infra``, the client admits no new
    rollout and raises ``InfraFailureRateError``.

    Example::

        AsyncRolloutClient(..., infra_stop=InfraStop(share=0.1, window=200))
    """

    share: float = 0.2
    window: int = 100

    def __post_init__(self) -> None:
        check_numbers(self, "share", above=0, finite=True)
        check_numbers(self, "window", at_least=1, integer=True)


@checked_init
@dataclass(frozen=True, kw_only=True)
class AwsConfig:
    """Where the client's AWS calls go (default: the environment's settings):
    ``endpoint_url`` AgentCore Runtime's, ``s3_endpoint_url`` S3's; ``qualifier``: the
    runtime endpoint's name.

    Example::

        AwsConfig(endpoint_url="http://127.0.0.1:8081", s3_endpoint_url="http://127.0.0.1:9000")
    """

    endpoint_url: str | None = None
    s3_endpoint_url: str | None = None
    qualifier: str | None = None

    def __post_init__(self) -> None:
        for name in ("endpoint_url", "s3_endpoint_url"):
            _check_url(self, name, "an http(s) URL", optional=True)
        if self.qualifier is not None and (
            not isinstance(self.qualifier, str) or not self.qualifier
        ):
            raise ConfigurationError(
                f"AwsConfig.qualifier must be a non-empty string, got {self.qualifier!r}"
            )


@checked_init
@dataclass(frozen=True, kw_only=True)
class GatewayConfig:
    """The rollout gateway that captures the rollouts' tokens, which agents reach at ``url``.

    A gateway in another process is driven over its admin routes with ``admin_token``
    (never shown in the repr; the environment is read where the process starts, not
    here). ``app``: a :class:`~agentcore_rl.gateway.RolloutGateway` running on the
    client's event loop and served at ``url``, called directly (no token).

    Example::

        GatewayConfig(url="http://10.0.0.5:9000", admin_token=os.environ["GATEWAY_TOKEN"])
    """

    url: str
    admin_token: str | None = field(default=None, repr=False)
    app: RolloutGateway | None = None

    def __post_init__(self) -> None:
        _check_url(self, "url", "the http(s) URL agents reach the gateway at")
        if self.app is not None:
            return
        if not self.admin_token:
            raise ConfigurationError(
                "a remote gateway needs its admin token: GatewayConfig(admin_token=...), the "
                f"token it was started with (--admin-token or {GATEWAY_TOKEN_ENV})"
            )


def _check_url(config: object, name: str, what: str, *, optional: bool = False) -> None:
    value = getattr(config, name)
    if value is None and optional:
        return
    if not isinstance(value, str) or not value.startswith(("http://", "https://")):
        raise ConfigurationError(f"{type(config).__name__}.{name} must be {what}, got {value!r}")


DEFAULT_LIMITS: Final = Limits()
DEFAULT_TIMEOUTS: Final = Timeouts()
DEFAULT_RETRIES: Final = Retries()
DEFAULT_AWS: Final = AwsConfig()
DEFAULT_INFRA_STOP: Final = InfraStop()

#: Where the reference toolkit's keywords live here (named by the TypeError): a migration aid.
MOVED_CLIENT_OPTIONS: Final = {
    "max_concurrent_sessions": "limits=Limits(max_concurrent_sessions=...)",
    "tps_limit": "limits=Limits(tps=...)",
    "timeout": "timeouts=Timeouts(rollout=...)",
    "endpoint_url": "aws=AwsConfig(endpoint_url=...)",
    "s3_endpoint_url": "aws=AwsConfig(s3_endpoint_url=...)",
    "base_url": "rollout={'base_url': ...}",
    "model_id": "rollout={'model_id': ...}",
}
#: The same for the per-call methods (``invoke``, ``run_batch``...).
MOVED_CALL_OPTIONS: Final = {
    "base_url": "rollout={'base_url': ...}",
    "model_id": "rollout={'model_id': ...}",
    "max_concurrent_sessions": "the client's limits=Limits(max_concurrent_sessions=...)",
}
