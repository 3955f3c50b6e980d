"""A trainer killed with SIGKILL mid-batch leaves nothing running for long: its lease
lapses and the agent server cancels every one of its rollouts, each with a ``cancelled``
envelope saying why."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import textwrap
from pathlib import Path

import pytest

from agentcore_rl import protocol
from agentcore_rl.client import LivenessConfig
from agentcore_rl.client.liveness import ClientLease
from agentcore_rl.client.outcomes import is_retryable
from agentcore_rl.errors import RolloutError
from agentcore_rl.local.background import BackgroundServer
from agentcore_rl.s3 import ResultStore
from agentcore_rl.server import FaultChecks, SpoolConfig
from tests.client.agents import Recorder, make_agent
from tests.conftest import FAST_RETRY
from tests.server.test_sigterm import free_port, read_until

ROLLOUTS = 12

TRAINER = textwrap.dedent(
    """
    import asyncio, sys
    from agentcore_rl.client import AsyncRolloutClient, AwsConfig, Limits, LivenessConfig

    async def main(url, endpoint, bucket, count):
        client = AsyncRolloutClient(
            agent_url=url, s3_bucket=bucket, exp_id="exp", aws=AwsConfig(s3_endpoint_url=endpoint),
            limits=Limits(tps=1000.0), liveness=LivenessConfig(lease=1.0, lease_renew=0.1),
        )
        async with client:
            futures = [await client.invoke({"mode": "hang"}) for _ in range(int(count))]
            print("accepted", " ".join(f.session_id for f in futures), flush=True)
            await asyncio.Event().wait()  # mid-batch: killed here

    asyncio.run(main(*sys.argv[1:]))
    """
)


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
async def test_rollouts_of_a_killed_client_are_cancelled_after_its_lease(
    s3_endpoint: str, bucket: str, store: ResultStore, tmp_path: Path
) -> None:
    recorder = Recorder()
    agent_store = ResultStore(endpoint_url=s3_endpoint, retry=FAST_RETRY)
    app = make_agent(
        agent_store,
        recorder,
        spool=SpoolConfig(directory=tmp_path / "spool"),
        faults=FaultChecks(lease_interval=0.1),
    )
    script = tmp_path / "trainer.py"
    script.write_text(TRAINER)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    async with BackgroundServer(app) as server:
        trainer = await asyncio.create_subprocess_exec(
            sys.executable,
            str(script),
            server.url,
            s3_endpoint,
            bucket,
            str(ROLLOUTS),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
        )
        try:
            lines: list[str] = []
            assert trainer.stdout is not None
            await asyncio.wait_for(read_until(trainer.stdout, "accepted", lines), 60)
            sessions = lines[-1].split()[1:]
            assert len(sessions) == ROLLOUTS
            await recorder.wait_for(lambda: recorder.running == ROLLOUTS, timeout=30)
        finally:
            if trainer.returncode is None:
                trainer.send_signal(signal.SIGKILL)
            await asyncio.wait_for(trainer.wait(), 30)
        # Lease 1 s, checked every 0.1 s: the bound only keeps a regression from hanging.
        await recorder.wait_for(lambda: recorder.cancelled >= set(sessions), timeout=30)
        assert await app.runner.wait(app.runner.jobs, within=10)
        assert app.leases.cancelled == ROLLOUTS
    for session in sessions:
        keys = await store.list_keys(bucket, "exp/")
        (key,) = [k for k in keys if k.endswith(f"/{session}.json")]
        envelope = await store.get_json(bucket, key)
        assert envelope is not None
        assert envelope[protocol.ERROR_TYPE] == protocol.ERROR_CANCELLED
        assert "the client's lease lapsed" in envelope[protocol.STOP_REASON]
    await agent_store.aclose()


async def test_a_renewal_s3_refuses_is_logged_and_retried_not_raised(
    caplog: pytest.LogCaptureFixture,
) -> None:
    dead = ResultStore(endpoint_url=f"http://127.0.0.1:{free_port()}", retry=FAST_RETRY)
    lease = ClientLease(dead, "rollouts", "exp", LivenessConfig(lease=10.0, lease_renew=1.0))
    assert lease.key.startswith("exp/.leases/")
    assert not await lease.renew_once()
    assert not await lease.renew_once()
    assert (lease.failures, lease.seq) == (2, 0)
    assert len([r for r in caplog.records if "could not renew" in r.getMessage()]) == 1
    await dead.aclose()


def test_a_lease_cancel_is_retryable_in_a_new_session() -> None:
    # A live client that reads one had stalled for the whole lease: the input is not at
    # fault (and `eval --resume` runs such rollouts again).
    envelope = {
        protocol.STATUS_CODE: 500,
        protocol.ERROR_TYPE: protocol.ERROR_CANCELLED,
        protocol.STOP_REASON: protocol.LEASE_LAPSED_REASON.format(ttl=180),
    }
    assert is_retryable(RolloutError(envelope))
    assert not is_retryable(RolloutError({**envelope, protocol.STOP_REASON: "cancelled"}))
