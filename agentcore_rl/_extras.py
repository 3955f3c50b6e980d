"""Optional parts and the extras that bring their dependencies.

The core install (``pip install agentcore-rl``) holds what both sides share; each part
beyond it needs an extra. A part imported without its extra raises
:class:`MissingExtraError`, a ``ModuleNotFoundError`` whose message says what to install.
"""

from __future__ import annotations

import importlib
from typing import Final

from agentcore_rl.errors import AgentCoreRLError

__all__ = ["THIRD_PARTY", "MissingExtraError", "install_hint", "is_ours", "require"]

#: The top-level modules the extras bring (pyproject.toml's optional dependencies).
THIRD_PARTY: Final = frozenset(
    {
        "a2wsgi",
        "httptools",
        "httpx",
        "jinja2",
        "matplotlib",
        "moto",
        "omegaconf",
        "openai",
        "orjson",
        "ray",
        "skyrl",
        "slime",
        "starlette",
        "strands",
        "torch",
        "tqdm",
        "uvicorn",
        "uvloop",
        "verl",
        "werkzeug",
    }
)


def install_hint(extra: str) -> str:
    return f"pip install 'agentcore-rl[{extra}]'"


def is_ours(exc: BaseException) -> bool:
    return (
        isinstance(exc, ModuleNotFoundError)
        and exc.name is not None
        and exc.name.split(".")[0] in THIRD_PARTY
    )


class MissingExtraError(AgentCoreRLError, ModuleNotFoundError):
    """``name`` is the missing module (as on any ``ModuleNotFoundError``), ``extra`` the
    extra to install."""

    def __init__(self, part: str, extra: str, module: str) -> None:
        super().__init__(
            f"{part} needs the '{extra}' extra (module {module!r} is not installed): "
            f"{install_hint(extra)}",
            name=module,
        )
        self.extra = extra


def require(extra: str, part: str, *modules: str) -> None:
    for module in modules:
        try:
            imported = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if (exc.name or "").split(".")[0] != module:
                raise  # installed, but broken: its own message says more
            raise MissingExtraError(part, extra, module) from exc
        if getattr(imported, "__file__", None) is None and "." not in module:
            # A bare directory of that name on sys.path (e.g. Ray's own /tmp/ray seen from
            # /tmp) imports as an empty namespace package: the package is still missing.
            raise MissingExtraError(part, extra, module)
