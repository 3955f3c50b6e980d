"""The public API: a sorted, importable ``__all__`` whose names are documented with examples."""

from __future__ import annotations

import inspect

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
