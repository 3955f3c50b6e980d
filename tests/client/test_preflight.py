"""Entering a client checks its services, connecting to each within ``Timeouts.check``
seconds: a wrong endpoint (nobody listens, or nothing takes the connection) ends the entry
with the one-line error ``agentcore-rl eval`` prints, naming the service."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator

import pytest

from agentcore_rl import AsyncRolloutClient, AwsConfig
from agentcore_rl.client import Timeouts
from agentcore_rl.errors import AgentCoreRLError, InvocationError, StorageError
from tests.server.test_sigterm import free_port

ARN = "arn:aws:bedrock-agentcore:us-west-2:123456789012:runtime/preflight"


@pytest.fixture
def silent_url() -> Iterator[str]:
    """A port that takes no connection, as a host that drops packets: its accept queue is
    full (Linux then drops new SYNs, so connecting waits until the caller gives up)."""
    with contextlib.ExitStack() as stack:
        listener = stack.enter_context(socket.socket())
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        for _ in range(3):
            filler = stack.enter_context(socket.socket())
            filler.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                filler.connect(listener.getsockname())
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"


def _client(s3: str, runtime: str, bucket: str, check: float) -> AsyncRolloutClient:
    return AsyncRolloutClient(
        agent_runtime_arn=ARN,
        s3_bucket=bucket,
        exp_id="pre",
        aws=AwsConfig(s3_endpoint_url=s3, endpoint_url=runtime),
        timeouts=Timeouts(check=check),
    )


def test_the_default_bound_leaves_room_within_two_seconds() -> None:
    # One check may wait its bound; the CPU of making the AWS clients comes on top (a
    # refused entry took 0.3-0.7 s in all at load average 10: docs/benchmarks.md).
    assert Timeouts().check <= 1.0


@pytest.mark.parametrize("problem", ["refused", "silent"])
@pytest.mark.parametrize("service", ["runtime", "s3"])
async def test_a_wrong_endpoint_fails_the_entry_in_one_line(
    s3_endpoint: str, bucket: str, silent_url: str, service: str, problem: str
) -> None:
    wrong = silent_url if problem == "silent" else f"http://127.0.0.1:{free_port()}"
    error: type[AgentCoreRLError]
    if service == "runtime":
        client = _client(s3_endpoint, wrong, bucket, check=0.2)
        error, words = InvocationError, f"cannot reach the AgentCore endpoint {wrong}: "
    else:
        client = _client(wrong, f"http://127.0.0.1:{free_port()}", bucket, check=0.2)
        error, words = StorageError, f"cannot use S3 bucket {bucket!r} at {wrong}: "
    with pytest.raises(error) as caught:
        async with client:
            pytest.fail("entered")
    message = str(caught.value)
    assert message.startswith(words), message
    assert len(message.splitlines()) == 1
    if problem == "silent":
        assert "ConnectTimeoutError" in message
