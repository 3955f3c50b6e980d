"""What the gateway keeps per model call, per session, and how a trace is stored.

Token ids and logprobs live in typed arrays (4 bytes per id, 8 per logprob), and the
agent's request is kept as the raw JSON bytes it sent, parsed only when someone reads
``messages``/``tools``/``sampling``. That keeps a 200-token call with a 1,000-token prompt
in a few kilobytes instead of tens of kilobytes of Python ints and dicts.

A trace serializes to gzip-compressed JSON (``dump_trace``/``load_trace``), the format
written beside a rollout's envelope as ``{exp_id}/{input_id}/{session_id}.trace.json.gz``
(see :func:`trace_key`).

Example::

    blob = dump_trace(trace)                   # bytes, gzip
    again = load_trace(blob)
    again.records[0].completions[0].token_ids  # array('i', [...])
"""

from __future__ import annotations

import contextlib
import gzip
import json
import struct
from array import array
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

__all__ = [
    "TRACE_FORMAT",
    "CallRecord",
    "Completion",
    "SessionTrace",
    "dump_trace",
    "load_trace",
    "trace_key",
]

#: The ``format`` field of a serialized trace; bumped when the layout changes.
TRACE_FORMAT: Final = "agentcore-rl.trace.v1"

# Request fields that are neither the conversation nor routing: the sampling parameters.
_NOT_SAMPLING: Final = frozenset(
    {"messages", "prompt", "tools", "tool_choice", "model", "stream", "stream_options", "user"}
)


def ids_array(values: Any = ()) -> array[int]:
    """Token ids as a compact int32 array."""
    if isinstance(values, list) and values:
        # struct packs a list twice as fast as array's per-item conversion
        with contextlib.suppress(struct.error):  # not ints: array names the problem
            return array("i", struct.pack(f"{len(values)}i", *values))
    return array("i", values)


def logprob_array(values: Any = ()) -> array[float]:
    """Logprobs as a compact float64 array (exactly what the server sent)."""
    return array("d", values)


class Completion:
    """One choice of a call: completion token ids, their logprobs, the finish reason, and
    ``versions``: ``[(first token index, policy version), ...]`` when a weight update came
    while it was generated (``None``: every token has the call's starting version).

    ``stop_string``: the stop string that ended the text the agent got inside the last
    token (vLLM and OpenAI cut the text before it): the ids decode to more than the agent's
    text. None when they decode to it.

    Example::

        completion = record.completions[0]
        list(zip(completion.token_ids, completion.logprobs))
    """

    __slots__ = ("finish_reason", "index", "logprobs", "stop_string", "token_ids", "versions")

    def __init__(
        self,
        index: int = 0,
        token_ids: array[int] | None = None,
        logprobs: array[float] | None = None,
        finish_reason: str | None = None,
        stop_string: str | None = None,
        versions: list[tuple[int, int]] | None = None,
    ) -> None:
        self.index = index
        self.stop_string = stop_string
        self.token_ids = ids_array() if token_ids is None else token_ids
        self.logprobs = logprob_array() if logprobs is None else logprobs
        self.finish_reason = finish_reason
        self.versions = versions

    def __repr__(self) -> str:
        return (
            f"Completion(index={self.index}, tokens={len(self.logprobs)}, "
            f"finish_reason={self.finish_reason!r})"
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Completion):
            return NotImplemented
        return self.to_json() == other.to_json()

    __hash__ = None  # type: ignore[assignment]  # mutable, compared by value

    def to_json(self) -> dict[str, Any]:
        """The JSON-ready form."""
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
        """Inverse of :meth:`to_json`."""
        return cls(
            index=int(data.get("index", 0)),
            token_ids=ids_array(data.get("token_ids") or ()),
            logprobs=logprob_array(data.get("logprobs") or ()),
            finish_reason=data.get("finish_reason"),
            stop_string=data.get("stop_string"),
            versions=[(int(at), int(v)) for at, v in data.get("versions") or ()] or None,
        )


