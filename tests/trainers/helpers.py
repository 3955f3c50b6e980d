"""The local stack the trainers' tests drive: embedded S3, the test agent on real uvicorn,
the stand-in policy and the token gateway, plus an offline tokenizer."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import tempfile
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from agentcore_rl.gateway import RolloutGateway
from agentcore_rl.groups import advantages
from agentcore_rl.integrations.settings import AgentCoreSettings
from agentcore_rl.local.background import BackgroundServer
from agentcore_rl.local.policy import ScriptedPolicy, Serving
from agentcore_rl.local.stack import LocalStack

ADMIN = "trainer-tests-admin"
SPOOL_ENV = "AGENTCORE_RL_SPOOL_DIR"


class _Front:
    """The gateway behind uvicorn; the test enters the gateway itself."""

    def __init__(self, gateway: RolloutGateway) -> None:
        self.gateway = gateway

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                kind = message["type"].rsplit(".", 1)[-1]
                await send({"type": f"lifespan.{kind}.complete"})
                if kind == "shutdown":
                    return
        await self.gateway(scope, receive, send)


@dataclass
class Rig:
    stack: LocalStack
    policy: ScriptedPolicy
    gateway: RolloutGateway
    gateway_url: str
    exp_id: str = dataclasses.field(default_factory=lambda: f"trainer-test-{uuid.uuid4().hex[:12]}")

    def settings(self, **overrides: Any) -> AgentCoreSettings:
        values: dict[str, Any] = {
            "agent_url": tuple(self.stack.agent_urls),
            "s3_bucket": self.stack.bucket,
            # Member session ids derive from (exp_id, input_id): a fresh experiment per rig,
            # so one test's sessions are never taken for another's repeats.
            "exp_id": self.exp_id,
            "s3_endpoint_url": self.stack.s3_endpoint_url,
            "gateway_url": self.gateway_url,
            "gateway_admin_token": ADMIN,
            "model_id": self.policy.model,
            "timeout": 60.0,
            "tps": 1000.0,
            "retry": 0,
        }
        values.update(overrides)
        return AgentCoreSettings(**values)


@contextlib.asynccontextmanager
async def local_rig(agents: int = 2, latency: float = 0.0) -> AsyncIterator[Rig]:
    policy = ScriptedPolicy(accuracy=1.0, serving=Serving(token_ids="requested", latency=latency))
    stack = LocalStack("tests.trainers.agent:app", agents=agents, policy=policy, tps=None)
    # The agents' spool of undelivered results is this rig's own, not the user's.
    spool = tempfile.TemporaryDirectory(prefix="agentcore-rl-spool-")
    previous = os.environ.get(SPOOL_ENV)
    os.environ[SPOOL_ENV] = spool.name
    try:
        async with _serve(stack, policy) as rig:
            yield rig
    finally:
        if previous is None:
            os.environ.pop(SPOOL_ENV, None)
        else:
            os.environ[SPOOL_ENV] = previous
        spool.cleanup()


@contextlib.asynccontextmanager
async def _serve(stack: LocalStack, policy: ScriptedPolicy) -> AsyncIterator[Rig]:
    async with stack:
        assert stack.policy_base_url is not None
        gateway = RolloutGateway(stack.policy_base_url, admin_token=ADMIN)
        async with gateway, BackgroundServer(_Front(gateway)) as server:
            yield Rig(stack, policy, gateway, server.url)


def project_advantages(rewards: list[float], normalize: str = "mean_std") -> list[float]:
    """The project's advantages of one group's member rewards (a group of one: its reward)."""
    return advantages(rewards, normalize)  # type: ignore[arg-type]


def offline_tokenizer() -> Any:
    """A Hugging Face fast tokenizer built in memory (no hub): pad id 0."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<unk>": 1, "<eos>": 2}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tokenizer, pad_token="<pad>", unk_token="<unk>", eos_token="<eos>"
    )
