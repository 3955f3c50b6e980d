"""Shared fixtures: a real S3 API (moto's server on loopback) and an isolated AWS
environment, so no test can reach a real account or read the developer's config."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from agentcore_rl.local.embedded_s3 import EmbeddedS3
from agentcore_rl.retry import RetryPolicy
from agentcore_rl.s3 import ResultStore

_bucket_numbers = itertools.count()


async def _no_sleep(_: float) -> None:
    """Retries in tests go round at once: behaviour is tested, not waiting."""


#: A retry policy for tests: a few quick attempts, no real sleeping.
FAST_RETRY = RetryPolicy(attempts=3, initial=0.0, maximum=0.0, jitter=0.0, sleep=_no_sleep)


@pytest.fixture(scope="session")
def s3_server() -> Iterator[EmbeddedS3]:
    """One moto S3 server on a free loopback port for the whole session."""
    server = EmbeddedS3().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(autouse=True)
def aws_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Fake credentials, a fixed region and no shared config files or endpoint overrides."""
    for name in (
        "AWS_PROFILE",
        "AWS_DEFAULT_PROFILE",
        "AWS_ENDPOINT_URL",
        "AWS_ENDPOINT_URL_S3",
        "AWS_ENDPOINT_URL_BEDROCK_AGENTCORE",
        "AWS_ROLE_ARN",
        "AWS_WEB_IDENTITY_TOKEN_FILE",
        "AGENTCORE_RL_ALLOWED_BUCKETS",
        "AGENTCORE_RL_SPOOL_DIR",
        "AGENTCORE_RL_APP_NAME",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    # The default spool directory persists across restarts: keep tests out of the real one.
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg-state"))


def fill_bucket(bucket: str, objects: dict[str, bytes]) -> None:
    """Put ``objects`` into a bucket of the session's moto server in-process, for tests that
    need more keys than one LIST page: a thousand PUTs over HTTP cost seconds of the suite's
    budget, and the reads under test still go through the S3 API."""
    from moto.core.models import DEFAULT_ACCOUNT_ID
    from moto.s3.models import s3_backends

    backend = s3_backends[DEFAULT_ACCOUNT_ID]["aws"]
    for key, body in objects.items():
        backend.put_object(bucket, key, body)


@pytest.fixture
def s3_endpoint(s3_server: EmbeddedS3) -> str:
    """The moto server's URL, e.g. ``http://127.0.0.1:53211``."""
    return s3_server.endpoint_url


@pytest.fixture
async def store(s3_endpoint: str) -> AsyncIterator[ResultStore]:
    """A ResultStore on the moto server with quick retries; closed after the test."""
    result_store = ResultStore(endpoint_url=s3_endpoint, retry=FAST_RETRY)
    try:
        yield result_store
    finally:
        await result_store.aclose()


@pytest.fixture
async def bucket(store: ResultStore) -> str:
    """A fresh, empty bucket for this test."""
    name = f"test-bucket-{next(_bucket_numbers)}"
    await store.ensure_bucket(name)
    return name
