"""Errors leave the app's lifespan as themselves, never as an exception group."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import anyio
import httpx
import pytest

from agentcore_rl.server import AgentCoreRLApp


class Fatal(BaseException):
    """Not an Exception: the rollout runner lets it through to the app's task group."""


def lifespan_raising(where: str) -> Any:
    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        if where == "startup":
            raise ValueError("the user's startup failed")
        yield
        if where == "shutdown":
            raise ValueError("the user's shutdown failed")

    return lifespan


@pytest.mark.parametrize("where", ["startup", "shutdown"])
async def test_a_user_lifespan_error_leaves_as_itself(where: str) -> None:
    app = AgentCoreRLApp(lifespan=lifespan_raising(where))
    with pytest.raises(ValueError, match=f"the user's {where} failed"):
        async with app.router.lifespan_context(app):
            pass
    assert app.closing


async def test_an_error_inside_async_with_app_leaves_as_itself() -> None:
    with pytest.raises(KeyError, match="mine"):
        async with AgentCoreRLApp():
            raise KeyError("mine")


async def test_a_task_failing_in_the_apps_task_group_leaves_as_itself() -> None:
    app = AgentCoreRLApp()
    started = anyio.Event()

    @app.rollout_entrypoint
    async def solve(payload: dict[str, Any]) -> dict[str, Any]:
        started.set()
        raise Fatal("the handler stopped the world")

    async def serve_one() -> None:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://agent") as http:
                assert (await http.post("/invocations", json={})).status_code == 200
            await started.wait()
            await anyio.sleep_forever()  # cancelled by the failing task

    with pytest.raises(Fatal, match="stopped the world"):
        await serve_one()
