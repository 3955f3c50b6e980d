"""Groups -> trainer-neutral rows (one per segment of every kept member), fitted to a
trainer's lengths, on disk as JSONL or Parquet. The rules are in docs/groups.md
(trainer-ready rows): every segment carries its member's reward and advantage, a member
counts once in its group, a group of one has its reward as its advantage.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from typing import IO, Any, Protocol, runtime_checkable

from agentcore_rl.errors import AgentCoreRLError, ConfigurationError
from agentcore_rl.groups import Normalize, RolloutGroup

__all__ = [
    "FitReport",
    "InvalidTrajectoryError",
    "MissingTrajectoryError",
    "SegmentLike",
    "TrainingRow",
    "TrajectoryLike",
    "fit_row",
    "fit_rows",
    "group_rows",
    "read_jsonl",
    "read_parquet",
    "rows_from_groups",
    "trajectory_rows",
    "write_jsonl",
    "write_parquet",
]


# --- What rows consume from a trajectory ------------------------------------------------------


@runtime_checkable
class SegmentLike(Protocol):
    """One token sequence of a trajectory (``agentcore_rl.trajectory.Segment`` binds to it):
    a 0/1 ``loss_mask`` per token (1 = generated), ``logprobs`` per token or per generated
    token (empty / ``None``: not captured), ``policy_versions`` per call or per token."""

    @property
    def token_ids(self) -> Sequence[int]: ...

    @property
    def loss_mask(self) -> Sequence[int]: ...

    @property
    def logprobs(self) -> Sequence[float] | None: ...

    @property
    def policy_versions(self) -> Sequence[int | None]: ...


@runtime_checkable
class TrajectoryLike(Protocol):
    """A member's captured trajectory: its segments in order."""

    @property
    def segments(self) -> Sequence[SegmentLike]: ...


class MissingTrajectoryError(AgentCoreRLError, ValueError):
    """A kept member has no captured tokens, so it cannot become a training row.

    Example::

        AsyncRolloutClient(..., gateway=GatewayConfig(url="http://127.0.0.1:9000"))  # tokens
    """


class InvalidTrajectoryError(AgentCoreRLError, ValueError):
    """A trajectory's segment is inconsistent (mask or logprobs of the wrong length...).

    Example::

        except InvalidTrajectoryError as exc:
            print(exc.session_id, exc)
    """

    def __init__(self, message: str, *, session_id: str):
        super().__init__(f"session {session_id}: {message}")
        self.session_id = session_id


# --- Rows -------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class TrainingRow:
    """One training sequence: a segment of a member, with its group's advantage (the fields
    are in docs/groups.md). ``loss_mask``, ``logprobs`` and ``response_versions`` align with
    ``response_ids``; ``response_versions`` is -1 on tokens the policy did not generate and
    empty when unknown.

    Example::

        row = group_rows(group)[0]
        json.dumps(row.to_dict())
    """

    exp_id: str
    group_id: str
    session_id: str
    member: int
    attempt: int
    segment: int
    num_segments: int
    prompt_ids: list[int]
    response_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float] | None
    reward: float
    advantage: float
    policy_versions: list[int] = field(default_factory=list)
    response_versions: list[int] = field(default_factory=list)
    outcome: str = "succeeded"
    zeroed: bool = False

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (the JSONL and Parquet column layout)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TrainingRow:
        """Read a row back from :meth:`to_dict`'s layout (unknown keys are an error)."""
        return cls(**data)

    @property
    def min_policy_version(self) -> int | None:
        """The oldest policy version that served this row (None when unknown)."""
        return min(self.policy_versions) if self.policy_versions else None

    @property
    def max_policy_version(self) -> int | None:
        """The newest policy version that served this row (None when unknown)."""
        return max(self.policy_versions) if self.policy_versions else None

    def masked_before(self, version: int) -> TrainingRow:
        """This row with loss mask 0 on tokens sampled under a version older than ``version``
        (rows without per-token versions stay as they are).

        Example::

            rows = [row.masked_before(step - 2) for row in rows]
        """
        if len(self.response_versions) != len(self.loss_mask):
            return self
        mask = [
            m if v < 0 or v >= version else 0
            for m, v in zip(self.loss_mask, self.response_versions, strict=True)
        ]
        return replace(self, loss_mask=mask)


