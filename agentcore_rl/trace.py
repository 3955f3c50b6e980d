"""A session's trace, the wire format the gateway writes, S3 stores and the client and
trainers read: each model call's record (request, prompt ids, completions with their logprobs
and policy versions) and a session's records in call order, as gzip JSON (docs/gateway.md,
"The record format")."""

from __future__ import annotations

import contextlib
import gzip
import json
import struct
from array import array
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Final

__all__ = [
    "TRACE_FORMAT",
    "CallRecord",
    "Completion",
    "SessionTrace",
    "dump_trace",
    "ids_array",
    "load_trace",
    "logprob_array",
]

#: The ``format`` field of a serialized trace; bumped when the layout changes.
TRACE_FORMAT: Final = "agentcore-rl.trace.v1"

# Request fields that are neither the conversation nor routing: the sampling parameters.
_NOT_SAMPLING: Final = frozenset(
    {"messages", "prompt", "tools", "tool_choice", "model", "stream", "stream_options", "user"}
)
# CallRecord fields written otherwise (the request as JSON) or converted (the arrays).
_NOT_JSON: Final = frozenset({"request_body", "overrides", "prompt_ids", "completions"})


def ids_array(values: Any = ()) -> array[int]:
    """Token ids as a compact int32 array."""
    if isinstance(values, list) and values:  # struct packs twice as fast as array
        with contextlib.suppress(struct.error):  # not ints: array names the problem
            return array("i", struct.pack(f"{len(values)}i", *values))
    return array("i", values)


def logprob_array(values: Any = ()) -> array[float]:
    """Logprobs as a compact float64 array (exactly what the server sent)."""
    return array("d", values)


@dataclass(slots=True, repr=False)
class Completion:
    """One choice of a call: completion token ids, their logprobs, the finish reason,
    ``versions`` (``[(first token index, policy version), ...]`` when a weight update came in
    the middle) and ``stop_string`` (docs/gateway.md, "The record format").

    Example::

        completion = record.completions[0]
        list(zip(completion.token_ids, completion.logprobs))
    """

    index: int = 0
    token_ids: array[int] = field(default_factory=ids_array)
    logprobs: array[float] = field(default_factory=logprob_array)
    finish_reason: str | None = None
    stop_string: str | None = None
    versions: list[tuple[int, int]] | None = None

    def __repr__(self) -> str:
        return (
            f"Completion(index={self.index}, tokens={len(self.logprobs)}, "
            f"finish_reason={self.finish_reason!r})"
        )

    def to_json(self) -> dict[str, Any]:
        out = {
            "index": self.index,
            "token_ids": self.token_ids.tolist(),
            "logprobs": self.logprobs.tolist(),
            "finish_reason": self.finish_reason,
            "stop_string": self.stop_string,
        }
        if self.versions is not None:
            out["versions"] = [list(start) for start in self.versions]
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Completion:
        return cls(
            index=int(data.get("index", 0)),
            token_ids=ids_array(data.get("token_ids") or ()),
            logprobs=logprob_array(data.get("logprobs") or ()),
            finish_reason=data.get("finish_reason"),
            stop_string=data.get("stop_string"),
            versions=[(int(at), int(v)) for at, v in data.get("versions") or ()] or None,
        )


