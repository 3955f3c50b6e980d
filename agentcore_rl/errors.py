"""The exception tree of agentcore-rl.

Every exception the library raises on purpose derives from :class:`AgentCoreRLError`, so
``except AgentCoreRLError`` catches all of them and nothing else::

    AgentCoreRLError
    ├── ConfigurationError          a constructor or CLI argument is wrong (also ValueError)
    ├── MissingExtraError           an optional part is not installed (also
    │                               ModuleNotFoundError); defined in :mod:`agentcore_rl._extras`
    ├── InvalidPayloadError         an invocation body the server refuses (also ValueError)
    │   ├── InvalidRolloutConfig    the ``_rollout`` block is missing a field or has a bad one
    │   └── BucketNotAllowedError   the payload names a bucket outside the allow-list (403)
    ├── StorageError                an S3 operation failed after its retries
    ├── InvocationError             invoking the agent failed after retries
    │   ├── AgentLostError          the agent no longer knows a pending session (it crashed)
    │   ├── AgentUnreachableError   no connection to the agent: nothing was started
    │   ├── StopUnsupportedError    the agent has no stop route (a transport's answer)
    │   └── RetryableError          one attempt failed in a way worth retrying; defined
    │       │                       with the transports (:mod:`agentcore_rl.client.transports`)
    │       └── NotConnectedError   ... before any byte reached the agent
    ├── RolloutError                the agent ran and wrote an error envelope
    ├── InfraError                  a handler's: a service it needs failed (not the agent)
    ├── RewardError                 a handler's: the run finished, its reward cannot be had
    ├── InfraFailureRateError       too many recent rollouts failed for infrastructure
    ├── RolloutTimeoutError         no result within the timeout (also TimeoutError)
    ├── ClientClosedError           the client was closed while the call was pending
    ├── GroupDroppedError           a GRPO group was dropped by its rules (``reason``);
    │   │                           defined in :mod:`agentcore_rl.groups` beside the group
    │   └── StaleGroupError         ... because its policy version grew too old
    ├── MissingTrajectoryError      a row needs a trajectory the rollout has not (also
    │                               ValueError); defined in :mod:`agentcore_rl.training`
    ├── InvalidTrajectoryError      a trajectory a trainer cannot take (also ValueError)
    ├── SampleFailedError           a veRL sample's rollout failed (also RuntimeError);
    │                               defined in :mod:`agentcore_rl.integrations.verl`
    ├── SharedLimitsUnavailableError  the shared limits' Ray actor stayed unreachable
    └── GatewayError                the rollout gateway was misused or could not do its job
        ├── TraceLostError          a rollout's token trace cannot be had (gateway restarted)
        ├── GatewayInputError       a call or an admin request the gateway refuses (400;
        │   │                       also ValueError)
        │   └── RenderError         the chat template refused the conversation
        ├── AlreadyPausedError      a pause asked while one is on (409)
        └── UpstreamError           an inference server failed: refused, reset, silent (502)

Messages say what happened and what to do about it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

__all__ = [
    "AgentCoreRLError",
    "AgentLostError",
    "AgentUnreachableError",
    "AlreadyPausedError",
    "BucketNotAllowedError",
    "ClientClosedError",
    "ConfigurationError",
    "GatewayError",
    "GatewayInputError",
    "InfraError",
    "InfraFailureRateError",
    "InvalidPayloadError",
    "InvalidRolloutConfig",
    "InvocationError",
    "RewardError",
    "RolloutError",
    "RolloutTimeoutError",
    "SharedLimitsUnavailableError",
    "StorageError",
    "TraceLostError",
    "UpstreamError",
]


class AgentCoreRLError(Exception):
    """Base class of every error agentcore-rl raises on purpose.

    Example::

        try:
            ...
        except AgentCoreRLError as exc:
            log.error("agentcore-rl failed: %s", exc)
    """


class ConfigurationError(AgentCoreRLError, ValueError):
    """A constructor or CLI argument is invalid.

    Example::

        AsyncRolloutClient(s3_bucket="b", exp_id="e")  # raises: no ARN and no URL
    """


class InvalidPayloadError(AgentCoreRLError, ValueError):
    """``status_code``: the HTTP status the server answers with (400, 403 or 413).

    Example::

        raise InvalidPayloadError("body is not a JSON object", status_code=400)
    """

    def __init__(self, message: str, *, status_code: int = 400, field: str | None = None):
        super().__init__(message)
        self.message = message
        self.status_code = status_code
        self.field = field


class InvalidRolloutConfig(InvalidPayloadError):
    """The ``_rollout`` block lacks a field or has a bad one.

    Example::

        RolloutConfig.from_dict({"exp_id": "e"})  # raises: input_id is required
    """


class BucketNotAllowedError(InvalidPayloadError):
    """The payload names a bucket outside the server's allow-list.

    Example::

        AgentCoreRLApp(limits=RequestLimits(allowed_buckets=["rollouts"]))  # "other": 403
    """

    def __init__(self, bucket: str, allowed: frozenset[str], *, field: str = "s3_bucket"):
        super().__init__(
            f"bucket {bucket!r} is not in this server's allow-list "
            f"({', '.join(sorted(allowed))}); ask the agent's operator to add it "
            "(RequestLimits(allowed_buckets=...) or AGENTCORE_RL_ALLOWED_BUCKETS)",
            status_code=403,
            field=field,
        )
        self.bucket = bucket


class StorageError(AgentCoreRLError):
    """``code``: the S3 error code (``NoSuchBucket``, ``SlowDown``...) when S3 answered, else
    the exception type.

    Example::

        except StorageError as exc:
            print(exc.operation, exc.code)
    """

    def __init__(
        self, message: str, *, operation: str, bucket: str, key: str | None = None, code: str = ""
    ):
        super().__init__(message)
        self.operation = operation
        self.bucket = bucket
        self.key = key
        self.code = code


class InvocationError(AgentCoreRLError):
    """Invoking the agent failed (after retries, where retryable).

    Example::

        except InvocationError as exc:
            print(exc.session_id, exc.status_code)
    """

    def __init__(
        self, message: str, *, session_id: str | None = None, status_code: int | None = None
    ):
        super().__init__(message)
        self.session_id = session_id
        self.status_code = status_code


class AgentUnreachableError(InvocationError):
    """No session was started, so there is nothing to stop and no point in a new session
    on the same agent.

    Example::

        except AgentUnreachableError as exc:
            print("is the agent running?", exc)
    """


class RolloutError(AgentCoreRLError):
    """The agent's result ``envelope`` has ``status_code`` >= 400.

    Example::

        except RolloutError as exc:
            print(exc.envelope["stop_reason"], exc.traceback)
    """

    def __init__(self, envelope: Mapping[str, Any], *, session_id: str | None = None):
        self.envelope = dict(envelope)
        self.session_id = session_id or self.envelope.get("session_id")
        self.status_code = self.envelope.get("status_code")
        self.error_type = self.envelope.get("error_type")
        self.traceback = self.envelope.get("traceback")
        reason = self.envelope.get("stop_reason", "unknown error")
        super().__init__(
            f"rollout {self.session_id} failed with status {self.status_code}"
            f" ({self.error_type or 'error'}): {reason}"
        )


class InfraError(AgentCoreRLError):
    """For a handler whose rollout did not get a fair run (a sandbox, a tool backend, a judge
    failed): it is retried in a new session and never trained on (failure kind ``infra``).

    Example::

        except SandboxUnavailable as exc:
            raise InfraError(f"sandbox down: {exc}") from exc
    """


class RewardError(AgentCoreRLError):
    """Failure kind ``reward``: never trained on as a zero.

    Example::

        raise RewardError("the judge answered without a score")
    """


class InfraFailureRateError(AgentCoreRLError):
    """The run stopped admitting rollouts; ``counts``: the failures by cause, out of
    ``window`` rollouts.

    Example::

        except InfraFailureRateError as exc:
            print(exc.counts)   # {"agent lost": 61, "throttled": 12}
    """

    def __init__(self, counts: Mapping[str, int], *, window: int, share: float) -> None:
        self.counts = dict(counts)
        self.window = window
        self.share = share
        causes = ", ".join(f"{n} {cause}" for cause, n in Counter(counts).most_common())
        super().__init__(
            f"infrastructure failures in {sum(counts.values())} of the last {window} rollouts "
            f"({causes}), more than {share:.0%}: stopped before training on what survives; "
            "fix the cause and run again (eval: --resume)"
        )


class RolloutTimeoutError(AgentCoreRLError, TimeoutError):
    """The session has been stopped.

    Example::

        except RolloutTimeoutError as exc:
            print(f"{exc.session_id} gave no result in {exc.timeout} s")
    """

    def __init__(
        self, message: str, *, session_id: str | None = None, timeout: float | None = None
    ):
        super().__init__(message)
        self.session_id = session_id
        self.timeout = timeout


class ClientClosedError(AgentCoreRLError):
    """The client was closed, or is closing.

    Example::

        await client.aclose()
        await client.invoke(payload)  # raises ClientClosedError
    """


class AgentLostError(InvocationError):
    """A probe found the session unknown to its agent, or the restarted successor wrote an
    ``agent_lost`` envelope (kept in ``envelope``). The client first runs it again in new
    sessions (``Retries.lost``).

    Example::

        except AgentLostError as exc:
            print(exc.session_id, "was lost after", exc.attempts, "attempt(s)")
    """

    def __init__(
        self,
        message: str,
        *,
        session_id: str | None = None,
        attempts: int = 1,
        envelope: Mapping[str, Any] | None = None,
    ):
        super().__init__(message, session_id=session_id)
        self.attempts = attempts
        self.envelope = None if envelope is None else dict(envelope)


class SharedLimitsUnavailableError(AgentCoreRLError):
    """The actor of ``agentcore_rl.distributed`` stayed unreachable.

    Example::

        try:
            await limits.rate.acquire()
        except SharedLimitsUnavailableError:
            ...   # the actor is gone: check `ray list actors`, recreate it
    """


class GatewayError(AgentCoreRLError):
    """The rollout gateway was misused or could not do its job.

    Example::

        except GatewayError as exc:
            log.error("gateway: %s", exc)
    """


class TraceLostError(GatewayError):
    """A rollout must not end as a success without tokens: with a gateway, the client makes
    this its outcome (with the agent's result in ``envelope`` when it had arrived).

    Example::

        try:
            result = await fut
        except TraceLostError as exc:
            print(exc.session_id, exc.reason)
    """

    def __init__(
        self, session_id: str, reason: str, *, envelope: Mapping[str, Any] | None = None
    ) -> None:
        super().__init__(f"trace of session {session_id!r} is lost: {reason}")
        self.session_id = session_id
        self.reason = reason
        self.envelope = None if envelope is None else dict(envelope)


class GatewayInputError(GatewayError, ValueError):
    """A model call or an admin request the gateway refuses (a 400).

    Example::

        gateway.set_policy_version(-1)   # raises GatewayInputError: must be in 0..
    """


class AlreadyPausedError(GatewayError):
    """A pause was asked while the gateway is paused (a 409).

    Example::

        async with gateway.paused():
            await gateway.pause()        # raises AlreadyPausedError
    """


class UpstreamError(GatewayError):
    """Refused, reset, cut short or silent past the read timeout (a 502 over HTTP).

    Example::

        try:
            await gateway.pause("suspend")
        except UpstreamError as exc:
            print("vLLM would not pause:", exc)
    """
