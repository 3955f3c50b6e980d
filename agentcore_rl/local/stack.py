"""LocalStack: a whole AgentCore-style deployment on one machine, inside one event loop,
reached through the standard AWS environment variables it sets meanwhile (docs/local.md)."""

from __future__ import annotations

import contextlib
import functools
import importlib.machinery
import importlib.util
import json
import logging
import os
import secrets
import shutil
import sys
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Final

from agentcore_rl.errors import ConfigurationError, InvalidRolloutConfig
from agentcore_rl.keywords import check_config_types, checked, checked_init
from agentcore_rl.local.background import BackgroundServer
from agentcore_rl.local.embedded_s3 import EmbeddedS3
from agentcore_rl.local.policy import ScriptedPolicy
from agentcore_rl.local.runtime import DEFAULT_AGENT_RUNTIME_ARN, LocalAgentCoreRuntime
from agentcore_rl.protocol import DEFAULT_TPS, parse_runtime_arn, validate_bucket
from agentcore_rl.s3 import ResultStore
from agentcore_rl.server.options import SPOOL_DIR_ENV, state_dir

logger = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_LOCAL_BUCKET",
    "LocalStack",
    "PolicyEndpoint",
    "StackS3",
    "load_app",
    "running_stack",
]

#: The bucket the stack creates in embedded S3 unless told otherwise.
DEFAULT_LOCAL_BUCKET: Final = "agentcore-rl-local"
#: Credentials for embedded S3: moto accepts any, and fake ones can never reach AWS.
_FAKE_CREDENTIALS: Final = {"AWS_ACCESS_KEY_ID": "local", "AWS_SECRET_ACCESS_KEY": "local"}
#: What a running stack's state file says (``save_state``), besides its pid and environment.
_STATE_FIELDS: Final = (
    *("bucket", "agent_runtime_arn", "runtime_endpoint_url", "s3_endpoint_url", "agent_urls"),
    *("policy_base_url", "policy_model", "gateway_url", "gateway_admin_token"),
)


def _find_module(target: str) -> tuple[str, str, importlib.machinery.ModuleSpec]:
    module_name, sep, attribute = target.partition(":")
    if not sep or not module_name or not attribute:
        raise ConfigurationError(f"app {target!r} must look like 'package.module:attribute'")
    try:
        spec = importlib.util.find_spec(module_name)
    except ImportError as exc:
        why = f"cannot import {module_name!r} for app {target!r}: {exc}"
        raise ConfigurationError(why) from exc
    if spec is None or spec.loader is None:
        why = f"no module {module_name!r} for app {target!r} (is its directory on sys.path?)"
        raise ConfigurationError(why)
    return module_name, attribute, spec


def load_app(target: str) -> Any:
    """A FRESH instance of the ASGI app named by ``"package.module:attribute"``: the module
    runs anew on every call (its dependencies are imported once), so each agent server has
    its own app, as each ACR session has its own container; ``sys.modules`` is left as it was.
    """
    module_name, attribute, spec = _find_module(target)
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # Registered while it runs: dataclasses and friends look their module up by name.
    previous = sys.modules.get(module_name)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    finally:
        if previous is None:
            sys.modules.pop(module_name, None)
        else:
            sys.modules[module_name] = previous
    try:
        return functools.reduce(getattr, attribute.split("."), module)
    except AttributeError:
        why = f"module {module_name!r} has no attribute {attribute!r} (app {target!r})"
        raise ConfigurationError(why) from None


def _up_file(path: Path | None) -> Path:
    return path if path is not None else state_dir() / "up.json"


