"""Chaos benchmark: rollouts through the local AgentCore Runtime while S3 fails,
agents crash, one is SIGTERMed, and the eval client is SIGKILLed and resumed.

Everything runs as real processes on loopback. In this process the local AgentCore
Runtime at ``--tps`` (eval asks for ``--client-tps``, more); in a child of its own moto
(S3) behind a layer that fails ``--s3-fail`` of all requests with ``503 SlowDown`` (agents
and client both go through it). Other children: ``--agents`` agent servers (each sleeps
``--min-sleep``..``--max-sleep`` s per rollout and appends start/end/cancel lines to a
shared log) and ``agentcore-rl eval`` with ``--concurrency`` rollouts in flight. A chaos
task SIGKILLs a random agent often enough that ``--crash-share`` of the rollouts have their
agent crash under them, and restarts it 1-2 s later on the same port; one agent is
SIGTERMed once (its rollouts outlive the 1 s grace). When a fraction
``--kill-eval-at`` of the inputs has results, eval is SIGKILLed and run again with
``--resume``. Then an outage case: ``--outage-rollouts`` rollouts through the client
library over HTTP while the S3 proxy answers every request with 503 for ``--outage`` s.

Prints one JSON document; targets are zero for every count and crash detection <= 30 s:

- ``inputs_lost``: inputs without a results line; ``wrong_outcomes``: ``done`` lines
  whose result is not the input's;
- ``duplicate_runs_without_crash``: inputs whose handler completed twice although the
  process of the first completion was never killed;
- ``sessions_left_running``: rollouts still running on live agents after everything ended;
- ``permanent_failures_from_transient_faults``: results lines that are not ``done``
  (every fault here is transient);
- ``crash_detection_s`` p50/p95/max: from a SIGKILL to the rollout it lost starting again
  in a new session (detection + retry; an upper bound of detection): the killed process's
  heartbeat stops changing;
- ``timeouts`` (``after_a_crash``: of inputs a killed process had run);
- ``results_disagreeing_with_s3``: ``done`` lines whose key holds no success envelope with
  their result, and other lines whose key holds a success envelope;
- ``liveness_quota_share``: status probes / all invocations the runtime received;
- ``outage_wrong_failures``: outage-case rollouts that did not succeed.

``--groups`` runs another case instead: a clean and a faulty grouped run compared row by
row (benchmarks/chaos_groups.py).

Example::

    python benchmarks/chaos.py                     # full size (a few minutes)
    python -m benchmarks.chaos --groups --inputs 32 --n 4
    python benchmarks/chaos.py --inputs 40 --agents 2 --outage-rollouts 20 --outage 10
    python benchmarks/chaos.py --concurrency 1000 --inputs 6000 --tps 90 --client-tps 120 \
        --agents 16 --min-sleep 5 --max-sleep 20 --timeout 60
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import resource
import signal
import socket
import sys
import tempfile
import textwrap
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

import anyio
import httpx
from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

from agentcore_rl import protocol
from agentcore_rl.cli.summary import percentile
from agentcore_rl.client import AsyncRolloutClient, AwsConfig, Limits, Timeouts
from agentcore_rl.local.background import BackgroundServer
from agentcore_rl.local.embedded_s3 import EmbeddedS3
from agentcore_rl.local.runtime import DEFAULT_AGENT_RUNTIME_ARN, LocalAgentCoreRuntime
from benchmarks import chaos_groups

BUCKET = "chaos-rollouts"
LOCAL_AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "bench",
    "AWS_SECRET_ACCESS_KEY": "bench",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}
SLOW_DOWN = (
    b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code>'
    b"<Message>injected</Message></Error>"
)

AGENT = textwrap.dedent(
    """
    import asyncio, json, os, random, sys, time
    from agentcore_rl.server import AgentCoreRLApp, ShutdownConfig

    LOG = os.environ["CHAOS_LOG"]
    LO, HI = float(os.environ["CHAOS_MIN_SLEEP"]), float(os.environ["CHAOS_MAX_SLEEP"])
    app = AgentCoreRLApp(shutdown=ShutdownConfig(grace=1.0, cancel_timeout=2.0))

    def log(event, payload, context):
        line = json.dumps({"ev": event, "input": payload["_rollout"]["input_id"],
                           "sid": context.session_id, "pid": os.getpid(), "t": time.time()})
        with open(LOG, "a") as f:
            f.write(line + "\\n")

    @app.rollout_entrypoint
    async def solve(payload, context):
        log("start", payload, context)
        try:
            await asyncio.sleep(random.uniform(LO, HI))
        except asyncio.CancelledError:
            log("cancel", payload, context)
            raise
        log("end", payload, context)
        return {"rewards": [1.0], "n": payload["n"]}

    if __name__ == "__main__":
        if not sys.stdin.readline():  # a warm spare binds its port when told, or never
            sys.exit()
        app.run(host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
    """
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class FlakyS3:
    """moto's S3 app failing a fraction of requests (503; ``only`` those of one method), or
    all during an outage. ``/_chaos/set?down=1&fail=0.1`` sets them and answers the tallies
    (the bench runs it in a child process of its own)."""

    def __init__(self, app: Any, fail: float, seed: int, only: str | None = None) -> None:
        self.app = app
        self.fail = fail
        self.only = only
        self.down = False
        self.tally = S3Tally()
        self.failed = 0
        self.rng = random.Random(seed)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        path, method = scope["path"], scope["method"]
        if path == "/_chaos/set":
            query = dict(parse_qsl(scope["query_string"].decode()))
            self.down = query.get("down", str(int(self.down))) == "1"
            self.fail = float(query.get("fail", self.fail))
            stats = {**vars(self.tally), "failed": self.failed}
            await Response(json.dumps(stats), media_type="application/json")(scope, receive, send)
            return
        self.tally.see(method, path, scope["query_string"].decode())
        chosen = self.only in (None, method) and self.rng.random() < self.fail
        if self.down or chosen:
            self.failed += 1
            response = Response(SLOW_DOWN, status_code=503, media_type="application/xml")
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)


def moto_app() -> Any:
    """moto's S3 as one ASGI app, as EmbeddedS3 serves it (in this process's memory)."""
    from a2wsgi import WSGIMiddleware

    from agentcore_rl.local.embedded_s3 import moto_wsgi_app

    moto = moto_wsgi_app()
    return WSGIMiddleware(moto, workers=8)


async def serve_s3(fail: float, seed: int) -> None:
    """``--serve-s3``: S3 with faults and S3 without (the same state) on two ports, named on
    stdout, until stdin closes. A process of its own: moto's CPU is not the runtime's."""
    app = moto_app()
    flaky = FlakyS3(app, fail, seed)
    options: dict[str, Any] = {"access_log": False, "lifespan": "off", "backlog": 4096}
    options["timeout_keep_alive"] = 60
    async with (
        BackgroundServer(flaky, **options) as front,
        BackgroundServer(app, **options) as direct,
    ):
        print(json.dumps({"flaky": front.url, "direct": direct.url}), flush=True)
        await anyio.to_thread.run_sync(sys.stdin.read)


class S3Child:
    """The ``--serve-s3`` child: its URLs, its outage switch, its tallies."""

    def __init__(self, proc: asyncio.subprocess.Process, urls: dict[str, str]) -> None:
        self.proc, self.url, self.direct = proc, urls["flaky"], urls["direct"]
        self.http = httpx.AsyncClient(base_url=self.url, timeout=30)

    @classmethod
    async def start(cls, args: argparse.Namespace) -> S3Child:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "benchmarks.chaos", "--serve-s3",
            "--s3-fail", str(args.s3_fail), "--seed", str(args.seed),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), 60)
        return cls(proc, json.loads(line))

    async def set(self, **changes: float) -> dict[str, int]:
        """Set ``down`` and ``fail``; the tallies so far."""
        stats: dict[str, int] = (await self.http.get("/_chaos/set", params=changes)).json()
        return stats

    async def aclose(self) -> None:
        await self.http.aclose()
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        await asyncio.wait_for(self.proc.wait(), 30)


class Counted:
    """The runtime, counting the invocations it receives and the status probes among them."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.invocations = 0
        self.probes = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].endswith("/invocations"):
            await self.app(scope, receive, send)
            return
        messages = [await receive()]
        while messages[-1].get("more_body"):
            messages.append(await receive())
        self.invocations += 1
        self.probes += protocol.CONTROL_FIELD.encode() in b"".join(
            m.get("body", b"") for m in messages
        )
        replay = iter(messages)

        async def again() -> Message:
            return next(replay, None) or await receive()

        await self.app(scope, again, send)


