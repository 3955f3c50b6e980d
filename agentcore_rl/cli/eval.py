"""The engine of ``agentcore-rl eval`` (and of ``demo``): run a JSONL file of inputs through
:class:`~agentcore_rl.client.AsyncRolloutClient`, record every outcome exactly once, and
resume an interrupted run.

The inputs and options live in :mod:`agentcore_rl.cli.eval_config`, the worker pool in
:mod:`agentcore_rl.cli.engine`.

Example::

    options = EvalOptions(data=Path("problems.jsonl"), out=Path("results.jsonl"),
                          s3_bucket="rollouts", exp_id="eval-1",
                          agent_urls=("http://127.0.0.1:8080",))
    summary = await run_eval(options)
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
from collections.abc import Sequence
from typing import Any, Final

from agentcore_rl.cli.engine import EvalEngine, Progress
from agentcore_rl.cli.eval_config import EvalInput, EvalOptions, EvalRun, load_inputs
from agentcore_rl.cli.group_eval import GroupEvalEngine
from agentcore_rl.cli.journal import EvalJournal
from agentcore_rl.cli.summary import RunSummary
from agentcore_rl.cli.trajectories import TrajectoryFile
from agentcore_rl.client import (
    AsyncRolloutClient,
    AwsConfig,
    GatewayConfig,
    Limits,
    LivenessConfig,
    Retries,
    Timeouts,
)
from agentcore_rl.client.config import DEFAULT_RETRY_LOST, DEFAULT_RETRY_ROLLOUTS
from agentcore_rl.errors import StorageError
from agentcore_rl.retry import RetryPolicy
from agentcore_rl.s3 import ResultStore

__all__ = [
    "EvalInput",
    "EvalOptions",
    "EvalRun",
    "check_bucket",
    "load_inputs",
    "preflight_s3",
    "run_eval",
]

#: A quick retry policy for the preflight check and re-attaching: fail fast when S3 is
#: unreachable instead of backing off for tens of seconds.
_QUICK_S3_RETRY: Final = RetryPolicy(attempts=2, initial=0.2, maximum=1.0, jitter=0.1)
_UNLIMITED_TPS: Final = 1e6
# A prefix no result key can have (key parts start with a letter or digit): listing it is
# a cheap way to prove the bucket exists and is readable.
_PREFLIGHT_PREFIX: Final = ".agentcore-rl-preflight/"


def _make_client(options: EvalOptions) -> AsyncRolloutClient:
    rollout: dict[str, Any] = dict(options.rollout_extra)
    for name, value in (("base_url", options.base_url), ("model_id", options.model_id)):
        if value is not None:
            rollout[name] = value
    retries = Retries(
        rollouts=DEFAULT_RETRY_ROLLOUTS
        if options.retry_rollouts is None
        else options.retry_rollouts,
        lost=DEFAULT_RETRY_LOST if options.retry_lost is None else options.retry_lost,
    )
    # One lease per results file: a run resumed after a crash renews its predecessor's
    # lease, so the rollouts it re-attaches to are not cancelled under it.
    run_key = f"{options.exp_id}\0{options.out.resolve()}".encode()
    liveness = LivenessConfig(lease_id="eval-" + hashlib.sha256(run_key).hexdigest()[:32])
    gateway = None
    if options.gateway_url is not None:
        gateway = GatewayConfig(url=options.gateway_url, admin_token=options.gateway_admin_token)
    return AsyncRolloutClient(
        agent_runtime_arn=options.agent_runtime_arn,
        agent_url=None if options.agent_runtime_arn is not None else list(options.agent_urls),
        s3_bucket=options.s3_bucket,
        exp_id=options.exp_id,
        rollout=rollout,
        limits=Limits(
            max_concurrent_sessions=options.concurrency,
            # The client's bucket needs a finite rate; "no limit" becomes one nobody reaches.
            tps=options.tps if options.tps is not None else _UNLIMITED_TPS,
        ),
        timeouts=Timeouts(rollout=options.timeout),
        retries=retries,
        liveness=liveness,
        aws=AwsConfig(
            endpoint_url=options.runtime_endpoint_url if options.agent_runtime_arn else None,
            s3_endpoint_url=options.s3_endpoint_url,
        ),
        gateway=gateway,
    )


async def preflight_s3(store: ResultStore, bucket: str, endpoint_url: str | None = None) -> None:
    """Prove the bucket is reachable and readable before starting anything.

    Raises :class:`~agentcore_rl.errors.StorageError` naming the bucket and endpoint.
    """
    try:
        await store.list_keys(bucket, _PREFLIGHT_PREFIX)
    except StorageError as exc:
        where = endpoint_url or os.environ.get("AWS_ENDPOINT_URL_S3") or "AWS S3"
        cause = exc.__cause__ if exc.__cause__ is not None else exc
        raise StorageError(
            f"cannot use S3 bucket {bucket!r} at {where}: {exc.code}: {cause}",
            operation=exc.operation,
            bucket=bucket,
            code=exc.code,
        ) from exc


async def check_bucket(options: EvalOptions) -> int:
    """:func:`preflight_s3` on the run's bucket with a quick retry policy; -> the S3
    requests it made.
    """
    store = ResultStore(
        endpoint_url=options.s3_endpoint_url, retry=_QUICK_S3_RETRY, connect_timeout=5.0
    )
    async with store:
        await preflight_s3(store, options.s3_bucket, options.s3_endpoint_url)
    return store.total_requests


async def run_eval(
    options: EvalOptions,
    *,
    progress: bool = True,
    inputs: Sequence[EvalInput] | None = None,
    run: EvalRun | None = None,
) -> EvalRun:
    """Run (or resume) an evaluation; every input ends in exactly one results line.

    Cancelling it (Ctrl-C) stops the rollouts in flight and journals them as abandoned, so
    that ``--resume`` runs them again; a run that dies without cleanup leaves them in the
    journal as started, and ``--resume`` re-attaches to them.

    ``inputs`` (from :func:`load_inputs`) saves reading ``options.data`` again. ``run``,
    when given, is filled in as the run goes, so a caller still has the partial figures
    after a cancellation.
    """
    if inputs is None:
        inputs = load_inputs(options.data, limit=options.limit)
    by_id = {item.input_id: item for item in inputs}
    if run is None:
        run = EvalRun(RunSummary())
    summary = run.summary
    run.out = options.out
    started = time.monotonic()
    # Before the results file is touched: a run that cannot start leaves nothing behind.
    preflight_requests = await check_bucket(options)
    EvalJournal.check(options.out, resume=options.resume)
    client = _make_client(options)  # its own refusals come before any file, too
    journal = EvalJournal.open(options.out, resume=options.resume)
    trajectories: TrajectoryFile | None = None
    bar: Progress | None = None
    try:
        # A group's trajectories go into its training rows (FILE.groups.jsonl) instead.
        if options.gateway_url is not None and options.group_size is None:
            trajectories = TrajectoryFile.open(options.out, resume=options.resume)
            run.trajectories = trajectories.path
        summary.resumed = sum(1 for i in by_id if i in journal.finished)
        in_flight = [e for i, e in journal.in_flight.items() if i in by_id]
        fresh = [
            item
            for item in inputs
            if item.input_id not in journal.finished and item.input_id not in journal.in_flight
        ]
        bar = Progress(len(inputs), summary.resumed, progress)
        try:
            async with client:
                for session_id in journal.unstopped:  # left running by the previous run
                    client.stop_session(session_id)
                try:
                    if options.group_size is not None:
                        groups = GroupEvalEngine(options, client, journal, summary, bar)
                        await groups.run(inputs)
                    else:
                        engine = EvalEngine(options, client, journal, summary, bar, trajectories)
                        await engine.collect_trajectories(journal.finished)  # an earlier run's
                        await engine.run(fresh, in_flight, by_id)
                except asyncio.CancelledError:
                    run.interrupted = True
                    raise
                finally:
                    run.s3_requests = preflight_requests + client.stats.s3_total
        finally:
            # What the client could not stop on its way out: --resume stops it.
            journal.record_unstopped(client.unstopped_sessions)
    finally:
        if bar is not None:
            bar.close()
        journal.close()
        if trajectories is not None:
            trajectories.close()
        run.wall_seconds = time.monotonic() - started
    return run
