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
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agentcore_rl.gateway.record import CallRecord

__all__ = ["Arena", "common_prefix"]


def common_prefix(a: bytes, b: bytes) -> int:
    """How many leading bytes ``a`` and ``b`` have in common."""
    # bytes compare with memcmp; a memoryview compares item by item (~8x slower here)
    n = min(len(a), len(b))
    if a[:n] == b[:n]:  # the usual case: one turn extends the last
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo] and a[:hi] != b[:hi]; only [lo:mid] is compared anew
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


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
        seq = prompt + completion.token_ids if completion is not None else prompt
        if not seq:
            return
        ids = self.ids
        start, end = self._conv
        with memoryview(ids) as view:  # released before ids grows (an export forbids it)
            last = view[start:end].tobytes()
        shared = common_prefix(last, seq.tobytes()) // ids.itemsize
        if shared == len(seq):  # nothing new (an identical retry, or a shorter prompt)
            at = start
        elif shared == end - start and end == len(ids):  # extends the last conversation
            ids.extend(seq[shared:])
            at = start
        else:  # another conversation (history cut, a concurrent call): one copy of it
            at = len(ids)
            ids.extend(seq)
        self._conv = (at, at + len(seq))
        record.share_prompt(ids, at, at + len(prompt))
        if completion is not None:
            completion.share_ids(ids, at + len(prompt), at + len(seq))

    def _keep_body(self, record: CallRecord) -> None:
        raw = record.request_body
        text = self._text_of(self._body)
        shared = common_prefix(text, raw)
        spans = _cut(self._body, shared)
        if shared < len(raw):
            at = len(self.text)
            self.text += raw[shared:]
            if spans and spans[-1] == at:  # continues the last piece
                spans[-1] = len(self.text)
            else:
                spans.extend((at, len(self.text)))
        self._body = spans
        record.share_body(self.text, spans)

    def _text_of(self, spans: array[int]) -> bytes:
        text = self.text
        return b"".join([text[spans[i] : spans[i + 1]] for i in range(0, len(spans), 2)])