class S3Tally:
    """Heartbeat writes and listings seen by the S3 proxy."""

    def __init__(self) -> None:
        self.heartbeat_puts = 0
        self.heartbeat_lists = 0
        self.lists = 0
        self.requests = 0

    def see(self, method: str, path: str, query: str) -> None:
        self.requests += 1
        folder = protocol.HEARTBEAT_FOLDER
        self.heartbeat_puts += method == "PUT" and f"/{folder}/" in path
        self.heartbeat_lists += method == "GET" and f"{folder}%2F" in query
        self.lists += method == "GET" and "list-type=2" in query


class Agents:
    """Agent processes on fixed ports; kill/restart by index; log who was killed when.

    ``warm``: each index keeps a spare process with its imports done, which binds the port
    when told: a restart takes about a second whatever the machine's load (the script
    reads one line from stdin before it serves, as ``AGENT`` does)."""

    def __init__(
        self,
        count: int,
        workdir: Path,
        env: dict[str, str],
        script: str = AGENT,
        *,
        warm: bool = False,
    ) -> None:
        self.script = workdir / "chaos_agent.py"
        self.script.write_text(script)
        self.workdir = workdir
        self.env = env
        self.warm = warm
        self.ports = [free_port() for _ in range(count)]
        self.procs: list[asyncio.subprocess.Process | None] = [None] * count
        self.spares: dict[int, asyncio.subprocess.Process] = {}
        self._stopping = False
        self.kills: list[tuple[float, int]] = []  # (time, pid) of SIGKILLs
        self.killed_pids: set[int] = set()
        self.sigterms = 0

    @property
    def urls(self) -> list[str]:
        return [f"http://127.0.0.1:{p}" for p in self.ports]

    async def _spawn(self, i: int) -> asyncio.subprocess.Process:
        env = {**self.env, "AGENTCORE_RL_SPOOL_DIR": str(self.workdir / f"spool-{i}")}
        return await asyncio.create_subprocess_exec(
            sys.executable, str(self.script), str(self.ports[i]), env=env,
            stdin=asyncio.subprocess.PIPE,
        )  # fmt: skip

    async def start(self, i: int) -> None:
        proc = self.procs[i] = self.spares.pop(i, None) or await self._spawn(i)
        assert proc.stdin is not None
        proc.stdin.write(b"go\n")
        async with httpx.AsyncClient() as http:
            for _ in range(600):  # bounded: 60 s
                with contextlib.suppress(httpx.TransportError):
                    if (await http.get(self.urls[i] + "/ping")).status_code == 200:
                        if self.warm and not self._stopping:
                            self.spares[i] = await self._spawn(i)
                        return
                await asyncio.sleep(0.1)
        raise RuntimeError(f"agent {i} did not start")

    async def kill(self, i: int, sig: int = signal.SIGKILL) -> None:
        proc = self.procs[i]
        if proc is None or proc.returncode is not None:
            return
        if sig == signal.SIGKILL:
            self.kills.append((time.time(), proc.pid))
            self.killed_pids.add(proc.pid)
        elif not self._stopping:
            self.sigterms += 1
        proc.send_signal(sig)
        await asyncio.wait_for(proc.wait(), 60)

    async def stop_all(self) -> None:
        self._stopping = True
        for spare in self.spares.values():
            assert spare.stdin is not None
            spare.stdin.close()  # it exits without serving
            await asyncio.wait_for(spare.wait(), 60)
        for i in range(len(self.procs)):
            await self.kill(i, signal.SIGTERM)

    def alive_pids(self) -> set[int]:
        return {p.pid for p in self.procs if p is not None and p.returncode is None}


