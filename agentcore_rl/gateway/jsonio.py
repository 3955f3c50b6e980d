"""JSON in and out of the gateway (orjson, about ten times cheaper than the json module), and
the one check of what it accepts (docs/gateway.md, "Input checked at the door"): what it cannot
re-encode for the upstream, serve back and finish is :class:`Invalid` (a 400). orjson reads
nesting deeper than it writes (1,024 levels against 254) and integers beyond 64 bits as floats.
"""

from __future__ import annotations

import json
from typing import Any, Final

from agentcore_rl._extras import MissingExtraError
from agentcore_rl.errors import GatewayInputError

try:
    import orjson
except ModuleNotFoundError as exc:
    raise MissingExtraError("the rollout gateway", "gateway", "orjson") from exc

__all__ = [
    "MAX_DEPTH",
    "MAX_VERSION",
    "Invalid",
    "check_value",
    "check_version",
    "dumps",
    "loads",
    "parse_object",
]

#: Compact UTF-8 JSON bytes.
dumps: Final = orjson.dumps
#: Parse JSON (an upstream's answer); a ``ValueError`` when it is not JSON.
loads: Final = orjson.loads
#: The deepest nesting of arrays and objects accepted: what orjson can write back.
MAX_DEPTH: Final = 254
#: The largest policy version (a signed 64-bit integer, as trainers count steps).
MAX_VERSION: Final = 2**63 - 1
_INTS: Final = (-(2**63), 2**64 - 1)  # what orjson reads as an integer
# A run of 19 digits may be an integer beyond 64 bits, which orjson reads as a float: found
# as a run of zeros once every digit is a zero (a C-speed pass; a regex is twenty times slower).
_ZEROS: Final = bytes.maketrans(b"123456789", b"000000000")
_LONG_NUMBER: Final = b"0" * 19


#: Input the gateway does not accept (answered 400 with its message).
Invalid = GatewayInputError


def _int(text: str) -> int:
    value = int(text)
    if not _INTS[0] <= value <= _INTS[1]:
        raise Invalid(f"integer {text[:40]} is beyond the 64-bit range")
    return value


def check_value(value: Any, what: str = "the value") -> None:
    """Refuse (:class:`Invalid`) what cannot be written back as JSON (see the module doc)."""
    try:
        dumps(value)
    except (orjson.JSONEncodeError, TypeError) as exc:
        message = str(exc)
        if "ecursion" in message:
            message = f"nested deeper than {MAX_DEPTH} levels"
        elif "64-bit" in message:
            message = "an integer beyond the 64-bit range"
        raise Invalid(f"{what} cannot be forwarded as JSON: {message}") from None


def parse_object(raw: bytes, what: str = "request body") -> dict[str, Any]:
    """``raw`` as a JSON object the gateway can forward, serve and finish; :class:`Invalid`
    naming the problem otherwise."""
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        if "depth" in str(exc):
            raise Invalid(f"{what} is nested deeper than {MAX_DEPTH} levels") from None
        raise Invalid(f"{what} is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise Invalid(f"{what} must be a JSON object")
    # Fewer brackets than the limit cannot nest deeper: only a bracket-rich body is written
    # back once to see (orjson's encoder is ten times faster than a walk in Python).
    if raw.count(b"[") + raw.count(b"{") > MAX_DEPTH:
        check_value(value, what)
    if _LONG_NUMBER in raw.translate(_ZEROS):  # rare: read its integers exactly, in the json module
        try:
            json.loads(raw, parse_int=_int)
        except Invalid as exc:
            raise Invalid(f"{what} cannot be forwarded: {exc}") from None
    return value


def check_version(version: Any) -> int:
    """A policy version: an int in ``0..MAX_VERSION`` (:class:`Invalid` otherwise)."""
    if not isinstance(version, int) or isinstance(version, bool):
        raise Invalid(f"policy version must be an int, got {str(version)[:40]!r}")
    if not 0 <= version <= MAX_VERSION:
        raise Invalid(f"policy version must be in 0..{MAX_VERSION}, got {str(version)[:40]}")
    return version
