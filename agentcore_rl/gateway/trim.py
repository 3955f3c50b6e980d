"""Giving freed memory back to the system after a large call.

A call of tens of megabytes (a long conversation, 100,000 messages) leaves its request,
its parsed form and the upstream's answer freed but, with glibc's malloc, mostly still
mapped: buffers this large come from the heap once a freed one has raised malloc's mmap
threshold, and the heap is returned only from its top. ``malloc_trim`` hands every free
page back. It walks the heap, so the gateway calls it only after a large call.

Example::

    if len(raw) >= TRIM_AT:
        give_back_memory()
"""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Callable
from typing import Final

__all__ = ["TRIM_AT", "give_back_memory"]

#: Request bodies at least this large are followed by :func:`give_back_memory`.
TRIM_AT: Final = 4 * 1024 * 1024


def _malloc_trim() -> Callable[[int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        trim: Callable[[int], int] = ctypes.CDLL(None).malloc_trim  # the process's C library
    except (OSError, AttributeError):  # not glibc (musl has no malloc_trim)
        return None
    return trim


_TRIM: Final = _malloc_trim()


def give_back_memory() -> bool:
    """Return the C heap's free pages to the system; -> whether this platform can."""
    if _TRIM is None:
        return False
    _TRIM(0)
    return True
