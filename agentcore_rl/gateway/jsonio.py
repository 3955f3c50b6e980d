"""JSON on the gateway's hot path: orjson, about ten times cheaper than the json module.

Every model call is parsed and re-encoded once, a streamed one once per SSE event (200
events for a 200-token answer), so this is most of the gateway's own CPU.

:func:`loads` only returns what :func:`dumps` can write back, so a parsed body can always
be forwarded: orjson refuses ``NaN``/``Infinity`` (not JSON, but some peers send them),
which the json module then reads, and that result must survive ``orjson.dumps`` (a lone
surrogate such as ``"\\ud800"`` or an integer beyond 64 bits does not: ``ValueError``).
Nesting is bounded by orjson's depth limit (:data:`MAX_DEPTH`) before any fallback, and
the json module's own recursion is caught, so no document reaches a ``RecursionError``.

Example::

    data = loads(b'{"a": 1}')
    dumps(data)   # b'{"a":1}'
"""

from __future__ import annotations

import json
from typing import Any, Final

from agentcore_rl._extras import MissingExtraError

try:
    import orjson
except ModuleNotFoundError as exc:
    raise MissingExtraError("the rollout gateway", "gateway", "orjson") from exc

__all__ = ["MAX_DEPTH", "dumps", "loads"]

#: Compact UTF-8 JSON bytes.
dumps: Final = orjson.dumps
#: The deepest nesting of arrays and objects read (orjson's own limit).
MAX_DEPTH: Final = 1024
#: What only the json module reads: the reason to try it after orjson refused a document.
_NON_JSON_NUMBERS: Final = (b"NaN", b"Infinity")


def loads(data: bytes | bytearray | memoryview | str) -> Any:
    """Parse JSON; ``ValueError`` naming the problem when it is not JSON the gateway can
    forward (malformed, nested deeper than :data:`MAX_DEPTH`, a lone surrogate)."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        refused = exc
    message = str(refused)
    if "depth" in message or "recursion" in message.lower():
        raise ValueError(f"JSON nested deeper than {MAX_DEPTH} levels") from None
    raw = data.encode() if isinstance(data, str) else bytes(data)
    if not any(token in raw for token in _NON_JSON_NUMBERS):
        raise ValueError(message) from None
    try:
        value = json.loads(raw)  # NaN, Infinity: Python's json reads them, orjson does not
    except RecursionError:
        raise ValueError(f"JSON nested deeper than {MAX_DEPTH} levels") from None
    except ValueError:
        raise ValueError(message) from None
    try:
        dumps(value)
    except (orjson.JSONEncodeError, TypeError) as exc:
        raise ValueError(f"JSON that cannot be forwarded: {exc}") from None
    return value
