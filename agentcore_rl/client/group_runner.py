"""The client side of GRPO groups (docs/groups.md, "How it works" and "--resume"):
:class:`GroupRunner` carries out a :class:`~agentcore_rl.group_tracker.GroupTracker`'s
actions; a :class:`MemberJournal` is told of each start and end, which a
:class:`ResumedGroup` replays in a new process.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from agentcore_rl.client.batch import Feed, Prepare, feed_and_read
from agentcore_rl.client.config import MOVED_CALL_OPTIONS
from agentcore_rl.client.future import RolloutFuture
from agentcore_rl.client.outcomes import failure_kind
from agentcore_rl.client.payload import default_input_id, rollout_extras
from agentcore_rl.client.rollout import Rollouts, RolloutSpec
from agentcore_rl.client.service import Service
from agentcore_rl.errors import (
    ClientClosedError,
    ConfigurationError,
    RolloutError,
    TraceLostError,
)
from agentcore_rl.group_tracker import Action, GroupCounters, GroupTracker, StartMember, StopMember
from agentcore_rl.groups import GroupDroppedError, GroupRules, RolloutGroup, result_reward
from agentcore_rl.keywords import check_config_types, checked
from agentcore_rl.protocol import FailureKind, reward_problem

__all__ = [
    "GroupFuture",
    "GroupMethods",
    "GroupRunner",
    "MemberEnd",
    "MemberJournal",
    "MemberStart",
    "ResumedGroup",
    "run_groups",
]

logger = logging.getLogger(__name__)

EndKind = Literal["succeeded", "failed", "timed_out"]


class GroupFuture(asyncio.Future[RolloutGroup]):
    """The outcome of one group: a :class:`~agentcore_rl.groups.RolloutGroup`, or a
    :class:`~agentcore_rl.errors.GroupDroppedError` (``StaleGroupError`` when it went stale,
    ``ClientClosedError`` when the client closed first). Cancelling it stops its members.

    Example::

        fut = await client.invoke_group(payload, rules=GroupRules(n=8), input_id="q-17")
        print(fut.input_id, fut.session_ids)
        group = await fut
    """

    def __init__(self, *, input_id: str, rules: GroupRules) -> None:
        super().__init__(loop=asyncio.get_running_loop())
        self.input_id = input_id
        self.rules = rules
        #: Session ids of every attempt started so far, in start order.
        self.session_ids: list[str] = []

    def __repr__(self) -> str:
        state = "pending" if not self.done() else "cancelled" if self.cancelled() else "done"
        return f"<GroupFuture {state} input_id={self.input_id!r} n={self.rules.n}>"


@dataclass(frozen=True)
class MemberStart:
    input_id: str
    session_id: str
    s3_bucket: str
    result_key: str
    started_at: float


@dataclass(frozen=True)
class MemberEnd:
    """How a member attempt ended, as the tracker was told (replayed on resume); on
    resume, ``trajectory`` is rebuilt from the trace kept in S3."""

    input_id: str
    session_id: str
    kind: EndKind
    reward: float | None = None
    error: str | None = None
    result: Mapping[str, Any] | None = None
    failure_kind: str | None = None
    trajectory: Any = None


class MemberJournal(Protocol):
    """Told of each member attempt before its invocation and of each outcome."""

    def member_started(self, start: MemberStart) -> None: ...

    def member_ended(self, end: MemberEnd) -> None: ...


@dataclass
class ResumedGroup:
    """What an earlier process journaled for one group."""

    started: dict[str, MemberStart] = field(default_factory=dict)
    ended: list[MemberEnd] = field(default_factory=list)


@dataclass(eq=False)
class _Run:
    input_id: str
    payload: Mapping[str, Any]
    overrides: dict[str, Any]
    timeout: float | None
    future: GroupFuture
    journal: MemberJournal | None
    #: Each started attempt's rollout future, by session id (StopMember cancels it).
    members: dict[str, RolloutFuture] = field(default_factory=dict)
    resumed: dict[str, MemberStart] = field(default_factory=dict)


class GroupRunner:
    """Runs the groups of one client: ``StartMember`` becomes a rollout task,
    ``StopMember`` cancels the member's future, the outcome settles its :class:`GroupFuture`."""

    def __init__(
        self, *, exp_id: str, service: Service, rollouts: Rollouts, prepare: Prepare
    ) -> None:
        self.service = service
        self.rollouts = rollouts
        self.prepare = prepare
        self.tracker = GroupTracker(exp_id=exp_id)
        self._runs: dict[str, _Run] = {}

    async def open(
        self,
        payload: Mapping[str, Any],
        *,
        rules: GroupRules,
        input_id: str | None = None,
        timeout: float | None = None,
        overrides: Mapping[str, Any] | None = None,
        default_input_id: str | None = None,
        journal: MemberJournal | None = None,
        resume: ResumedGroup | None = None,
    ) -> GroupFuture:
        """The group's future, once its first ``n + redundancy`` members took slots."""
        overrides = dict(overrides or {})
        timeout = self.rollouts.timeout_for(timeout)
        # Validates the payload once, and fixes the input id (the group key).
        _, config = self.prepare(
            payload, input_id=input_id, overrides=overrides, default_input_id=default_input_id
        )
        if self.rollouts.closing:
            raise ClientClosedError("the client is closed; create a new one")
        starts = self.tracker.open(config.input_id, rules)
        fut = GroupFuture(input_id=config.input_id, rules=rules)
        run = _Run(
            input_id=config.input_id,
            payload=payload,
            overrides={**overrides, "input_id": config.input_id},
            timeout=timeout,
            future=fut,
            journal=journal,
        )
        self._runs[run.input_id] = run
        fut.add_done_callback(self._group_done)
        try:
            pending = self._replay(run, starts, resume) if resume else list(starts)
            for action in pending:
                if isinstance(action, StartMember):
                    await self.rollouts.admit(token=action.session_id not in run.resumed)
                    self._start(run, action, admitted=True)
                else:
                    self._apply([action])
        except BaseException:
            # Not handed over (cancelled while waiting for slots, the client closing...):
            # whatever started is stopped, and the group is given up.
            fut.cancel()
            raise
        return fut

    def _replay(self, run: _Run, starts: Sequence[Action], resume: ResumedGroup) -> list[Action]:
        """Feed the ended members an earlier process journaled, in their order; return the
        actions left to carry out (starts, and whatever resolves the group)."""
        run.resumed = dict(resume.started)
        pending = {a.session_id: a for a in starts if isinstance(a, StartMember)}
        left: list[Action] = []
        for end in resume.ended:
            if end.session_id not in pending:
                continue  # ended after it was stopped: the tracker ignored it then too
            pending.pop(end.session_id)
            run.future.session_ids.append(end.session_id)
            for action in self._feed(end):
                if isinstance(action, StartMember):
                    pending[action.session_id] = action
                elif isinstance(action, StopMember):
                    was_pending = pending.pop(action.session_id, None) is not None
                    if was_pending and action.session_id in run.resumed:
                        self.rollouts.calls.stop_soon(action.session_id)  # it may still run
                else:
                    left.append(action)
        return list(pending.values()) + left

    def _feed(self, end: MemberEnd, trajectory: Any = None) -> list[Action]:
        """Tell the tracker how a member ended (``trajectory``: this process's capture)."""
        trajectory = end.trajectory if trajectory is None else trajectory
        if end.kind == "succeeded" and end.reward is not None:
            return self.tracker.succeeded(
                end.session_id, end.reward, trajectory=trajectory, result=end.result
            )
        if end.kind == "timed_out":
            return self.tracker.timed_out(end.session_id, trajectory=trajectory)
        kind = FailureKind(end.failure_kind or FailureKind.AGENT)
        return self.tracker.failed(
            end.session_id,
            end.error or "failed",
            kind=kind,
            trajectory=trajectory,
            result=end.result,
        )

    def _start(self, run: _Run, action: StartMember, *, admitted: bool) -> None:
        sid = action.session_id
        overrides = dict(run.overrides)
        if action.policy_version is not None:
            overrides["policy_version"] = action.policy_version
        seed = run.future.rules.member_seed
        if seed is not None:
            # One seed per draw: members (and retries) sample differently; an infra retry is
            # the same draw again.
            overrides["seed"] = seed + action.draw * run.future.rules.starts + action.index
        body, config = self.prepare(run.payload, input_id=run.input_id, overrides=overrides)
        resumed = run.resumed.get(sid)

        def started(fut: RolloutFuture) -> None:
            run.members[sid] = fut

        def journaled(fut: RolloutFuture) -> None:
            run.future.session_ids.append(sid)
            if run.journal is not None:
                start = MemberStart(run.input_id, sid, fut.s3_bucket, fut.result_key, time.time())
                run.journal.member_started(start)

        spec = RolloutSpec(
            body=body,
            config=config,
            timeout=run.timeout,
            session_id=sid,
            retry=False,
            on_future=started,
            on_session=journaled if resumed is None else None,
        )
        if resumed is not None:
            # Journaled as started by an earlier process: read its result, else invoke it
            # again (a repeat: the agent runs a session once) within what is left of its
            # deadline, else follow its key to the deadline.
            run.future.session_ids.append(sid)
            same_key = (config.s3_bucket, config.key_for(sid)) == (
                resumed.s3_bucket,
                resumed.result_key,
            )
            late = run.timeout is not None and resumed.started_at + run.timeout <= time.time()
            spec.started_at = resumed.started_at
            spec.resume = same_key and not late
            spec.attach = not spec.resume
            spec.key = (resumed.s3_bucket, resumed.result_key)
        self.service.start_soon(self._member, run, spec, admitted, name=f"member {sid}")

    async def _member(self, run: _Run, spec: RolloutSpec, admitted: bool) -> None:
        """One member attempt's task: its rollout, then its outcome to the tracker (from
        this task: what the tracker decides may start tasks)."""
        sid = spec.session_id
        assert sid is not None
        if not self.tracker.is_running(sid):  # stopped before its task ran
            if admitted:
                self.rollouts.slots.release()
            return
        try:
            await self.rollouts.run(spec, admitted=admitted)
        except Exception as exc:  # not admitted (the client closing, a shared limit down...)
            self._close_run(run, exc)
            return
        fut = run.members[sid]
        if fut.cancelled():
            why = "the member's rollout was cancelled"
            self._apply(self.tracker.failed(sid, why, kind=FailureKind.STOPPED))
            return
        error = fut.exception()
        # A ConfigurationError is the caller's to fix (another payload under a used key).
        if isinstance(error, ClientClosedError | ConfigurationError) or self.rollouts.closing:
            self._close_run(run, error or ClientClosedError("the client closed"))
            return
        end: MemberEnd
        kind = failure_kind(error)
        if error is None:
            result = fut.result()
            problem = reward_problem(result, required=True)
            if problem is None:
                reward = result_reward(result)
                end = MemberEnd(run.input_id, sid, "succeeded", reward=reward, result=result)
            else:  # the rules need a reward: say which field lacks one
                bad = FailureKind.REWARD.value
                end = MemberEnd(run.input_id, sid, "failed", error=problem, failure_kind=bad)
        elif kind is FailureKind.TIMEOUT:
            end = MemberEnd(run.input_id, sid, "timed_out", error=str(error))
        else:
            envelope = error.envelope if isinstance(error, RolloutError | TraceLostError) else None
            end = MemberEnd(
                run.input_id,
                sid,
                "failed",
                error=f"{type(error).__name__}: {error}",
                result=envelope,
                failure_kind=None if kind is None else kind.value,
            )
        if run.journal is not None:
            run.journal.member_ended(end)  # before the decisions it leads to, as on replay
        self._apply(self._feed(end, fut.trajectory))  # a gateway's capture, if any

    def _apply(self, actions: Iterable[Action]) -> None:
        for action in actions:
            if isinstance(action, StartMember):
                run = self._runs.get(action.input_id)
                if run is not None and not self.rollouts.closing and self.service.running:
                    self._start(run, action, admitted=False)  # a retry: admitted by its task
            elif isinstance(action, StopMember):
                run = self._runs.get(action.input_id)
                if run is None:
                    continue
                fut = run.members.get(action.session_id)
                if fut is not None:
                    fut.cancel()  # its task stops the session
            else:
                if isinstance(action, GroupDroppedError):
                    # A dropped group trains nothing: say why where a default log level shows it.
                    logger.warning("%s", action)
                self._settle(action.input_id, action)

    def _settle(self, input_id: str, outcome: RolloutGroup | BaseException) -> None:
        run = self._runs.pop(input_id, None)
        if run is None or run.future.done():
            return
        if isinstance(outcome, BaseException):
            run.future.set_exception(outcome)
        else:
            run.future.set_result(outcome)

    def _group_done(self, fut: asyncio.Future[RolloutGroup]) -> None:
        assert isinstance(fut, GroupFuture)
        if fut.cancelled():
            self._apply(self.tracker.cancel(fut.input_id))
        self._runs.pop(fut.input_id, None)

    def _close_run(self, run: _Run, error: BaseException) -> None:
        self._apply(a for a in self.tracker.cancel(run.input_id) if isinstance(a, StopMember))
        self._settle(run.input_id, error)

    def advance_policy(self, version: int, *, max_staleness: int) -> int:
        actions = self.tracker.advance_policy(version, max_staleness=max_staleness)
        self._apply(actions)
        return sum(isinstance(a, GroupDroppedError) for a in actions)

    def close(self, error: BaseException) -> None:
        for run in list(self._runs.values()):
            self._close_run(run, error)


