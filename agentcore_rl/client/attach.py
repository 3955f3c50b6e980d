"""What ``AsyncRolloutClient.attach`` needs besides the client: the checked coordinates of
a rollout that is already running, and a first read of its result key.

A resumed evaluation attaches to the rollouts an earlier process started: nothing is sent
to the agent, so all there is to go on is the session id and the result key it journaled.

Example::

    target = AttachTarget.resolve(session_id=sid, result_key=key, input_id=None,
                                  s3_bucket="rollouts", check_session_id=sessions.check)
    found = await peek_result(store, target.s3_bucket, target.result_key)
    fut = target.future(started_at=entry.started_at)
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agentcore_rl import protocol
from agentcore_rl.client.future import RolloutFuture
from agentcore_rl.errors import InvalidRolloutConfig, StorageError
from agentcore_rl.s3 import ResultStore

__all__ = ["AttachTarget", "peek_result"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class AttachTarget:
    """The validated coordinates of a running rollout."""

    session_id: str
    result_key: str
    input_id: str
    s3_bucket: str

    @classmethod
    def resolve(
        cls,
        *,
        session_id: object,
        result_key: object,
        input_id: str | None,
        s3_bucket: str,
        check_session_id: Callable[[object], str],
    ) -> AttachTarget:
        """Check the coordinates (``InvalidRolloutConfig`` names a bad one; the session id
        goes through ``check_session_id``); ``input_id`` defaults to the one in the key."""
        sid = check_session_id(session_id)
        bucket = protocol.validate_bucket(s3_bucket, name="s3_bucket")
        if not isinstance(result_key, str) or not result_key:
            raise InvalidRolloutConfig(
                f"result_key must be a non-empty string, got {result_key!r}", field="result_key"
            )
        if input_id is None:
            try:
                input_id = protocol.parse_result_key(result_key)[1]
            except InvalidRolloutConfig:
                input_id = sid  # a key outside the usual layout: the session names it
        return cls(session_id=sid, result_key=result_key, input_id=input_id, s3_bucket=bucket)

    def future(self, *, started_at: float | None) -> RolloutFuture:
        """A pending future for this rollout, started at ``started_at`` (epoch seconds;
        default now)."""
        fut = RolloutFuture(
            session_id=self.session_id,
            input_id=self.input_id,
            s3_bucket=self.s3_bucket,
            result_key=self.result_key,
        )
        if started_at is not None:
            fut.invoked_at = started_at
        return fut


async def peek_result(store: ResultStore, bucket: str, key: str) -> dict[str, Any] | None:
    """Read the result envelope at ``s3://bucket/key``, or ``None`` (absent, or S3 failed:
    the completion watcher retries, and says so if the failure persists)."""
    try:
        return await store.get_json(bucket, key)
    except StorageError as exc:
        logger.warning("reading s3://%s/%s failed: %s", bucket, key, exc)
        return None
