"""Unknown keywords are ``TypeError``s naming the closest known one (difflib) or where a
keyword moved (``max_concurrent_sessions`` -> ``limits=Limits(max_concurrent_sessions=...)``).
"""

from __future__ import annotations

import difflib
import functools
import inspect
import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Concatenate, Final, ParamSpec, TypeVar

from agentcore_rl.errors import ConfigurationError

__all__ = ["check_config_types", "check_numbers", "checked", "checked_init", "same_parameters"]

P = ParamSpec("P")
R = TypeVar("R")
C = TypeVar("C", bound=type)

_NAMED: Final = (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def checked(
    *, moved: Mapping[str, str] | None = None, extras: str | None = None
) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """An unknown keyword raises a ``TypeError`` naming the closest known one (or, for a
    ``moved`` one, where it lives now; else a hint that the mapping parameter ``extras``
    takes free-form keys) before the call."""

    def decorate(func: Callable[P, R]) -> Callable[P, R]:
        return _guard(func, inspect.signature(func), func.__qualname__, moved, extras)

    return decorate


def checked_init(cls: C) -> C:
    """The class's ``__init__`` checks its keywords (see :func:`checked`)."""
    # setattr, as mypy refuses assigning __init__; a generated one is qualified by its class.
    setattr(cls, "__init__", checked()(cls.__dict__["__init__"]))  # noqa: B010
    return cls


def _unexpected(
    call: str, name: str, known: Iterable[str], moved: Mapping[str, str], extras: str | None
) -> TypeError:
    message = f"{call} got an unexpected keyword argument {name!r}"
    hint = moved.get(name)
    if hint is None:
        close = difflib.get_close_matches(name, [*known, *moved], n=1)
        if close:
            hint = moved.get(close[0], close[0])
    if hint is not None:
        return TypeError(f"{message} (did you mean {hint!r}?)")
    if extras is not None:
        return TypeError(f"{message} (free-form keys go in {extras}={{{name!r}: ...}})")
    return TypeError(message)


def _guard(
    func: Callable[P, R],
    signature: inspect.Signature,
    qualname: str,
    moved: Mapping[str, str] | None,
    extras: str | None,
) -> Callable[P, R]:
    known = frozenset(n for n, p in signature.parameters.items() if p.kind in _NAMED)
    owner, _, name = qualname.rpartition(".")
    call = f"{owner}()" if name == "__init__" else f"{qualname}()"

    @functools.wraps(func)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        if not known.issuperset(kwargs):
            raise _unexpected(call, sorted(set(kwargs) - known)[0], known, moved or {}, extras)
        return func(*args, **kwargs)

    wrapper.__signature__ = signature  # type: ignore[attr-defined]
    wrapper._keyword_hints = (moved, extras)  # type: ignore[attr-defined]  # for facades
    return wrapper


def same_parameters(
    source: Callable[Concatenate[Any, P], Any],
) -> Callable[[Callable[..., R]], Callable[Concatenate[Any, P], R]]:
    """``source``'s parameters (and keyword checks) for a facade that forwards ``*args,
    **kwargs``: it takes exactly those, for callers and type checkers, and cannot drift."""
    source_signature = inspect.signature(source)
    moved, extras = getattr(source, "_keyword_hints", (None, None))

    def decorate(func: Callable[..., R]) -> Callable[Concatenate[Any, P], R]:
        own = inspect.signature(func)
        signature = source_signature.replace(return_annotation=own.return_annotation)
        return _guard(func, signature, func.__qualname__, moved, extras)

    return decorate


def check_config_types(*configs: tuple[str, object, type]) -> None:
    for name, value, kind in configs:
        if not isinstance(value, kind):
            raise ConfigurationError(
                f"{name} must be a {kind.__name__}, got {type(value).__name__}"
            )


def check_numbers(
    config: object,
    *names: str,
    above: float | None = None,
    at_least: float | None = None,
    integer: bool = False,
    optional: bool = False,
    finite: bool = False,
) -> None:
    """``ConfigurationError`` naming ``Class.field`` unless each field of ``config`` is a
    number (an int with ``integer``; ``None`` too with ``optional``) ``> above`` or
    ``>= at_least``, and finite with ``finite``."""
    for name in names:
        value = getattr(config, name)
        if value is None and optional:
            continue
        kind = int if integer else int | float
        ok = isinstance(value, kind) and not isinstance(value, bool) and value == value
        if ok and (finite and not math.isfinite(value)):
            ok = False
        if ok and not (value > above if above is not None else value >= (at_least or 0)):
            ok = False
        if not ok:
            bound = f"> {above:g}" if above is not None else f">= {at_least or 0:g}"
            raise ConfigurationError(
                f"{type(config).__name__}.{name} must be {'an int' if integer else 'a number'} "
                f"{bound}{' or None' if optional else ''}, got {value!r}"
            )
