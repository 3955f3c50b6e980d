"""app.run() in a real process: SIGTERM cancels the running rollout and writes its envelope."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
import textwrap
from pathlib import Path

import httpx
import pytest

from agentcore_rl import protocol
from agentcore_rl.s3 import ResultStore

from .helpers import SESSION, rollout_payload, session_headers

AGENT = textwrap.dedent(
    """
    import sys, threading
    from agentcore_rl.server import AgentCoreRLApp, ShutdownConfig

    app = AgentCoreRLApp(shutdown=ShutdownConfig(grace=0.05))

    @app.rollout_entrypoint
    def solve(payload):
        print("entered", flush=True)
        threading.Event().wait(60)   # blocks like a slow tool call
        return {"rewards": [1.0]}

    if __name__ == "__main__":
        app.run(host="127.0.0.1", port=int(sys.argv[1]), log_level="info")
    """
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def read_until(stream: asyncio.StreamReader, marker: str, lines: list[str]) -> None:
    while True:
        line = (await stream.readline()).decode()
        if not line:
            raise AssertionError(f"stream ended before {marker!r}: {''.join(lines)}")
        lines.append(line)
        if marker in line:
            return


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
async def test_sigterm_writes_cancelled_envelope(
    store: ResultStore, bucket: str, s3_endpoint: str, tmp_path: Path
) -> None:
    script = tmp_path / "agent.py"
    script.write_text(AGENT)
    port = free_port()
    env = {**os.environ, "AWS_ENDPOINT_URL_S3": s3_endpoint, "PYTHONUNBUFFERED": "1"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(script),
        str(port),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    assert proc.stdout is not None
    assert proc.stderr is not None
    log: list[str] = []
    try:
        await asyncio.wait_for(read_until(proc.stderr, "Uvicorn running on", log), 30)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
            response = await http.post(
                "/invocations", json=rollout_payload(bucket), headers=session_headers()
            )
            assert response.status_code == 200
        await asyncio.wait_for(read_until(proc.stdout, "entered", []), 10)
        proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(read_until(proc.stderr, "agent server shut down", log), 20)
        # uvicorn re-raises the captured SIGTERM once shut down, so the exit is by signal.
        assert await asyncio.wait_for(proc.wait(), 20) in (0, -signal.SIGTERM)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    text = "".join(log)
    assert "1 cancelled" in text
    envelope = await store.get_json(bucket, f"exp/q-1/{SESSION}.json")
    assert envelope is not None
    assert envelope[protocol.ERROR_TYPE] == protocol.ERROR_CANCELLED
