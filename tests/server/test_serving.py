"""Serving on uvicorn's own options: /ping answers beside idle connections, app.run()
passes uvicorn options through and says where it listens, and the library reaches into no
private part of uvicorn."""

from __future__ import annotations

import asyncio
import os
import sys
import textwrap
from pathlib import Path

import httpx

import agentcore_rl
from agentcore_rl.local.background import BackgroundServer
from agentcore_rl.s3 import ResultStore
from agentcore_rl.server import AgentCoreRLApp
from agentcore_rl.server.overload import serve_options

from .test_sigterm import free_port, read_until


async def test_ping_gets_in_beside_idle_connections(store: ResultStore) -> None:
    app = AgentCoreRLApp(store=store)
    async with BackgroundServer(app, **serve_options({})) as server:
        idle = [await asyncio.open_connection(server.host, server.port) for _ in range(32)]
        try:
            for _ in range(3):  # a fresh connection each time
                async with httpx.AsyncClient(base_url=server.url) as http:
                    assert (await http.get("/ping")).status_code == 200
        finally:
            for _, writer in idle:
                writer.close()


def test_serving_keeps_connections_longer_than_clients_do() -> None:
    # httpx drops idle connections after 5 s, aiohttp after 15 s: the server must not
    # close first, or a client's next request meets a reset connection.
    options = serve_options({})
    assert options["timeout_keep_alive"] > 15
    assert options["backlog"] >= 4096
    assert serve_options({"backlog": 64, "limit_concurrency": 10}) == {
        "timeout_keep_alive": 20.0,
        "backlog": 64,
        "limit_concurrency": 10,
    }


def test_no_private_uvicorn_parts() -> None:
    root = Path(agentcore_rl.__file__).parent
    for path in root.rglob("*.py"):
        text = path.read_text()
        assert "uvicorn.protocols" not in text, path
        assert "resource.setrlimit" not in text, path


AGENT = textwrap.dedent(
    """
    import sys
    from agentcore_rl.server import AgentCoreRLApp

    app = AgentCoreRLApp()

    @app.rollout_entrypoint
    def solve(payload):
        return {}

    if __name__ == "__main__":
        app.run(host="127.0.0.1", port=int(sys.argv[1]), limit_concurrency=64)
    """
)


async def test_app_run_serves_with_uvicorn_options(tmp_path: Path) -> None:
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
        assert any(f"listening on http://127.0.0.1:{port}" in line for line in log), log
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
            assert (await http.get("/ping")).status_code == 200
    finally:
        proc.terminate()
        await asyncio.wait_for(proc.wait(), 30)
