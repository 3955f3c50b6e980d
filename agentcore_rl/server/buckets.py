"""BucketCheck: a remembered HeadBucket per result bucket.

Without it, a rollout for a missing or forbidden bucket would be spooled and retried for
ever while its client times out. Only such answers refuse; an outage accepts (the spool
covers it). Concurrent invocations share one request.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Final, NamedTuple

import anyio

from agentcore_rl import protocol
from agentcore_rl.errors import InvalidPayloadError, StorageError
from agentcore_rl.s3 import ResultStore
from agentcore_rl.server.options import FaultChecks
from agentcore_rl.server.spool import s3_destination

__all__ = ["BucketCheck"]

logger = logging.getLogger(__name__)

_FIELD: Final = f"{protocol.ROLLOUT_FIELD}.{protocol.S3_BUCKET}"
# S3 answers about a bucket that no waiting cures, with what the user should do.
_FINAL_CODES: Final = {
    "NoSuchBucket": (400, "it does not exist; create it or fix {field}"),
    "AccessDenied": (403, "the agent server's credentials may not use it"),
    "AllAccessDisabled": (403, "all access to it is disabled"),
    "InvalidAccessKeyId": (403, "the agent server's AWS access key is not valid"),
    "SignatureDoesNotMatch": (403, "the agent server's AWS secret key is wrong"),
    "PermanentRedirect": (400, "it is in another region than the agent server's S3 client"),
}


class _Verdict(NamedTuple):
    until: float
    refusal: InvalidPayloadError | None


class BucketCheck:
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
        self.requests = 0

    async def require(self, bucket: str) -> None:
        """Return when ``bucket`` is usable or S3 cannot tell now, else raise a 4xx refusal."""
        if not self.config.check_buckets:
            return
        verdict = self._verdicts.get(bucket)
        if verdict is None or verdict.until <= self._clock():
            verdict = await self._check(bucket)
        if verdict is not None and verdict.refusal is not None:
            raise verdict.refusal

    async def _check(self, bucket: str) -> _Verdict | None:
        running = self._checking.get(bucket)
        if running is not None:  # share another invocation's answer
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
                    if exc.code not in _FINAL_CODES:
                        logger.info("could not check S3 bucket %s now (%s)", bucket, exc.code)
                        return None
                    status, advice = _FINAL_CODES[exc.code]
                    endpoint = s3_destination(self.store)["endpoint_url"]
                    at = f" at {endpoint}" if endpoint else " in AWS S3"
                    refusal = InvalidPayloadError(
                        f"result bucket {bucket!r}{at} cannot be used: {exc.code}: "
                        + advice.format(field=_FIELD),
                        status_code=status,
                        field=_FIELD,
                    )
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
