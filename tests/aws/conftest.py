"""Fixtures for the lean AWS path: generic aiobotocore clients (the source of settings and
the reference behaviour) and lean clients built from them, on moto and the local runtime."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiobotocore.config import AioConfig
from aiobotocore.session import get_session

from agentcore_rl.aws import LeanS3

_names = itertools.count()

#: The generic clients' settings in the library: one attempt, no client-side extras.
GENERIC_CONFIG = AioConfig(
    retries={"total_max_attempts": 1},
    parameter_validation=False,
    request_checksum_calculation="when_required",
    response_checksum_validation="when_required",
)


@pytest.fixture
async def s3_client(s3_endpoint: str) -> AsyncIterator[Any]:
    """A generic aiobotocore S3 client on the moto server."""
    async with get_session().create_client(
        "s3", endpoint_url=s3_endpoint, config=GENERIC_CONFIG
    ) as client:
        yield client


@pytest.fixture
async def lean_s3(s3_client: Any) -> AsyncIterator[LeanS3]:
    """A lean S3 reader built from ``s3_client``."""
    reader = await LeanS3.create(s3_client)
    try:
        yield reader
    finally:
        await reader.aclose()


@pytest.fixture
async def s3_bucket(s3_client: Any) -> str:
    """A fresh bucket on moto."""
    name = f"lean-bucket-{next(_names)}"
    await s3_client.create_bucket(Bucket=name)
    return name
