"""GRPO groups: n rollouts of one input, their rewards, advantages and the rules they follow.

Pure: the rules (:class:`GroupRules`), the result (:class:`RolloutGroup`), drop reasons and
errors, and member session ids (docs/groups.md, "Session ids").

:class:`GroupTracker` is the pure state machine deciding what happens to the members: the
client tells it how each ended (``succeeded``, ``failed``, ``timed_out``) and carries out
the actions it answers with, in order: :class:`StartMember`, :class:`StopMember` (always
before the resolution they lead to), then the group's outcome itself, a
:class:`RolloutGroup` or a :class:`GroupDroppedError`. Nothing here awaits or reads a clock.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from enum import Enum
from functools import partial
from typing import Any, Final, Literal, get_args

from agentcore_rl.errors import AgentCoreRLError, ConfigurationError
from agentcore_rl.keywords import check_numbers, checked_init
from agentcore_rl.protocol import FailureKind, reward_problem, validate_key_part

__all__ = [
    "Action",
    "DropReason",
    "GroupCounters",
    "GroupDroppedError",
    "GroupMember",
    "GroupRules",
    "GroupStats",
    "GroupTracker",
    "MemberKey",
    "MemberOutcome",
    "Normalize",
    "OnFailure",
    "RolloutGroup",
    "StaleGroupError",
    "StartMember",
    "StopMember",
    "advantages",
    "group_digest",
    "member_session_id",
    "parse_member_session_id",
    "result_reward",
]

OnFailure = Literal["drop_member", "zero", "drop_group"]
Normalize = Literal["mean", "mean_std"]

#: Added to the standard deviation so a near-uniform group does not blow up (veRL's value).
ADVANTAGE_EPSILON: Final = 1e-6


# --- Outcomes and reasons -------------------------------------------------------------------


class MemberOutcome(str, Enum):
    """How one attempt of a member ended."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    #: Stopped before it ended (an extra beyond n, or its group was dropped or cancelled).
    STOPPED = "stopped"


class DropReason(str, Enum):
    """Why an attempt is not in its group, or why a whole group was dropped.

    Member reasons: ``RETRIED`` (failed, re-run in a fresh session), ``FAILED`` /
    ``TIMED_OUT`` (left out under ``on_failure="drop_member"``, or covered by a spare),
    ``INFRA`` / ``REWARD`` (failed with that kind and left out: never zeroed),
    ``REDUNDANT`` (an extra beyond n, stopped). Group reasons: ``FAILED`` / ``TIMED_OUT``
    (``on_failure="drop_group"``), ``TOO_FEW_MEMBERS``, ``UNIFORM``, ``STALE``, ``CANCELLED``.

    Example::

        counters.groups_dropped[DropReason.UNIFORM]
    """

    RETRIED = "retried"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    INFRA = "infra"
    REWARD = "reward"
    REDUNDANT = "redundant"
    TOO_FEW_MEMBERS = "too_few_members"
    UNIFORM = "uniform"
    STALE = "stale"
    CANCELLED = "cancelled"


# --- Rules ----------------------------------------------------------------------------------


