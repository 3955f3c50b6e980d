"""The client side of GRPO groups: run the members a GroupTracker asks for, feed it outcomes.

:class:`GroupRunner` (one per client) carries out the tracker's actions: a
:class:`~agentcore_rl.group_tracker.StartMember` becomes a member task in the client's task
group (admitted like any rollout, sent under the member's derived session id, its
``_rollout`` stamped with the policy version); a ``StopMember`` cancels that task or the
member's rollout future (which stops the session on the agent); ``GroupReady`` /
``GroupDropped`` settle the group's :class:`GroupFuture`. Each member's outcome goes back to
the tracker from its future's done callback, so the decisions stay in the pure state
machine and nothing here polls.

A :class:`MemberJournal` (the eval CLI's) is told of each member before it is invoked and
of each outcome; a :class:`ResumedGroup` hands those records back to a new process, which
replays the ended members in their order, invokes the started ones again under the same
session id (an agent runs one rollout per session, so never twice) or reads their results,
and starts only what was never started.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import AsyncGenerator, Callable, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import anyio
from anyio.abc import TaskStatus
from anyio.streams.memory import MemoryObjectSendStream

from agentcore_rl.client.admission import Slot
from agentcore_rl.client.batch import Launcher
from agentcore_rl.client.future import RolloutFuture
from agentcore_rl.errors import (
    ClientClosedError,
    RolloutError,
    RolloutTimeoutError,
    StorageError,
)
from agentcore_rl.group_tracker import (
    Action,
    GroupCounters,
    GroupDropped,
    GroupReady,
    GroupTracker,
    StartMember,
    StopMember,
)
from agentcore_rl.groups import GroupDroppedError, GroupRules, RolloutGroup, result_reward
from agentcore_rl.protocol import RolloutConfig

__all__ = [
    "GroupFuture",
    "GroupRunner",
    "MemberEnd",
    "MemberJournal",
    "MemberStart",
    "ResumedGroup",
]

logger = logging.getLogger(__name__)

#: The ``_rollout`` key a member's policy version is stamped under.
POLICY_VERSION_KEY = "policy_version"
#: The ``_rollout`` key of the sampling seed (passed to the policy by agents that do).
SEED_KEY = "seed"

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
        self.opened_at = time.time()
        self.resolved_at: float | None = None

    def __repr__(self) -> str:
        state = "pending" if not self.done() else "cancelled" if self.cancelled() else "done"
        return f"<GroupFuture {state} input_id={self.input_id!r} n={self.rules.n}>"


# --- Journal and resume ---------------------------------------------------------------------


@dataclass(frozen=True)
class MemberStart:
    """A member attempt about to be invoked: where its result will be."""

    input_id: str
    session_id: str
    s3_bucket: str
    result_key: str
    started_at: float


@dataclass(frozen=True)
class MemberEnd:
    """How a member attempt ended, as the tracker was told (replayed on resume)."""

    input_id: str
    session_id: str
    kind: EndKind
    reward: float | None = None
    error: str | None = None
    result: Mapping[str, Any] | None = None
    #: On resume, a succeeded member's trajectory rebuilt from the trace kept in S3.
    trajectory: Any = None


class MemberJournal(Protocol):
    """Told of each member attempt before its invocation and of each outcome."""

    def member_started(self, start: MemberStart) -> None: ...

    def member_ended(self, end: MemberEnd) -> None: ...


@dataclass
class ResumedGroup:
    """What an earlier process journaled for one group: its starts and ends, in order."""

    started: dict[str, MemberStart] = field(default_factory=dict)
    ended: list[MemberEnd] = field(default_factory=list)


# --- The runner -----------------------------------------------------------------------------


class GroupHost(Launcher, Protocol):
    """What the runner needs from the client: a batch's launcher, plus attach and stop."""

    exp_id: str

    async def _ensure_open(self) -> None: ...

    def _slot(self, *, token: bool = True) -> AbstractAsyncContextManager[Slot]: ...

    async def _start(self, func: Callable[..., Any], *args: Any, name: str) -> Any: ...

    def _stop_session(self, session_id: str) -> None: ...

    async def attach(
        self,
        *,
        session_id: str,
        result_key: str,
        input_id: str | None = None,
        s3_bucket: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 (the rollout's deadline)
        started_at: float | None = None,
    ) -> RolloutFuture: ...

    @property
    def store(self) -> Any: ...


@dataclass(eq=False)
class _Member:
    # Made by the member's task: an anyio scope cannot be created in a done callback.
    scope: anyio.CancelScope | None = None
    future: RolloutFuture | None = None
    stopped: bool = False


@dataclass(eq=False)
class _Run:
    input_id: str
    payload: Mapping[str, Any]
    overrides: dict[str, Any]
    timeout: float | None
    future: GroupFuture
    journal: MemberJournal | None
    members: dict[str, _Member] = field(default_factory=dict)
    resumed: dict[str, MemberStart] = field(default_factory=dict)


class GroupRunner:
    """Runs the groups of one client (see the module docstring); ``counters`` are the
    tracker's."""

    def __init__(self, host: GroupHost) -> None:
        self.host = host
        self.tracker = GroupTracker(exp_id=host.exp_id)
        self._runs: dict[str, _Run] = {}
        self._closed: BaseException | None = None
        # Retries are decided in done callbacks, where no task can be started: they go
        # through a stream to :meth:`run`, which starts them (made there, closed with it).
        self._send: MemoryObjectSendStream[tuple[_Run, StartMember]] | None = None

    def __repr__(self) -> str:
        return f"GroupRunner(open={len(self._runs)})"

    @property
    def counters(self) -> GroupCounters:
        """The tracker's counters (opened, ready, dropped by reason, members...)."""
        return self.tracker.counters

    async def run(self) -> None:
        """Start the member attempts decided in callbacks (retries), each in its own task.
        Runs in the client's task group until it closes."""
        send, receive = anyio.create_memory_object_stream[tuple[_Run, StartMember]](math.inf)
        self._send = send
        async with anyio.create_task_group() as tasks, send, receive:
            async for run, action in receive:
                tasks.start_soon(
                    self._run_member, run, action, name=f"group member {action.session_id}"
                )

    # -- opening --

    async def open(
        self,
        payload: Mapping[str, Any],
        *,
        rules: GroupRules,
        input_id: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 (each member's deadline)
        overrides: Mapping[str, Any] | None = None,
        default_input_id: str | None = None,
        journal: MemberJournal | None = None,
        resume: ResumedGroup | None = None,
    ) -> GroupFuture:
        """Open a group and return its future once its first members are admitted.

        Members wait for slots like any rollout, so this returns when ``n + redundancy``
        slots were taken (the invocations are still on their way)."""
        overrides = dict(overrides or {})
        # Validates the payload once, and fixes the input id (the group key).
        _, config = self.host._prepare(
            payload, input_id=input_id, overrides=overrides, default_input_id=default_input_id
        )
        await self.host._ensure_open()
        if self._closed is not None:
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
                    await self.host._start(
                        self._run_member, run, action, name=f"group member {action.session_id}"
                    )
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
                        self.host._stop_session(action.session_id)  # it may still run
                else:
                    left.append(action)
        return list(pending.values()) + left

    def _feed(self, end: MemberEnd) -> list[Action]:
        if end.kind == "succeeded" and end.reward is not None:
            return self.tracker.succeeded(
                end.session_id, end.reward, trajectory=end.trajectory, result=end.result
            )
        if end.kind == "timed_out":
            return self.tracker.timed_out(end.session_id)
        return self.tracker.failed(end.session_id, end.error or "failed", result=end.result)

    # -- members --

    async def _run_member(
        self,
        run: _Run,
        action: StartMember,
        *,
        task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Admit, journal and send one member attempt; report once admitted (or done)."""
        sid = action.session_id
        member = run.members.setdefault(sid, _Member())
        member.scope = scope = anyio.CancelScope()
        reported = False
        fut: RolloutFuture | None = None
        error: BaseException | None = None
        with scope:
            if member.stopped:
                scope.cancel()
            overrides = dict(run.overrides)
            if action.policy_version is not None:
                overrides[POLICY_VERSION_KEY] = action.policy_version
            seed = run.future.rules.member_seed
            if seed is not None:
                # One seed per attempt: members (and retries) sample differently.
                starts = run.future.rules.starts
                overrides[SEED_KEY] = seed + action.attempt * starts + action.index
            try:
                body, config = self.host._prepare(
                    run.payload, input_id=run.input_id, overrides=overrides
                )
                resumed = run.resumed.get(sid)
                if resumed is not None:
                    task_status.started()
                    reported = True
                    fut = await self._resume_member(run, resumed, body, config)
                else:
                    async with self.host._slot() as slot:
                        task_status.started()
                        reported = True
                        run.future.session_ids.append(sid)
                        if run.journal is not None:
                            run.journal.member_started(
                                MemberStart(
                                    run.input_id,
                                    sid,
                                    config.s3_bucket,
                                    config.key_for(sid),
                                    time.time(),
                                )
                            )
                        fut = await self.host._launch(
                            slot, body, config, timeout=run.timeout, session_id=sid
                        )
            except Exception as exc:  # InvocationError, ClientClosedError...: its outcome
                error = exc
        if not reported:
            task_status.started()
        if fut is not None and (scope.cancel_called or member.stopped):
            # Stopped while the answer was on its way: end it here, which stops it.
            fut.cancel()
            return
        if error is not None:
            self._member_error(run, sid, error)
            return
        if fut is None:
            return  # stopped before it was sent
        member.future = fut
        self.tracker.started(sid)
        fut.add_done_callback(lambda f: self._member_done(run, sid, f))

    async def _resume_member(
        self, run: _Run, start: MemberStart, body: dict[str, Any], config: RolloutConfig
    ) -> RolloutFuture:
        """A member an earlier process journaled as started: read its result if it is
        there, else invoke it again under the same session id (the agent does not run a
        session twice) within what is left of its deadline, else follow its key."""
        remaining = math.inf
        if run.timeout is not None:
            remaining = start.started_at + run.timeout - time.time()
        same_key = (config.s3_bucket, config.key_for(start.session_id)) == (
            start.s3_bucket,
            start.result_key,
        )
        run.future.session_ids.append(start.session_id)
        if remaining > 0 and same_key:
            async with self.host._slot() as slot:
                try:
                    found = await self.host.store.get_json(start.s3_bucket, start.result_key)
                except StorageError:
                    found = None
                if found is None:
                    return await self.host._launch(
                        slot, body, config, timeout=remaining, session_id=start.session_id
                    )
        return await self.host.attach(
            session_id=start.session_id,
            result_key=start.result_key,
            input_id=run.input_id,
            s3_bucket=start.s3_bucket,
            timeout=run.timeout,
            started_at=start.started_at,
        )

    def _member_done(self, run: _Run, sid: str, fut: RolloutFuture) -> None:
        if fut.cancelled():
            self._apply(self.tracker.failed(sid, "the member's rollout was cancelled"))
            return
        exc = fut.exception()
        if isinstance(exc, ClientClosedError):
            self._close_run(run, exc)
            return
        trajectory = getattr(fut, "trajectory", None)  # set when a gateway captured one
        end: MemberEnd
        if exc is None:
            result = fut.result()
            reward = result_reward(result)
            if reward is None:
                end = MemberEnd(run.input_id, sid, "failed", error="result has no reward")
            else:
                end = MemberEnd(run.input_id, sid, "succeeded", reward=reward, result=result)
        elif isinstance(exc, RolloutTimeoutError):
            end = MemberEnd(run.input_id, sid, "timed_out", error=str(exc))
        else:
            envelope = exc.envelope if isinstance(exc, RolloutError) else None
            end = MemberEnd(
                run.input_id, sid, "failed", error=f"{type(exc).__name__}: {exc}", result=envelope
            )
        if run.journal is not None:
            run.journal.member_ended(end)  # before the decisions it leads to, as on replay
        if end.kind == "succeeded":
            assert end.reward is not None
            actions = self.tracker.succeeded(
                sid, end.reward, trajectory=trajectory, result=end.result
            )
        elif end.kind == "timed_out":
            actions = self.tracker.timed_out(sid, trajectory=trajectory)
        else:
            actions = self.tracker.failed(
                sid, end.error or "failed", trajectory=trajectory, result=end.result
            )
        self._apply(actions)

    def _member_error(self, run: _Run, sid: str, error: BaseException) -> None:
        """A member that never got a future: not admitted, or its invocation failed."""
        if isinstance(error, ClientClosedError) or self._closed is not None:
            self._close_run(run, error)
            return
        end = MemberEnd(run.input_id, sid, "failed", error=f"{type(error).__name__}: {error}")
        if run.journal is not None:
            run.journal.member_ended(end)
        self._apply(self.tracker.failed(sid, error))

    # -- actions --

    def _apply(self, actions: Iterable[Action]) -> None:
        for action in actions:
            if isinstance(action, StartMember):
                run = self._runs.get(action.input_id)
                if run is not None and self._closed is None and self._send is not None:
                    with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
                        self._send.send_nowait((run, action))
            elif isinstance(action, StopMember):
                run = self._runs.get(action.input_id)
                if run is None:
                    continue
                member = run.members.setdefault(action.session_id, _Member())
                member.stopped = True
                if member.future is not None:
                    member.future.cancel()  # its done callback stops the session
                elif member.scope is not None:
                    member.scope.cancel()
            elif isinstance(action, GroupReady):
                self._settle(action.group.input_id, result=action.group)
            elif isinstance(action, GroupDropped):
                # A dropped group trains nothing: say why where a default log level shows it.
                logger.warning("%s", action.error)
                self._settle(action.error.input_id, error=action.error)

    def _settle(
        self,
        input_id: str,
        *,
        result: RolloutGroup | None = None,
        error: BaseException | None = None,
    ) -> None:
        run = self._runs.pop(input_id, None)
        if run is None or run.future.done():
            return
        run.future.resolved_at = time.time()
        if error is not None:
            run.future.set_exception(error)
        else:
            assert result is not None
            run.future.set_result(result)

    def _group_done(self, fut: asyncio.Future[RolloutGroup]) -> None:
        assert isinstance(fut, GroupFuture)
        if fut.cancelled() and self.tracker.is_open(fut.input_id):
            self._apply(self.tracker.cancel(fut.input_id))
        self._runs.pop(fut.input_id, None)

    def _close_run(self, run: _Run, error: BaseException) -> None:
        """End a group with ``error`` (the client closing): stop what still runs."""
        if self.tracker.is_open(run.input_id):
            self._apply(a for a in self.tracker.cancel(run.input_id) if isinstance(a, StopMember))
        self._settle(run.input_id, error=error)

    # -- policy and closing --

    def set_policy_version(self, version: int) -> None:
        """Stamp ``version`` into every member started from now on."""
        self.tracker.set_policy_version(version)

    def advance_policy(self, version: int, *, max_staleness: int) -> int:
        """Move to ``version``; stop the groups that went stale. Returns how many."""
        actions = self.tracker.advance_policy(version, max_staleness=max_staleness)
        self._apply(actions)
        return sum(isinstance(a, GroupDropped) for a in actions)

    def close(self, error: BaseException) -> None:
        """The client closes: every open group ends in ``error``; no member starts again."""
        self._closed = error
        for run in list(self._runs.values()):
            self._close_run(run, error)


# --- run_groups -----------------------------------------------------------------------------


@dataclass(frozen=True)
class GroupsFed:
    """The feeder's last message: how many groups were opened, and why it stopped early."""

    opened: int
    error: BaseException | None


GroupItem = GroupFuture | GroupsFed


class GroupBatch:
    """The work of ``run_groups``, in the client's task group: open a group per payload
    (waiting for slots, which paces it) and send each resolved group future to ``send``."""

    def __init__(
        self,
        runner: GroupRunner,
        payloads: Iterable[Mapping[str, Any]],
        options: Mapping[str, Any],
        send: MemoryObjectSendStream[GroupItem],
    ) -> None:
        self.runner = runner
        self.payloads = payloads
        self.options = dict(options)
        self.send = send
        self.live: set[GroupFuture] = set()
        self.scope = anyio.CancelScope()

    def abandon(self) -> None:
        """The loop is gone: stop opening groups and stop the open ones."""
        self.scope.cancel()
        self.send.close()
        for fut in list(self.live):
            fut.cancel()

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Open every payload's group, then report how many."""
        opened = 0
        error: BaseException | None = None
        try:
            with self.scope:
                task_status.started()
                try:
                    for index, payload in enumerate(self.payloads):
                        fut = await self.runner.open(
                            payload, default_input_id=f"{index:06d}", **self.options
                        )
                        opened += 1
                        self.live.add(fut)
                        fut.add_done_callback(self._finished)
                except Exception as exc:  # a bad payload, the client closing...
                    error = exc
        except BaseException:
            self.send.close()
            raise
        if self.scope.cancelled_caught:
            self.send.close()
        else:
            self._put(GroupsFed(opened, error))

    def _finished(self, fut: asyncio.Future[RolloutGroup]) -> None:
        assert isinstance(fut, GroupFuture)
        self.live.discard(fut)
        self._put(fut)

    def _put(self, item: GroupItem) -> None:
        with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
            self.send.send_nowait(item)


async def read_groups(receive: Any, batch: GroupBatch) -> AsyncGenerator[RolloutGroup, None]:
    """The loop side of ``run_groups``: whole groups in completion order; dropped ones are
    counted (and logged) by the runner, not yielded."""
    with receive:
        try:
            resolved = 0
            fed: GroupsFed | None = None
            while fed is None or resolved < fed.opened:
                try:
                    item = await receive.receive()
                except anyio.EndOfStream:
                    raise ClientClosedError("the client was closed during run_groups") from None
                if isinstance(item, GroupsFed):
                    fed = item
                    continue
                resolved += 1
                if item.cancelled():
                    continue
                error = item.exception()
                if isinstance(error, ClientClosedError):
                    raise error
                if error is None:
                    yield item.result()
                elif not isinstance(error, GroupDroppedError):
                    raise error
            if fed.error is not None:
                raise fed.error
        finally:
            batch.abandon()
