"""Errors leave our objects as themselves: a task group's one error, not its group.

anyio's task groups raise an exception group even for one error; the task groups are our
business, so what leaves an ``async with`` of ours is that one error (a group stays a
group only when several things failed at once).

Example::

    try:
        await owner.aclose()
    except BaseException as exc:
        raise_unwrapped(exc)
"""

from __future__ import annotations

from typing import NoReturn

__all__ = ["raise_unwrapped", "unwrap"]


def unwrap(exc: BaseException) -> BaseException:
    """The one error inside an exception group (nested groups flattened), else ``exc``."""
    # Duck-typed: the builtin group from Python 3.11, the exceptiongroup backport before.
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
