"""From a session's captured calls to training sequences (pure Python, no torch).

A call whose prompt ids start with the previous call's prompt + completion (the
conversation only grew) extends the same segment: its new prompt tokens get loss mask 0,
its completion mask 1. Any other call (history truncated, re-templated, a sub-agent)
starts a new segment; merges and splits are counted. A call retried with an identical
request and prompt keeps only its last answer; failed calls are skipped and counted. Token
ids are the served ones, never re-tokenised text.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Final

from agentcore_rl.trace import CallRecord, Completion, SessionTrace

__all__ = ["NO_VERSION", "Segment", "Trajectory", "build_trajectory"]

#: The policy version of tokens the policy did not generate (prompt, tool results).
NO_VERSION: Final = -1


@dataclass(slots=True)
class Segment:
    """One training sequence: all four arrays have one entry per token.

    ``loss_mask`` is 1 for tokens the policy generated, 0 for prompt/tool tokens;
    ``logprobs`` and ``policy_versions`` are the sampler's values for generated tokens
    (0.0 and ``NO_VERSION`` elsewhere): each generated token's version is the one it was
    sampled under, so a completion a weight update came in the middle of carries two.
    ``calls`` lists the call indices merged into it.

    Example::

        for segment in trajectory.segments:
            batch.add(segment.token_ids, segment.loss_mask, segment.logprobs)
    """

    token_ids: array[int] = field(default_factory=lambda: array("i"))
    loss_mask: array[int] = field(default_factory=lambda: array("b"))
    logprobs: array[float] = field(default_factory=lambda: array("d"))
    policy_versions: array[int] = field(default_factory=lambda: array("i"))
    calls: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def generated_tokens(self) -> int:
        return sum(self.loss_mask)

    def _append(
        self, ids: array[int], generated: bool, logprobs: Any, versions: array[int] | None
    ) -> None:
        n = len(ids)
        self.token_ids.extend(ids)
        self.loss_mask.extend(array("b", [1 if generated else 0]) * n)
        if generated:
            self.logprobs.extend(logprobs)
            self.policy_versions.extend(versions if versions is not None else array("i"))
        else:
            self.logprobs.extend(array("d", [0.0]) * n)
            self.policy_versions.extend(array("i", [NO_VERSION]) * n)

    def to_json(self) -> dict[str, Any]:
        return {f.name: list(getattr(self, f.name)) for f in fields(self)}


@dataclass(slots=True)
class Trajectory:
    """A rollout's training data: its segments, its reward and how they were built.

    Example::

        trajectory = build_trajectory(trace, reward=result["rewards"][-1])
        trajectory.min_policy_version     # for staleness checks
    """

    segments: list[Segment]
    reward: float | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    session_id: str = ""
    input_id: str | None = None
    merges: int = 0
    splits: int = 0
    duplicates: int = 0
    failed_calls: int = 0

    @property
    def generated_tokens(self) -> int:
        return sum(s.generated_tokens for s in self.segments)

    @property
    def min_policy_version(self) -> int | None:
        """The oldest policy version that generated any token (None without tokens)."""
        versions = [v for s in self.segments for v in s.policy_versions if v != NO_VERSION]
        return min(versions) if versions else None

    def to_json(self) -> dict[str, Any]:
        scalars = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "segments"}
        return {**scalars, "segments": [s.to_json() for s in self.segments]}


def _versions(completion: Completion, version: int, n: int) -> array[int]:
    """Its own spans where a weight update came while it was generated, else ``version``."""
    spans = completion.versions
    if not spans:
        return array("i", [version]) * n
    out = array("i")
    ends = [at for at, _ in spans[1:]] + [n]
    for (at, v), end in zip(spans, ends, strict=True):
        out.extend(array("i", [v]) * (end - at))
    return out


def build_trajectory(
    trace: SessionTrace | Iterable[CallRecord],
    *,
    reward: float | None = None,
    metrics: Mapping[str, Any] | None = None,
    session_id: str | None = None,
    input_id: str | None = None,
    choice: int = 0,
) -> Trajectory:
    """Turn a session's records (or its ``SessionTrace``) into a :class:`Trajectory`.

    ``choice`` picks which choice of a multi-choice (``n`` > 1) call is followed.

    Example::

        build_trajectory(trace, reward=1.0, metrics={"turns": 3})
    """
    records: list[CallRecord]
    if isinstance(trace, SessionTrace):
        records = list(trace.records)
        session_id = session_id if session_id is not None else trace.session_id
        input_id = input_id if input_id is not None else trace.input_id
    else:
        records = list(trace)
    records.sort(key=lambda r: r.index)

    failed = 0
    duplicates = 0
    kept: list[CallRecord] = []
    for record in records:
        if not record.ok or len(record.completions) <= choice:
            failed += 1
            continue
        last = kept[-1] if kept else None
        if last and (record.prompt_ids, record.request_body) == (
            last.prompt_ids,
            last.request_body,
        ):
            kept[-1] = record  # the agent went on with the retry's answer
            duplicates += 1
            continue
        kept.append(record)

    segments: list[Segment] = []
    merges = splits = 0
    current: Segment | None = None
    for record in kept:
        completion = record.completions[choice]
        prompt: array[int] = record.prompt_ids
        version = record.policy_version_start
        version = NO_VERSION if version is None else version
        if current is not None and prompt[: len(current.token_ids)] == current.token_ids:
            merges += 1
            current._append(prompt[len(current.token_ids) :], False, None, None)
        else:
            if current is not None:
                splits += 1
            current = Segment()
            segments.append(current)
            current._append(prompt, False, None, None)
        ids = completion.token_ids
        current._append(ids, True, completion.logprobs, _versions(completion, version, len(ids)))
        current.calls.append(record.index)
    return Trajectory(
        segments=segments,
        reward=reward,
        metrics=dict(metrics or {}),
        session_id=session_id or "",
        input_id=input_id,
        merges=merges,
        splits=splits,
        duplicates=duplicates,
        failed_calls=failed,
    )