def group_rows(
    group: RolloutGroup, normalize: Normalize = "mean", *, require_tokens: bool = True
) -> list[TrainingRow]:
    """The rows of one group: every segment of every kept member, in member order. A kept
    member without a trajectory raises :class:`MissingTrajectoryError` unless
    ``require_tokens`` is false; a zeroed one gets a single empty row.

    Example::

        rows = group_rows(group, normalize="mean_std")
    """
    out: list[TrainingRow] = []
    for member, advantage in zip(group.members, group.advantages(normalize), strict=True):
        trajectory = member.trajectory
        tokenless = trajectory is None or (
            isinstance(trajectory, TrajectoryLike) and not trajectory.segments
        )
        if tokenless and require_tokens and not member.zeroed:
            raise MissingTrajectoryError(
                f"member {member.index} of group {group.input_id!r} (session "
                f"{member.session_id}) has no captured tokens; configure a gateway so "
                "rollouts carry trajectories, or pass require_tokens=False"
            )
        out += trajectory_rows(
            trajectory,
            exp_id=group.exp_id,
            group_id=group.input_id,
            session_id=member.session_id,
            reward=0.0 if member.reward is None else member.reward,
            advantage=advantage,
            member=member.index,
            attempt=member.attempt,
            policy_version=member.policy_version,
            outcome=member.outcome.value,
            zeroed=member.zeroed,
        )
    return out


def rows_from_groups(
    groups: Iterable[RolloutGroup], normalize: Normalize = "mean", *, require_tokens: bool = True
) -> Iterator[TrainingRow]:
    """The rows of many groups, group after group.

    Example::

        write_jsonl(rows_from_groups(groups, "mean_std"), "step-12.jsonl")
    """
    for group in groups:
        yield from group_rows(group, normalize, require_tokens=require_tokens)


def trajectory_rows(
    trajectory: TrajectoryLike | None,
    *,
    exp_id: str,
    group_id: str,
    session_id: str,
    reward: float,
    advantage: float = 0.0,
    member: int = 0,
    attempt: int = 0,
    policy_version: int | None = None,
    outcome: str = "succeeded",
    zeroed: bool = False,
) -> list[TrainingRow]:
    """The rows of one rollout's trajectory, without a :class:`RolloutGroup` (for trainers
    that run a prompt's n samples themselves). ``zeroed`` masks every token out; no
    segments (or ``None``) gives one empty row, so the sample still counts in its group.

    Example::

        rows = trajectory_rows(build_trajectory(trace), exp_id="e1", group_id="q-17",
                               session_id=trace.session_id, reward=1.0)
    """
    common: dict[str, Any] = {
        "exp_id": exp_id,
        "group_id": group_id,
        "session_id": session_id,
        "member": member,
        "attempt": attempt,
        "reward": float(reward),
        "advantage": float(advantage),
        "outcome": outcome,
        "zeroed": zeroed,
    }
    segments: Sequence[SegmentLike] = ()
    if trajectory is not None:
        if not isinstance(trajectory, TrajectoryLike):
            raise InvalidTrajectoryError(
                f"trajectory of type {type(trajectory).__name__} has no segments",
                session_id=session_id,
            )
        segments = trajectory.segments
    fallback = [policy_version] if policy_version is not None else []
    if not segments:
        return [
            TrainingRow(
                **common,
                segment=0,
                num_segments=1,
                prompt_ids=[],
                response_ids=[],
                loss_mask=[],
                logprobs=[],
                policy_versions=fallback,
            )
        ]
    rows = []
    for number, segment in enumerate(segments):
        prompt, response, mask, logprobs = _split(segment, session_id)
        # None, or the trajectory's NO_VERSION (-1) on prompt tokens, is no version.
        versions = [-1 if v is None else int(v) for v in segment.policy_versions]
        distinct = list(dict.fromkeys(v for v in versions if v >= 0))
        per_token = versions[len(prompt) :] if len(versions) == len(segment.token_ids) else []
        if zeroed:
            mask = [0] * len(mask)
            if logprobs is None:
                logprobs = [0.0] * len(response)
        rows.append(
            TrainingRow(
                **common,
                segment=number,
                num_segments=len(segments),
                prompt_ids=prompt,
                response_ids=response,
                loss_mask=mask,
                logprobs=logprobs,
                policy_versions=distinct or fallback,
                response_versions=per_token,
            )
        )
    return rows


