"""Unknown keyword arguments are errors that name the keyword and the closest known one.

Python's own message ("got an unexpected keyword argument 'max_body'") names the word but
not what was meant; :func:`strict_keywords` adds the closest known keyword and, for a
keyword that moved into a config object, where it lives now.

Example::

    @strict_keywords(moved={"shutdown_grace": "shutdown=ShutdownConfig(grace=...)"})
    def __init__(self, *, shutdown: ShutdownConfig = DEFAULT_SHUTDOWN) -> None: ...
"""

from __future__ import annotations

import difflib
import functools
import inspect
from collections.abc import Callable, Collection, Mapping
from typing import ParamSpec, TypeVar

__all__ = ["strict_init", "strict_keywords", "unknown_keyword_error"]

P = ParamSpec("P")
R = TypeVar("R")
C = TypeVar("C", bound=type)

_NAMED = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def unknown_keyword_error(
    owner: str, name: str, known: Collection[str], moved: Mapping[str, str] | None = None
) -> TypeError:
    """The ``TypeError`` for keyword ``name`` that ``owner`` does not take."""
    message = f"{owner}() got an unexpected keyword argument {name!r}"
    if moved and name in moved:
        return TypeError(f"{message}: it is now {moved[name]}")
    close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.6)
    if close:
        return TypeError(f"{message}; did you mean {close[0]!r}?")
    return TypeError(f"{message}; known: {', '.join(sorted(known))}")


def strict_keywords(
    moved: Mapping[str, str] | None = None,
) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Decorate a function so that an unknown keyword raises :func:`unknown_keyword_error`."""

    def decorate(func: Callable[P, R]) -> Callable[P, R]:
        known = frozenset(
            name
            for name, param in inspect.signature(func).parameters.items()
            if param.kind in _NAMED
        )
        owner = func.__qualname__.removesuffix(".__init__")

        @functools.wraps(func)
        def checked(*args: P.args, **kwargs: P.kwargs) -> R:
            for name in kwargs:
                if name not in known:
                    raise unknown_keyword_error(owner, name, known - {"self"}, moved)
            return func(*args, **kwargs)

        return checked

    return decorate


def strict_init(cls: C) -> C:
    """Class decorator: :func:`strict_keywords` on ``cls.__init__`` (for dataclasses)."""
    init = strict_keywords()(cls.__init__)  # type: ignore[misc]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    cls.__init__ = init  # type: ignore[misc]
    return cls
