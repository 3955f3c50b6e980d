"""Errors leave our objects as themselves: what leaves an ``async with`` of ours is a task
group's one error, not its exception group (a group stays one only when several failed)."""

from __future__ import annotations

from typing import NoReturn

__all__ = ["raise_unwrapped", "unwrap"]


def unwrap(exc: BaseException) -> BaseException:
    """The one error inside an exception group (nested groups flattened), else ``exc``."""
    # Duck-typed: the builtin group and the exceptiongroup backport alike.
    leaves: list[BaseException] = []
    pending: list[BaseException] = [exc]
    while pending:
        current = pending.pop()
        inner = getattr(current, "exceptions", None)
        if isinstance(inner, tuple) and all(isinstance(e, BaseException) for e in inner):
            pending.extend(inner)
        else:
            leaves.append(current)
    return leaves[0] if len(leaves) == 1 else exc


def raise_unwrapped(exc: BaseException) -> NoReturn:
    """Raise ``exc``, or the one error it groups (with its own traceback)."""
    error = unwrap(exc)
    if error is exc:
        raise exc
    raise error from None