@checked_init
@dataclass(frozen=True, kw_only=True)
class GroupRules:
    """How a group of ``n`` members is run and when it counts as whole.

    ``redundancy`` extra members start with the group; the first ``n`` to succeed are kept
    and the rest are stopped. A failed or timed-out member is re-run in a fresh session,
    unless a spare still running covers it: up to ``retry_infra`` times after failures of
    kind ``infra``, up to ``retry`` times after any other. What then remains failed follows
    its kind (docs/groups.md has the table): an ``agent`` failure (and a timeout, unless
    ``on_timeout`` says otherwise) follows ``on_failure``: ``"drop_member"`` (the group
    resolves with its survivors if at least ``min_members`` - capped at ``n`` - succeed),
    ``"zero"`` (the member stays with reward 0 and its tokens masked out) or
    ``"drop_group"``; an ``infra`` or ``reward`` failure is never zeroed: it is left out,
    as under ``"drop_member"``. ``filter_uniform`` drops a
    group whose rewards are all equal: it carries no learning signal. ``member_seed``
    gives each draw of a member its own ``_rollout.seed`` (``member_seed + draw * (n +
    redundancy) + index``): a seed shared by every member would make them sample alike. A
    retry after an ``infra`` failure is the same draw again (it never got a fair run), any
    other retry the next one.

    Example::

        GroupRules(n=8, redundancy=2, on_failure="zero", filter_uniform=True)
    """

    n: int
    redundancy: int = 0
    retry: int = 1
    retry_infra: int = 3
    on_failure: OnFailure = "drop_member"
    on_timeout: OnFailure | None = None
    min_members: int = 2
    filter_uniform: bool = False
    member_seed: int | None = None

    def __post_init__(self) -> None:
        check_numbers(self, "n", "min_members", at_least=1, integer=True)
        check_numbers(self, "redundancy", "retry", "retry_infra", at_least=0, integer=True)
        for name in ("on_failure", "on_timeout"):
            value = getattr(self, name)
            if value not in get_args(OnFailure) and (name == "on_failure" or value is not None):
                raise ConfigurationError(
                    f"{name} must be one of {', '.join(get_args(OnFailure))}, got {value!r}"
                )
        seed = self.member_seed
        if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
            raise ConfigurationError(f"member_seed must be an integer or None, got {seed!r}")

    @property
    def keep_at_least(self) -> int:
        """Survivors a ``drop_member`` group needs: ``min_members`` capped at ``n``."""
        return min(self.min_members, self.n)

    @property
    def starts(self) -> int:
        """Members started with the group: ``n + redundancy``."""
        return self.n + self.redundancy


# --- Session ids ----------------------------------------------------------------------------

_SESSION_PREFIX: Final = "grp"
_DIGEST_CHARS: Final = 32
_MEMBER_SESSION: Final = re.compile(
    rf"{_SESSION_PREFIX}-(?P<digest>[0-9a-f]{{{_DIGEST_CHARS}}})-m(?P<index>\d+)-a(?P<attempt>\d+)"
)


@dataclass(frozen=True)
class MemberKey:
    """What a member session id encodes (see :func:`parse_member_session_id`)."""

    digest: str
    index: int
    attempt: int


def group_digest(exp_id: str, input_id: str) -> str:
    """The 32 hex characters naming one group in its members' session ids."""
    validate_key_part("exp_id", exp_id)
    validate_key_part("input_id", input_id)
    # Key parts never contain "/", so the joined text is unambiguous.
    return hashlib.sha256(f"{exp_id}/{input_id}".encode()).hexdigest()[:_DIGEST_CHARS]


