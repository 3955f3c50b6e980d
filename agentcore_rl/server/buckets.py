"""BucketCheck: is a result bucket usable? Asked once per bucket, answered from memory.

A rollout whose bucket does not exist or refuses the server would run, fail to write its
envelope, be spooled and retried for ever, while its client waits out its timeout. So the
server asks S3 (HeadBucket) before accepting the first rollout for a bucket and refuses
invocations for a bucket S3 says is missing or forbidden. Only those answers are
verdicts; an outage (timeouts, 5xx, throttling) leaves the rollout accepted, to be
spooled and written when S3 is back. Concurrent invocations for an unchecked bucket share
one request.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

import anyio

from agentcore_rl import protocol
from agentcore_rl.errors import InvalidPayloadError, StorageError
from agentcore_rl.s3 import ResultStore
from agentcore_rl.server.config import FaultChecks
from agentcore_rl.server.spool import s3_destination

__all__ = ["BucketCheck"]

logger = logging.getLogger(__name__)

# S3 answers about a bucket that no waiting cures, with what the user should do.
_FINAL_CODES: Final = {
    "NoSuchBucket": (400, "it does not exist; create it or fix {field}"),
    "AccessDenied": (403, "the agent server's credentials may not use it"),
    "AllAccessDisabled": (403, "all access to it is disabled"),
    "InvalidAccessKeyId": (403, "the agent server's AWS access key is not valid"),
    "SignatureDoesNotMatch": (403, "the agent server's AWS secret key is wrong"),
    "PermanentRedirect": (400, "it is in another region than the agent server's S3 client"),
}


@dataclass
class _Verdict:
    until: float
    refusal: InvalidPayloadError | None


class BucketCheck:
    """Remembered HeadBucket answers, one per bucket (see the module docstring)."""

    def __init__(
        self,
        store: ResultStore,
        config: FaultChecks,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.config = config
        self._clock = clock
        self._verdicts: dict[str, _Verdict] = {}
        self._checking: dict[str, asyncio.Event] = {}
        #: HeadBucket requests sent (for tests and benchmarks).
        self.requests = 0

    async def require(self, bucket: str) -> None:
        """Return when ``bucket`` is usable or S3 cannot tell now; raise the refusal
        (:class:`InvalidPayloadError`, 4xx, naming the bucket and the cause) when not."""
        if not self.config.check_buckets:
            return
        verdict = self._verdicts.get(bucket)
        if verdict is None or verdict.until <= self._clock():
            verdict = await self._check(bucket)
        if verdict is not None and verdict.refusal is not None:
            raise verdict.refusal

    async def _check(self, bucket: str) -> _Verdict | None:
        running = self._checking.get(bucket)
        if running is not None:  # another invocation is asking: share its answer
            with anyio.move_on_after(self.config.bucket_wait):
                await running.wait()
            return self._verdicts.get(bucket)
        done = self._checking[bucket] = asyncio.Event()
        try:
            refusal: InvalidPayloadError | None = None
            with anyio.move_on_after(self.config.bucket_wait) as waited:
                self.requests += 1
                try:
                    await self.store.head_bucket(bucket)
                except StorageError as exc:
                    refusal = _refusal(bucket, exc, s3_destination(self.store)["endpoint_url"])
                    if refusal is None:
                        logger.info("could not check S3 bucket %s now (%s)", bucket, exc.code)
                        return None
            if waited.cancelled_caught:
                logger.info("no answer from S3 about bucket %s in time", bucket)
                return None
            ttl = self.config.bucket_ttl if refusal is None else self.config.bucket_miss_ttl
            verdict = self._verdicts[bucket] = _Verdict(self._clock() + ttl, refusal)
            if refusal is not None:
                logger.warning("refusing rollouts for S3 bucket %s: %s", bucket, refusal.message)
            return verdict
        finally:
            del self._checking[bucket]
            done.set()


def _refusal(bucket: str, exc: StorageError, endpoint: str | None) -> InvalidPayloadError | None:
    final = _FINAL_CODES.get(exc.code)
    if final is None:
        return None
    status, advice = final
    field = f"{protocol.ROLLOUT_FIELD}.{protocol.S3_BUCKET}"
    at = f" at {endpoint}" if endpoint else " in AWS S3"
    return InvalidPayloadError(
        f"result bucket {bucket!r}{at} cannot be used: {exc.code}: {advice.format(field=field)}",
        status_code=status,
        field=field,
    )
