"""A part used without its extra says which extra to install, in one line: the CLI's
commands exit 2, a library import raises ``ModuleNotFoundError`` naming the extra. Each
case runs in a fresh interpreter where the modules the extra would bring are made
unimportable (``sys.modules[name] = None``), as in an install without that extra."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from agentcore_rl._extras import THIRD_PARTY

REPO = Path(__file__).resolve().parents[2]

#: What each install brings of the modules our extras provide (pyproject.toml).
INSTALLED = {
    "core": set(),
    "server": {"starlette", "uvicorn"},
    "client": {"httpx", "httptools"},
    "cli": {"starlette", "uvicorn", "httpx", "httptools", "tqdm"},
    "gateway": {"starlette", "uvicorn", "orjson", "httptools", "uvloop"},
}

_PRELUDE = """
import sys
for name in {missing!r}:
    sys.modules[name] = None  # as if not installed: importing it raises ModuleNotFoundError
"""


def _python(install: str, code: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    missing = sorted(THIRD_PARTY - INSTALLED[install])
    return subprocess.run(
        [sys.executable, "-c", _PRELUDE.format(missing=missing) + code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("install", "argv", "extra"),
    [
        ("server", ["gateway", "--upstream", "http://127.0.0.1:9/v1"], "gateway"),
        ("core", ["demo", "--n", "2"], "local"),
        ("cli", ["demo", "--n", "2"], "local"),
        (
            "server",
            [
                "eval",
                "in.jsonl",
                "--agent-url",
                "http://127.0.0.1:9",
                "--s3-bucket",
                "bkt",
                "--exp-id",
                "e",
            ],
            "cli",
        ),
        ("core", ["serve", "agent:app"], "server"),
        ("core", ["local-runtime", "--agent-url", "http://127.0.0.1:9"], "cli"),
        ("cli", ["report", "in.jsonl"], "report"),
    ],
)
def test_a_command_without_its_extra_names_it_and_exits_2(
    install: str, argv: list[str], extra: str, tmp_path: Path
) -> None:
    (tmp_path / "in.jsonl").write_text('{"id": "a"}\n')
    code = f"from agentcore_rl.cli import main\nraise SystemExit(main({argv!r}))"
    done = _python(install, code, tmp_path)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr  # nothing printed before it
    assert lines[0].endswith(f"pip install 'agentcore-rl[{extra}]'"), lines[0]
    assert f"needs the '{extra}' extra" in lines[0]
    assert "unexpected" not in lines[0]


def test_help_needs_no_extra(tmp_path: Path) -> None:
    done = _python("core", "from agentcore_rl.cli import main\nmain(['--help'])", tmp_path)
    assert done.returncode == 0, done.stderr
    assert "4 internal error" in done.stdout


@pytest.mark.parametrize(
    ("install", "statement", "extra"),
    [
        ("core", "import agentcore_rl.server", "server"),
        ("server", "from agentcore_rl import AsyncRolloutClient", "client"),
        ("server", "from agentcore_rl import RolloutGateway", "gateway"),
        ("client", "from agentcore_rl.gateway import RolloutGateway", "gateway"),
        ("server", "import agentcore_rl.gateway.jsonio", "gateway"),
        ("core", "from agentcore_rl.local import LocalStack", "local"),
        (
            "client",
            "from agentcore_rl.distributed import shared_limits as s; s('x', tps=25, sessions=8)",
            "ray",
        ),
    ],
)
def test_an_import_without_its_extra_names_it(
    install: str, statement: str, extra: str, tmp_path: Path
) -> None:
    code = f"""
try:
    {statement}
except ModuleNotFoundError as exc:
    print(exc.name, exc, sep="|")
else:
    print("imported")
"""
    done = _python(install, code, tmp_path)
    assert done.returncode == 0, done.stderr
    name, _, message = done.stdout.strip().partition("|")
    assert name in THIRD_PARTY, done.stdout
    assert message.endswith(f"pip install 'agentcore-rl[{extra}]'"), message


def test_a_directory_named_like_the_package_is_no_install(tmp_path: Path) -> None:
    # Ray's own temp directory /tmp/ray imports as an empty namespace package from /tmp.
    (tmp_path / "ray").mkdir()
    code = """
from agentcore_rl.distributed import shared_limits
try:
    shared_limits('x', tps=25, sessions=8)
except ModuleNotFoundError as exc:
    print(exc)
"""
    done = _python("client", code, tmp_path)
    assert done.stdout.strip().endswith("pip install 'agentcore-rl[ray]'"), done.stderr


def test_the_core_install_imports_the_pure_parts(tmp_path: Path) -> None:
    code = "import agentcore_rl, agentcore_rl.s3, agentcore_rl.trajectory, agentcore_rl.training"
    assert _python("core", code, tmp_path).returncode == 0
