"""What a runtime's quota sees: whether a sequence of calls stays within a token bucket."""

from __future__ import annotations

from collections.abc import Iterable


def violations(times: Iterable[float], rate: float, burst: float) -> int:
    """Calls a ``rate``/``burst`` token bucket (starting full) would have throttled.

    Equivalently: windows [a, b] holding more than ``burst + rate * (b - a)`` calls.
    """
    tokens, last, bad = burst, None, 0
    for t in sorted(times):
        if last is not None:
            tokens = min(burst, tokens + (t - last) * rate)
        last = t
        if tokens >= 1 - 1e-9:
            tokens -= 1
        else:
            bad += 1
    return bad


def max_in_window(times: Iterable[float], window: float = 1.0) -> int:
    """The most calls in any ``window`` seconds (a sliding window)."""
    ordered = sorted(times)
    best, start = 0, 0
    for end, t in enumerate(ordered):
        while ordered[start] <= t - window:
            start += 1
        best = max(best, end - start + 1)
    return best
