"""The worker pool behind ``agentcore-rl eval``: journal, invoke, await, record.

``concurrency`` workers take inputs from a queue, journal each rollout's session id and
result key, invoke it through the client with that session id, await its outcome and
write exactly one results line for it. Beside them, rollouts an earlier run left in
flight are resumed by session id and result key (see docs/cli.md).

Example::

    engine = EvalEngine(options, client, journal, summary, Progress(10, 0, True), store)
    await engine.run(fresh_inputs, in_flight_entries, inputs_by_id)
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

from agentcore_rl import protocol
from agentcore_rl.cli_eval_config import EvalInput, EvalOptions
from agentcore_rl.cli_reattach import await_existing_results
from agentcore_rl.cli_summary import RunSummary, reward_of
from agentcore_rl.client import AsyncRolloutClient, RolloutFuture
from agentcore_rl.errors import RolloutError, RolloutTimeoutError, StorageError
from agentcore_rl.eval_journal import EvalJournal, JournalEntry
from agentcore_rl.s3 import ResultStore

__all__ = ["EvalEngine", "Progress", "outcome_record"]

logger = logging.getLogger(__name__)


def outcome_record(
    input_id: str,
    outcome: str,
    where: JournalEntry | None,
    elapsed: float | None,
    *,
    result: dict[str, Any] | None = None,
    error: BaseException | None = None,
    reattached: bool = False,
) -> dict[str, Any]:
    """One results-file line. ``where`` is the started rollout (``None`` when the agent
    never accepted it); the reward is read from a successful result only.

    Example::

        outcome_record("q-1", "done", entry, 1.9, result={"rewards": [1.0]})["reward"]  # 1.0
    """
    if isinstance(error, RolloutError):
        result = error.envelope
    return {
        "input_id": input_id,
        "outcome": outcome,
        "reward": reward_of(result) if outcome == "done" else None,
        "elapsed": None if elapsed is None else round(elapsed, 4),
        "session_id": where.session_id if where else getattr(error, "session_id", None),
        "result_key": where.result_key if where else None,
        "reattached": reattached,
        "error": None if error is None else str(error),
        "error_type": None if error is None else type(error).__name__,
        "result": result,
    }


def _bar_shape() -> dict[str, int]:
    """tqdm's own size detection, unless the terminal reports a zero size (a pty nobody
    sized, as under ``script`` or some CI runners): then tqdm would draw nothing."""
    try:
        size = os.get_terminal_size(sys.stderr.fileno())
    except (OSError, ValueError, AttributeError):
        return {}
    return {} if size.columns > 0 and size.lines > 0 else {"ncols": 100, "nrows": 24}


class Progress:
    """The progress bar on stderr (tqdm), showing failures and the mean reward so far.

    Example::

        bar = Progress(total=200, initial=0, enabled=True)
        bar.update(summary)
        bar.close()
    """

    def __init__(self, total: int, initial: int, enabled: bool) -> None:
        from tqdm import tqdm

        self.bar = tqdm(
            total=total,
            initial=initial,
            unit="rollout",
            disable=not enabled,
            **_bar_shape(),
        )

    def update(self, summary: RunSummary) -> None:
        """Count one more outcome; refresh the failure count and mean reward.

        Example::

            bar.update(summary)
        """
        self.bar.update(1)
        mean = summary.mean_reward
        self.bar.set_postfix(
            failed=summary.counts["failed"] + summary.counts["timeout"],
            reward="-" if mean is None else f"{mean:.2f}",
            refresh=False,
        )

    def close(self) -> None:
        """Finish the bar. Idempotent.

        Example::

            bar.close()
        """
        self.bar.close()


class EvalEngine:
    """The worker pool: ``concurrency`` workers take inputs from a queue; meanwhile the
    results of rollouts an earlier run left in flight are collected (and the ones that
    were stopped are queued to run again). Every outcome goes to the journal, the summary
    and the progress bar.

    Example::

        engine = EvalEngine(options, client, journal, summary, bar, store)
        await engine.run(fresh, in_flight, by_id)
    """

    def __init__(
        self,
        options: EvalOptions,
        client: AsyncRolloutClient,
        journal: EvalJournal,
        summary: RunSummary,
        bar: Progress,
        store: ResultStore,
    ) -> None:
        self.options = options
        self.client = client
        self.journal = journal
        self.summary = summary
        self.bar = bar
        self.store = store
        self.queue: asyncio.Queue[EvalInput | None] = asyncio.Queue()

    def _record(self, record: dict[str, Any]) -> None:
        self.journal.record_outcome(record)
        self.summary.add(record["outcome"], elapsed=record["elapsed"], reward=record["reward"])
        self.bar.update(self.summary)

    async def run(
        self,
        fresh: Sequence[EvalInput],
        in_flight: Sequence[JournalEntry],
        by_id: dict[str, EvalInput],
    ) -> None:
        """Run ``fresh`` inputs and re-attach ``in_flight`` ones until each has an outcome.

        Example::

            await engine.run(fresh, in_flight, {item.input_id: item for item in inputs})
        """
        for item in fresh:
            self.queue.put_nowait(item)
        workers = [
            asyncio.create_task(self._worker(), name=f"eval worker {n}")
            for n in range(self.options.concurrency)
        ]
        tasks = set(workers)
        try:
            if in_flight:
                await self._resume_all(in_flight, by_id)
            for _ in workers:
                self.queue.put_nowait(None)
            await asyncio.gather(*workers)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _resume_all(
        self, entries: Sequence[JournalEntry], by_id: dict[str, EvalInput]
    ) -> None:
        tasks = [
            asyncio.create_task(self._resume_one(e, by_id[e.input_id]), name=f"resume {e.input_id}")
            for e in entries
        ]
        try:
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _resume_one(self, entry: JournalEntry, item: EvalInput) -> None:
        """Finish a rollout an earlier run journaled as started but never saw end.

        Its invocation may or may not have reached the agent (the journal line is written
        before the call). Within its deadline it is invoked again with the same session id
        and result key, which the agent runs once: a running rollout is not started twice
        (see docs/cli.md). Otherwise its result key is watched until the deadline.
        """
        remaining = entry.started_at + self.options.timeout - time.time()
        found: dict[str, Any] | None = None
        future: RolloutFuture | None = None
        if remaining > 0:
            found, future = await self._reinvoke(entry, item, remaining)
        try:
            if future is not None:
                try:
                    found = await future
                except RolloutError as exc:
                    found = exc.envelope
                except RolloutTimeoutError:
                    found = None
            elif found is None:
                found = await self._await_existing(entry, remaining)
        except asyncio.CancelledError:
            if future is not None:  # the client stops its session: run it again next time
                self.journal.record_abandoned(entry.input_id)
            raise
        except Exception as exc:  # StorageError or a surprise: this input's outcome
            elapsed = time.time() - entry.started_at
            self.summary.reattached += 1
            self._record(
                outcome_record(entry.input_id, "failed", entry, elapsed, error=exc, reattached=True)
            )
            return
        self._record_resumed(entry, item, found)

    async def _reinvoke(
        self, entry: JournalEntry, item: EvalInput, remaining: float
    ) -> tuple[dict[str, Any] | None, RolloutFuture | None]:
        """``(result, None)`` when the result is already there, ``(None, future)`` when
        re-invoked, ``(None, None)`` when it cannot be (the caller watches the key)."""
        try:
            body, config = self.client.prepare(item.payload, input_id=item.input_id, overrides={})
        except Exception:
            return None, None
        if (config.s3_bucket, config.key_for(entry.session_id)) != (
            entry.s3_bucket,
            entry.result_key,
        ):
            # Another --exp-id or bucket than the first run: same session, other key, and
            # the agent would run it again. Only wait for the journaled key.
            return None, None
        await self.client.admit()
        # Checked with the slot held, right before sending: a rollout that finished while
        # we waited is read, not run again.
        try:
            found = await self.store.get_json(entry.s3_bucket, entry.result_key)
        except BaseException as exc:
            self.client.release()
            if isinstance(exc, StorageError):
                return None, None
            raise
        if found is not None:
            self.client.release()
            return found, None
        try:
            future = await self.client.start(
                body, config, timeout=remaining, session_id=entry.session_id
            )
        except Exception as exc:  # the agent may still run it: watch its key instead
            logger.warning("re-invoking %s failed: %s", entry.input_id, exc)
            return None, None
        return None, future

    async def _await_existing(self, entry: JournalEntry, remaining: float) -> dict[str, Any] | None:
        deadline = {entry.input_id: asyncio.get_running_loop().time() + remaining}
        async for _, envelope in await_existing_results(self.store, [entry], deadline):
            if envelope is None:
                await self._stop_orphan(entry.session_id)
            return envelope
        return None

    def _record_resumed(
        self, entry: JournalEntry, item: EvalInput, envelope: dict[str, Any] | None
    ) -> None:
        elapsed = time.time() - entry.started_at
        if envelope is not None and envelope.get(protocol.ERROR_TYPE) == protocol.ERROR_CANCELLED:
            # The previous run stopped it on its way out: run it again.
            self.queue.put_nowait(item)
            return
        if envelope is None:
            error: BaseException = RolloutTimeoutError(
                f"no result for session {entry.session_id} within {self.options.timeout} s "
                "(re-attached after a restart)",
                session_id=entry.session_id,
                timeout=self.options.timeout,
            )
            record = outcome_record(
                entry.input_id, "timeout", entry, elapsed, error=error, reattached=True
            )
        elif protocol.is_error_envelope(envelope):
            error = RolloutError(envelope, session_id=entry.session_id)
            record = outcome_record(
                entry.input_id, "failed", entry, elapsed, error=error, reattached=True
            )
        else:
            record = outcome_record(
                entry.input_id, "done", entry, elapsed, result=envelope, reattached=True
            )
        self.summary.reattached += 1
        self._record(record)

    async def _stop_orphan(self, session_id: str) -> None:
        """Stop a timed-out session an earlier run started, as the client stops its own.

        The client's stop queue only knows sessions it invoked, so this goes through its
        transport directly; a failure is logged, not fatal (the outcome is already known).
        """
        try:
            await self.client.transport.stop(session_id)
        except Exception as exc:  # the outcome stands; the session may linger
            logger.warning("could not stop timed-out session %s: %s", session_id, exc)

    async def _worker(self) -> None:
        while True:
            item = await self.queue.get()
            if item is None:
                return
            await self._run_one(item)

    async def _run_one(self, item: EvalInput) -> None:
        t0 = time.monotonic()
        try:
            _, config = self.client.prepare(item.payload, input_id=item.input_id, overrides={})
        except Exception as exc:  # a bad payload: nothing starts
            elapsed = time.monotonic() - t0
            self._record(outcome_record(item.input_id, "failed", None, elapsed, error=exc))
            return
        # Journaled before the call: whatever happens next, a resumed run knows the session
        # and result key, and never starts a second rollout for this input.
        session_id = protocol.new_session_id()
        entry = JournalEntry(
            item.input_id, session_id, config.s3_bucket, config.key_for(session_id), time.time()
        )
        self.journal.record_started(entry)
        try:
            future = await self.client.invoke(
                item.payload, input_id=item.input_id, session_id=session_id
            )
        except asyncio.CancelledError:
            self.journal.record_abandoned(item.input_id)  # the client stops the session
            raise
        except Exception as exc:  # one input failing must not end the run
            # The invocation itself failed (after the client's retries): nothing started.
            elapsed = time.monotonic() - t0
            self._record(outcome_record(item.input_id, "failed", None, elapsed, error=exc))
            return
        if (future.s3_bucket, future.result_key) != (entry.s3_bucket, entry.result_key):
            # The agent chose another place for the result: journal where it really goes.
            entry = JournalEntry(
                item.input_id, session_id, future.s3_bucket, future.result_key, entry.started_at
            )
            self.journal.record_started(entry)
        try:
            result = await future
        except asyncio.CancelledError:
            self.journal.record_abandoned(item.input_id)
            raise
        except RolloutTimeoutError as exc:
            record = outcome_record(item.input_id, "timeout", entry, future.elapsed, error=exc)
        except Exception as exc:  # RolloutError, StorageError or a surprise
            record = outcome_record(item.input_id, "failed", entry, future.elapsed, error=exc)
        else:
            record = outcome_record(item.input_id, "done", entry, future.elapsed, result=result)
        self._record(record)