def _split(
    segment: SegmentLike, session_id: str
) -> tuple[list[int], list[int], list[int], list[float] | None]:
    tokens = [int(t) for t in segment.token_ids]
    mask = [int(m) for m in segment.loss_mask]
    if len(mask) != len(tokens):
        raise InvalidTrajectoryError(
            f"loss mask has {len(mask)} entries for {len(tokens)} tokens", session_id=session_id
        )
    if any(m not in (0, 1) for m in mask):
        raise InvalidTrajectoryError("loss mask entries must be 0 or 1", session_id=session_id)
    start = mask.index(1) if 1 in mask else len(tokens)
    raw = list(segment.logprobs or ())
    logprobs: list[float] | None
    if not raw:
        logprobs = None
    elif len(raw) == len(tokens):
        logprobs = [float(x) for x in raw[start:]]
    elif len(raw) == sum(mask):
        # Logprobs of generated tokens only: spread them over the mask's 1s.
        it = iter(raw)
        logprobs = [float(next(it)) if m else 0.0 for m in mask[start:]]
    else:
        raise InvalidTrajectoryError(
            f"{len(raw)} logprobs fit neither the {len(tokens)} tokens nor the "
            f"{sum(mask)} generated ones",
            session_id=session_id,
        )
    return tokens[:start], tokens[start:], mask[start:], logprobs


# --- Fitting to a trainer's lengths -----------------------------------------------------------
# A response too long is cut (the kept tokens' logprobs stay exact: a causal model's logprob
# depends only on what precedes it). A prompt too long keeps its last tokens, as veRL
# left-truncates, and the whole row gets loss mask 0: its response followed a context the
# trainer no longer sees. No row is dropped, so its reward still counts in its group.


@dataclass(frozen=True, kw_only=True)
class FitReport:
    """Fitted rows and what fitting changed.

    Example::

        report = fit_rows(rows, max_prompt_length=512, max_response_length=512)
        metrics["rows/prompts_masked"] = report.prompts_masked
    """

    rows: list[TrainingRow]
    responses_truncated: int = 0
    prompts_masked: int = 0
    response_tokens_cut: int = 0
    prompt_tokens_cut: int = 0


