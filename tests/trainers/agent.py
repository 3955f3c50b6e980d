"""The agent the trainers' tests roll out: each sample follows a plan in its payload.

``{"prompt": ..., "plan": {"do": "plain" | "split" | "fail", "reward": r, "sleep": s}}`` for
one sample, or ``"plans": [...]`` indexed by ``_rollout.seed`` for the members of a group
(the client gives member i attempt 0 the seed ``member_seed + i``). ``split`` makes a
second model call with a fresh context (a sub-agent), so its trajectory has two segments;
``fail`` makes one call, then fails, so the member is kept zeroed or retried.
"""

from __future__ import annotations

from typing import Any

import anyio
import httpx
from openai import AsyncOpenAI, DefaultAsyncHttpxClient

from agentcore_rl.protocol import BASE_URL, MODEL_ID, ROLLOUT_FIELD
from agentcore_rl.server import AgentCoreRLApp, RequestContext

app = AgentCoreRLApp()
# Building a TLS context reads the CA bundle (tens of ms of CPU): one for every rollout.
_TLS = httpx.create_ssl_context()


def plan_of(payload: dict[str, Any]) -> dict[str, Any]:
    if "plan" in payload:
        plan: dict[str, Any] = payload["plan"]
        return plan
    seed = int(payload[ROLLOUT_FIELD].get("seed", 0))
    plans: list[dict[str, Any]] = payload["plans"]
    return plans[seed % len(plans)]


@app.rollout_entrypoint
async def run(payload: dict[str, Any], context: RequestContext) -> dict[str, Any]:
    plan = plan_of(payload)
    block = payload[ROLLOUT_FIELD]
    if plan.get("sleep"):
        await anyio.sleep(float(plan["sleep"]))
    async with AsyncOpenAI(
        base_url=block[BASE_URL], api_key="EMPTY", http_client=DefaultAsyncHttpxClient(verify=_TLS)
    ) as llm:
        await llm.chat.completions.create(
            model=block[MODEL_ID], messages=[{"role": "user", "content": payload["prompt"]}]
        )
        if plan["do"] == "fail":
            raise RuntimeError("injected failure")
        if plan["do"] == "split":
            await llm.chat.completions.create(
                model=block[MODEL_ID],
                messages=[
                    {"role": "system", "content": "You are a sub-agent."},
                    {"role": "user", "content": "Check: " + payload["prompt"]},
                ],
            )
    return {"rewards": [float(plan["reward"])]}