def crash_every(args: argparse.Namespace) -> float:
    """Seconds between kills for ``--crash-share``: a kill loses ``concurrency / agents``
    rollouts, and ``concurrency / mean duration`` end per second."""
    mean = (args.min_sleep + args.max_sleep) / 2
    return float(mean / (args.agents * args.crash_share))


async def chaos(agents: Agents, args: argparse.Namespace, rng: random.Random) -> None:
    """Crash and restart agents until cancelled; SIGTERM one of them once."""
    rounds = 0
    while True:
        await asyncio.sleep(crash_every(args))
        i = rng.randrange(len(agents.ports))
        rounds += 1
        sig = signal.SIGTERM if rounds == 2 else signal.SIGKILL
        await agents.kill(i, sig)
        await asyncio.sleep(rng.uniform(1.0, 2.0))
        await agents.start(i)


def results(out: Path) -> list[dict[str, Any]]:
    if not out.exists():
        return []
    lines = []
    for line in out.read_text().splitlines():
        with contextlib.suppress(ValueError):
            lines.append(json.loads(line))
    return lines


async def run_eval(argv: list[str], env: dict[str, str], log: Path) -> asyncio.subprocess.Process:
    with log.open("ab") as stderr:  # the child keeps its own descriptor
        return await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "agentcore_rl.cli",
            "eval",
            *argv,
            env=env,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=stderr,
        )