def _check(name: str, value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigurationError(f"{name} must be an integer >= 1, got {value!r}")


def fit_row(row: TrainingRow, *, max_prompt_length: int, max_response_length: int) -> TrainingRow:
    """One row fitted by the fitting rule (see above) (the same row when it already fits).

    Example::

        fit_row(row, max_prompt_length=512, max_response_length=512)
    """
    _check("max_prompt_length", max_prompt_length)
    _check("max_response_length", max_response_length)
    changes: dict[str, object] = {}
    if len(row.response_ids) > max_response_length:
        changes["response_ids"] = row.response_ids[:max_response_length]
        changes["loss_mask"] = row.loss_mask[:max_response_length]
        if row.logprobs is not None:
            changes["logprobs"] = row.logprobs[:max_response_length]
        changes["response_versions"] = row.response_versions[:max_response_length]
    if len(row.prompt_ids) > max_prompt_length:
        changes["prompt_ids"] = row.prompt_ids[-max_prompt_length:]
        kept = changes.get("loss_mask", row.loss_mask)
        assert isinstance(kept, list)
        changes["loss_mask"] = [0] * len(kept)
    return replace(row, **changes) if changes else row  # type: ignore[arg-type]


def fit_rows(
    rows: Iterable[TrainingRow], *, max_prompt_length: int, max_response_length: int
) -> FitReport:
    """Every row fitted by the fitting rule (see above), with counts of what was cut or masked.

    Example::

        report = fit_rows(rows, max_prompt_length=1024, max_response_length=2048)
    """
    limits = {"max_prompt_length": max_prompt_length, "max_response_length": max_response_length}
    pairs = [(row, fit_row(row, **limits)) for row in rows]
    response_cut = [len(row.response_ids) - len(fitted.response_ids) for row, fitted in pairs]
    prompt_cut = [len(row.prompt_ids) - len(fitted.prompt_ids) for row, fitted in pairs]
    return FitReport(
        rows=[fitted for _, fitted in pairs],
        responses_truncated=sum(cut > 0 for cut in response_cut),
        prompts_masked=sum(cut > 0 for cut in prompt_cut),
        response_tokens_cut=sum(response_cut),
        prompt_tokens_cut=sum(prompt_cut),
    )


# --- Files: JSONL always, Parquet with pyarrow (imported only then) ---------------------------


PathOrFile = str | os.PathLike[str] | IO[str]


def _opened(target: PathOrFile, mode: str) -> contextlib.AbstractContextManager[IO[str]]:
    if isinstance(target, (str, os.PathLike)):
        return open(target, mode, encoding="utf-8")
    return contextlib.nullcontext(target)  # the caller's to close


def write_jsonl(rows: Iterable[TrainingRow], target: PathOrFile, *, append: bool = False) -> int:
    """Write rows as JSON lines to a path (created, or appended to) or an open text file;
    returns how many.

    Example::

        write_jsonl(group_rows(group), "rows.jsonl", append=True)
    """
    count = 0
    with _opened(target, "a" if append else "w") as file:
        for row in rows:
            file.write(json.dumps(row.to_dict(), separators=(",", ":")) + "\n")
            count += 1
    return count


def read_jsonl(source: PathOrFile) -> list[TrainingRow]:
    """Read rows written by :func:`write_jsonl` (blank lines are skipped).

    Example::

        rows = read_jsonl("rows.jsonl")
    """
    name = source if isinstance(source, (str, os.PathLike)) else getattr(source, "name", "<file>")
    rows = []
    with _opened(source, "r") as file:
        for number, line in enumerate(file, start=1):
            if not line.strip():
                continue
            try:
                rows.append(TrainingRow.from_dict(json.loads(line)))
            except (ValueError, TypeError) as exc:
                raise ConfigurationError(f"{name}:{number} is not a training row: {exc}") from exc
    return rows


def _pyarrow() -> Any:
    # import_module keeps pyarrow optional for the type checker as well as at run time.
    try:
        pyarrow = importlib.import_module("pyarrow")
        importlib.import_module("pyarrow.parquet")
    except ImportError as exc:
        raise ConfigurationError(
            "Parquet needs pyarrow, which is not installed: pip install pyarrow "
            "(or write JSONL with write_jsonl)"
        ) from exc
    return pyarrow


def _schema(pa: Any) -> Any:
    """The Parquet columns of :class:`TrainingRow`'s fields, in order (the mask as int8)."""
    kinds = {
        "str": pa.string(),
        "int": pa.int64(),
        "float": pa.float64(),
        "bool": pa.bool_(),
        "list[int]": pa.list_(pa.int64()),
        "list[float] | None": pa.list_(pa.float64()),
    }
    return pa.schema(
        [
            (f.name, pa.list_(pa.int8()) if f.name == "loss_mask" else kinds[str(f.type)])
            for f in fields(TrainingRow)
        ]
    )


def write_parquet(rows: Iterable[TrainingRow], path: str | os.PathLike[str]) -> int:
    """Write rows to one Parquet file (needs pyarrow). Returns the number of rows.

    Example::

        write_parquet(rows_from_groups(groups), "step-12.parquet")
    """
    pa = _pyarrow()
    records = [row.to_dict() for row in rows]
    table = pa.Table.from_pylist(records, schema=_schema(pa))
    pa.parquet.write_table(table, path)
    return len(records)


def read_parquet(path: str | os.PathLike[str]) -> list[TrainingRow]:
    """Read rows written by :func:`write_parquet` (needs pyarrow).

    Example::

        rows = read_parquet("step-12.parquet")
    """
    pa = _pyarrow()
    return [TrainingRow.from_dict(r) for r in pa.parquet.read_table(path).to_pylist()]
