"""The pure state machine deciding what happens to a group's members (:class:`GroupTracker`).

The client tells it how each attempt ended and carries out the actions it answers with, in
order: :class:`StartMember`, :class:`StopMember` (always before the resolution they lead
to), then the group's outcome, a :class:`~agentcore_rl.groups.RolloutGroup` or a
:class:`~agentcore_rl.groups.GroupDroppedError`. Nothing here awaits or reads a clock.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, Final

from agentcore_rl.errors import ConfigurationError
from agentcore_rl.groups import (
    DropReason,
    GroupDroppedError,
    GroupMember,
    GroupRules,
    MemberOutcome,
    RolloutGroup,
    StaleGroupError,
    check_whole,
    group_digest,
    member_session_id,
    parse_member_session_id,
)
from agentcore_rl.protocol import FailureKind

__all__ = ["Action", "GroupCounters", "GroupTracker", "StartMember", "StopMember"]


@dataclass(frozen=True, kw_only=True)
class StartMember:
    """Run one attempt of one member in ``session_id``, stamped ``policy_version``;
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


def _count(counts: dict[str, int], key: str) -> None:
    counts[key] = counts.get(key, 0) + 1


@dataclass(eq=False)
class _Attempt:
    """One attempt's :class:`GroupMember`, replaced as the tracker decides about it; once it
    no longer ``runs`` (stopped included), no further event matters."""

    member: GroupMember
    runs: bool = True

    def set(self, **changes: Any) -> None:
        self.member = replace(self.member, **changes)


@dataclass(kw_only=True)
class _Group:
    input_id: str
    rules: GroupRules
    attempts: list[_Attempt] = field(default_factory=list)

    def active(self) -> list[_Attempt]:
        return [a for a in self.attempts if a.runs]

    def kept(self) -> list[_Attempt]:
        return [
            a
            for a in self.attempts
            if a.member.drop_reason is None
            and (a.member.outcome is MemberOutcome.SUCCEEDED or a.member.zeroed)
        ]

    def oldest_version(self) -> int:
        # Discarded attempts (retried, redundant) no longer count: a group whose old members
        # were all replaced by retries under a newer policy is not stale.
        live = self.active() + self.kept()
        return min((a.member.policy_version or 0) for a in live or self.attempts)


