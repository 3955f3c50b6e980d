"""``benchmarks/chaos.py --groups``: faults change nothing a trainer trains on.

The same grouped workload runs twice through ``run_groups`` (``on_failure="zero"``, a
token gateway in front of the stand-in policy, agents as real processes behind the local
AgentCore Runtime): once clean, once with infrastructure faults of every kind: agents
SIGKILLed mid-rollout and restarted, ``--s3-fail`` of the agents' S3 writes answered
``503 SlowDown``, ``--acr-fail`` of the invocations answered 500 or 429 by the runtime,
``--upstream-fail`` of the model calls answered 502 by the policy's side of the gateway,
and ``--infra-fail`` of the handlers raising ``InfraError``. The agent is deterministic: its
reward is a function of the input and the member's ``_rollout.seed``, its one model call's
tokens of the same.

Prints what it compared as JSON and exits 1 when a group both runs completed has rows that
differ (rewards, advantages, tokens, masks, logprobs), when a member was zeroed for an
``infra`` failure, or when a fault is not accounted for session by session: every session
whose handler raised ``InfraError`` or failed on a 502 is a member failed with kind
``infra`` for that cause (unless a kill lost it first), every member lost ran on a killed
agent (or never started its handler), and no session killed mid-run is kept. Faults
absorbed inside a session (a call or a write retried) end none and are reported apart, as
are the crashes' side effects (an invocation failing while its agent restarts).

Example::

    python benchmarks/chaos.py --groups --inputs 24 --n 4
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import signal
import textwrap
from collections import Counter
from pathlib import Path
from typing import Any

import anyio
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from agentcore_rl.client import (
    AsyncRolloutClient,
    AwsConfig,
    GatewayConfig,
    Limits,
    LivenessConfig,
    Timeouts,
)
from agentcore_rl.client.outcomes import UPSTREAM_FAILED
from agentcore_rl.gateway import RolloutGateway
from agentcore_rl.groups import GroupRules, RolloutGroup
from agentcore_rl.local.background import BackgroundServer
from agentcore_rl.local.policy import ScriptedPolicy
from agentcore_rl.local.runtime import DEFAULT_AGENT_RUNTIME_ARN, LocalAgentCoreRuntime
from agentcore_rl.protocol import FailureKind
from agentcore_rl.training import rows_from_groups

TOKEN = "chaos-groups-admin"
COMPARED = ("prompt_ids", "response_ids", "loss_mask", "logprobs", "reward", "advantage")

AGENT = textwrap.dedent(
    """
    import asyncio, json, os, random, sys, time
    import httpx
    from agentcore_rl import InfraError
    from agentcore_rl.server import AgentCoreRLApp, ShutdownConfig

    LOG = os.environ["CHAOS_LOG"]
    LO, HI = float(os.environ["CHAOS_MIN_SLEEP"]), float(os.environ["CHAOS_MAX_SLEEP"])
    INFRA = float(os.environ["CHAOS_INFRA_FAIL"])
    app = AgentCoreRLApp(shutdown=ShutdownConfig(grace=1.0, cancel_timeout=2.0))

    def log(event, context):
        line = json.dumps({"ev": event, "sid": context.session_id, "pid": os.getpid()})
        with open(LOG, "a") as f:
            f.write(line + "\\n")

    @app.rollout_entrypoint
    async def solve(payload, context):
        block = payload["_rollout"]
        seed, n = block["seed"], payload["n"]
        log("start", context)
        await asyncio.sleep(random.uniform(LO, HI))  # a window for a SIGKILL
        if random.random() < INFRA:
            log("infra", context)
            raise InfraError("injected: the tool backend is down")
        question = {"role": "user", "content": f"What is {n} + {seed % 10}?"}
        async with httpx.AsyncClient(timeout=60) as http:
            answer = await http.post(
                block["base_url"] + "/chat/completions",
                json={"model": block["model_id"], "messages": [question], "seed": seed},
            )
        if answer.status_code >= 500:
            log("upstream", context)
        answer.raise_for_status()
        log("end", context)
        return {"rewards": [((n * 7919 + seed * 104729) % 5) / 4], "n": n}

    if __name__ == "__main__":
        app.run(host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
    """
)


class Faults:
    """ASGI middleware answering a share of the matching requests with an error of its own."""

    def __init__(self, app: ASGIApp, rate: float, seed: int, *, methods: set[str]) -> None:
        self.app, self.rate, self.methods = app, rate, methods
        self.rng = random.Random(seed)
        self.injected: Counter[int] = Counter()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        chosen = scope["type"] == "http" and scope["method"] in self.methods
        if chosen and self.rng.random() < self.rate:
            response = self.error()
            self.injected[response.status_code] += 1
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def error(self) -> Response:
        return JSONResponse({"error": {"message": "injected upstream failure"}}, 502)


class RuntimeFaults(Faults):
    """Invocations answered like an overloaded runtime: 500 or 429, half and half."""

    def error(self) -> Response:
        code = "ThrottlingException" if self.rng.random() < 0.5 else "InternalServerException"
        status = 429 if code == "ThrottlingException" else 500
        headers = {"x-amzn-ErrorType": code, "x-amzn-RequestId": "injected"}
        return JSONResponse({"message": "injected"}, status, headers=headers)


def cause(member: Any) -> str:
    """What ended an ``infra`` member (its error and envelope say): an injected fault, else
    the type of the error (an agent refusing connections while it restarts...)."""
    result = member.result or {}
    if result.get(UPSTREAM_FAILED):
        return "upstream"
    if result.get("error_type") == "infra_error":
        return "infra_error"
    kind = str(member.error).split(":", 1)[0]
    return "lost" if kind == "AgentLostError" else kind


async def run_once(
    args: argparse.Namespace, name: str, faulty: bool, env: dict[str, str], workdir: Path
) -> dict[str, Any]:
    # Lazily: chaos.py's helpers (one copy of the S3 proxy and the agent processes).
    from benchmarks.chaos import BUCKET, Agents, FlakyS3, moto_app

    rng = random.Random(args.seed)
    proxy = FlakyS3(moto_app(), args.s3_fail if faulty else 0.0, args.seed, only="PUT")
    policy = Faults(ScriptedPolicy(accuracy=0.5, seed=args.seed), 0.0, args.seed, methods={"POST"})
    if faulty:
        policy.rate = args.upstream_fail
    log = workdir / f"{name}.log"
    async with contextlib.AsyncExitStack() as stack:
        s3 = await stack.enter_async_context(BackgroundServer(proxy))
        upstream = await stack.enter_async_context(BackgroundServer(policy))
        gateway = RolloutGateway(upstream.url + "/v1", admin_token=TOKEN)
        gate = await stack.enter_async_context(BackgroundServer(gateway))
        agent_env = {
            **env,
            "AWS_ENDPOINT_URL_S3": s3.url,
            "CHAOS_LOG": str(log),
            "CHAOS_INFRA_FAIL": str(args.infra_fail if faulty else 0.0),
        }
        (workdir / name).mkdir()
        agents = Agents(args.agents, workdir / name, agent_env, script=AGENT)
        stack.push_async_callback(agents.stop_all)
        for i in range(args.agents):
            await agents.start(i)
        runtime = LocalAgentCoreRuntime({DEFAULT_AGENT_RUNTIME_ARN: agents.urls}, tps=None)
        acr_faults = RuntimeFaults(runtime, args.acr_fail if faulty else 0.0, args.seed,
                                   methods={"POST"})  # fmt: skip
        acr = await stack.enter_async_context(BackgroundServer(acr_faults))
        rules = GroupRules(n=args.n, on_failure="zero", retry_infra=args.retry_infra,
                           member_seed=args.seed)  # fmt: skip
        payloads = [{"n": n, "_rollout": {"input_id": f"q{n:04d}"}} for n in range(args.inputs)]
        groups: list[RolloutGroup] = []
        client = AsyncRolloutClient(
            agent_runtime_arn=DEFAULT_AGENT_RUNTIME_ARN,
            s3_bucket=BUCKET,
            exp_id=name,
            rollout={"model_id": "policy"},
            limits=Limits(max_concurrent_sessions=args.concurrency, tps=200.0),
            timeouts=Timeouts(rollout=args.timeout),
            aws=AwsConfig(endpoint_url=acr.url, s3_endpoint_url=s3.url),
            gateway=GatewayConfig(url=gate.url, admin_token=TOKEN),
            # Crashes found in about a second: the comparison, not detection, is measured.
            liveness=LivenessConfig(probe_after=1.0, probe_interval=0.5, max_rate=50.0),
            infra_stop=None,  # the faults here are many, and meant
        )
        async with client, anyio.create_task_group() as tg:
            if faulty:
                tg.start_soon(crash_agents, agents, args, rng)
            async for group in client.run_groups(payloads, rules=rules, timeout=args.timeout):
                groups.append(group)
            tg.cancel_scope.cancel()
        stats, group_stats = client.stats, client.group_stats
    events = [json.loads(line) for line in log.read_text().splitlines() if line]
    on_killed = {e["sid"] for e in events if e["pid"] in agents.killed_pids}
    started = {e["sid"] for e in events if e["ev"] == "start"}
    injected = {
        "infra_error": {e["sid"] for e in events if e["ev"] == "infra"},
        "upstream": {e["sid"] for e in events if e["ev"] == "upstream"},
    }
    members = [m for g in groups for m in (*g.members, *g.discarded)]
    infra = [m for m in members if m.failure_kind is FailureKind.INFRA]
    counted: dict[str, set[str]] = {}
    for m in infra:
        counted.setdefault(cause(m), set()).add(m.session_id)
    # A kill between an invocation's acceptance and its handler's start loses a session
    # that never logged a start; a kill after the handler ended and before its envelope
    # was written loses one that did (an InfraError or a 502 included).
    lost = counted.get("lost", set())
    unexplained = {
        "lost": sorted((lost & started) - on_killed),
        **{k: sorted(counted.get(k, set()) ^ (injected[k] - lost)) for k in injected},
        "killed_mid_run_yet_kept": sorted(
            {e["sid"] for e in events if e["ev"] == "start" and e["pid"] in agents.killed_pids}
            - {e["sid"] for e in events if e["ev"] == "end"}
            & {m.session_id for g in groups for m in g.members}
        ),
    }  # fmt: skip
    miscounted = {k: v for k, v in unexplained.items() if v}
    return {
        "groups": groups,
        "miscounted": miscounted,
        "report": {
            "groups_whole": len(groups),
            "groups_dropped": group_stats.groups_dropped,
            "failures_by_kind": group_stats.failures,
            "zeroed_for_infra": sum(m.zeroed for m in infra),
            "infra_by_cause": {k: len(v) for k, v in counted.items()},
            "injected_ending_a_session": {
                "sessions_on_killed_agents": len(on_killed),
                "infra_error": len(injected["infra_error"]),
                "upstream": len(injected["upstream"]),
            },
            "injected_absorbed": {
                "s3_writes_failed": proxy.failed,
                "invocations_500_429": sum(acr_faults.injected.values()),
                "call_retries": stats.retries,
            },
            "agent_crashes": len(agents.kills),
        },
    }


async def crash_agents(agents: Any, args: argparse.Namespace, rng: random.Random) -> None:
    while True:
        await asyncio.sleep(args.crash_every)
        i = rng.randrange(len(agents.ports))
        await agents.kill(i, signal.SIGKILL)
        await asyncio.sleep(rng.uniform(0.5, 1.0))
        await agents.start(i)


def rows_by_group(groups: list[RolloutGroup]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for row in rows_from_groups(groups, normalize="mean_std"):
        data = row.to_dict()
        key = str(data["group_id"])
        out.setdefault(key, []).append({k: data[k] for k in ("member", *COMPARED)})
    return out


async def main(args: argparse.Namespace, env: dict[str, str], workdir: Path) -> dict[str, Any]:
    clean = await run_once(args, "clean", False, env, workdir)
    faulty = await run_once(args, "faulty", True, env, workdir)
    a, b = rows_by_group(clean["groups"]), rows_by_group(faulty["groups"])
    both = sorted(set(a) & set(b))
    differ = [g for g in both if a[g] != b[g]]
    miscounted = faulty["miscounted"]
    # What else failed for infrastructure: the crashes' side effects (an agent restarting
    # refuses connections), none of them a fault of the agent's.
    counted = faulty["report"]["infra_by_cause"]
    side_effects = {
        k: v for k, v in counted.items() if k not in ("lost", "infra_error", "upstream")
    }
    tokens = sum(len(r["response_ids"]) for rows in b.values() for r in rows)
    return {
        "inputs": args.inputs,
        "n": args.n,
        "groups_compared": len(both),
        "groups_differing": differ,
        "response_tokens_compared": tokens,
        "faults_counted_differently": miscounted,
        "infra_failures_from_crash_side_effects": side_effects,
        "clean": clean["report"],
        "faulty": faulty["report"],
        "ok": not differ and not miscounted and faulty["report"]["zeroed_for_infra"] == 0
        and bool(both),
    }  # fmt: skip


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument_group("--groups").add_argument
    add("--n", type=int, default=4, help="members per group")
    add("--crash-every", type=float, default=4.0, help="seconds between agent crashes")
    add("--retry-infra", type=int, default=6, help="GroupRules.retry_infra")
    add("--infra-fail", type=float, default=0.05, help="handlers raising InfraError")
    add("--upstream-fail", type=float, default=0.05, help="model calls answered 502")
    add("--acr-fail", type=float, default=0.05, help="invocations answered 500/429")