@dataclass(slots=True, repr=False)
class CallRecord:
    """One model call the agent made through the gateway (docs/gateway.md, "The record format").

    Example::

        for record in trace.records:
            print(record.index, record.status, len(record.prompt_ids), record.messages[-1])
    """

    session_id: str
    index: int
    endpoint: str  # "chat.completions" or "completions"
    exp_id: str | None = None
    input_id: str | None = None
    policy_version_start: int | None = None
    policy_version_end: int | None = None
    request_body: bytes = b"{}"  # the agent's request JSON, as it sent it
    overrides: Mapping[str, Any] | None = None
    prompt_ids: array[int] = field(default_factory=ids_array)
    completions: list[Completion] = field(default_factory=list)
    usage: dict[str, Any] | None = None
    started_at: float = 0.0  # wall clock (time.time) when the call arrived
    latency_s: float = 0.0
    stream: bool = False
    upstream: str = ""
    status: int = 0
    error: str | None = None

    def __repr__(self) -> str:
        return (
            f"CallRecord(session_id={self.session_id!r}, index={self.index}, "
            f"status={self.status}, error={self.error!r}, completions={self.completions!r})"
        )

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.error is None

    @property
    def straddled(self) -> bool:
        """Whether a weight update came while the call ran (its tokens may span versions)."""
        return self.policy_version_start != self.policy_version_end

    @property
    def request(self) -> dict[str, Any]:
        """The request as the upstream saw it, minus the gateway's capture flags."""
        body = json.loads(self.request_body)
        if not isinstance(body, dict):
            return {}
        if self.overrides:
            body.update(self.overrides)
        return body

    @property
    def messages(self) -> list[Any]:
        return list(self.request.get("messages") or [])

    @property
    def tools(self) -> list[Any]:
        return list(self.request.get("tools") or [])

    @property
    def sampling(self) -> dict[str, Any]:
        return {k: v for k, v in self.request.items() if k not in _NOT_SAMPLING}

    def to_json(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in _NOT_JSON}
        out.update(
            request=self.request,
            prompt_ids=self.prompt_ids.tolist(),
            completions=[c.to_json() for c in self.completions],
        )
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CallRecord:
        names = {f.name for f in fields(cls)} - _NOT_JSON
        return cls(
            **{k: v for k, v in data.items() if k in names},
            request_body=json.dumps(data.get("request") or {}).encode(),
            prompt_ids=ids_array(data.get("prompt_ids") or ()),
            completions=[Completion.from_json(c) for c in data.get("completions") or ()],
        )


@dataclass(slots=True)
class SessionTrace:
    """Every call of one session, in call order; ``complete`` is False for a session that
    expired rather than finished, ``gateway_id`` names the gateway process that captured it.

    Example::

        trace = await gateway.finish_session(sid)
        print(trace.session_id, len(trace.records), trace.failed_calls)
    """

    session_id: str
    exp_id: str | None = None
    input_id: str | None = None
    records: list[CallRecord] = field(default_factory=list)
    gateway_id: str = ""
    complete: bool = True

    @property
    def failed_calls(self) -> int:
        return sum(1 for r in self.records if not r.ok)

    @property
    def straddled_calls(self) -> int:
        """How many calls a weight update came in the middle of (see ``CallRecord.straddled``)."""
        return sum(1 for r in self.records if r.straddled)

    @property
    def tokens_captured(self) -> int:
        return sum(
            len(r.prompt_ids) + sum(len(c.token_ids) for c in r.completions)
            for r in self.records
            if r.ok
        )

    def to_json(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        return {"format": TRACE_FORMAT, **out, "records": [r.to_json() for r in self.records]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SessionTrace:
        """Inverse of :meth:`to_json`; refuses another format."""
        if data.get("format") != TRACE_FORMAT:
            raise ValueError(f"not a {TRACE_FORMAT} trace (format={data.get('format')!r})")
        names = {f.name for f in fields(cls)} - {"records"}
        return cls(
            **{k: v for k, v in data.items() if k in names},
            records=[CallRecord.from_json(r) for r in data.get("records") or ()],
        )


def dump_trace(trace: SessionTrace, *, level: int = 6) -> bytes:
    """A trace as gzip-compressed JSON (what goes to S3 beside the envelope).

    Example::

        Path("t.trace.json.gz").write_bytes(dump_trace(trace))
    """
    text = json.dumps(trace.to_json(), separators=(",", ":"))
    return gzip.compress(text.encode(), compresslevel=level, mtime=0)


def load_trace(blob: bytes) -> SessionTrace:
    """Read what :func:`dump_trace` wrote (plain JSON is accepted too).

    Example::

        trace = load_trace(Path("t.trace.json.gz").read_bytes())
    """
    raw = gzip.decompress(blob) if blob[:2] == b"\x1f\x8b" else blob
    return SessionTrace.from_json(json.loads(raw))
