"""A result bucket that cannot be used ends the rollout at once, in an error naming it;
an S3 outage on the agent's side leaves it pending (paused), not failed."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from agentcore_rl.client import Timeouts
from agentcore_rl.errors import InvocationError
from agentcore_rl.local.background import BackgroundServer
from agentcore_rl.s3 import ResultStore
from agentcore_rl.server import SpoolConfig
from tests.client.agents import Recorder, make_agent
from tests.client.conftest import ClientFactory
from tests.conftest import FAST_RETRY
from tests.server.test_sigterm import free_port


async def test_missing_bucket_fails_at_once_naming_the_bucket(
    make_client: ClientFactory, recorder: Recorder
) -> None:
    client = make_client(s3_bucket="no-such-bucket-19", timeouts=Timeouts(rollout=3600.0))
    # Bounded only to keep a regression from hanging the suite: the rollout's own
    # timeout (an hour) is what it used to wait for.
    with pytest.raises(InvocationError) as info:
        await asyncio.wait_for(client.invoke({"n": 1}), 30)
    message = str(info.value)
    assert "no-such-bucket-19" in message
    assert "NoSuchBucket" in message
    assert info.value.status_code == 400
    stats = client.stats
    assert (stats.invocations, stats.retries, stats.rollout_retries) == (1, 0, 0)
    assert recorder.sessions == []  # the handler never ran
    await client.aclose()
    assert client.unstopped_sessions == []


async def test_agent_side_s3_outage_leaves_the_rollout_pending(
    make_client: ClientFactory, recorder: Recorder, tmp_path: Path
) -> None:
    dead = ResultStore(endpoint_url=f"http://127.0.0.1:{free_port()}", retry=FAST_RETRY)
    app = make_agent(
        dead, recorder, spool=SpoolConfig(directory=tmp_path / "spool", retry_interval=60)
    )
    async with BackgroundServer(app) as server:
        client = make_client(agent_url=server.url)
        fut = await client.invoke({"n": 1})  # accepted: the bucket check had no answer
        await recorder.wait_for(lambda: fut.session_id in recorder.finished, timeout=10)
        assert await app.runner.wait(app.runner.jobs, within=10)  # envelope spooled
        assert app.spool.pending == 1
        assert not fut.done()  # waiting for S3 to come back, not failed
        assert client.stats.invocation_errors == 0
        await client.aclose()
    await dead.aclose()