class GroupTracker:
    """Decides, for every open group, which members to start, retry, stop and keep.

    One tracker serves all groups of one experiment (``exp_id``); ``input_id`` names a
    group and may be used once per tracker, since member session ids derive from it.
    ``policy_version`` is stamped into every member started from now on.

    Every method that takes an event returns the actions to carry out, in order. An event
    for a session the tracker never started raises ``KeyError``; one for an attempt that
    already ended (a result racing its stop) is counted in ``ignored_events`` and changes
    nothing.

    Example::

        tracker = GroupTracker(exp_id="e1")
        actions = tracker.open("q-17", GroupRules(n=4))    # four StartMember
        actions = tracker.succeeded(actions[0].session_id, 1.0)
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

    @property
    def policy_version(self) -> int | None:
        """The version stamped into members started from now on (``None``: not set)."""
        return self._version

    @property
    def counters(self) -> GroupCounters:
        c = self._counts
        return replace(
            c,
            groups_open=len(self._groups),
            members_dropped=dict(c.members_dropped),
            groups_dropped=dict(c.groups_dropped),
            failures=dict(c.failures),
        )

    def is_open(self, input_id: str) -> bool:
        return input_id in self._groups

    def is_running(self, session_id: str) -> bool:
        found = self._by_session.get(session_id)
        return found is not None and found[1].runs

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
        found = self._end(session_id, MemberOutcome.SUCCEEDED, trajectory, result)
        if found is None:
            return []
        group, attempt = found
        self._counts.members_succeeded += 1
        attempt.set(reward=float(reward))
        return self._check_done(group)

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
        kind = FailureKind(kind)
        if kind is FailureKind.TIMEOUT:
            return self.timed_out(session_id, trajectory=trajectory)
        if not isinstance(error, str):
            error = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
        found = self._end(session_id, MemberOutcome.FAILED, trajectory, result)
        return [] if found is None else self._failure(*found, error, kind)

    def timed_out(self, session_id: str, *, trajectory: Any = None) -> list[Action]:
        """This attempt gave no result in time (the client stops its session itself)."""
        found = self._end(session_id, MemberOutcome.TIMED_OUT, trajectory, None)
        if found is None:
            return []
        return self._failure(*found, "no result within the timeout", FailureKind.TIMEOUT)

    def cancel(self, input_id: str) -> list[Action]:
        """Give up a group (its future was cancelled, the client closes): stop and drop it."""
        group = self._groups.get(input_id)
        return [] if group is None else self._drop(group, DropReason.CANCELLED)

    def set_policy_version(self, version: int) -> None:
        """Stamp ``version`` into every member started from now on (retries included)."""
        check_whole("policy version", version)
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
        check_whole("max_staleness", max_staleness)
        self.set_policy_version(version)
        actions: list[Action] = []
        for group in list(self._groups.values()):
            oldest = group.oldest_version()
            if oldest < version - max_staleness:
                stale = partial(
                    StaleGroupError,
                    policy_version=oldest,
                    current=version,
                    max_staleness=max_staleness,
                )
                actions += self._drop(group, DropReason.STALE, make_error=stale)
        return actions

    # -- decisions --

    def _end(
        self,
        session_id: str,
        outcome: MemberOutcome,
        trajectory: Any,
        result: Mapping[str, Any] | None,
    ) -> tuple[_Group, _Attempt] | None:
        """Record how an attempt ended; ``None`` for a late event (ignored)."""
        found = self._lookup(session_id)
        if found is None or not found[1].runs:
            self._counts.ignored_events += 1
            return None
        found[1].runs = False
        found[1].set(outcome=outcome, trajectory=trajectory, result=result)
        return found

    def _failure(
        self, group: _Group, attempt: _Attempt, error: str, kind: FailureKind
    ) -> list[Action]:
        attempt.set(error=error, failure_kind=kind)
        _count(self._counts.failures, kind.value)
        if kind is FailureKind.TIMEOUT:
            self._counts.members_timed_out += 1
        else:
            self._counts.members_failed += 1
        reason = _REASONS.get(kind, DropReason.FAILED)
        rules = group.rules
        if len(group.active()) >= rules.n - len(group.kept()):
            # Spares still running can fill every open place: no retry needed.
            self._discard(attempt, reason)
            return self._check_done(group)
        # Infrastructure failures have a budget of their own: they say nothing of the input.
        infra = kind in _INFRA_BUDGET
        member = attempt.member
        same = [
            a.member
            for a in group.attempts
            if a.member.index == member.index
            and a.member.failure_kind is not None
            and (a.member.failure_kind in _INFRA_BUDGET) == infra
        ]
        if len(same) <= (rules.retry_infra if infra else rules.retry):
            self._discard(attempt, DropReason.RETRIED)
            self._counts.members_retried += 1
            return [self._start(group, member.index, member.attempt + 1)]
        rule = rules.on_failure
        if kind is FailureKind.TIMEOUT and rules.on_timeout is not None:
            rule = rules.on_timeout
        elif kind not in (FailureKind.AGENT, FailureKind.TIMEOUT):
            rule = "drop_member"  # infra and reward: never trained on, never a group's end
        if rule == "drop_group":
            self._discard(attempt, reason)
            return self._drop(group, reason, error)
        if rule == "zero":
            attempt.set(zeroed=True, reward=0.0)
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
        _count(self._counts.groups_dropped, error.reason.value)
        return [*actions, error]

    def _stop_active(
        self, group: _Group, reason: DropReason, *, count_as_drop: bool
    ) -> list[Action]:
        actions: list[Action] = []
        for attempt in group.active():
            attempt.runs = False
            attempt.set(outcome=MemberOutcome.STOPPED, drop_reason=reason)
            if count_as_drop:
                self._discard(attempt, reason)
            self._counts.members_stopped += 1
            sid = attempt.member.session_id
            actions.append(StopMember(input_id=group.input_id, session_id=sid, reason=reason))
        return actions

    # -- bookkeeping --

    def _start(self, group: _Group, index: int, attempt_no: int) -> StartMember:
        session_id = member_session_id(self.exp_id, group.input_id, index=index, attempt=attempt_no)
        # STOPPED until it ends: the outcome of an attempt that never does.
        member = GroupMember(
            index=index,
            attempt=attempt_no,
            session_id=session_id,
            outcome=MemberOutcome.STOPPED,
            policy_version=self._version,
        )
        attempt = _Attempt(member)
        group.attempts.append(attempt)
        self._by_session[session_id] = (group, attempt)
        self._counts.members_started += 1
        earlier = [a.member.failure_kind for a in group.attempts if a.member.index == index]
        return StartMember(
            input_id=group.input_id,
            index=index,
            attempt=attempt_no,
            session_id=session_id,
            policy_version=self._version,
            draw=sum(kind is not None and kind not in _INFRA_BUDGET for kind in earlier),
        )

    def _discard(self, attempt: _Attempt, reason: DropReason) -> None:
        attempt.set(drop_reason=reason)
        _count(self._counts.members_dropped, reason.value)

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
            self._by_session.pop(attempt.member.session_id, None)

    def _snapshot(self, group: _Group) -> RolloutGroup:
        kept = sorted(group.kept(), key=lambda a: (a.member.index, a.member.attempt))
        kept_ids = {id(a) for a in kept}
        return RolloutGroup(
            exp_id=self.exp_id,
            input_id=group.input_id,
            n=group.rules.n,
            members=tuple(a.member for a in kept[: group.rules.n]),
            discarded=tuple(a.member for a in group.attempts if id(a) not in kept_ids),
        )