def losses_declared(log: Path) -> list[tuple[float, str]]:
    """(time, session id) of every "session ... is lost" warning in eval's log."""
    found = []
    for line in log.read_text().splitlines() if log.exists() else ():
        if " is lost: " in line:
            stamp, _, rest = line.partition(" WARNING ")
            when = datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()
            found.append((when, rest.split("session ", 1)[1].split(" ", 1)[0]))
    return found


async def chaos_phase(
    args: argparse.Namespace, workdir: Path, s3_url: str, runtime_url: str, agents: Agents
) -> dict[str, Any]:
    data = workdir / "inputs.jsonl"
    data.write_text(
        "".join(json.dumps({"id": f"q{n:05d}", "n": n}) + "\n" for n in range(args.inputs))
    )
    out = workdir / "results.jsonl"
    env = {
        **os.environ,
        **LOCAL_AWS_ENV,
        "AWS_ENDPOINT_URL_S3": s3_url,
        "AWS_ENDPOINT_URL_BEDROCK_AGENTCORE": runtime_url,
    }
    argv = [
        str(data),
        "--agent-runtime-arn", DEFAULT_AGENT_RUNTIME_ARN,
        "--s3-bucket", BUCKET,
        "--exp-id", "chaos",
        "--tps", str(args.client_tps),
        "--concurrency", str(args.concurrency),
        "--timeout", str(args.timeout),
        "--out", str(out),
        "--no-progress",
        # A kill loses every session of one agent process at once (concurrency / agents):
        # a burst the infrastructure stop is right to stop a real run for.
        "--infra-stop", "off",
    ]  # fmt: skip
    rng = random.Random(args.seed)
    started = time.monotonic()
    async with anyio.create_task_group() as tg:
        tg.start_soon(chaos, agents, args, rng)
        proc = await run_eval(argv, env, workdir / "eval.log")
        while proc.returncode is None and len(results(out)) < args.kill_eval_at * args.inputs:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(proc.wait(), 0.5)
        eval_killed = proc.returncode is None
        if eval_killed:
            proc.send_signal(signal.SIGKILL)
            await proc.wait()
        resumed = await run_eval([*argv, "--resume"], env, workdir / "eval.log")
        await asyncio.wait_for(resumed.wait(), args.deadline)
        tg.cancel_scope.cancel()
    wall = time.monotonic() - started
    await asyncio.sleep(args.settle)  # stops in flight land; spooled envelopes drain
    return {
        "wall_s": round(wall, 1),
        "eval_killed": eval_killed,
        **measure(args, workdir, out, agents),
    }


