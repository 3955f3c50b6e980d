"""``agentcore-rl report`` end to end: eval on the local stack through the rollout gateway,
once as GRPO groups and once plainly, with failures; the report compares the two and is
opened in a real headless Chromium (Debian's ``chromium``; the test skips, saying so, where
it is not installed): its summary numbers are the results file's, every chart is drawn, a
rollout's page shows its transcript and tokens, and nothing is fetched from the network."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from agentcore_rl.cli import main
from agentcore_rl.cli.journal import rows_path_for
from agentcore_rl.gateway import RolloutGateway
from agentcore_rl.local.background import BackgroundServer
from agentcore_rl.local.policy import ScriptedPolicy
from agentcore_rl.local.stack import LocalStack, StackS3
from tests.e2e.test_cli_eval import _lines, _write_problems

TOKEN = "report-admin-token"
CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run",
    "--hide-scrollbars", "--window-size=1200,1400",
]  # fmt: skip


@pytest.fixture
async def stack(s3_endpoint: str) -> AsyncIterator[LocalStack]:
    async with LocalStack(
        "tests.e2e.failing_agent:app",
        agents=2,
        s3=StackS3(endpoint_url=s3_endpoint, bucket="cli-report"),
        policy=ScriptedPolicy(accuracy=0.5, seed=3),
        tps=None,
    ) as value:
        yield value


def _data(path: Path) -> list[str]:
    ids = _write_problems(path, 4)
    with path.open("a") as data:
        data.write(json.dumps({"id": "boom", "prompt": "What is 1 + 1?", "answer": "2",
                               "explode": True}) + "\n")  # fmt: skip
    return [*ids, "boom"]


async def _eval(stack: LocalStack, gateway: str, data: Path, out: Path, *extra: str) -> int:
    assert stack.s3_endpoint_url is not None
    argv = [
        "eval", str(data), "--agent-url", stack.agent_urls[0], "--s3-bucket", stack.bucket,
        "--exp-id", out.stem, "--out", str(out), "--model-id", str(stack.policy_model),
        "--s3-endpoint-url", stack.s3_endpoint_url, "--timeout", "30", "--tps", "0",
        "--no-progress", "--gateway-url", gateway, "--gateway-admin-token", TOKEN,
        "--retry-rollouts", "0", *extra,
    ]  # fmt: skip
    return await asyncio.to_thread(main, argv)


def _data_of(html: str) -> dict[str, Any]:
    found = re.search(r'<script type="application/json" id="data">(.*?)</script>', html, re.S)
    assert found is not None
    value: dict[str, Any] = json.loads(found.group(1))
    return value


# Chromium's own background calls (its clock, component updates, sign-in), made for an
# empty page as well: Google's service hosts, never a page's resource.
CHROMIUM_OWN = (".google.com", ".googleapis.com", ".gstatic.com")


class Recorder:
    """A proxy that forwards nothing and notes the host of every request the browser would
    send off the machine."""

    def __init__(self) -> None:
        self.hosts: list[str] = []

    async def __call__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        line = (await reader.readline()).decode("latin-1").split()
        target = line[1] if len(line) > 1 else "?"
        self.hosts.append(target.split("://")[-1].split("/")[0].split(":")[0])
        writer.close()


async def _chromium(url: str, profile: Path, *args: str) -> str:
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    if binary is None:
        pytest.skip("Debian's chromium is not installed (apt-get install chromium; .ci/run does)")
    recorder = Recorder()
    server = await asyncio.start_server(recorder, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    command = [binary, *CHROMIUM_FLAGS, f"--user-data-dir={profile}",
               f"--proxy-server=http://127.0.0.1:{port}", *args, url]  # fmt: skip
    try:
        done = await asyncio.to_thread(
            subprocess.run, command, capture_output=True, text=True, timeout=90
        )
    finally:
        server.close()
        await server.wait_closed()
    fetched = [h for h in recorder.hosts if not h.endswith(CHROMIUM_OWN)]
    assert fetched == [], "the report made the browser fetch something"
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


@pytest.mark.timeout(240)
async def test_report_of_an_eval_opens_offline_in_chromium(
    stack: LocalStack, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "in.jsonl"
    ids = _data(data)
    gateway = RolloutGateway(stack.policy_base_url or "", admin_token=TOKEN)
    async with BackgroundServer(gateway, host="127.0.0.1") as server:
        groups_out = tmp_path / "groups.jsonl"
        assert await _eval(stack, server.url, data, groups_out, "--group-size", "2",
                           "--group-seed", "7") == 1  # fmt: skip
        plain_out = tmp_path / "plain.jsonl"
        assert await _eval(stack, server.url, data, plain_out) == 1
    assert rows_path_for(groups_out) == tmp_path / "groups.groups.jsonl"
    assert rows_path_for(groups_out).exists()
    plain = _lines(plain_out)
    assert sorted(r["input_id"] for r in plain) == sorted(ids)
    assert "[tool]" in (tmp_path / "plain.example.txt").read_text()  # one to read, as eval says
    report = tmp_path / "report.html"
    capsys.readouterr()
    assert main(["report", str(plain_out), "--compare", str(groups_out), "-o", str(report)]) == 0
    assert f"report: {report}" in capsys.readouterr().out
    html = report.read_text()
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", html)

    dom = await _chromium(report.as_uri(), tmp_path / "profile-1", "--dump-dom")
    first, second = re.findall(r'<table class="kv">.*?</table>', dom, re.S)  # side by side
    figures = dict(re.findall(r'data-k="(\w+)">([^<]*)<', first))
    assert dict(re.findall(r'data-k="(\w+)">([^<]*)<', second))["groups_whole"] != ""
    done = [r for r in plain if r["outcome"] == "done"]
    rewards = [r["reward"] for r in done]
    assert figures["rollouts"] == str(len(plain))
    assert figures["done"] == str(len(done))
    assert figures["failed"] == str(len(plain) - len(done))
    assert figures["mean_reward"] == f"{sum(rewards) / len(rewards):.4f}"
    charts = re.findall(r"<svg.*?</svg>", dom, re.S)
    assert len(charts) == 4
    assert all(chart.count("<path") >= 3 for chart in charts)
    assert "the calculator exploded on boom" in dom  # failures by cause, with the traceback
    assert "boom" in dom.split('id="compare"')[1]

    # Each rollout's page is data in the page, rendered by its script for the #r-N asked.
    blob = _data_of(html)
    assert [p["key"] for p in blob["pages"]] == [r["input_id"] for r in plain]
    assert 'class="rollout"' not in dom  # no page asked, none drawn
    number = next(
        i
        for i, r in enumerate(plain, 1)
        if r["outcome"] == "done" and any(m["role"] == "tool" for m in r["result"]["messages"])
    )
    page_url = f"{report.as_uri()}#r-{number}"
    shown = await _chromium(page_url, tmp_path / "profile-4", "--dump-dom")
    page = shown.split(f'id="r-{number}"')[1].split("</section>")[0]
    assert 'body class="page"' in shown
    assert '<div class="msg tool">' in page
    assert re.search(r'<span class="m1" title="id (\d+) · logprob -?\d+\.\d{4}[^"]*">\1<', page)
    summary_png, rollout_png = tmp_path / "summary.png", tmp_path / "rollout.png"
    await _chromium(report.as_uri(), tmp_path / "profile-2", f"--screenshot={summary_png}")
    await _chromium(page_url, tmp_path / "profile-3", f"--screenshot={rollout_png}")
    assert summary_png.stat().st_size > 20_000
    assert summary_png.read_bytes() != rollout_png.read_bytes()  # the page is the rollout's


HOSTILE = "</script><script>document.title='pwned'</script><!-- <b>bold</b>"


async def test_token_text_from_a_tokenizer_and_a_message_that_closes_the_script(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A tokenizer directory names each token; an agent's message that tries to end the data
    script stays text, in the data and on the page Chromium draws."""
    from tests.gateway.template_rig import RENDER_MISSING, tokenizer_dir

    if RENDER_MISSING:
        pytest.skip(RENDER_MISSING)
    from transformers import AutoTokenizer

    directory = tokenizer_dir("qwen2.5")
    prompt, answer = "What is 2 + 2?", " The answer is 4."
    tokenizer = AutoTokenizer.from_pretrained(directory)
    ids = tokenizer.encode(prompt) + tokenizer.encode(answer)
    mask = [0] * len(tokenizer.encode(prompt)) + [1] * len(tokenizer.encode(answer))
    results = tmp_path / "run.jsonl"
    messages = [{"role": "user", "content": prompt}, {"role": "assistant", "content": HOSTILE}]
    line = {"input_id": "q1", "outcome": "done", "reward": 1.0, "session_id": "s1",
            "result": {"exp_id": "tok", "messages": messages}}  # fmt: skip
    results.write_text(json.dumps(line) + "\n")
    segment = {"token_ids": ids, "loss_mask": mask, "logprobs": [-0.5] * len(ids),
               "policy_versions": [0] * len(ids)}  # fmt: skip
    trajectories = tmp_path / "run.trajectories.jsonl"
    trajectories.write_text(json.dumps({"session_id": "s1", "segments": [segment]}) + "\n")
    report = tmp_path / "tok.html"
    argv = ["report", str(results), "-o", str(report), "--tokenizer", str(directory)]
    assert main(argv) == 0
    html = report.read_text()
    assert html.count("</script>") == 2  # the data's and the script's: none from the message
    data = _data_of(html)
    assert data["pages"][0]["messages"][1][1] == HOSTILE
    assert "".join(data["texts"][str(t)] for t in ids) == prompt + answer
    capsys.readouterr()
    argv[-1] = str(tmp_path / "missing")
    assert main(argv) == 2
    assert "--tokenizer" in capsys.readouterr().err
    # A trace that carries its tokens' text needs no tokenizer; without either, ids.
    plain = tmp_path / "plain.html"
    assert main(["report", str(results), "-o", str(plain)]) == 0
    assert _data_of(plain.read_text())["texts"] == {}
    words = [f"w{t}" for t in ids]
    trajectories.write_text(
        json.dumps({"session_id": "s1", "segments": [{**segment, "tokens": words}]})
    )
    assert main(["report", str(results), "-o", str(plain)]) == 0
    assert _data_of(plain.read_text())["texts"] == {str(t): f"w{t}" for t in ids}

    dom = await _chromium(f"{report.as_uri()}#r-1", tmp_path / "profile", "--dump-dom")
    assert "pwned" not in dom.split("<title>")[1].split("</title>")[0]
    page = dom.split('id="r-1"')[1]
    assert "&lt;/script&gt;&lt;script&gt;document.title=" in page
    assert "<b>bold</b>" not in page
    assert ">What is 2 + 2?</span>" in page  # the prompt's tokens, as text
    assert '">The</span>' in page or '"> The</span>' in page