class CallRecord:
    """One model call the agent made through the gateway.

    ``status`` is the HTTP status the agent got (200 on success); ``error`` says why a call
    failed (upstream down, no token ids, ...). ``request_body`` is the agent's JSON as sent;
    ``overrides`` the per-session sampling and pinned model the gateway applied on top.

    Example::

        for record in trace.records:
            print(record.index, record.status, len(record.prompt_ids), record.messages[-1])
    """

    __slots__ = (
        "completions",
        "endpoint",
        "error",
        "exp_id",
        "index",
        "input_id",
        "latency_s",
        "overrides",
        "policy_version_end",
        "policy_version_start",
        "prompt_ids",
        "request_body",
        "session_id",
        "started_at",
        "status",
        "stream",
        "upstream",
        "usage",
    )

    def __init__(
        self,
        session_id: str,
        index: int,
        endpoint: str,  # "chat.completions" or "completions"
        exp_id: str | None = None,
        input_id: str | None = None,
        policy_version_start: int | None = None,
        policy_version_end: int | None = None,
        request_body: bytes = b"{}",
        overrides: Mapping[str, Any] | None = None,
        prompt_ids: array[int] | None = None,
        completions: list[Completion] | None = None,
        usage: dict[str, Any] | None = None,
        started_at: float = 0.0,  # wall clock (time.time) when the call arrived
        latency_s: float = 0.0,
        stream: bool = False,
        upstream: str = "",
        status: int = 0,
        error: str | None = None,
    ) -> None:
        self.session_id = session_id
        self.index = index
        self.endpoint = endpoint
        self.exp_id = exp_id
        self.input_id = input_id
        self.policy_version_start = policy_version_start
        self.policy_version_end = policy_version_end
        self.request_body = request_body  # the agent's request JSON, as it sent it
        self.overrides = overrides
        self.prompt_ids = ids_array() if prompt_ids is None else prompt_ids
        self.completions: list[Completion] = [] if completions is None else completions
        self.usage = usage
        self.started_at = started_at
        self.latency_s = latency_s
        self.stream = stream
        self.upstream = upstream
        self.status = status
        self.error = error

    def __repr__(self) -> str:
        return (
            f"CallRecord(session_id={self.session_id!r}, index={self.index}, "
            f"status={self.status}, error={self.error!r}, completions={self.completions!r})"
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, CallRecord):
            return NotImplemented
        return self.to_json() == other.to_json() and self.request_body == other.request_body

    __hash__ = None  # type: ignore[assignment]  # mutable, compared by value

    @property
    def ok(self) -> bool:
        """Whether the call succeeded and its tokens were captured."""
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
        """The chat messages (empty for ``/v1/completions``)."""
        return list(self.request.get("messages") or [])

    @property
    def tools(self) -> list[Any]:
        """The tools offered to the model."""
        return list(self.request.get("tools") or [])

    @property
    def sampling(self) -> dict[str, Any]:
        """The sampling parameters (temperature, max_tokens, seed, ...)."""
        return {k: v for k, v in self.request.items() if k not in _NOT_SAMPLING}

    def to_json(self) -> dict[str, Any]:
        """The JSON-ready form (the request embedded as JSON, not as bytes)."""
        return {
            "session_id": self.session_id,
            "index": self.index,
            "endpoint": self.endpoint,
            "exp_id": self.exp_id,
            "input_id": self.input_id,
            "policy_version_start": self.policy_version_start,
            "policy_version_end": self.policy_version_end,
            "request": self.request,
            "prompt_ids": self.prompt_ids.tolist(),
            "completions": [c.to_json() for c in self.completions],
            "usage": self.usage,
            "started_at": self.started_at,
            "latency_s": self.latency_s,
            "stream": self.stream,
            "upstream": self.upstream,
            "status": self.status,
            "error": self.error,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CallRecord:
        """Inverse of :meth:`to_json`."""
        return cls(
            session_id=str(data["session_id"]),
            index=int(data["index"]),
            endpoint=str(data.get("endpoint", "chat.completions")),
            exp_id=data.get("exp_id"),
            input_id=data.get("input_id"),
            policy_version_start=data.get("policy_version_start"),
            policy_version_end=data.get("policy_version_end"),
            request_body=json.dumps(data.get("request") or {}).encode(),
            prompt_ids=ids_array(data.get("prompt_ids") or ()),
            completions=[Completion.from_json(c) for c in data.get("completions") or ()],
            usage=data.get("usage"),
            started_at=float(data.get("started_at", 0.0)),
            latency_s=float(data.get("latency_s", 0.0)),
            stream=bool(data.get("stream", False)),
            upstream=str(data.get("upstream", "")),
            status=int(data.get("status", 0)),
            error=data.get("error"),
        )


@dataclass(slots=True)
class SessionTrace:
    """Every call of one session, in call order, and where it came from.

    ``complete`` is False when the trace was persisted because the session expired rather
    than finished. ``gateway_id`` names the gateway process that captured it.

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
        """How many calls failed (their records are kept, with ``error`` set)."""
        return sum(1 for r in self.records if not r.ok)

    @property
    def straddled_calls(self) -> int:
        """How many calls a weight update came in the middle of (see ``CallRecord.straddled``)."""
        return sum(1 for r in self.records if r.straddled)

    @property
    def tokens_captured(self) -> int:
        """Prompt plus completion tokens over the successful calls."""
        return sum(
            len(r.prompt_ids) + sum(len(c.token_ids) for c in r.completions)
            for r in self.records
            if r.ok
        )

    def to_json(self) -> dict[str, Any]:
        """The JSON-ready form."""
        return {
            "format": TRACE_FORMAT,
            "session_id": self.session_id,
            "exp_id": self.exp_id,
            "input_id": self.input_id,
            "gateway_id": self.gateway_id,
            "complete": self.complete,
            "records": [r.to_json() for r in self.records],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SessionTrace:
        """Inverse of :meth:`to_json`; refuses another format."""
        if data.get("format") != TRACE_FORMAT:
            raise ValueError(f"not a {TRACE_FORMAT} trace (format={data.get('format')!r})")
        return cls(
            session_id=str(data["session_id"]),
            exp_id=data.get("exp_id"),
            input_id=data.get("input_id"),
            records=[CallRecord.from_json(r) for r in data.get("records") or ()],
            gateway_id=str(data.get("gateway_id", "")),
            complete=bool(data.get("complete", True)),
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


def trace_key(exp_id: str | None, input_id: str | None, session_id: str) -> str:
    """The S3 key of a trace beside its envelope: ``{exp_id}/{input_id}/{sid}.trace.json.gz``.

    Example::

        trace_key("e1", "q7", "sid-1")   # "e1/q7/sid-1.trace.json.gz"
    """
    return f"{exp_id or '_'}/{input_id or '_'}/{session_id}.trace.json.gz"