def measure(args: argparse.Namespace, workdir: Path, out: Path, agents: Agents) -> dict[str, Any]:
    (workdir / "kills.json").write_text(json.dumps(agents.kills))
    lines = results(out)
    by_input: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for line in lines:
        by_input[line["input_id"]].append(line)
    expected = {f"q{n:05d}": n for n in range(args.inputs)}
    wrong = 0
    for input_id, recs in by_input.items():
        for rec in recs:
            result = rec.get("result") or {}
            if rec["outcome"] == "done" and result.get("n") != expected.get(input_id):
                wrong += 1
    events = [json.loads(x) for x in (workdir / "runs.log").read_text().splitlines() if x]
    ends: dict[str, list[dict[str, Any]]] = defaultdict(list)
    open_runs: dict[tuple[str, str, int], dict[str, Any]] = {}
    for ev in events:
        key = (ev["input"], ev["sid"], ev["pid"])
        if ev["ev"] == "start":
            open_runs[key] = ev
        else:
            open_runs.pop(key, None)
            if ev["ev"] == "end":
                ends[ev["input"]].append(ev)
    duplicates = sum(
        1
        for runs in ends.values()
        if len(runs) > 1 and any(r["pid"] not in agents.killed_pids for r in runs[:-1])
    )
    alive = agents.alive_pids()
    left_running = sum(1 for (_, _, pid) in open_runs if pid in alive)
    closed = {(ev["input"], ev["sid"], ev["pid"]) for ev in events if ev["ev"] != "start"}
    latencies: list[float] = []
    undetected = 0
    for killed_at, pid in agents.kills:
        lost = {
            ev["input"]
            for ev in events
            if ev["pid"] == pid
            and ev["ev"] == "start"
            and ev["t"] <= killed_at
            and (ev["input"], ev["sid"], pid) not in closed
        }
        for input_id in lost:
            again = [
                e["t"]
                for e in events
                if e["ev"] == "start" and e["input"] == input_id and e["t"] > killed_at
            ]
            if again:
                latencies.append(min(again) - killed_at)
            else:
                undetected += 1
    pid_of = {ev["sid"]: ev["pid"] for ev in events if ev["ev"] == "start"}
    declared = losses_declared(workdir / "eval.log")
    false_losses = [sid for _, sid in declared if pid_of.get(sid) not in agents.killed_pids]
    kill_time = {pid: t for t, pid in agents.kills}
    detection = [t - kill_time[pid_of[sid]] for t, sid in declared if pid_of.get(sid) in kill_time]
    crashed_inputs = {
        ev["input"]
        for ev in events
        if ev["ev"] == "start" and ev["pid"] in agents.killed_pids and ev["sid"]
    }
    timeouts = [line for line in lines if line["outcome"] == "timeout"]
    # From a rollout's first invocation to its agent starting it: the machine's queueing.
    first_start: dict[str, float] = {}
    for ev in events:
        if ev["ev"] == "start":
            first_start.setdefault(ev["input"], ev["t"])
    invoked: dict[str, float] = {}
    for record in results(out.with_name(out.name + ".journal")):
        if record.get("event") == "started" and record.get("started_at"):
            invoked.setdefault(record["input_id"], record["started_at"])
    to_agent = [first_start[i] - t for i, t in invoked.items() if i in first_start]
    return {
        "inputs": args.inputs,
        "concurrency": args.concurrency,
        "runtime_tps": args.tps,
        "client_tps": args.client_tps,
        "lost_runs_share": round(len(latencies) / args.inputs, 4),
        "timeouts": len(timeouts),
        "timeouts_after_a_crash": sum(1 for t in timeouts if t["input_id"] in crashed_inputs),
        "results_disagreeing_with_s3": disagreeing(lines, args),
        "agent_crashes": len(agents.kills),
        "agent_sigterms": agents.sigterms,
        "inputs_lost": sum(1 for i in expected if i not in by_input),
        "inputs_with_two_results_lines": sum(1 for r in by_input.values() if len(r) > 1),
        "duplicate_runs_without_crash": duplicates,
        "sessions_left_running": left_running,
        "wrong_outcomes": wrong,
        "permanent_failures_from_transient_faults": sum(
            1 for line in lines if line["outcome"] != "done"
        ),
        "failure_examples": [
            f"{line['input_id']} {line['error_type']} attempts={line.get('attempts')}: "
            f"{str(line['error'])[:240]}"
            for line in lines
            if line["outcome"] != "done"
        ][:5],
        "losses_declared": len(declared),
        "losses_of_live_processes": len(false_losses),
        "loss_declared_after_kill_s": {
            "p50": percentile(detection, 50),
            "p95": percentile(detection, 95),
            "max": max(detection, default=None),
        },
        "invocation_to_agent_s": {
            "p50": percentile(to_agent, 50),
            "p95": percentile(to_agent, 95),
            "max": max(to_agent, default=None),
        },
        "crash_detection_s": {
            "p50": percentile(latencies, 50),
            "p95": percentile(latencies, 95),
            "max": max(latencies) if latencies else None,
            "n": len(latencies),
            "lost_runs_never_restarted": undetected,
        },
    }


