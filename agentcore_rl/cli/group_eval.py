"""``agentcore-rl eval --group-size N``: each input runs as a GRPO group of N rollouts.

Every member attempt is journaled (session id, bucket, result key, start time) before its
invocation, and every member outcome when the client sees it; each finished group gets one
results line (its rewards, members and pass@ figures) and its training rows
(:mod:`agentcore_rl.training` JSONL) in ``FILE.groups.jsonl``. On ``--resume`` a finished
group is skipped; an unfinished one is opened again with what the journal says: its ended
members are replayed in their order, its started members are invoked again under the same
session id (an agent runs one rollout per session, so none runs twice) or their results
read, and only members never started are started.

Example::

    engine = GroupEvalEngine(options, client, journal, summary, bar)
    await engine.run(fresh_inputs)
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any, Final

from agentcore_rl.cli.cost import Prices, price, usage_of
from agentcore_rl.cli.engine import Progress, _task_group
from agentcore_rl.cli.eval_config import EvalInput, EvalOptions
from agentcore_rl.cli.group_summary import GroupTally, pass_at_k
from agentcore_rl.cli.journal import EvalJournal
from agentcore_rl.cli.summary import RunSummary
from agentcore_rl.cli.trajectories import rows_path_for
from agentcore_rl.client import AsyncRolloutClient
from agentcore_rl.client.groups import GroupFuture, MemberEnd, MemberStart, ResumedGroup
from agentcore_rl.client.traces import trace_key_of
from agentcore_rl.errors import ClientClosedError, StorageError
from agentcore_rl.groups import GroupDroppedError, GroupMember, GroupRules, RolloutGroup
from agentcore_rl.training import group_rows, write_jsonl
from agentcore_rl.trajectory import build_trajectory

__all__ = ["GroupEvalEngine", "group_record", "rows_path_for"]

logger = logging.getLogger(__name__)

_MEMBER_STARTED: Final = "member_started"
_MEMBER_ENDED: Final = "member_ended"
_OUTCOME: Final = {"succeeded": "done", "failed": "failed", "timed_out": "timeout"}


def _member(m: GroupMember, prices: Prices | None = None) -> dict[str, Any]:
    record = {"result": m.result}
    return {
        "index": m.index,
        "attempt": m.attempt,
        "session_id": m.session_id,
        "outcome": m.outcome.value,
        "reward": m.reward,
        "zeroed": m.zeroed,
        "drop_reason": None if m.drop_reason is None else m.drop_reason.value,
        "error": m.error,
        "cost": price(usage_of(record), prices or Prices()),
        **record,
    }


def group_record(
    input_id: str,
    group: RolloutGroup | None,
    error: BaseException | None,
    elapsed: float,
    prices: Prices | None = None,
) -> dict[str, Any]:
    """One results line for a group: ``outcome`` ``done`` (whole) or ``dropped``."""
    if isinstance(error, GroupDroppedError):
        group = error.group
    rewards = [] if group is None or error is not None else group.rewards
    reason = getattr(error, "reason", None)
    return {
        "input_id": input_id,
        "outcome": "done" if error is None else "dropped",
        "reason": None if error is None else getattr(reason, "value", None) or "failed",
        "n": None if group is None else group.n,
        "rewards": rewards,
        "reward": sum(rewards) / len(rewards) if rewards else None,
        "pass@1": sum(1 for r in rewards if r > 0) / len(rewards) if rewards else None,
        "pass@k": pass_at_k(rewards, len(rewards)) if rewards else None,
        "elapsed": round(elapsed, 4),
        "members": [] if group is None else [_member(m, prices) for m in group.members],
        "discarded": [] if group is None else [_member(m, prices) for m in group.discarded],
        "error": None if error is None else str(error),
        "error_type": None if error is None else type(error).__name__,
    }


def resumed_groups(events: Sequence[Mapping[str, Any]]) -> dict[str, ResumedGroup]:
    """The journaled members of each group, by input id, in journal order."""
    groups: dict[str, ResumedGroup] = {}
    for event in events:
        kind = event.get("event")
        input_id = event.get("input_id")
        if kind not in (_MEMBER_STARTED, _MEMBER_ENDED) or not isinstance(input_id, str):
            continue
        group = groups.setdefault(input_id, ResumedGroup())
        try:
            if kind == _MEMBER_STARTED:
                start = MemberStart(
                    input_id,
                    str(event["session_id"]),
                    str(event["s3_bucket"]),
                    str(event["result_key"]),
                    float(event["started_at"]),
                )
                group.started[start.session_id] = start
            else:
                reward = event.get("reward")
                group.ended.append(
                    MemberEnd(
                        input_id,
                        str(event["session_id"]),
                        event["kind"],
                        reward=None if reward is None else float(reward),
                        error=event.get("error"),
                    )
                )
        except (KeyError, TypeError, ValueError):
            continue  # a line this version cannot read: that member runs again
    return groups


class _Journal:
    """The MemberJournal of one run: journal lines, and member outcomes in the summary."""

    def __init__(self, journal: EvalJournal, summary: RunSummary) -> None:
        self.journal = journal
        self.summary = summary
        self.started: dict[str, float] = {}

    def member_started(self, start: MemberStart) -> None:
        self.started[start.session_id] = start.started_at
        self.journal.record_event(
            {
                "event": _MEMBER_STARTED,
                "input_id": start.input_id,
                "session_id": start.session_id,
                "s3_bucket": start.s3_bucket,
                "result_key": start.result_key,
                "started_at": start.started_at,
            }
        )

    def member_ended(self, end: MemberEnd) -> None:
        self.journal.record_event(
            {
                "event": _MEMBER_ENDED,
                "input_id": end.input_id,
                "session_id": end.session_id,
                "kind": end.kind,
                "reward": end.reward,
                "error": end.error,
            }
        )
        started = self.started.get(end.session_id)
        elapsed = None if started is None else time.time() - started
        self.summary.add(_OUTCOME[end.kind], elapsed=elapsed, reward=end.reward, error=end.error)


class GroupEvalEngine:
    """Opens a group per input (waiting for slots, which paces it), records each once."""

    def __init__(
        self,
        options: EvalOptions,
        client: AsyncRolloutClient,
        journal: EvalJournal,
        summary: RunSummary,
        bar: Progress,
    ) -> None:
        assert options.group_size is not None
        self.options = options
        self.client = client
        self.journal = journal
        self.summary = summary
        self.bar = bar
        self.rules = GroupRules(
            n=options.group_size, redundancy=options.redundancy, member_seed=options.group_seed
        )
        self.members = _Journal(journal, summary)
        self.rows = rows_path_for(options.out)
        if summary.groups is None:
            summary.groups = GroupTally(size=options.group_size)
        self.tally = summary.groups

    async def run(self, inputs: Sequence[EvalInput]) -> None:
        """Run every input not finished yet, resuming the ones an earlier run started."""
        for record in self.journal.finished.values():
            self.tally.add_record(record)
        resumes = resumed_groups(self.journal.events)
        if self.options.gateway_url is not None:
            await self._load_trajectories(resumes)
        todo = [item for item in inputs if item.input_id not in self.journal.finished]
        async with _task_group() as waiters:
            for item in todo:
                t0 = time.monotonic()
                try:
                    fut = await self.client.invoke_group(
                        item.payload,
                        rules=self.rules,
                        input_id=item.input_id,
                        timeout=self.options.timeout,
                        journal=self.members,
                        resume=resumes.get(item.input_id),
                    )
                except ClientClosedError:
                    raise
                except Exception as exc:  # a bad payload: this input fails, the run goes on
                    self._record(self._group_record(item, None, exc, t0))
                    continue
                waiters.start_soon(self._wait, item, fut, t0, name=f"group {item.input_id}")

    async def _load_trajectories(self, resumes: Mapping[str, ResumedGroup]) -> None:
        """Members an earlier run saw succeed are replayed, not run again: their tokens
        come from the traces the client kept in S3 beside their results."""
        for group in resumes.values():
            for number, end in enumerate(group.ended):
                start = group.started.get(end.session_id)
                if end.kind != "succeeded" or start is None:
                    continue
                key = trace_key_of(start.result_key)
                try:
                    trace = await self.client.store.get_trace(start.s3_bucket, key)
                except StorageError as exc:  # its rows then go without tokens
                    logger.warning("reading the trace of %s failed: %s", end.session_id, exc)
                    continue
                if trace is not None:
                    trajectory = build_trajectory(trace, reward=end.reward)
                    group.ended[number] = dataclasses.replace(end, trajectory=trajectory)

    async def _wait(self, item: EvalInput, fut: GroupFuture, t0: float) -> None:
        try:
            group = await fut
        except (asyncio.CancelledError, ClientClosedError):
            raise  # interrupted: the journal has what --resume needs
        except Exception as exc:
            self._record(self._group_record(item, None, exc, t0))
            return
        # Rows first: a kill between the two writes leaves a group that --resume replays
        # from the journal (no member runs again) and whose rows are then written twice
        # (one (group_id, session_id, segment) key each, easy to drop), never a results
        # line without rows.
        write_jsonl(group_rows(group, require_tokens=False), self.rows, append=True)
        self._record(self._group_record(item, group, None, t0))

    def _group_record(
        self, item: EvalInput, group: RolloutGroup | None, exc: Exception | None, t0: float
    ) -> dict[str, Any]:
        elapsed = time.monotonic() - t0
        return group_record(item.input_id, group, exc, elapsed, self.options.prices)

    def _record(self, record: dict[str, Any]) -> None:
        self.summary.costs.extend(m["cost"] for m in record["members"] + record["discarded"])
        self.journal.record_outcome(record)
        self.tally.add_record(record)
        self.bar.update(self.summary)