def running_stack(path: Path | None = None) -> dict[str, Any]:
    """The client options of the stack ``agentcore-rl up`` runs (its state file, default in
    :func:`state_dir`); sets this process's AWS credentials and region for it.
    ConfigurationError when none runs.

    Example::

        client = AsyncRolloutClient(exp_id="try-1", **running_stack())
    """
    # lazy: the client's config objects (the client extra), only for a client
    from agentcore_rl.client.config import AwsConfig, GatewayConfig

    file = _up_file(path)
    try:
        state = json.loads(file.read_text(encoding="utf-8"))
        os.kill(int(state["pid"]), 0)
    except (OSError, ValueError, KeyError, TypeError):
        raise ConfigurationError(
            f"no stack is running ({file}): start one with 'agentcore-rl up MODULE:APP', "
            "or name the agent (--agent-runtime-arn or --agent-url)"
        ) from None
    os.environ.update(state["environment"])
    options: dict[str, Any] = {
        "agent_runtime_arn": state["agent_runtime_arn"],
        "s3_bucket": state["bucket"],
        "aws": AwsConfig(
            endpoint_url=state["runtime_endpoint_url"], s3_endpoint_url=state["s3_endpoint_url"]
        ),
        "rollout": {"model_id": state["policy_model"]},
    }
    if state.get("gateway_url"):
        options["gateway"] = GatewayConfig(
            url=state["gateway_url"], admin_token=state["gateway_admin_token"]
        )
    else:
        options["rollout"]["base_url"] = state["policy_base_url"]
    return options


def _set_env(stack: contextlib.AsyncExitStack, values: Mapping[str, str | None]) -> None:
    """Set (``None``: unset) environment variables until ``stack`` closes."""
    stack.callback(_put, {name: os.environ.get(name) for name in values})
    _put(values)


def _put(values: Mapping[str, str | None]) -> None:
    for name, value in values.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@checked_init
@dataclass(frozen=True, kw_only=True)
class StackS3:
    """Where a :class:`LocalStack`'s results go: embedded moto (the default), with ``bucket``
    (default ``agentcore-rl-local``) created in it; ``endpoint_url``, an S3 of yours (MinIO, a
    shared moto), the bucket created there; or ``aws=True``, real S3 with your credentials
    and your existing ``bucket``. Nothing reaches AWS unless ``aws`` says so.

    Example::

        StackS3(endpoint_url="http://127.0.0.1:5000", bucket="rollouts")
    """

    bucket: str | None = None
    endpoint_url: str | None = None
    aws: bool = False

    def __post_init__(self) -> None:
        if self.aws and self.endpoint_url is not None:
            raise ConfigurationError("give StackS3.aws or StackS3.endpoint_url, not both")
        if self.aws and self.bucket is None:
            raise ConfigurationError("StackS3(aws=True) needs the bucket= of yours results go to")
        try:
            validate_bucket(self.bucket or DEFAULT_LOCAL_BUCKET, name="StackS3.bucket")
        except InvalidRolloutConfig as exc:
            raise ConfigurationError(exc.message) from None


@checked_init
@dataclass(frozen=True)
class PolicyEndpoint:
    """An OpenAI-compatible server of yours (vLLM, SGLang) as a :class:`LocalStack`'s policy:
    ``base_url`` (``.../v1``) and the ``model`` it serves.

    Example::

        LocalStack(app, policy=PolicyEndpoint("http://127.0.0.1:8000/v1", model="Qwen/Qwen3-0.6B"))
    """

    base_url: str
    model: str | None = None


DEFAULT_S3: Final = StackS3()
_MOVED: Final = {
    **{name: "s3=StackS3(...)" for name in ("bucket", "s3_endpoint_url")},
    **{name: "policy=PolicyEndpoint(...)" for name in ("policy_base_url", "policy_model")},
}


