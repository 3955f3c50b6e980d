"""The package has no import cycles, counting imports in functions and type-only ones."""

from __future__ import annotations

import ast
from pathlib import Path

import agentcore_rl

ROOT = Path(agentcore_rl.__file__).parent


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            wanted = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            # `from pkg import mod` imports the submodule, not (only) the package.
            wanted = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                for alias in node.names
            ]
        else:
            continue
        for target in wanted:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                targets.add(target)
    return targets


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in graph[node]:
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    return found


def test_no_import_cycles() -> None:
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    assert _cycles(graph) == []


def test_a_cycle_is_found() -> None:
    assert _cycles({"a": {"b"}, "b": {"a"}, "c": set()}) == [["a", "b"]]


def test_no_two_modules_share_a_name() -> None:
    # A module's name says its one concept; two `config.py` would be two concepts under one
    # name (and a grep for one finds the other).
    seen: dict[str, list[str]] = {}
    for path in ROOT.rglob("*.py"):
        if path.stem not in ("__init__", "__main__"):
            seen.setdefault(path.name, []).append(str(path.relative_to(ROOT)))
    assert {short: names for short, names in seen.items() if len(names) > 1} == {}


def test_only_the_cli_local_and_the_clients_gateway_link_import_the_gateway() -> None:
    modules = _modules()
    allowed = ("agentcore_rl.cli", "agentcore_rl.local", "agentcore_rl.gateway")
    # the package's lazy public names, and the client's in-process gateway link
    links = {"agentcore_rl", "agentcore_rl.client.traces", "agentcore_rl.client.config"}
    importers = {
        name
        for name, path in modules.items()
        if not name.startswith(allowed)
        and name not in links
        and any(t.startswith("agentcore_rl.gateway") for t in _imports(name, path, modules))
    }
    assert importers == set()


def test_no_module_over_600_lines() -> None:
    # One concept per module: past 600 lines a module has become two.
    long = {
        str(path.relative_to(ROOT)): n
        for path in ROOT.rglob("*.py")
        if (n := len(path.read_text().splitlines())) > 600
    }
    assert long == {}


def test_a_chat_call_goes_down_its_path_without_coming_back() -> None:
    # The ASGI entry, the admission of a call, the mode, vLLM's scale-out exchange, the
    # backend's request shapes and the HTTP pool: each module on the way to the upstream
    # imports only those after it, so no step calls back into one the call already left.
    path = [
        f"agentcore_rl.gateway.{name}"
        for name in ("gateway", "admission", "proxy", "scale_out", "backends", "upstream")
    ]
    modules = _modules()
    for i, name in enumerate(path):
        assert _imports(name, modules[name], modules) & set(path) <= set(path[i + 1 :]), name
