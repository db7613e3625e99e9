"""Fixtures of the object-storage tier: moto's S3 server on loopback (devtools/s3_server.py),
two buckets (one reached directly, one through the fault-injecting proxy of
devtools/s3_faults.py) and one worker process whose SparkSession has hadoop-aws
(tests/s3/s3_app.py), all for the whole test session; a fresh ``s3a://`` table URI per test."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from devtools.s3_faults import FaultProxy
from devtools.s3_server import MotoS3, storage_options
from tests.s3.worker import S3Worker

BUCKET = "s3-tier"
FAULTS_BUCKET = "s3-tier-faults"  # S3A, delta-rs and obstore reach it through the fault proxy


@pytest.fixture(scope="session")
def moto_s3() -> Iterator[MotoS3]:
    with MotoS3() as server:
        server.create_bucket(BUCKET)
        server.create_bucket(FAULTS_BUCKET)
        yield server


@pytest.fixture(scope="session")
def fault_proxy(moto_s3: MotoS3) -> Iterator[FaultProxy]:
    with FaultProxy(moto_s3.endpoint) as proxy:
        yield proxy


@pytest.fixture()
def faults(fault_proxy: FaultProxy) -> Iterator[FaultProxy]:
    """The proxy, with no fault armed and no hit recorded before the test, none left armed after."""
    fault_proxy.reset()
    yield fault_proxy
    fault_proxy.reset()


@pytest.fixture(scope="session")
def s3_worker(moto_s3: MotoS3, fault_proxy: FaultProxy,
              tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Worker]:
    worker = S3Worker({BUCKET: moto_s3.endpoint, FAULTS_BUCKET: fault_proxy.endpoint},
                      tmp_path_factory.mktemp("s3-worker"))
    yield worker
    worker.stop()


@pytest.fixture()
def s3_table() -> str:
    """A table URI in the bucket, not created yet."""
    return f"s3a://{BUCKET}/tables/{uuid.uuid4().hex[:12]}"


@pytest.fixture()
def faulty_table() -> str:
    """A table URI in the bucket behind the fault proxy, not created yet."""
    return f"s3a://{FAULTS_BUCKET}/tables/{uuid.uuid4().hex[:12]}"


@pytest.fixture()
def s3_options(moto_s3: MotoS3) -> dict[str, str]:
    """delta-rs / obstore options for reading the tier's tables without Spark."""
    return storage_options(moto_s3.endpoint)
