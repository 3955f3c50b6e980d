"""GRPO groups: n rollouts of one input, their rules, results, advantages and session ids
(docs/groups.md). :class:`~agentcore_rl.group_tracker.GroupTracker` runs them by the rules.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Final, Literal, get_args

from agentcore_rl.errors import AgentCoreRLError, ConfigurationError
from agentcore_rl.keywords import check_numbers, checked_init
from agentcore_rl.protocol import FailureKind, reward_problem, validate_key_part

__all__ = [
    "DropReason",
    "GroupDroppedError",
    "GroupMember",
    "GroupRules",
    "GroupStats",
    "MemberKey",
    "MemberOutcome",
    "Normalize",
    "OnFailure",
    "RolloutGroup",
    "StaleGroupError",
    "advantages",
    "check_whole",
    "group_digest",
    "member_session_id",
    "parse_member_session_id",
    "result_reward",
]

OnFailure = Literal["drop_member", "zero", "drop_group"]
Normalize = Literal["mean", "mean_std"]

#: Added to the standard deviation so a near-uniform group does not blow up (veRL's value).
ADVANTAGE_EPSILON: Final = 1e-6


class MemberOutcome(str, Enum):
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    #: Stopped before it ended (an extra beyond n, or its group was dropped or cancelled).
    STOPPED = "stopped"


class DropReason(str, Enum):
    """Why an attempt is not in its group, or why a whole group was dropped (the table is
    in docs/groups.md, "Failures").

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


@checked_init
@dataclass(frozen=True, kw_only=True)
class GroupRules:
    """How a group of ``n`` members is run and when it counts as whole (each field and the
    failure table: docs/groups.md, "Rules").

    ``redundancy`` extra members start with the group; the first ``n`` to succeed are kept.
    A failure is retried in a fresh session (``retry_infra`` times for kind ``infra``,
    ``retry`` for the others), then follows its rule: ``on_failure`` (``on_timeout`` for a
    timeout) for an ``agent`` failure; an ``infra`` or ``reward`` failure is never zeroed,
    only left out. ``filter_uniform`` drops a group whose rewards are all equal (no
    learning signal). ``member_seed`` gives each draw of a member its own ``_rollout.seed``:
    a seed shared by every member would make them sample alike.

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
        return min(self.min_members, self.n)

    @property
    def starts(self) -> int:
        return self.n + self.redundancy


_SESSION_PREFIX: Final = "grp"
_DIGEST_CHARS: Final = 32
_MEMBER_SESSION: Final = re.compile(
    rf"{_SESSION_PREFIX}-(?P<digest>[0-9a-f]{{{_DIGEST_CHARS}}})-m(?P<index>\d+)-a(?P<attempt>\d+)"
)


@dataclass(frozen=True)
class MemberKey:
    digest: str
    index: int
    attempt: int


def group_digest(exp_id: str, input_id: str) -> str:
    validate_key_part("exp_id", exp_id)
    validate_key_part("input_id", input_id)
    # Key parts never contain "/", so the joined text is unambiguous.
    return hashlib.sha256(f"{exp_id}/{input_id}".encode()).hexdigest()[:_DIGEST_CHARS]


def member_session_id(exp_id: str, input_id: str, *, index: int, attempt: int) -> str:
    """``grp-<digest>-m<index>-a<attempt>``: deterministic, so a restarted process finds the
    same sessions (and result keys); hashed, as ``input_id`` may hold characters session ids
    may not (AgentCore Runtime's: letters, digits and hyphens, at least 33)."""
    check_whole("member index", index)
    check_whole("member attempt", attempt)
    return f"{_SESSION_PREFIX}-{group_digest(exp_id, input_id)}-m{index}-a{attempt}"


def check_whole(what: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ConfigurationError(f"{what} must be an integer >= 0, got {value!r}")


def parse_member_session_id(session_id: str) -> MemberKey | None:
    match = _MEMBER_SESSION.fullmatch(session_id)
    if match is None:
        return None
    return MemberKey(match["digest"], int(match["index"]), int(match["attempt"]))


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


@dataclass(frozen=True, kw_only=True)
class GroupMember:
    """One attempt of one member of a group, as it ended.

    ``reward``: the agent's for a success, 0.0 for a member ``zeroed`` under
    ``on_failure="zero"`` (its tokens train with mask 0), else ``None``. ``trajectory``: the
    captured tokens (with a gateway); ``drop_reason``: why it is not in the group.

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
    """Counts, and rewards over the kept members (population std)."""

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
    """The kept ``members`` of one input, in index order (fewer than ``n`` only under
    ``"drop_member"``), and every other attempt in ``discarded`` with its ``drop_reason``.

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
        return [0.0 if m.reward is None else m.reward for m in self.members]

    @property
    def session_ids(self) -> list[str]:
        return [m.session_id for m in self.members]

    def advantages(self, normalize: Normalize = "mean") -> list[float]:
        return advantages(self.rewards, normalize)

    @property
    def is_uniform(self) -> bool:
        return len(set(self.rewards)) <= 1

    @property
    def stats(self) -> GroupStats:
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
    """A group with a member started under ``policy_version``, older than ``current``
    (what :meth:`advance_policy` moved to) minus ``max_staleness``, was stopped.

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