def disagreeing(lines: list[dict[str, Any]], args: argparse.Namespace) -> int:
    """Results lines whose key in S3 says otherwise (read past the fault layer)."""
    import boto3

    s3 = boto3.client("s3", endpoint_url=args.s3_direct)

    def wrong(line: dict[str, Any]) -> bool:
        done: bool = line["outcome"] == "done"
        try:
            body = s3.get_object(Bucket=BUCKET, Key=line["result_key"])["Body"].read()
        except s3.exceptions.NoSuchKey:
            return done
        envelope = json.loads(body)
        if protocol.is_error_envelope(envelope):
            return done
        return not done or bool(envelope.get("n") != (line.get("result") or {}).get("n"))

    with ThreadPoolExecutor(16) as pool:  # a GET waits on the S3 child: overlap them
        return sum(pool.map(wrong, [line for line in lines if line.get("result_key")]))


async def outage_phase(args: argparse.Namespace, s3: S3Child, agents: Agents) -> dict[str, Any]:
    await s3.set(fail=0.0)
    failures = 0
    async with AsyncRolloutClient(
        agent_url=agents.urls,
        s3_bucket=BUCKET,
        exp_id="outage",
        limits=Limits(max_concurrent_sessions=args.outage_rollouts, tps=100.0),
        timeouts=Timeouts(rollout=args.outage + 120.0),
        aws=AwsConfig(s3_endpoint_url=s3.url),
    ) as client:
        futures = [
            await client.invoke({"n": n}, input_id=f"o{n:05d}") for n in range(args.outage_rollouts)
        ]
        await asyncio.sleep(0.5)
        await s3.set(down=1)
        await asyncio.sleep(args.outage)
        await s3.set(down=0)
        for fut, n in zip(futures, range(args.outage_rollouts), strict=True):
            try:
                result = await fut
            except Exception:
                failures += 1
            else:
                failures += result.get("n") != n
        stats = client.stats
    await s3.set(fail=args.s3_fail)
    return {
        "rollouts": args.outage_rollouts,
        "outage_s": args.outage,
        "outage_wrong_failures": failures,
        "store_outages_seen": stats.store_outages,
        "degraded_seconds": round(stats.degraded_seconds, 1),
    }


def cpu_seconds() -> float:
    """CPU of this process and of its children that ended (agents, eval, S3)."""
    own, children = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


