"""Security options end to end, on the SASL_SSL listener of the session's Apache Kafka: the same
``kafka.*`` options (Spark's connector's names: a JAAS line, a JKS, PKCS12 or PEM truststore)
reach confluent-kafka and kafka-python through the ``kafka_py`` source, and Spark's connector
through the job's ``--source-format kafka``. Wrong credentials and an unreachable broker fail
the job before anything is written, with the broker and the cause named.

Cheap by design: the full mechanism × truststore × client matrix runs on the reader alone (the
driver's metadata and one executor read, in this process); through Spark each source format
runs once per combination that matters (one tiny topic, three records each). Skipped on the
embedded Tansu broker, which has no SASL_SSL listener."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql import SparkSession

from devtools.kafka_server import STORE_PASSWORD, USER, ApacheKafka
from streaming_merge.kafka import _clients
from streaming_merge.kafka._clients import truststore as truststores
from streaming_merge.kafka._clients.common import translate_options
from streaming_merge.kafka._clients.truststore import Truststore, resolved
from streaming_merge.kafka.broker import KafkaBrokerClient
from streaming_merge.kafka.source import KafkaOptions, KafkaRange, KafkaSourceError, KafkaStreamReader
from tests.kafka.test_ingest_e2e import change, failure_text, run_available_now, simple_config, simple_state

pytestmark = pytest.mark.skipif(os.environ.get("STREAMING_MERGE_TEST_BROKER", "").lower() == "embedded",
                                reason="the embedded Tansu broker has no SASL_SSL listener")

CLIENTS = [pytest.param(kind, marks=pytest.mark.skipif(not _clients.client_importable(kind),
                                                       reason=f"{kind} not installed"))
           for kind in _clients.CLIENT_KINDS]
FAST_FAILURE = {"kafka.default.api.timeout.ms": "3000"}  # wrong credentials / no broker: fail in seconds


@pytest.fixture()
def sasl_topic(kafka_broker: KafkaBrokerClient, kafka_topic: Callable[..., str]) -> str:
    """A topic with three changes, produced on the PLAINTEXT listener of the same broker."""
    topic = kafka_topic(partitions=1)
    kafka_broker.produce(topic, [change(1, 1, "a"), change(2, 2, "b"), change(1, 3, "a2", op="u")])
    return topic


def job_options(server: ApacheKafka, mechanism: str, truststore: str) -> dict[str, str]:
    """The listener's options without the bootstrap servers (the job takes them apart)."""
    options = server.sasl_ssl_options(mechanism, truststore=truststore)
    options.pop("kafka.bootstrap.servers")
    return options


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256"])
@pytest.mark.parametrize("truststore", ["pem", "jks", "p12"])
def test_every_mechanism_and_truststore_reaches_both_clients(
        apache_kafka: ApacheKafka, sasl_topic: str, client: str, mechanism: str, truststore: str) -> None:
    options = KafkaOptions.parse({**apache_kafka.sasl_ssl_options(mechanism, truststore=truststore),
                                  "subscribe": sasl_topic, "kafka.client": client, "startingOffsets": "earliest"})
    reader = KafkaStreamReader(options)
    try:
        assert reader.initialOffset() == {sasl_topic: {"0": 0}}
        end = reader.latestOffset({}, reader.getDefaultReadLimit())
        assert end == {sasl_topic: {"0": 3}}
        (task,) = reader.partitions({sasl_topic: {"0": 0}}, end)
        assert task == KafkaRange(sasl_topic, 0, 0, 3)
        rows = pa.Table.from_batches(list(reader.read(task)), schema=_clients.ARROW_SCHEMA).to_pylist()
    finally:
        reader.stop()
        _clients.clear_consumer_cache()
    assert [(r["offset"], r["key"]) for r in rows] == [(0, b"1"), (1, b"2"), (2, b"1")]


