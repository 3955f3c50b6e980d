"""Every exception class the library defines is an ``AgentCoreRLError`` and stands in the tree
drawn in ``errors.py``'s docstring (the edge's ``Refusal`` and its kinds aside: the internal
signal of a server, answered as an HTTP error where it is raised, never leaving it)."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re

import agentcore_rl
from agentcore_rl import errors
from agentcore_rl._extras import MissingExtraError
from agentcore_rl.edge import Refusal


def _library_exceptions() -> dict[str, type[BaseException]]:
    found: dict[str, type[BaseException]] = {}
    for info in pkgutil.walk_packages(agentcore_rl.__path__, "agentcore_rl."):
        if info.name.endswith("__main__"):  # runs the command
            continue
        try:
            module = importlib.import_module(info.name)
        except MissingExtraError:  # an extra not installed here (a trainer's)
            continue
        except ImportError:
            continue
        for name, value in vars(module).items():
            if (
                inspect.isclass(value)
                and issubclass(value, BaseException)
                and value.__module__ == info.name
            ):
                found[name] = value
    return found


def test_every_library_exception_is_an_agentcore_rl_error_in_the_tree() -> None:
    found = _library_exceptions()
    assert {"UpstreamError", "MissingExtraError"} <= set(found)
    tree = errors.__doc__ or ""
    for name, cls in sorted(found.items()):
        if issubclass(cls, Refusal):
            continue
        assert issubclass(cls, errors.AgentCoreRLError), f"{cls.__module__}.{name}"
        assert re.search(rf"(^|[ ─]){name}(\s|$)", tree, re.M), f"{name} is not in the tree"