def member_session_id(exp_id: str, input_id: str, *, index: int, attempt: int) -> str:
    """The session id of one attempt of one member: ``grp-<digest>-m<index>-a<attempt>``.

    Deterministic, so a restarted process finds the same sessions (and result keys), and
    valid for AgentCore Runtime (letters, digits and hyphens; at least 33 characters).
    The ids are hashed because ``input_id`` may hold characters session ids may not.
    """
    for name, value in (("index", index), ("attempt", attempt)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ConfigurationError(f"member {name} must be an integer >= 0, got {value!r}")
    return f"{_SESSION_PREFIX}-{group_digest(exp_id, input_id)}-m{index}-a{attempt}"


def parse_member_session_id(session_id: str) -> MemberKey | None:
    """``(digest, index, attempt)`` of a member session id, ``None`` for any other id."""
    match = _MEMBER_SESSION.fullmatch(session_id)
    if match is None:
        return None
    return MemberKey(match["digest"], int(match["index"]), int(match["attempt"]))


# --- Advantages -----------------------------------------------------------------------------


def advantages(rewards: Sequence[float], normalize: Normalize = "mean") -> list[float]:
    """GRPO advantages of one group: reward minus the group mean, divided by its std.

    ``"mean"`` subtracts the mean only (Dr. GRPO); ``"mean_std"`` also divides by the
    sample standard deviation plus 1e-6, as veRL and TRL do. A group of one has no
    baseline: its advantage is its reward, as veRL's and SkyRL's GRPO give a lone sample.
    """
    if normalize not in get_args(Normalize):
        raise ConfigurationError(
            f"normalize must be one of {', '.join(get_args(Normalize))}, got {normalize!r}"
        )
    values = [float(r) for r in rewards]
    if not values:
        return []
    if len(values) == 1:
        return values
    mean = math.fsum(values) / len(values)
    centred = [r - mean for r in values]
    if normalize == "mean":
        return centred
    std = math.sqrt(math.fsum(c * c for c in centred) / (len(values) - 1))
    return [c / (std + ADVANTAGE_EPSILON) for c in centred]


def result_reward(result: Any) -> float | None:
    """The reward of a result dict: the first of ``rewards: [r, ...]``, else ``reward: r``;
    ``None`` when there is none or it is not usable (``protocol.reward_problem`` says why).
    """
    if not isinstance(result, Mapping) or reward_problem(result, required=True):
        return None
    rewards = result.get("rewards")
    return float(rewards[0] if rewards else result["reward"])


# --- Members and groups ---------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class GroupMember:
    """One attempt of one member of a group, as it ended.

    ``reward`` is the agent's reward for a success, 0.0 for a member zeroed under
    ``on_failure="zero"`` (``zeroed`` is then true and its tokens train with mask 0) and
    ``None`` otherwise. ``trajectory`` is the captured token trajectory when a gateway is
    configured; ``result`` the agent's result envelope when there was one; ``error`` a
    one-line description of a failure and ``failure_kind`` its kind; ``drop_reason`` why
    the attempt is not in the group.

    Example::

        for m in group.members:
            print(m.index, m.session_id, m.reward, m.policy_version)
    """

    index: int
    attempt: int
    session_id: str
    outcome: MemberOutcome
    reward: float | None = None
    policy_version: int | None = None
    trajectory: Any = None
    result: Mapping[str, Any] | None = None
    error: str | None = None
    failure_kind: FailureKind | None = None
    zeroed: bool = False
    drop_reason: DropReason | None = None


@dataclass(frozen=True, kw_only=True)
class GroupStats:
    """Figures of one group: counts, and rewards over the kept members (population std)."""

    n: int
    size: int
    succeeded: int
    zeroed: int
    retried: int
    discarded: int
    reward_mean: float | None
    reward_std: float | None
    reward_min: float | None
    reward_max: float | None
    policy_version_min: int | None
    policy_version_max: int | None


@dataclass(frozen=True, kw_only=True)
class RolloutGroup:
    """The members of one input that count, and every attempt that does not.

    ``members`` are the kept members in index order (at most ``n``; fewer only under
    ``on_failure="drop_member"``); ``discarded`` holds every other attempt with its
    ``drop_reason``, so no session goes unaccounted for.

    Example::

        g = await client.invoke_group(payload, rules=GroupRules(n=8), input_id="q-17")
        g = await g
        for member, adv in zip(g.members, g.advantages("mean_std")):
            print(member.session_id, member.reward, adv)
    """

    exp_id: str
    input_id: str
    n: int
    members: tuple[GroupMember, ...]
    discarded: tuple[GroupMember, ...] = field(default=())

    @property
    def rewards(self) -> list[float]:
        """Rewards of the kept members, in member order (zeroed members count 0.0)."""
        return [0.0 if m.reward is None else m.reward for m in self.members]

    @property
    def session_ids(self) -> list[str]:
        """Session ids of the kept members, in member order."""
        return [m.session_id for m in self.members]

    def advantages(self, normalize: Normalize = "mean") -> list[float]:
        """Advantages of the kept members, in member order (see :func:`advantages`)."""
        return advantages(self.rewards, normalize)

    @property
    def is_uniform(self) -> bool:
        """True when all kept rewards are equal (no GRPO learning signal)."""
        return len(set(self.rewards)) <= 1

    @property
    def stats(self) -> GroupStats:
        """Counts, reward figures and the min/max policy version of the kept members."""
        rewards = self.rewards
        versions = [m.policy_version for m in self.members if m.policy_version is not None]
        mean = math.fsum(rewards) / len(rewards) if rewards else None
        std = None
        if mean is not None:
            std = math.sqrt(math.fsum((r - mean) ** 2 for r in rewards) / len(rewards))
        return GroupStats(
            n=self.n,
            size=len(self.members),
            succeeded=sum(m.outcome is MemberOutcome.SUCCEEDED for m in self.members),
            zeroed=sum(m.zeroed for m in self.members),
            retried=sum(m.drop_reason is DropReason.RETRIED for m in self.discarded),
            discarded=len(self.discarded),
            reward_mean=mean,
            reward_std=std,
            reward_min=min(rewards) if rewards else None,
            reward_max=max(rewards) if rewards else None,
            policy_version_min=min(versions) if versions else None,
            policy_version_max=max(versions) if versions else None,
        )


class GroupDroppedError(AgentCoreRLError):
    """A group was dropped by its rules; ``reason`` says which, ``group`` what had finished.

    Example::

        try:
            g = await group
        except GroupDroppedError as exc:
            print(exc.input_id, exc.reason.value, len(exc.group.members))
    """

    def __init__(self, group: RolloutGroup, reason: DropReason, detail: str = "") -> None:
        self.group = group
        self.input_id = group.input_id
        self.reason = reason
        text = f"group {group.input_id!r} dropped ({reason.value})"
        super().__init__(f"{text}: {detail}" if detail else text)


class StaleGroupError(GroupDroppedError):
    """A group started under a policy version too old for the trainer was stopped.

    ``policy_version`` is the oldest version among its members, ``current`` the version
    :meth:`advance_policy` moved to and ``max_staleness`` the allowed lag.

    Example::

        except StaleGroupError as exc:
            print(exc.policy_version, "<", exc.current - exc.max_staleness)
    """

    def __init__(
        self, group: RolloutGroup, *, policy_version: int, current: int, max_staleness: int
    ) -> None:
        self.policy_version = policy_version
        self.current = current
        self.max_staleness = max_staleness
        super().__init__(
            group,
            DropReason.STALE,
            f"started under policy version {policy_version}, older than "
            f"{current} - {max_staleness} allowed",
        )


# --- GroupTracker's actions ----------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class StartMember:
    """Run one attempt of one member: invoke in ``session_id`` stamped ``policy_version``;
    ``draw`` counts its earlier attempts that were not ``infra`` failures (its seed's)."""

    input_id: str
    index: int
    attempt: int
    session_id: str
    policy_version: int | None
    draw: int = 0


@dataclass(frozen=True, kw_only=True)
class StopMember:
    """Stop this session (or never start it if it still waits for admission)."""

    input_id: str
    session_id: str
    reason: DropReason


#: What the tracker answers an event with; a group's outcome (whole, or dropped) comes last.
Action = StartMember | StopMember | RolloutGroup | GroupDroppedError

#: A failed attempt's drop reason by kind (else ``FAILED``).
_REASONS: Final = {
    FailureKind.INFRA: DropReason.INFRA,
    FailureKind.REWARD: DropReason.REWARD,
    FailureKind.TIMEOUT: DropReason.TIMED_OUT,
}
#: Kinds retried on ``retry_infra``: the rollout did not get a fair run.
_INFRA_BUDGET: Final = frozenset({FailureKind.INFRA, FailureKind.STOPPED})


# --- Counters -------------------------------------------------------------------------------


@dataclass(kw_only=True)
class GroupCounters:
    """A snapshot of what a tracker has decided so far.

    ``members_dropped`` and ``groups_dropped`` count by :class:`DropReason` value,
    ``failures`` every failed attempt by :class:`~agentcore_rl.FailureKind` value;
    ``ignored_events`` counts outcomes that arrived for an attempt already stopped or
    ended (a late result after a stop), which change nothing.

    Example::

        c = tracker.counters
        print(c.groups_ready, c.groups_dropped.get("uniform", 0), c.members_retried)
    """

    groups_opened: int = 0
    groups_open: int = 0
    groups_ready: int = 0
    members_started: int = 0
    members_succeeded: int = 0
    members_failed: int = 0
    members_timed_out: int = 0
    members_retried: int = 0
    members_zeroed: int = 0
    members_stopped: int = 0
    ignored_events: int = 0
    members_dropped: dict[str, int] = field(default_factory=dict)
    groups_dropped: dict[str, int] = field(default_factory=dict)
    failures: dict[str, int] = field(default_factory=dict)


# --- State ----------------------------------------------------------------------------------


@dataclass(kw_only=True)
class _Attempt:
    index: int
    attempt: int
    session_id: str
    policy_version: int | None
    #: None while it runs; once set (stopped included), no further event matters.
    outcome: MemberOutcome | None = None
    reward: float | None = None
    trajectory: Any = None
    result: Mapping[str, Any] | None = None
    error: str | None = None
    failure_kind: FailureKind | None = None
    zeroed: bool = False
    drop_reason: DropReason | None = None

    def frozen(self) -> GroupMember:
        named = {f.name: getattr(self, f.name) for f in fields(GroupMember)}
        return GroupMember(**{**named, "outcome": self.outcome or MemberOutcome.STOPPED})


@dataclass(kw_only=True)
class _Group:
    input_id: str
    rules: GroupRules
    attempts: list[_Attempt] = field(default_factory=list)

    def active(self) -> list[_Attempt]:
        return [a for a in self.attempts if a.outcome is None]

    def kept(self) -> list[_Attempt]:
        return [
            a
            for a in self.attempts
            if a.drop_reason is None and (a.outcome is MemberOutcome.SUCCEEDED or a.zeroed)
        ]

    def oldest_version(self) -> int:
        """The oldest version among the attempts that are, or may still be, in the group.

        Discarded attempts (retried, redundant) no longer count: a group whose old
        members were all replaced by retries under a newer policy is not stale. A member
        started before any version was set counts as version 0.
        """
        live = self.active() + self.kept()
        return min((a.policy_version or 0) for a in live or self.attempts)


# --- The tracker ----------------------------------------------------------------------------


class GroupTracker:
    """Decides, for every open group, which members to start, retry, stop and keep.

    One tracker serves all groups of one experiment (``exp_id``); ``input_id`` names a
    group and may be used once per tracker, since member session ids derive from it.
    ``policy_version`` is stamped into every member started from now on; see
    :meth:`set_policy_version` and :meth:`advance_policy`.

    Every method that takes an event returns the actions to carry out, in order. An event
    for a session the tracker never started raises ``KeyError``; one for an attempt that
    already ended (a result racing its stop) is counted in ``ignored_events`` and changes
    nothing.
    """

    def __init__(self, *, exp_id: str, policy_version: int | None = None) -> None:
        group_digest(exp_id, "probe")  # validates exp_id as session ids will use it
        self.exp_id = exp_id
        self._version: int | None = None
        if policy_version is not None:
            self.set_policy_version(policy_version)
        self._groups: dict[str, _Group] = {}
        self._by_session: dict[str, tuple[_Group, _Attempt]] = {}
        # Digests of every group opened: an input_id names one group per experiment.
        self._seen: set[str] = set()
        self._counts = GroupCounters()

    # -- inspection --

    @property
    def policy_version(self) -> int | None:
        """The version stamped into members started from now on (``None``: not set)."""
        return self._version

    @property
    def counters(self) -> GroupCounters:
        """A snapshot of the counters."""
        c = self._counts
        return replace(
            c,
            groups_open=len(self._groups),
            members_dropped=dict(c.members_dropped),
            groups_dropped=dict(c.groups_dropped),
            failures=dict(c.failures),
        )

    def is_open(self, input_id: str) -> bool:
        """True while the group has not been resolved or dropped."""
        return input_id in self._groups

    def is_running(self, session_id: str) -> bool:
        """True while the attempt in ``session_id`` has neither ended nor been stopped."""
        found = self._by_session.get(session_id)
        return found is not None and found[1].outcome is None

    # -- events --

    def open(self, input_id: str, rules: GroupRules) -> list[Action]:
        """Open a group: one :class:`StartMember` per member (``n + redundancy``)."""
        digest = group_digest(self.exp_id, input_id)
        if digest in self._seen:
            raise ConfigurationError(
                f"input_id {input_id!r} already had a group in experiment {self.exp_id!r}; "
                "member session ids derive from it, so give each group its own input_id "
                f"(for example '{input_id}@step3')"
            )
        self._seen.add(digest)
        group = _Group(input_id=input_id, rules=rules)
        self._groups[input_id] = group
        self._counts.groups_opened += 1
        return [self._start(group, index, 0) for index in range(rules.starts)]

    def succeeded(
        self,
        session_id: str,
        reward: float,
        *,
        trajectory: Any = None,
        result: Mapping[str, Any] | None = None,
    ) -> list[Action]:
        """This attempt ended with ``reward``; the group may now be whole."""
        if isinstance(reward, bool) or not isinstance(reward, (int, float)):
            raise ValueError(f"reward must be a number, got {type(reward).__name__}")
        if not math.isfinite(reward):
            raise ValueError(f"reward must be finite, got {reward!r}")
        return self._ended(session_id, MemberOutcome.SUCCEEDED, float(reward), trajectory, result)

    def failed(
        self,
        session_id: str,
        error: BaseException | str,
        *,
        kind: FailureKind = FailureKind.AGENT,
        trajectory: Any = None,
        result: Mapping[str, Any] | None = None,
    ) -> list[Action]:
        """This attempt failed with ``kind``: retry it or apply the rule for its kind."""
        if not isinstance(error, str):
            error = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
        if kind is FailureKind.TIMEOUT:
            return self.timed_out(session_id, trajectory=trajectory)
        attempt_kind = (error, FailureKind(kind))
        return self._ended(session_id, MemberOutcome.FAILED, attempt_kind, trajectory, result)

    def timed_out(self, session_id: str, *, trajectory: Any = None) -> list[Action]:
        """This attempt gave no result in time (the client stops its session itself)."""
        why = ("no result within the timeout", FailureKind.TIMEOUT)
        return self._ended(session_id, MemberOutcome.TIMED_OUT, why, trajectory, None)

    def cancel(self, input_id: str) -> list[Action]:
        """Give up a group (its future was cancelled, the client closes): stop and drop it."""
        group = self._groups.get(input_id)
        if group is None:
            return []
        return self._drop(group, DropReason.CANCELLED)

    def set_policy_version(self, version: int) -> None:
        """Stamp ``version`` into every member started from now on (retries included)."""
        if isinstance(version, bool) or not isinstance(version, int) or version < 0:
            raise ConfigurationError(f"policy version must be an integer >= 0, got {version!r}")
        if self._version is not None and version < self._version:
            raise ConfigurationError(
                f"policy version {version} is older than the current {self._version}; "
                "versions only move forward"
            )
        self._version = version

    def advance_policy(self, version: int, *, max_staleness: int) -> list[Action]:
        """Move to ``version`` and drop every open group with a member older than
        ``version - max_staleness`` (running or kept members count, discarded attempts do
        not; a member started before any version counts as 0).
        """
        if (
            isinstance(max_staleness, bool)
            or not isinstance(max_staleness, int)
            or max_staleness < 0
        ):
            raise ConfigurationError(
                f"max_staleness must be an integer >= 0, got {max_staleness!r}"
            )
        self.set_policy_version(version)
        actions: list[Action] = []
        for group in list(self._groups.values()):
            oldest = group.oldest_version()
            if oldest < version - max_staleness:
                actions += self._drop(
                    group,
                    DropReason.STALE,
                    make_error=partial(
                        StaleGroupError,
                        policy_version=oldest,
                        current=version,
                        max_staleness=max_staleness,
                    ),
                )
        return actions

    # -- decisions --

    def _ended(
        self,
        session_id: str,
        outcome: MemberOutcome,
        reward_or_error: float | tuple[str, FailureKind],
        trajectory: Any,
        result: Mapping[str, Any] | None,
    ) -> list[Action]:
        """Record how an attempt ended (a late event is ignored), then decide."""
        found = self._lookup(session_id)
        if found is None or found[1].outcome is not None:
            self._counts.ignored_events += 1
            return []
        group, attempt = found
        attempt.outcome = outcome
        attempt.trajectory = trajectory
        attempt.result = result
        if isinstance(reward_or_error, float):
            self._counts.members_succeeded += 1
            attempt.reward = reward_or_error
            return self._check_done(group)
        error, kind = reward_or_error
        attempt.error, attempt.failure_kind = error, kind
        failures = self._counts.failures
        failures[kind.value] = failures.get(kind.value, 0) + 1
        if kind is FailureKind.TIMEOUT:
            self._counts.members_timed_out += 1
        else:
            self._counts.members_failed += 1
        reason = _REASONS.get(kind, DropReason.FAILED)
        rules = group.rules
        needed = rules.n - len(group.kept())
        if len(group.active()) >= needed:
            # Spares still running can fill every open place: no retry needed.
            self._discard(attempt, reason)
            return self._check_done(group)
        # Infrastructure failures have a budget of their own: they say nothing of the input.
        infra = kind in _INFRA_BUDGET
        same = [
            a
            for a in group.attempts
            if a.index == attempt.index
            and a.failure_kind is not None
            and (a.failure_kind in _INFRA_BUDGET) == infra
        ]
        if len(same) <= (rules.retry_infra if infra else rules.retry):
            self._discard(attempt, DropReason.RETRIED)
            self._counts.members_retried += 1
            return [self._start(group, attempt.index, attempt.attempt + 1)]
        rule = rules.on_failure
        if kind is FailureKind.TIMEOUT and rules.on_timeout is not None:
            rule = rules.on_timeout
        elif kind not in (FailureKind.AGENT, FailureKind.TIMEOUT):
            rule = "drop_member"  # infra and reward: never trained on, never a group's end
        if rule == "drop_group":
            self._discard(attempt, reason)
            return self._drop(group, reason, error)
        if rule == "zero":
            attempt.zeroed = True
            attempt.reward = 0.0
            self._counts.members_zeroed += 1
            return self._check_done(group)
        self._discard(attempt, reason)
        reachable = len(group.kept()) + len(group.active())  # zeroed members count too
        if reachable < rules.keep_at_least:
            detail = f"at most {reachable} of the {rules.keep_at_least} members needed can succeed"
            return self._drop(group, DropReason.TOO_FEW_MEMBERS, detail)
        return self._check_done(group)

    def _check_done(self, group: _Group) -> list[Action]:
        """Resolve a group with n kept members, or none of whose attempts still runs."""
        if len(group.kept()) >= group.rules.n:
            return self._finish(group)
        if group.active():
            return []
        if len(group.kept()) < group.rules.keep_at_least:
            detail = f"{len(group.kept())} of the {group.rules.keep_at_least} members needed"
            return self._drop(group, DropReason.TOO_FEW_MEMBERS, detail)
        return self._finish(group)

    def _finish(self, group: _Group) -> list[Action]:
        """Keep the members that made it, stop the extras, resolve (or filter) the group."""
        actions = self._stop_active(group, DropReason.REDUNDANT, count_as_drop=True)
        snapshot = self._snapshot(group)
        if group.rules.filter_uniform and snapshot.is_uniform:
            detail = f"all {len(snapshot.members)} rewards are {snapshot.rewards[0]!r}"
            if group.rules.member_seed is None:  # the usual cause: members sampled alike
                detail += (
                    "; with GroupRules(member_seed=...) each member gets its own "
                    "_rollout.seed, which the agent passes to its model"
                )
            return actions + self._drop(group, DropReason.UNIFORM, detail)
        self._close(group)
        self._counts.groups_ready += 1
        return [*actions, snapshot]

    def _drop(
        self,
        group: _Group,
        reason: DropReason,
        detail: str = "",
        make_error: Callable[[RolloutGroup], GroupDroppedError] | None = None,
    ) -> list[Action]:
        """Stop what still runs, then fail the group with an error holding what finished."""
        actions = self._stop_active(group, reason, count_as_drop=False)
        snapshot = self._snapshot(group)
        error = make_error(snapshot) if make_error else GroupDroppedError(snapshot, reason, detail)
        self._close(group)
        dropped = self._counts.groups_dropped
        dropped[error.reason.value] = dropped.get(error.reason.value, 0) + 1
        return [*actions, error]

    def _stop_active(
        self, group: _Group, reason: DropReason, *, count_as_drop: bool
    ) -> list[Action]:
        actions: list[Action] = []
        for attempt in group.active():
            attempt.outcome = MemberOutcome.STOPPED
            if count_as_drop:
                self._discard(attempt, reason)
            else:
                attempt.drop_reason = reason
            self._counts.members_stopped += 1
            actions.append(
                StopMember(input_id=group.input_id, session_id=attempt.session_id, reason=reason)
            )
        return actions

    # -- bookkeeping --

    def _start(self, group: _Group, index: int, attempt_no: int) -> StartMember:
        session_id = member_session_id(self.exp_id, group.input_id, index=index, attempt=attempt_no)
        attempt = _Attempt(
            index=index, attempt=attempt_no, session_id=session_id, policy_version=self._version
        )
        group.attempts.append(attempt)
        self._by_session[session_id] = (group, attempt)
        self._counts.members_started += 1
        earlier = [a.failure_kind for a in group.attempts if a.index == index]
        return StartMember(
            input_id=group.input_id,
            index=index,
            attempt=attempt_no,
            session_id=session_id,
            policy_version=self._version,
            draw=sum(kind is not None and kind not in _INFRA_BUDGET for kind in earlier),
        )

    def _discard(self, attempt: _Attempt, reason: DropReason) -> None:
        attempt.drop_reason = reason
        dropped = self._counts.members_dropped
        dropped[reason.value] = dropped.get(reason.value, 0) + 1

    def _lookup(self, session_id: str) -> tuple[_Group, _Attempt] | None:
        """The open attempt, or ``None`` for a session of a group already closed."""
        found = self._by_session.get(session_id)
        if found is not None:
            return found
        key = parse_member_session_id(session_id)
        if key is not None and key.digest in self._seen:
            return None
        raise KeyError(f"session {session_id!r} is not a member this tracker started")

    def _close(self, group: _Group) -> None:
        # A closed group leaves the index, so memory does not grow with every attempt ever
        # run; its sessions stay recognisable through the group's digest in _seen.
        del self._groups[group.input_id]
        for attempt in group.attempts:
            self._by_session.pop(attempt.session_id, None)

    def _snapshot(self, group: _Group) -> RolloutGroup:
        kept = sorted(group.kept(), key=lambda a: (a.index, a.attempt))
        kept_ids = {id(a) for a in kept}
        other = [a for a in group.attempts if id(a) not in kept_ids]
        return RolloutGroup(
            exp_id=self.exp_id,
            input_id=group.input_id,
            n=group.rules.n,
            members=tuple(a.frozen() for a in kept[: group.rules.n]),
            discarded=tuple(a.frozen() for a in other),
        )
