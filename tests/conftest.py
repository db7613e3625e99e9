"""Shared fixtures: one local SparkSession per test session, temp table folders, one Kafka
broker per test session, and markers assigned from the folder a test lives in (unit/, spark/,
kafka/, cluster/).

The broker fixtures serve tests/kafka/ and tests/cluster/ (the ingestion job on a
local-cluster); they live here, not in a folder's conftest, so both share one broker.
One broker per test session: Apache Kafka itself (KRaft, from its Maven Central jars; see
devtools/), or with ``STREAMING_MERGE_TEST_BROKER=embedded`` the embedded Tansu broker of the
demo. Both are reached through the same bootstrap string, so tests do not care which one
runs, except for scenarios Tansu cannot serve (adding partitions, deleting records), which
skip or branch on ``kafka_broker.kind``.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import uuid
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from devtools.kafka_server import ApacheKafka
from streaming_merge.kafka.broker import EmbeddedKafka, KafkaBrokerClient, KafkaBrokerError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

logger = logging.getLogger(__name__)

_FOLDER_MARKERS = {"spark": ("spark",), "kafka": ("kafka", "spark"), "cluster": ("cluster", "slow")}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        folder = Path(str(item.fspath)).parent.name
        for marker in _FOLDER_MARKERS.get(folder, ()):
            item.add_marker(getattr(pytest.mark, marker))


@dataclass(frozen=True)
class WarmedArchive:
    """The driver class archive of the test session's key (``local[2]``), and what the warm-up
    printed when this session built it (None when it was there already or the build failed)."""

    path: Path
    build_output: str | None


@pytest.fixture(scope="session")
def driver_class_archive() -> WarmedArchive | None:
    """The driver class archive built before any test's driver starts (see
    tests/streaming_support/class_archive_warmup.py): one JVM life of ~30 s when it is missing,
    nothing when it is there. A failed build only costs speed: the drivers then start without it.
    None where no archive can be built (no JVM to key by, another platform)."""
    from streaming_merge.session import class_archive_path
    from streaming_merge.spark.class_archive import complete

    archive = class_archive_path("local[2]")
    if archive is None:
        return None
    if complete(archive):
        return WarmedArchive(archive, None)
    result = subprocess.run([sys.executable, "-m", "tests.streaming_support.class_archive_warmup"],
                            cwd=Path(__file__).resolve().parent.parent, capture_output=True, text=True,
                            timeout=900, check=False)
    if result.returncode != 0 or not complete(archive):
        logger.warning("No driver class archive built before the tests (exit %d): %s", result.returncode,
                       result.stderr[-2000:])
        return WarmedArchive(archive, None)
    return WarmedArchive(archive, result.stdout)


def test_session() -> SparkSession:
    """The session the tests share. One JVM serves both engines: Spark's Kafka connector and
    Delta Lake (its SQL extension and catalog) beside ours, as oracle, second reader and
    benchmark peer."""
    from streaming_merge.session import local_session
    from streaming_merge.spark.packages import package_conf

    return local_session("streaming_merge-tests", "local[2]", shuffle_partitions=2,
                         extra_conf={**package_conf(("kafka", "delta")),
                                     # Delta's log replay on the session's 2 cores, not its 50
                                     # default partitions: what a careful user sets here
                                     "spark.databricks.delta.snapshotPartitions": "2"})


test_session.__test__ = False  # type: ignore[attr-defined]  # a factory, not a test


@pytest.fixture(scope="session")
def spark(driver_class_archive: WarmedArchive | None) -> Iterator[SparkSession]:
    session = test_session()
    yield session
    session.stop()


@pytest.fixture()
def without_small_table_rules(monkeypatch: pytest.MonkeyPatch) -> None:
    """MergeSink's shortcuts for small tables off: tiny candidate files rewritten whole without
    findTouchedFiles (sink.SMALL_CANDIDATES_BYTES), a small tombstone table checked while the
    batch is materialized (tombstones.SMALL_TABLE_BYTES). For tests of the mechanisms those
    shortcuts skip (the scan, the tombstone lookup, small files left for compaction), whose
    tables are tiny to keep the tests fast."""
    from streaming_merge.streaming import sink, tombstones

    monkeypatch.setattr(sink, "SMALL_CANDIDATES_BYTES", 0)
    monkeypatch.setattr(tombstones, "SMALL_TABLE_BYTES", 0)


@pytest.fixture()
def table_path(tmp_path: Path) -> str:
    """A fresh folder path for a Delta table (not created yet)."""
    return str(tmp_path / "table")


# ------------------------------------------------------------------ Kafka broker


@pytest.fixture(scope="session")
def apache_kafka() -> Iterator[ApacheKafka]:
    """Apache Kafka (one KRaft node from its Maven jars, devtools/kafka_server.py) for the whole
    test session, with its PLAINTEXT and SASL_SSL listeners."""
    with ApacheKafka() as server:
        logger.info("Apache Kafka at %s (SASL_SSL %s)", server.bootstrap_servers, server.sasl_ssl_bootstrap_servers)
        yield server


@pytest.fixture(scope="session")
def kafka_broker(request: pytest.FixtureRequest) -> Iterator[KafkaBrokerClient]:
    """Helpers (create_topic, produce, ...) bound to the session's broker: Apache Kafka's
    PLAINTEXT listener (``.kind == "kafka"``), or the embedded Tansu broker (``"tansu"``) with
    ``STREAMING_MERGE_TEST_BROKER=embedded``."""
    if os.environ.get("STREAMING_MERGE_TEST_BROKER", "").lower() == "embedded":
        with EmbeddedKafka() as broker, broker.client() as client:
            yield client
        return
    server: ApacheKafka = request.getfixturevalue("apache_kafka")
    with server.client() as client:
        yield client


@pytest.fixture(scope="session")
def kafka_bootstrap(kafka_broker: KafkaBrokerClient) -> str:
    """``host:port`` of the session's broker, for Kafka clients and Spark source options."""
    return kafka_broker.bootstrap_servers


