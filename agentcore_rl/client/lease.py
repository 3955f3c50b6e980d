"""ClientLease: the client's proof of life, read by the agent servers that run its rollouts.

A client that crashes (SIGKILL, OOM, a lost host) cannot stop its sessions, and on
AgentCore Runtime each of them keeps a microVM busy until its rollout ends, for hours.
So the client keeps one small S3 object alive (``{exp_id}/.leases/{lease_id}.json``,
rewritten every ``lease_renew`` seconds with a new ``seq``) and names it in every
invocation's ``_rollout.lease``. Agent servers read it once per check interval for all
their rollouts that name it and cancel those whose lease went unrenewed for its ``ttl``
(:mod:`agentcore_rl.server.lease`). Renewals cost S3 PUTs, not AgentCore TPS.

A renewal that fails (S3 down) is logged and tried again at the next interval: the
servers do not count an unreadable lease as lapsed either.

Example::

    lease = ClientLease(store, "rollouts", "exp-1", LivenessConfig(lease=120.0))
    body["_rollout"]["lease"] = lease.reference
    service.start_soon(lease.run, name="client lease")
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any

from agentcore_rl import protocol
from agentcore_rl.client.liveness import LivenessConfig
from agentcore_rl.errors import StorageError
from agentcore_rl.s3 import ResultStore

__all__ = ["ClientLease"]

logger = logging.getLogger(__name__)


class ClientLease:
    """One client's lease: where it lives, and the task that renews it.

    ``config.lease`` must not be ``None`` (no lease: do not create one).
    ``wall`` (epoch seconds) stamps renewals; ``sleep`` paces them.
    """

    def __init__(
        self,
        store: ResultStore,
        bucket: str,
        exp_id: str,
        config: LivenessConfig,
        *,
        wall: Callable[[], float] = time.time,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        if config.lease is None:
            raise ValueError("ClientLease needs a lease (seconds)")
        self.store = store
        self.bucket = bucket
        self.lease_id = config.lease_id or secrets.token_hex(16)
        self.key = protocol.lease_key(exp_id, self.lease_id)
        self.ttl = config.lease
        self.renew = config.lease_renew
        self._sleep = sleep
        self._wall = wall
        self.seq = 0
        self.failures = 0
        self._failing = False
        #: The ``_rollout.lease`` value of this client's invocations.
        self.reference: dict[str, str] = protocol.lease_reference(bucket, self.key)

    def __repr__(self) -> str:
        return f"ClientLease(s3://{self.bucket}/{self.key}, ttl={self.ttl:g}, seq={self.seq})"

    def body(self) -> dict[str, Any]:
        """The next renewal's content."""
        return protocol.lease_body(
            self.lease_id,
            seq=self.seq + 1,
            renewed_at=self._wall(),
            ttl=self.ttl,
            renew=self.renew,
        )

    async def renew_once(self) -> bool:
        """Write the next renewal; False (logged once per run of failures) when S3 refused."""
        try:
            await self.store.put_json(self.bucket, self.key, self.body())
        except StorageError as exc:
            self.failures += 1
            if not self._failing:
                self._failing = True
                logger.warning(
                    "could not renew the client's lease s3://%s/%s (%s); retrying every "
                    "%g s. Agents do not count an unreadable lease as lapsed.",
                    self.bucket,
                    self.key,
                    exc.code,
                    self.renew,
                )
            return False
        self.seq += 1
        if self._failing:
            self._failing = False
            logger.info("the client's lease s3://%s/%s is renewed again", self.bucket, self.key)
        return True

    async def run(self) -> None:
        """Renew every ``renew`` seconds until cancelled (the client's task group owns it)."""
        while True:
            await self.renew_once()
            await self._sleep(self.renew)