@pytest.mark.parametrize("kind", ["JKS", "PKCS12"])
def test_a_java_truststore_becomes_the_pem_ca_once_per_store_file(apache_kafka: ApacheKafka, kind: str, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    tls = apache_kafka.tls
    assert tls is not None
    store = Path(shutil.copy(tls.truststore_jks if kind == "JKS" else tls.truststore_p12, tmp_path))
    calls = []
    real_run = subprocess.run

    def counting_run(*args: Any, **kwargs: Any) -> Any:
        calls.append(args[0])
        return real_run(*args, **kwargs)

    monkeypatch.setattr(truststores.subprocess, "run", counting_run)
    monkeypatch.setattr(truststores, "_CONVERTED", {})
    monkeypatch.setattr(truststores.tempfile, "gettempdir", lambda: str(tmp_path))
    given = dict(translate_options("kafka-python", {"ssl.truststore.location": str(store),
                                                    "ssl.truststore.type": kind,
                                                    "ssl.truststore.password": STORE_PASSWORD}))
    pem = Path(resolved(given)["ssl_cafile"])
    assert pem.read_text().strip() == tls.ca_pem.read_text().strip()
    assert STORE_PASSWORD not in " ".join(map(str, calls[0])), "the password never goes on a command line"
    assert resolved(given)["ssl_cafile"] == str(pem) and len(calls) == 1, "converted once"
    monkeypatch.setattr(truststores, "_CONVERTED", {})  # another worker of the host: the file serves it
    assert resolved(given)["ssl_cafile"] == str(pem) and len(calls) == 1
    os.utime(store, ns=(store.stat().st_atime_ns, store.stat().st_mtime_ns + 10_000_000_000))
    assert resolved(given)["ssl_cafile"] != str(pem) and len(calls) == 2, "a changed store is converted again"


def test_a_wrong_truststore_password_or_a_missing_store_names_the_option(apache_kafka: ApacheKafka,
                                                                        tmp_path: Path) -> None:
    tls = apache_kafka.tls
    assert tls is not None
    cannot_read = re.escape("Option 'kafka.ssl.truststore.location': cannot read JKS store")
    with pytest.raises(KafkaSourceError, match=cannot_read):
        Truststore(str(tls.truststore_jks), "JKS", "wrong-password").pem_file()
    with pytest.raises(KafkaSourceError, match=re.escape("Option 'kafka.ssl.truststore.location': cannot read ")):
        Truststore(str(tmp_path / "nothing.jks"), "JKS", "x").pem_file()
    pem = Truststore(certificates=tls.ca_pem.read_text(), type="PEM").pem_file()
    assert Path(pem).read_text() == tls.ca_pem.read_text()


@pytest.mark.parametrize(("source_format", "client", "mechanism", "truststore"), [
    pytest.param("kafka_py", "confluent", "SCRAM-SHA-256", "jks", marks=CLIENTS[0].marks),
    pytest.param("kafka_py", "kafka-python", "PLAIN", "pem", marks=CLIENTS[1].marks),
    ("kafka", None, "PLAIN", "jks"),
    ("kafka", None, "SCRAM-SHA-256", "pem"),
])
def test_the_job_reads_the_sasl_ssl_listener(
        spark: SparkSession, apache_kafka: ApacheKafka, sasl_topic: str, tmp_path: Path, source_format: str,
        client: str | None, mechanism: str, truststore: str) -> None:
    options = job_options(apache_kafka, mechanism, truststore)
    if client:
        options["kafka.client"] = client
    config = simple_config(tmp_path, apache_kafka.sasl_ssl_bootstrap_servers, sasl_topic,
                           source_format=source_format, kafka_options=options)
    _, progress = run_available_now(spark, config)
    assert simple_state(config.target) == {1: "a2", 2: "b"}
    assert sum(p["kafkaRecords"] for p in progress) == 3


@pytest.mark.parametrize(("source_format", "client", "cause"), [
    pytest.param("kafka_py", "confluent", "SASL authentication error: Authentication failed: Invalid username or "
                 "password", marks=CLIENTS[0].marks),
    pytest.param("kafka_py", "kafka-python", "cause:", marks=CLIENTS[1].marks),
    pytest.param("kafka", None, "SASL authentication error: Authentication failed: Invalid username or password",
                 marks=CLIENTS[0].marks),
], ids=["kafka_py-confluent", "kafka_py-kafka-python", "kafka"])
def test_wrong_credentials_fail_before_anything_is_written(
        spark: SparkSession, apache_kafka: ApacheKafka, sasl_topic: str, tmp_path: Path, source_format: str,
        client: str | None, cause: str) -> None:
    options = {**job_options(apache_kafka, "PLAIN", "pem"), **FAST_FAILURE}
    options["kafka.sasl.jaas.config"] = options["kafka.sasl.jaas.config"].replace(
        f'username="{USER}"', 'username="mallory"')
    if client:
        options["kafka.client"] = client
    config = simple_config(tmp_path, apache_kafka.sasl_ssl_bootstrap_servers, sasl_topic,
                           source_format=source_format, kafka_options=options)
    with pytest.raises((StreamingQueryException, KafkaSourceError)) as failure:
        run_available_now(spark, config)
    text = failure_text(failure.value)
    assert apache_kafka.sasl_ssl_bootstrap_servers in text, text[:2000]
    assert cause in text, text[:2000]
    assert not Path(config.target).exists() and not Path(str(config.dead_letter)).exists()


@pytest.mark.parametrize(("source_format", "client", "cause"), [
    pytest.param("kafka_py", "confluent", "Connection refused", marks=CLIENTS[0].marks),
    pytest.param("kafka_py", "kafka-python", "ECONNREFUSED", marks=CLIENTS[1].marks),
    pytest.param("kafka", None, "Connection refused", marks=CLIENTS[0].marks),
], ids=["kafka_py-confluent", "kafka_py-kafka-python", "kafka"])
def test_an_unreachable_broker_fails_before_anything_is_written(
        spark: SparkSession, tmp_path: Path, source_format: str, client: str | None, cause: str) -> None:
    from devtools.kafka_server import free_port

    broker = f"127.0.0.1:{free_port()}"
    options = {**FAST_FAILURE, **({"kafka.client": client} if client else {})}
    config = simple_config(tmp_path, broker, "orders", source_format=source_format, kafka_options=options)
    with pytest.raises((StreamingQueryException, KafkaSourceError)) as failure:
        run_available_now(spark, config)
    text = failure_text(failure.value)
    assert broker in text, text[:2000]
    assert cause in text, text[:2000]
    assert not Path(config.target).exists()
