"""Servers of the Debezium end-to-end tests, each started once per test session: PostgreSQL
(devtools/postgres.py) and a Kafka Connect worker with Debezium's PostgreSQL connector
(devtools/connect.py) on the session's Apache Kafka."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import pytest

from devtools.connect import KafkaConnect
from devtools.kafka_server import ApacheKafka
from devtools.postgres import Postgres

logger = logging.getLogger(__name__)


@pytest.fixture(scope="session")
def postgres() -> Iterator[Postgres]:
    started = time.monotonic()
    with Postgres() as server:
        logger.warning("PostgreSQL 15 on port %d in %.1f s", server.port, time.monotonic() - started)
        yield server


@pytest.fixture(scope="session")
def kafka_connect(apache_kafka: ApacheKafka) -> Iterator[KafkaConnect]:
    started = time.monotonic()
    with KafkaConnect(apache_kafka.bootstrap_servers) as worker:
        logger.warning("Kafka Connect at %s in %.1f s", worker.url, time.monotonic() - started)
        yield worker