async def run_groups(
    runner: GroupRunner, payloads: Iterable[Mapping[str, Any]], options: Mapping[str, Any]
) -> AsyncGenerator[RolloutGroup, None]:
    """The loop of ``run_groups``; dropped groups are counted (and logged) by the runner."""

    async def start(feed: Feed, index: int, payload: Mapping[str, Any]) -> None:
        fut = await runner.open(
            payload, default_input_id=default_input_id(payload, index), **options
        )
        feed.watch(fut)

    opened = feed_and_read(runner.service, payloads, start, name="groups", what="run_groups")
    async with contextlib.aclosing(opened) as groups:
        async for item in groups:
            if item.cancelled():
                continue
            error = item.exception()
            if isinstance(error, ClientClosedError):
                raise error
            if error is None:
                yield item.result()
            elif not isinstance(error, GroupDroppedError):
                raise error


class GroupMethods:
    """The GRPO-group half of :class:`~agentcore_rl.client.AsyncRolloutClient`'s API."""

    _groups: GroupRunner

    @checked(moved=MOVED_CALL_OPTIONS, extras="rollout")
    async def invoke_group(
        self,
        payload: Mapping[str, Any],
        *,
        rules: GroupRules,
        input_id: str | None = None,
        timeout: float | None = None,
        rollout: Mapping[str, Any] | None = None,
        journal: MemberJournal | None = None,
        resume: ResumedGroup | None = None,
    ) -> GroupFuture:
        """Start a GRPO group of ``rules.n`` rollouts of ``payload``; return its future once
        its members are admitted (``n + redundancy`` slots taken).

        ``input_id`` is the group key (default: a fresh id): member session ids derive
        from it, so each group of an experiment needs its own. The future ends in a
        :class:`~agentcore_rl.groups.RolloutGroup`, a ``GroupDroppedError``
        (``StaleGroupError`` after :meth:`advance_policy`) or ``ClientClosedError``;
        cancelling it stops the members. ``timeout`` and ``rollout`` are as in
        :meth:`invoke`, for each member. ``journal`` (a :class:`MemberJournal`) is told of
        each member before its invocation and of each outcome; ``resume`` (a
        :class:`ResumedGroup`) opens the group where an earlier process left it: ended
        members are replayed, started ones resumed by session id, only the others started.
        """
        check_config_types(("rules", rules, GroupRules))
        await self._groups.service.ensure_open()
        return await self._groups.open(
            payload,
            rules=rules,
            input_id=input_id,
            timeout=timeout,
            overrides=rollout_extras(rollout),
            journal=journal,
            resume=resume,
        )

    @checked(moved=MOVED_CALL_OPTIONS, extras="rollout")
    def run_groups(
        self,
        payloads: Iterable[Mapping[str, Any]],
        *,
        rules: GroupRules,
        timeout: float | None = None,
        rollout: Mapping[str, Any] | None = None,
    ) -> AsyncGenerator[RolloutGroup, None]:
        """Run a group per payload (``rules`` as in :meth:`invoke_group`); yield the whole
        groups in completion order, as :meth:`run_batch` yields items (and names inputs).
        Dropped groups are counted by reason in :attr:`group_stats` (and logged)."""
        self._groups.service.check_open()
        check_config_types(("rules", rules, GroupRules))
        options = {"rules": rules, "timeout": timeout, "overrides": rollout_extras(rollout)}
        return run_groups(self._groups, payloads, options)

    def set_policy_version(self, version: int) -> None:
        """Stamp ``_rollout.policy_version = version`` into every member started from now
        on (retries included). Versions only move forward."""
        self._groups.tracker.set_policy_version(version)

    def advance_policy(self, version: int, *, max_staleness: int) -> int:
        """Move to ``version`` and stop every open group with a member started under a
        version older than ``version - max_staleness``: their futures end in
        ``StaleGroupError`` (counted under ``groups_dropped["stale"]``). Returns how many."""
        return self._groups.advance_policy(version, max_staleness=max_staleness)

    @property
    def group_stats(self) -> GroupCounters:
        """Counters of the groups: opened, ready, dropped by reason, members by outcome."""
        return self._groups.tracker.counters