class LocalStack:
    """Embedded S3, a stand-in policy, N agent servers and the local runtime, in-process.

    ``app`` is the agent: an ASGI app (served by every agent server), a
    ``"module:attribute"`` string (imported afresh for each agent server), or ``None`` with
    ``app_factory`` (called once per agent server). ``s3``: where results go
    (:class:`StackS3`). ``policy``: a :class:`~agentcore_rl.local.policy.ScriptedPolicy`
    served in the stack (default ``ScriptedPolicy()``) or a :class:`PolicyEndpoint` of yours.
    ``tps``: the local runtime's quota (``None``: none). ``gateway``: a rollout gateway in
    front of the policy (``gateway_url``, with the admin token ``gateway_admin_token``),
    which records every call's tokens. ``save_state(path)`` lets another process find the
    stack (:func:`running_stack`).

    Example::

        async with LocalStack("examples.math_agent.agent:app", agents=2, tps=25) as stack:
            print(stack.runtime_endpoint_url, stack.agent_runtime_arn, stack.bucket)
    """

    @checked(moved=_MOVED)
    def __init__(
        self,
        app: Any = None,
        *,
        app_factory: Callable[[], Any] | None = None,
        agents: int = 2,
        s3: StackS3 = DEFAULT_S3,
        policy: ScriptedPolicy | PolicyEndpoint | None = None,
        agent_runtime_arn: str = DEFAULT_AGENT_RUNTIME_ARN,
        tps: float | None = DEFAULT_TPS,
        gateway: bool = False,
    ) -> None:
        check_config_types(("s3", s3, StackS3))
        if (app is None) == (app_factory is None):
            raise ConfigurationError("give the agent as exactly one of app or app_factory")
        if agents < 1:
            raise ConfigurationError(f"agents must be >= 1, got {agents}")
        self.region = parse_runtime_arn(agent_runtime_arn).region
        self.embedded_s3 = not s3.aws and s3.endpoint_url is None
        #: The agents' private spool directory while the stack runs.
        self.spool_dir: Path | None = None
        self.bucket, self.s3_endpoint_url = s3.bucket or DEFAULT_LOCAL_BUCKET, s3.endpoint_url
        self.agent_runtime_arn, self.agents, self.tps = agent_runtime_arn, agents, tps
        self.policy = policy if isinstance(policy, ScriptedPolicy | None) else None
        self.policy_base_url = policy.base_url if isinstance(policy, PolicyEndpoint) else None
        self.policy_model = policy.model if isinstance(policy, PolicyEndpoint) else None
        self.runtime: LocalAgentCoreRuntime | None = None
        self.agent_urls: list[str] = []
        self.gateway = gateway
        self.runtime_endpoint_url: str | None = None
        self.gateway_url: str | None = None
        self.gateway_admin_token: str | None = None
        self._make_app = self._app_maker(app, app_factory)
        self._stack: contextlib.AsyncExitStack | None = None

    @staticmethod
    def _app_maker(app: Any, app_factory: Callable[[], Any] | None) -> Callable[[], Any]:
        if app_factory is not None:
            return app_factory
        if isinstance(app, str):
            target = app
            _find_module(target)  # a typo fails here, not half-way through start()
            return lambda: load_app(target)
        if not callable(app):
            raise ConfigurationError(f"app must be an ASGI app or 'module:attribute', got {app!r}")
        return lambda: app

    @property
    def environment(self) -> Mapping[str, str]:
        """The AWS variables a separate process needs to use this stack (e.g. a trainer)."""
        env = {"AWS_DEFAULT_REGION": self.region}
        if self.runtime_endpoint_url is not None:
            env["AWS_ENDPOINT_URL_BEDROCK_AGENTCORE"] = self.runtime_endpoint_url
        if self.s3_endpoint_url is not None:
            env["AWS_ENDPOINT_URL_S3"] = self.s3_endpoint_url
        if self.embedded_s3:
            env.update(_FAKE_CREDENTIALS)
        return env

    async def start(self) -> LocalStack:
        """Start every part (no-op when running). On failure, also on cancellation, what
        started is stopped."""
        if self._stack is None:
            async with contextlib.AsyncExitStack() as stack:
                await self._start_parts(stack)
                self._stack = stack.pop_all()
        return self

    async def _start_parts(self, stack: contextlib.AsyncExitStack) -> None:
        async def serve(app: Any) -> str:
            return (await stack.enter_async_context(BackgroundServer(app))).url

        if self.embedded_s3:
            # Blocking, but short, and nothing else runs on the loop yet.
            s3 = EmbeddedS3().start()
            stack.callback(s3.stop)
            self.s3_endpoint_url = s3.endpoint_url

        self.spool_dir = Path(tempfile.mkdtemp(prefix="agentcore-rl-stack-spool-"))
        stack.callback(self._remove_spool, self.spool_dir)
        environment: dict[str, str | None] = {SPOOL_DIR_ENV: str(self.spool_dir)}
        if self.embedded_s3:
            environment.update(_FAKE_CREDENTIALS, AWS_SESSION_TOKEN=None)
            environment["AWS_DEFAULT_REGION"] = self.region
        if self.s3_endpoint_url is not None:
            environment["AWS_ENDPOINT_URL_S3"] = self.s3_endpoint_url
        _set_env(stack, environment)
        if self.s3_endpoint_url is not None:
            # Real S3 buckets are the user's to create; local ones are ours.
            async with ResultStore(
                endpoint_url=self.s3_endpoint_url, region_name=self.region
            ) as store:
                await store.ensure_bucket(self.bucket)

        if self.policy_base_url is None:
            self.policy = self.policy or ScriptedPolicy()
            self.policy_base_url = await serve(self.policy) + "/v1"
            self.policy_model = self.policy.model
        if self.gateway:
            # lazy: the gateway extra
            from agentcore_rl.gateway import RolloutGateway

            self.gateway_admin_token = secrets.token_urlsafe(16)
            gateway = RolloutGateway(self.policy_base_url, admin_token=self.gateway_admin_token)
            self.gateway_url = await serve(gateway)

        agents = [BackgroundServer(self._make_app()) for _ in range(self.agents)]
        for agent in agents:
            stack.push_async_callback(agent.aclose)
        # All are told first (callbacks run last in, first out), so the slowest agent's shutdown
        # grace sets the time, not the sum.
        for agent in agents:
            stack.callback(agent.request_exit)
        for agent in agents:
            await agent.start()
        self.agent_urls = [agent.url for agent in agents]

        self.runtime = LocalAgentCoreRuntime(
            {self.agent_runtime_arn: self.agent_urls}, tps=self.tps
        )
        stack.push_async_callback(self.runtime.aclose)
        self.runtime_endpoint_url = await serve(self.runtime)
        _set_env(stack, {"AWS_ENDPOINT_URL_BEDROCK_AGENTCORE": self.runtime_endpoint_url})

    def save_state(self, path: Path | None = None) -> Path:
        """Write where every part runs (for :func:`running_stack`) until the stack closes;
        ConfigurationError when another live stack wrote it."""
        assert self._stack is not None, "start the stack first"
        file = _up_file(path)
        with contextlib.suppress(ConfigurationError):
            running_stack(file)
            raise ConfigurationError(f"a stack is already running (its state: {file})")
        file.parent.mkdir(parents=True, exist_ok=True)
        state = {name: getattr(self, name) for name in _STATE_FIELDS}
        state.update(pid=os.getpid(), environment=dict(self.environment))
        # Owner-only: the gateway's admin token is in it.
        fd = os.open(file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump(state, out, indent=1)
        self._stack.callback(file.unlink, missing_ok=True)
        return file

    def _remove_spool(self, directory: Path) -> None:
        self.spool_dir = None
        left = sorted(directory.glob("*.json"))
        if left and not self.embedded_s3:
            # Meant for an S3 that outlives the stack: a server with this spool delivers them.
            logger.warning(
                "%d envelope(s) could not be written to S3 and remain in %s", len(left), directory
            )
            return
        shutil.rmtree(directory, ignore_errors=True)

    async def aclose(self) -> None:
        """Stop everything in reverse order and restore the environment. Idempotent."""
        stack, self._stack = self._stack, None
        if stack is not None:
            await stack.aclose()

    async def __aenter__(self) -> LocalStack:
        return await self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()