async def main(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="chaos-") as tmp:
        workdir = Path(args.workdir or tmp)
        os.environ.update(LOCAL_AWS_ENV)
        import boto3

        s3 = await S3Child.start(args)
        args.s3_direct = s3.direct
        boto3.client("s3", endpoint_url=s3.direct).create_bucket(Bucket=BUCKET)
        env = {
            **os.environ,
            **LOCAL_AWS_ENV,
            "AWS_ENDPOINT_URL_S3": s3.url,
            "CHAOS_LOG": str(workdir / "runs.log"),
            "CHAOS_MIN_SLEEP": str(args.min_sleep),
            "CHAOS_MAX_SLEEP": str(args.max_sleep),
            "PYTHONUNBUFFERED": "1",
        }
        agents = Agents(args.agents, workdir, env, warm=True)
        try:
            for i in range(args.agents):
                await agents.start(i)
            runtime = Counted(
                LocalAgentCoreRuntime({DEFAULT_AGENT_RUNTIME_ARN: agents.urls}, tps=args.tps)
            )
            async with BackgroundServer(runtime, backlog=4096) as acr:
                report = await chaos_phase(args, workdir, s3.url, acr.url, agents)
            report["invocations_at_the_runtime"] = runtime.invocations
            report["liveness_probes"] = runtime.probes
            report["liveness_quota_share"] = round(runtime.probes / max(1, runtime.invocations), 4)
            tally = await s3.set()
            report["heartbeat_puts"] = tally["heartbeat_puts"]
            report["heartbeat_lists"] = tally["heartbeat_lists"]
            report["s3_lists"] = tally["lists"]
            report["s3_requests"] = tally["requests"]
            if args.outage_rollouts:
                report["outage"] = await outage_phase(args, s3, agents)
            report["s3_requests_failed_by_proxy"] = (await s3.set())["failed"]
        finally:
            await agents.stop_all()
            await s3.aclose()
        report["cpu_s"] = round(cpu_seconds(), 1)
        report["cpu_ms_per_rollout"] = round(1000 * report["cpu_s"] / args.inputs, 1)
        report["load_average"] = os.getloadavg()
    return report


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--inputs", type=int, default=400, help="eval inputs")
    add("--agents", type=int, default=4, help="agent processes behind the runtime")
    add("--tps", type=float, default=10.0, help="the runtime's quota")
    add("--client-tps", type=float, default=12.0, help="eval --tps")
    add("--concurrency", type=int, default=64, help="eval --concurrency")
    add("--timeout", type=float, default=60.0, help="eval --timeout (s)")
    add("--min-sleep", type=float, default=2.0, help="shortest rollout (s)")
    add("--max-sleep", type=float, default=8.0, help="longest rollout (s)")
    add("--s3-fail", type=float, default=0.10, help="fraction of S3 requests failed")
    add("--crash-share", type=float, default=0.05, help="share of rollouts losing their agent")
    add("--kill-eval-at", type=float, default=0.4, help="fraction done when eval is killed")
    add("--deadline", type=float, default=1800.0, help="bound on the resumed eval (s)")
    add("--settle", type=float, default=5.0, help="wait before measuring (s)")
    add("--outage", type=float, default=20.0, help="S3 outage length (s)")
    add("--outage-rollouts", type=int, default=100, help="rollouts during the outage")
    add("--seed", type=int, default=9)
    add("--workdir", default=None, help="keep the logs here (default: a temporary directory)")
    add("--groups", action="store_true", help="compare a clean and a faulty grouped run")
    add("--serve-s3", action="store_true", help=argparse.SUPPRESS)  # the S3 child
    chaos_groups.add_arguments(parser)
    return parser.parse_args(argv)


async def groups_main(args: argparse.Namespace) -> dict[str, Any]:
    """``--groups``: see benchmarks/chaos_groups.py."""
    moto = EmbeddedS3().start()
    try:
        with tempfile.TemporaryDirectory(prefix="chaos-groups-") as tmp:
            os.environ.update(LOCAL_AWS_ENV)
            import boto3

            boto3.client("s3", endpoint_url=moto.endpoint_url).create_bucket(Bucket=BUCKET)
            env = {
                **os.environ,
                **LOCAL_AWS_ENV,
                "CHAOS_MOTO": moto.endpoint_url,
                "CHAOS_MIN_SLEEP": str(args.min_sleep),
                "CHAOS_MAX_SLEEP": str(args.max_sleep),
                "PYTHONUNBUFFERED": "1",
            }
            return await chaos_groups.main(args, env, Path(tmp))
    finally:
        moto.stop()


if __name__ == "__main__":
    arguments = parse_args()
    if arguments.serve_s3:
        asyncio.run(serve_s3(arguments.s3_fail, arguments.seed))
        sys.exit(0)
    if arguments.groups:
        report = asyncio.run(groups_main(arguments))
        print(json.dumps(report, indent=2))
        sys.exit(0 if report["ok"] else 1)
    print(json.dumps(asyncio.run(main(arguments)), indent=2))