@pytest.fixture()
def kafka_topic(kafka_broker: KafkaBrokerClient, request: pytest.FixtureRequest) -> Iterator[Callable[..., str]]:
    """Factory: ``kafka_topic(partitions=1, prefix=None) -> name`` creates a topic whose name is
    unique in the session (derived from the test name), so tests sharing one broker never see
    each other's records. Created topics are deleted afterwards, best effort."""
    created: list[str] = []
    base = re.sub(r"[^A-Za-z0-9._-]", "_", request.node.name)[:80]

    def make(partitions: int = 1, prefix: str | None = None) -> str:
        name = f"{prefix or base}-{uuid.uuid4().hex[:10]}"
        kafka_broker.create_topic(name, partitions)
        created.append(name)
        return name

    yield make
    for name in created:
        try:
            kafka_broker.delete_topic(name)
        except KafkaBrokerError as exc:
            logger.warning("could not delete test topic %s: %s", name, exc)


# ------------------------------------------------------------------ Delta Lake as second reader


#: ``STREAMING_MERGE_DELTA_READS``: ``all`` (every Spark test), ``0`` (none), or by default one
#: test in SAMPLE_EVERY, chosen by a hash of its id (the same tests on every run): Delta's reads
#: cost about a second per table, and a whole run leaves over 600 tables.
SAMPLE_EVERY = 10


def _delta_reads_wanted(request: pytest.FixtureRequest) -> bool:
    mode = os.environ.get("STREAMING_MERGE_DELTA_READS", "sample").lower()
    if mode == "0" or "spark" not in request.fixturenames or "tmp_path" not in request.fixturenames:
        return False
    if request.node.get_closest_marker("no_delta_reads") is not None:
        return False
    return mode == "all" or zlib.crc32(request.node.nodeid.encode()) % SAMPLE_EVERY == 0


@pytest.fixture(autouse=True)
def delta_reads_what_the_test_wrote(request: pytest.FixtureRequest) -> Iterator[None]:
    """After a Spark test that used a ``tmp_path``, Delta Lake reads every table left there and
    must see what our reader sees (tests/delta_reader_check.py)."""
    wanted = _delta_reads_wanted(request)
    # Taken now: a fixture asked for here is torn down after this one.
    spark, folder = (request.getfixturevalue("spark"), request.getfixturevalue("tmp_path")) if wanted else (None, None)
    yield
    if spark is None or folder is None:
        return
    from tests.delta_reader_check import differences, tables_under

    found = {str(table): differences(spark, str(table)) for table in tables_under(folder)}
    found = {table: problems for table, problems in found.items() if problems}
    assert not found, f"Delta Lake reads these tables differently from us: {found}"
