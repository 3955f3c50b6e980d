"""The public API: a sorted, importable ``__all__`` whose names are documented with examples."""

from __future__ import annotations

import importlib.metadata
import inspect
import subprocess
import sys

import agentcore_rl


def test_all_is_sorted_and_unique() -> None:
    assert list(agentcore_rl.__all__) == sorted(set(agentcore_rl.__all__))


def test_every_public_name_exists_and_has_a_usage_example() -> None:
    for name in agentcore_rl.__all__:
        obj = getattr(agentcore_rl, name)
        doc = inspect.getdoc(obj) or ""
        assert "Example" in doc, f"{name} has no usage example in its docstring"


def test_no_public_name_is_left_out_of_all() -> None:
    public = {
        name
        for name, obj in vars(agentcore_rl).items()
        if not name.startswith("_") and (inspect.isclass(obj) or inspect.isfunction(obj))
    }
    assert public <= set(agentcore_rl.__all__)


def _imported_after(statement: str) -> set[str]:
    """Every module a fresh interpreter has loaded after ``statement``."""
    code = f"import sys\n{statement}\nprint(' '.join(sorted(sys.modules)))"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    return set(done.stdout.split())


def test_the_agent_side_does_not_import_the_clients_dependencies() -> None:
    loaded = _imported_after("from agentcore_rl import AgentCoreRLApp")
    assert "starlette" in loaded
    assert not loaded & {"tqdm", "agentcore_rl.client", "agentcore_rl.cli"}


def test_the_trainer_side_does_not_import_the_servers_dependencies() -> None:
    loaded = _imported_after("from agentcore_rl import AsyncRolloutClient")
    assert "httpx" in loaded
    assert not loaded & {"starlette", "uvicorn", "tqdm", "agentcore_rl.server"}


def test_the_version_is_the_distributions() -> None:
    assert importlib.metadata.version("agentcore-rl") == agentcore_rl.__version__


def test_serve_needs_only_the_server_extra() -> None:
    # The agent container runs `agentcore-rl serve` with `agentcore-rl[server]` installed.
    loaded = _imported_after(
        "from agentcore_rl.cli import build_parser; from agentcore_rl.cli.commands import "
        "cmd_serve; from agentcore_rl import AgentCoreRLApp; build_parser()"
    )
    # (httpx may be loaded: aiobotocore uses it when it is installed.)
    assert not loaded & {"tqdm", "openai", "moto", "agentcore_rl.client"}


def test_the_top_level_holds_what_the_docs_use_and_no_more() -> None:
    # Everything else stays importable from its own module (agentcore_rl.client, ...).
    assert len(agentcore_rl.__all__) <= 32
    from agentcore_rl.client import TokenBucket, WatcherConfig

    assert "TokenBucket" not in agentcore_rl.__all__
    assert WatcherConfig.__module__ == "agentcore_rl.client.watcher"
    assert TokenBucket.__module__ == "agentcore_rl.ratelimit"
