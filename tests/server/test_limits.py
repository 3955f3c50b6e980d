"""Serving with limits: idle connections closed, /ping admitted at the connection cap,
the open-file limit raised, "Too many open files" logged once per interval."""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import sys
import textwrap
from pathlib import Path

import httpx
import pytest

from agentcore_rl.local.background import BackgroundServer
from agentcore_rl.s3 import ResultStore
from agentcore_rl.server import AgentCoreRLApp
from agentcore_rl.server.limits import OpenFilesLogFilter, serve_options

from .helpers import FakeClock
from .test_sigterm import free_port, read_until


async def closed_by_server(reader: asyncio.StreamReader) -> bool:
    """True when the server closes the connection (bounded wait)."""
    try:
        return await asyncio.wait_for(reader.read(), 5) == b""
    except (ConnectionResetError, TimeoutError):
        return False


async def test_connection_without_a_request_is_closed(store: ResultStore) -> None:
    app = AgentCoreRLApp(store=store)
    options = serve_options({"first_request_timeout": 0.2})
    async with BackgroundServer(app, **options) as server:
        silent_reader, silent = await asyncio.open_connection(server.host, server.port)
        slow_reader, slow = await asyncio.open_connection(server.host, server.port)
        slow.write(b"GET /ping HTTP/1.1\r\nHost: ag")  # slowloris: a head that never ends
        assert await closed_by_server(silent_reader)
        assert await closed_by_server(slow_reader)
        for writer in (silent, slow):
            writer.close()
        async with httpx.AsyncClient(base_url=server.url) as http:
            assert (await http.get("/ping")).status_code == 200


async def test_ping_gets_in_when_connections_are_full(store: ResultStore) -> None:
    app = AgentCoreRLApp(store=store)
    options = serve_options({"max_connections": 4, "first_request_timeout": 60})
    async with BackgroundServer(app, **options) as server:
        idle = [await asyncio.open_connection(server.host, server.port) for _ in range(6)]
        async with httpx.AsyncClient(base_url=server.url) as http:
            for _ in range(3):
                assert (await http.get("/ping")).status_code == 200
        closed = [await closed_by_server(reader) for reader, _ in idle[:2]]
        assert all(closed)  # the oldest idle connections made room
        for _, writer in idle:
            writer.close()


def test_too_many_open_files_logged_once_per_interval(caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock(0)
    log = logging.getLogger("agentcore_rl.test.accept")
    log.addFilter(OpenFilesLogFilter(60, clock=clock))
    out_of_files = OSError(errno.EMFILE, "Too many open files")
    with caplog.at_level(logging.ERROR, logger=log.name):
        for _ in range(100):
            log.error("socket.accept() out of system resource", exc_info=out_of_files)
            log.error("an unrelated error")
        clock.advance(61)
        log.error("socket.accept() out of system resource", exc_info=out_of_files)
    emfile = [r for r in caplog.records if "out of system resource" in r.getMessage()]
    assert len(emfile) == 2
    assert emfile[0].exc_info is None  # no traceback
    assert "99 like it in the last interval hidden" in emfile[1].getMessage()
    assert sum("unrelated" in r.getMessage() for r in caplog.records) == 100


AGENT = textwrap.dedent(
    """
    import resource, sys
    from agentcore_rl.server import AgentCoreRLApp

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(256, hard), hard))
    app = AgentCoreRLApp()

    @app.rollout_entrypoint
    def solve(payload):
        return {}

    if __name__ == "__main__":
        app.run(host="127.0.0.1", port=int(sys.argv[1]), first_request_timeout=0.2)
    """
)


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX rlimits")
async def test_app_run_serves_with_limits(tmp_path: Path) -> None:
    import resource

    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    script = tmp_path / "agent.py"
    script.write_text(AGENT)
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(script),
        str(port),
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert proc.stderr is not None
    log: list[str] = []
    try:
        await asyncio.wait_for(read_until(proc.stderr, "Uvicorn running on", log), 30)
        if hard > 256:
            assert any("open-file limit raised from 256" in line for line in log), log
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        assert await closed_by_server(reader)  # no request: closed, not held forever
        writer.close()
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
            assert (await http.get("/ping")).status_code == 200
    finally:
        proc.terminate()
        await asyncio.wait_for(proc.wait(), 30)
