"""A session's append-only stores, which its records share the repeated conversation through.

A multi-turn agent resends the whole conversation every turn: turn t's request body starts
with turn t-1's messages, and its prompt token ids with turn t-1's prompt and completion.
Kept per record, a 4-turn session holds its system prompt four times and its first answer
three times. An :class:`Arena` keeps one int32 store of token ids and one byte store of
request bodies per session; a finished call's record is compacted into spans of them
(:meth:`Arena.keep`), storing only what the previous call did not already have there.

Both stores only grow, so a span's content never changes once written; a record (or a
trace holding it) stays readable after its session is released, and the stores go with the
last record that refers to them. Reading ``record.prompt_ids`` or ``record.request_body``
rebuilds the value; what is read equals what was captured, byte for byte.

Example::

    arena = Arena()
    arena.keep(record)          # after the answer's last byte
    record.prompt_ids           # a fresh array, equal to the captured prompt ids
"""

from __future__ import annotations

from array import array
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from agentcore_rl.gateway.record import CallRecord

__all__ = ["Arena", "common_prefix"]

# Items compared at a time: a large prompt or body (megabytes) is compared in slices this
# long, never copied whole.
_CHUNK: Final = 1 << 18


def _common(a: Any, a0: int, a1: int, b: Any, b0: int, b1: int) -> int:
    """How many leading items ``a[a0:a1]`` and ``b[b0:b1]`` have in common (bytes, bytearray
    or arrays of one type; slices compare with memcmp or a typed loop, a memoryview item
    by item, ~8x slower)."""
    n = max(0, min(a1 - a0, b1 - b0))
    lo = 0
    while lo < n:
        hi = min(n, lo + _CHUNK)
        if (
            a[a0 + lo : a0 + hi] == b[b0 + lo : b0 + hi]
        ):  # the usual case: one turn extends the last
            lo = hi
            continue
        while hi - lo > 1:  # a[:lo] == b[:lo] and a[:hi] != b[:hi]; only [lo:mid] compared anew
            mid = (lo + hi) // 2
            if a[a0 + lo : a0 + mid] == b[b0 + lo : b0 + mid]:
                lo = mid
            else:
                hi = mid
        return lo
    return n


def common_prefix(a: bytes, b: bytes) -> int:
    """How many leading bytes ``a`` and ``b`` have in common."""
    return _common(a, 0, len(a), b, 0, len(b))


def _append(store: array[int], ids: array[int], skip: int) -> None:
    """``store.extend(ids[skip:])`` without a copy of ``ids[skip:]``."""
    if skip <= 0:
        store.extend(ids)
    elif skip < len(ids):
        with memoryview(ids) as view, view[skip:] as rest, rest.cast("B") as raw:
            store.frombytes(raw)


def _cut(spans: array[int], length: int) -> array[int]:
    """The (start, end, ...) spans covering the first ``length`` bytes of what ``spans`` lists."""
    out = array("q")
    for i in range(0, len(spans), 2):
        if length <= 0:
            break
        start, end = spans[i], spans[i + 1]
        end = min(end, start + length)
        out.extend((start, end))
        length -= end - start
    return out


class Arena:
    """One session's token id and request body stores (see the module docstring).

    Example::

        session.arena.keep(record)
    """

    __slots__ = ("_body", "_conv", "ids", "text")

    def __init__(self) -> None:
        self.ids: array[int] = array("i")
        self.text = bytearray()
        self._conv = (0, 0)  # span of the last kept call's prompt + first completion in ids
        self._body: array[int] = array("q")  # the last kept body's spans of text

    def keep(self, record: CallRecord) -> None:
        """Move ``record``'s prompt ids, first completion's ids and body into the stores."""
        if record.shared:
            return
        self._keep_ids(record)
        self._keep_body(record)

    def _keep_ids(self, record: CallRecord) -> None:
        prompt = record.prompt_ids
        completion = record.completions[0] if record.completions else None
        tail = completion.token_ids if completion is not None else array("i")
        n_prompt = len(prompt)
        n = n_prompt + len(tail)
        if not n:
            return
        ids = self.ids
        start, end = self._conv
        # the prompt + completion's common prefix with the last conversation kept
        shared = _common(ids, start, end, prompt, 0, n_prompt)
        if shared == n_prompt:
            shared += _common(ids, start + n_prompt, end, tail, 0, len(tail))
        if shared == n:  # nothing new (an identical retry, or a shorter prompt)
            at = start
        elif shared == end - start and end == len(ids):  # extends the last conversation
            _append(ids, prompt, shared)
            _append(ids, tail, shared - n_prompt)
            at = start
        else:  # another conversation (history cut, a concurrent call): one copy of it
            at = len(ids)
            _append(ids, prompt, 0)
            _append(ids, tail, 0)
        self._conv = (at, at + n)
        record.share_prompt(ids, at, at + n_prompt)
        if completion is not None:
            completion.share_ids(ids, at + n_prompt, at + n)

    def _keep_body(self, record: CallRecord) -> None:
        raw = record.request_body
        text, last = self.text, self._body
        shared = 0  # the body's common prefix with the last body kept, piece by piece
        for i in range(0, len(last), 2):
            start, end = last[i], last[i + 1]
            same = _common(text, start, end, raw, shared, len(raw))
            shared += same
            if same < end - start:
                break
        spans = _cut(last, shared)
        if shared < len(raw):
            at = len(text)
            with memoryview(raw) as view:
                text += view[shared:]
            if spans and spans[-1] == at:  # continues the last piece
                spans[-1] = len(text)
            else:
                spans.extend((at, len(text)))
        self._body = spans
        record.share_body(text, spans)
