"""Fixtures of the object-storage tier: moto's S3 server on loopback (devtools/s3_server.py),
one bucket, and one worker process whose SparkSession has hadoop-aws (tests/s3/s3_app.py), all
for the whole test session; a fresh ``s3a://`` table URI per test."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from devtools.s3_server import MotoS3, storage_options
from tests.s3.worker import S3Worker

BUCKET = "s3-tier"


@pytest.fixture(scope="session")
def moto_s3() -> Iterator[MotoS3]:
    with MotoS3() as server:
        server.create_bucket(BUCKET)
        yield server


@pytest.fixture(scope="session")
def s3_worker(moto_s3: MotoS3, tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Worker]:
    worker = S3Worker(moto_s3.endpoint, BUCKET, tmp_path_factory.mktemp("s3-worker"))
    yield worker
    worker.stop()


@pytest.fixture()
def s3_table() -> str:
    """A table URI in the bucket, not created yet."""
    return f"s3a://{BUCKET}/tables/{uuid.uuid4().hex[:12]}"


@pytest.fixture()
def s3_options(moto_s3: MotoS3) -> dict[str, str]:
    """delta-rs / obstore options for reading the tier's tables without Spark."""
    return storage_options(moto_s3.endpoint)
