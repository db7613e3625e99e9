"""The ``kafka_py`` source on both Kafka clients (``kafka.client``): the exact records through
Spark, ranges over several micro-batches, the executors' consumer cache, ``kafka.*`` option
pass-through and refusal, and one metadata fetch per trigger on the driver.

Spark-level tests run each client against the session's broker; the cache and read-loop
tests call the reader in this process (what an executor's Python worker runs), where the
cache counters are directly visible. Through Spark, executors publish their counters to
``$STREAMING_MERGE_KAFKA_CONSUMER_STATS_DIR`` (set with ``sc.environment`` before the source
is registered, which is the environment the executors' read function gets).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from streaming_merge.kafka import _clients
from streaming_merge.kafka._clients.columns import _Columns
from streaming_merge.kafka._clients.confluent import _confluent_config
from streaming_merge.kafka.broker import KafkaBrokerClient, Record
from streaming_merge.kafka.source import (
    STATS_DIR_ENV,
    KafkaOptions,
    KafkaRange,
    KafkaSourceError,
    KafkaStreamReader,
    clear_consumer_cache,
    consumer_cache_stats,
    register,
)

CLIENTS = [pytest.param(kind, marks=pytest.mark.skipif(not _clients.client_importable(kind),
                                                       reason=f"{kind} not installed"))
           for kind in _clients.CLIENT_KINDS]
QUERY_TIMEOUT_S = 300.0  # a guard against hangs, not a synchronisation
BASE_TS = 1_700_000_000_000


# ------------------------------------------------------------------------------ helpers


def options(bootstrap: str, topic: str, client: str, **extra: str) -> dict[str, str]:
    return {"kafka.bootstrap.servers": bootstrap, "subscribe": topic, "startingOffsets": "earliest",
            "kafka.client": client, **extra}


def run_query(spark: SparkSession, source_options: dict[str, str], checkpoint: Path
              ) -> tuple[StreamingQuery, list[tuple[int, list[dict[str, Any]]]]]:
    """AvailableNow through ``kafka_py`` into foreachBatch; returns the query and the rows of
    every batch (timestamps as epoch milliseconds, headers as (key, bytes) pairs)."""
    register(spark)
    batches: list[tuple[int, list[dict[str, Any]]]] = []

    def collect(frame: DataFrame, batch_id: int) -> None:
        rows = frame.selectExpr("key", "value", "topic", "partition", "offset", "unix_millis(timestamp) AS ts",
                                "timestampType", "headers").collect()
        batches.append((batch_id, [{
            "key": None if r["key"] is None else bytes(r["key"]),
            "value": None if r["value"] is None else bytes(r["value"]),
            "topic": r["topic"], "partition": r["partition"], "offset": r["offset"], "ts": r["ts"],
            "timestampType": r["timestampType"],
            "headers": [(h["key"], None if h["value"] is None else bytes(h["value"])) for h in r["headers"]],
        } for r in rows]))

    reader = spark.readStream.format("kafka_py")
    for key, value in source_options.items():
        reader = reader.option(key, value)
    query = (reader.load().writeStream.foreachBatch(collect).option("checkpointLocation", str(checkpoint))
             .trigger(availableNow=True).start())
    try:
        finished = query.awaitTermination(QUERY_TIMEOUT_S)
    finally:
        if query.isActive:
            query.stop()
    assert finished, f"the query did not finish within {QUERY_TIMEOUT_S:.0f}s"
    return query, batches


def failure_text(error: BaseException) -> str:
    return "\n".join(str(part) for part in (error, getattr(error, "desc", ""), getattr(error, "stackTrace", "")))


def worker_stats(folder: Path) -> dict[str, dict[str, Any]]:
    return {p.stem: json.loads(p.read_text()) for p in folder.glob("*.json")}


@pytest.fixture()
def executor_stats(spark: SparkSession, tmp_path: Path) -> Iterator[Path]:
    """Executors (Python workers) of the source registered inside this fixture publish their
    consumer-cache counters to the returned folder; a fresh folder means fresh workers
    (the worker pool is keyed by the environment), so their counters start at zero."""
    folder = tmp_path / "consumer_stats"
    spark.sparkContext.environment[STATS_DIR_ENV] = str(folder)
    try:
        yield folder
    finally:
        spark.sparkContext.environment.pop(STATS_DIR_ENV, None)
        register(spark)  # later registrations carry no stats folder


def read_in_process(reader: KafkaStreamReader, topic: str, partition: int, start: int, end: int) -> pa.Table:
    return pa.Table.from_batches(list(reader.read(KafkaRange(topic, partition, start, end))),
                                 schema=_clients.ARROW_SCHEMA)


def cache_delta(before: dict[str, int]) -> dict[str, int]:
    after = consumer_cache_stats()
    return {k: after[k] - before[k] for k in ("created", "reused", "released", "closedAfterFailure")}


# ------------------------------------------------------------------------------ records through Spark


@pytest.mark.parametrize("client", CLIENTS)
def test_exact_records_through_spark(spark: SparkSession, kafka_broker: KafkaBrokerClient,
                                     kafka_topic: Callable[..., str], tmp_path: Path, client: str) -> None:
    topic = kafka_topic(partitions=2)
    sent = [
        Record(value=b'{"id": 1}', key=b"k1", headers=(("op", b"c"), ("empty", b"")), timestamp_ms=BASE_TS,
               partition=0),
        Record(value=b"\x00\xffbinary", key=None, timestamp_ms=BASE_TS + 1, partition=0),
        Record(value=None, key=b"k1", timestamp_ms=BASE_TS + 2, partition=0),  # tombstone
        Record(value=b"p1-a", key=b"k2", headers=(("trace", b"\x01\x02"),), timestamp_ms=BASE_TS + 3, partition=1),
        Record(value=b"", key=b"", timestamp_ms=BASE_TS + 4, partition=1),
    ]
    acks = kafka_broker.produce(topic, sent)

    _, batches = run_query(spark, options(kafka_broker.bootstrap_servers, topic, client), tmp_path / "chk")

    rows = sorted((r for _, rows in batches for r in rows), key=lambda r: (r["partition"], r["offset"]))
    expected = [{"key": None if s.key is None else bytes(s.key), "value": s.value, "topic": topic,
                 "partition": a.partition, "offset": a.offset, "ts": s.timestamp_ms, "timestampType": 0,
                 "headers": list(s.headers)} for s, a in zip(sent, acks, strict=True)]
    assert rows == expected


@pytest.mark.parametrize("client", CLIENTS)
def test_micro_batches_cover_every_offset_once(spark: SparkSession, kafka_broker: KafkaBrokerClient,
                                               kafka_topic: Callable[..., str], tmp_path: Path, client: str) -> None:
    """maxOffsetsPerTrigger splits the backlog into several batches; each batch continues
    exactly where the previous one stopped in every partition, and a second run of the same
    checkpoint reads only what was produced since."""
    topic = kafka_topic(partitions=2)
    first = kafka_broker.produce(topic, [(f"k{i}", f"v{i}") for i in range(30)])
    source_options = options(kafka_broker.bootstrap_servers, topic, client, maxOffsetsPerTrigger="7")

    query, batches = run_query(spark, source_options, tmp_path / "chk")
    second = kafka_broker.produce(topic, [(f"k{i}", f"v{i}") for i in range(30, 41)])
    _, more = run_query(spark, source_options, tmp_path / "chk")

    every = batches + more
    assert len(batches) >= 5 and all(len(rows) <= 7 for _, rows in every), [len(r) for _, r in every]
    assert [b for b, _ in every] == list(range(len(every)))
    next_offset = {0: 0, 1: 0}
    for _, rows in every:
        for partition in (0, 1):
            offsets = sorted(r["offset"] for r in rows if r["partition"] == partition)
            assert offsets == list(range(next_offset[partition], next_offset[partition] + len(offsets)))
            next_offset[partition] += len(offsets)
    read = sorted((r["partition"], r["offset"], r["value"]) for _, rows in every for r in rows)
    produced = [(a.partition, a.offset, f"v{i}".encode()) for i, a in enumerate(first + second)]
    assert read == sorted(produced)
    assert sum(int(p["numInputRows"]) for p in query.recentProgress) == 30


@pytest.mark.parametrize("client", CLIENTS)
def test_later_micro_batches_reuse_the_cached_consumer(
        spark: SparkSession, kafka_broker: KafkaBrokerClient, kafka_topic: Callable[..., str], tmp_path: Path,
        executor_stats: Path, client: str) -> None:
    """One partition, four micro-batches: every Python worker that reads creates one consumer
    for it and serves its later batches from the cache."""
    topic = kafka_topic(partitions=1)
    kafka_broker.produce(topic, [(f"k{i}", f"v{i}") for i in range(20)])

    _, batches = run_query(spark, options(kafka_broker.bootstrap_servers, topic, client, maxOffsetsPerTrigger="5"),
                           tmp_path / "chk")

    assert [len(rows) for _, rows in batches] == [5, 5, 5, 5]
    stats = worker_stats(executor_stats)
    readers = {pid: s for pid, s in stats.items() if s["reads"]}
    assert sum(s["reads"] for s in readers.values()) == 4
    for pid, s in readers.items():
        assert s["created"] == 1, (pid, s)
        assert s["reused"] == s["reads"] - 1, (pid, s)
        assert s["closedAfterFailure"] == 0, (pid, s)
    assert sum(s["reused"] for s in readers.values()) >= 4 - len(readers) >= 2


# ------------------------------------------------------------------------------ options


@pytest.mark.parametrize(("client", "message"), [
    pytest.param("confluent", 'Invalid value "BOGUS" for configuration property "security.protocol"',
                 marks=CLIENTS[0].marks),
    pytest.param("kafka-python",
                 "Option 'kafka.security.protocol' must be one of PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL "
                 "for kafka.client=kafka-python, got 'BOGUS'", marks=CLIENTS[1].marks),
])
def test_kafka_options_reach_the_client(spark: SparkSession, kafka_broker: KafkaBrokerClient,
                                        kafka_topic: Callable[..., str], tmp_path: Path, client: str,
                                        message: str) -> None:
    """An invalid ``kafka.security.protocol`` fails the query with the client's verdict in a
    KafkaSourceError (kafka-python does not validate it, so the source does): the option is
    passed through, not dropped as before."""
    topic = kafka_topic(partitions=1)
    kafka_broker.produce(topic, [b"x"])
    with pytest.raises(StreamingQueryException) as failure:
        run_query(spark, options(kafka_broker.bootstrap_servers, topic, client, **{"kafka.security.protocol": "BOGUS"}),
                  tmp_path / "chk")
    text = failure_text(failure.value)
    assert "KafkaSourceError" in text
    assert message in text


def test_confluent_client_errors_are_wrapped_with_their_cause() -> None:
    pytest.importorskip("confluent_kafka")
    from confluent_kafka import KafkaException

    spec = KafkaOptions.parse({**options("127.0.0.1:9", "t", "confluent"),
                               "kafka.security.protocol": "BOGUS"}).client
    expected = re.escape("Cannot create a confluent consumer for 127.0.0.1:9")
    with pytest.raises(KafkaSourceError, match=expected) as failure:
        _clients.MetadataClient(spec)
    assert isinstance(failure.value.__cause__, KafkaException)
    spec = KafkaOptions.parse({**options("127.0.0.1:9", "t", "confluent"), "kafka.no.such.property": "1"}).client
    with pytest.raises(KafkaSourceError, match=re.escape('No such configuration property: "no.such.property"')):
        _clients.MetadataClient(spec)


def test_client_settings_are_translated_for_each_client() -> None:
    given = {"kafka.security.protocol": "sasl_ssl", "kafka.sasl.mechanism": "SCRAM-SHA-512",
             "kafka.sasl.jaas.config": 'org.apache.kafka.common.security.scram.ScramLoginModule required '
                                       'username="alice" password="s3\\"cret";',
             "kafka.ssl.ca.location": "/etc/ca.pem", "kafka.fetch.max.wait.ms": "250", "kafka.check.crcs": "false",
             "kafka.ssl.endpoint.identification.algorithm": "none", "kafka.client.id": "ingest"}
    confluent = dict(KafkaOptions.parse({**options("h:1", "t", "confluent"), **given}).client.settings)
    assert confluent == {"security.protocol": "sasl_ssl", "sasl.mechanism": "SCRAM-SHA-512",
                         "sasl.username": "alice", "sasl.password": 's3\\"cret', "ssl.ca.location": "/etc/ca.pem",
                         "fetch.wait.max.ms": "250", "check.crcs": "false",
                         "ssl.endpoint.identification.algorithm": "none", "client.id": "ingest"}
    kafka_python = dict(KafkaOptions.parse({**options("h:1", "t", "kafka-python"), **given}).client.settings)
    assert kafka_python == {"security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512",
                            "sasl_plain_username": "alice", "sasl_plain_password": 's3\\"cret',
                            "ssl_cafile": "/etc/ca.pem", "fetch_max_wait_ms": 250, "check_crcs": False,
                            "ssl_check_hostname": False, "client_id": "ingest"}


def test_executor_consumers_wait_briefly_for_data_unless_told_otherwise() -> None:
    """A cached librdkafka consumer at the end of its partition has a fetch waiting at the
    broker; a read that seeks waits for it, so executors cap that wait (the driver never fetches)."""
    default = KafkaOptions.parse(options("h:1", "t", "confluent")).client
    assert _confluent_config(default, "executor")["fetch.wait.max.ms"] == _clients.EXECUTOR_FETCH_WAIT_MS == 50
    assert "fetch.wait.max.ms" not in _confluent_config(default, "driver")
    chosen = KafkaOptions.parse({**options("h:1", "t", "confluent"), "kafka.fetch.max.wait.ms": "400"}).client
    assert _confluent_config(chosen, "executor")["fetch.wait.max.ms"] == "400"


@pytest.mark.parametrize(("extra", "message"), [
    ({"kafka.queued.max.messages.kbytes": "1024"},
     "Kafka option 'kafka.queued.max.messages.kbytes' cannot be passed to kafka-python (kafka.client=kafka-python)"),
    ({"kafka.request.timeout.ms": "soon"}, "Option 'kafka.request.timeout.ms' must be an integer, got 'soon'."),
    ({"kafka.sasl.jaas.config": "com.sun.security.auth.module.Krb5LoginModule required;"},
     "Option 'kafka.sasl.jaas.config' can only be translated for PlainLoginModule or ScramLoginModule"),
])
def test_options_kafka_python_cannot_take_are_refused(extra: dict[str, str], message: str) -> None:
    with pytest.raises(KafkaSourceError) as failure:
        KafkaOptions.parse({**options("h:1", "t", "kafka-python"), **extra})
    assert message in str(failure.value)


@pytest.mark.parametrize(("name", "reason"), [
    ("group.id", "user-specified consumer groups are not used to track offsets"),
    ("auto.offset.reset", "set the source option 'startingOffsets' to 'earliest' or 'latest'"),
    ("enable.auto.commit", "Spark checkpoints the offsets"),
    ("key.deserializer", "keys are always read as bytes"),
    ("value.deserializer", "values are always read as bytes"),
    ("interceptor.classes", "interceptors can modify the payload"),
])
@pytest.mark.parametrize("client", _clients.CLIENT_KINDS)
def test_options_spark_manages_are_refused(name: str, reason: str, client: str) -> None:
    with pytest.raises(KafkaSourceError, match=re.escape(f"Kafka option '{name}' is not supported: {reason}")):
        KafkaOptions.parse({**options("h:1", "t", client), f"kafka.{name}": "x"})


def test_unknown_client_is_refused_and_the_default_is_the_fastest_installed() -> None:
    with pytest.raises(KafkaSourceError) as failure:
        KafkaOptions.parse({**options("h:1", "t", "librdkafka")})
    assert str(failure.value) == ("Option 'kafka.client' must be one of 'confluent', 'kafka-python', "
                                  "got 'librdkafka'.")
    default = KafkaOptions.parse({"kafka.bootstrap.servers": "h:1", "subscribe": "t"}).client.kind
    assert default == ("confluent" if _clients.client_importable("confluent") else "kafka-python")
    assert KafkaOptions.parse(options("h:1", "t", "Kafka-Python")).client.kind == "kafka-python"


# ------------------------------------------------------------------------------ the read path in this process


@pytest.mark.parametrize("client", CLIENTS)
def test_cached_consumer_continues_or_seeks(kafka_broker: KafkaBrokerClient, kafka_topic: Callable[..., str],
                                            client: str) -> None:
    """Consecutive ranges reuse one consumer without a seek; a range that starts elsewhere
    (a retried task, another query) repositions it; other options get their own consumer."""
    topic = kafka_topic(partitions=1)
    kafka_broker.produce(topic, [f"v{i}".encode() for i in range(12)], partition=0)
    reader = KafkaStreamReader(KafkaOptions.parse(options(kafka_broker.bootstrap_servers, topic, client)))
    clear_consumer_cache()
    before = consumer_cache_stats()
    try:
        for start, end in [(0, 4), (4, 9), (2, 6), (6, 12), (11, 12)]:
            table = read_in_process(reader, topic, 0, start, end)
            assert table.column("offset").to_pylist() == list(range(start, end))
            assert table.column("value").to_pylist() == [f"v{i}".encode() for i in range(start, end)]
        assert cache_delta(before) == {"created": 1, "reused": 4, "released": 5, "closedAfterFailure": 0}

        other = KafkaStreamReader(KafkaOptions.parse(
            options(kafka_broker.bootstrap_servers, topic, client, **{"kafka.client.id": "another"})))
        assert read_in_process(other, topic, 0, 0, 2).num_rows == 2
        assert cache_delta(before)["created"] == 2
        assert consumer_cache_stats()["cached"] == 2
    finally:
        clear_consumer_cache()


@pytest.mark.parametrize("client", CLIENTS)
def test_a_failed_read_closes_and_drops_its_consumer(kafka_broker: KafkaBrokerClient,
                                                     kafka_topic: Callable[..., str], client: str) -> None:
    topic = kafka_topic(partitions=1)
    kafka_broker.produce(topic, [b"a", b"b", b"c"], partition=0)
    reader = KafkaStreamReader(KafkaOptions.parse(
        options(kafka_broker.bootstrap_servers, topic, client, **{"kafkaConsumer.pollTimeoutMs": "300"})))
    clear_consumer_cache()
    before = consumer_cache_stats()
    try:
        assert read_in_process(reader, topic, 0, 0, 2).num_rows == 2
        with pytest.raises(KafkaSourceError, match=rf"Timed out after 300 ms reading {re.escape(topic)}-0 at "
                                                   r"offset 3 \(wanted up to 10\)"):
            read_in_process(reader, topic, 0, 2, 10)  # offsets 3..9 do not exist
        assert cache_delta(before) == {"created": 1, "reused": 1, "released": 1, "closedAfterFailure": 1}
        assert consumer_cache_stats()["cached"] == 0
        assert read_in_process(reader, topic, 0, 1, 3).column("value").to_pylist() == [b"b", b"c"]
        assert cache_delta(before)["created"] == 2
    finally:
        clear_consumer_cache()


def test_no_timestamp_is_null_with_type_minus_one() -> None:
    """confluent-kafka reports (0, -1) for a record without a timestamp (message format v0);
    Spark's source gives type -1. Log-append time (2) is Spark's 1."""
    columns = _Columns(type_shift=1)
    columns.keys, columns.values, columns.offsets = [b"a", b"b", b"c"], [b"1", None, b"3"], [5, 6, 7]
    columns.types, columns.stamps = [1, 0, 2], [BASE_TS, -1, BASE_TS + 2]
    columns.headers = [(2, [("h", None)])]
    rows = pa.Table.from_batches([columns.to_batch("t", 3)]).to_pylist()
    assert [(r["offset"], r["timestampType"], r["headers"]) for r in rows] == [
        (5, 0, []), (6, -1, []), (7, 1, [{"key": "h", "value": None}])]
    assert rows[1]["timestamp"] is None
    assert int(rows[2]["timestamp"].timestamp() * 1000) == BASE_TS + 2
    assert {r["topic"] for r in rows} == {"t"} and {r["partition"] for r in rows} == {3}


# ------------------------------------------------------------------------------ driver planning


@pytest.mark.parametrize("client", CLIENTS)
def test_one_metadata_fetch_per_trigger(kafka_broker: KafkaBrokerClient, kafka_topic: Callable[..., str],
                                        monkeypatch: pytest.MonkeyPatch, client: str) -> None:
    """latestOffset fetches topic metadata and offsets; reportLatestOffset and partitions of
    the same trigger reuse them (each fetch used to cost ~100 ms with kafka-python). The
    first trigger reuses what initialOffset fetched at query start; later triggers see new
    records."""
    topic = kafka_topic(partitions=2)
    kafka_broker.produce(topic, [(f"k{i}", f"v{i}") for i in range(6)])
    calls: list[str] = []
    topics, watermarks = _clients.MetadataClient.topics, _clients.MetadataClient.watermarks
    monkeypatch.setattr(_clients.MetadataClient, "topics", lambda self: calls.append("topics") or topics(self))
    monkeypatch.setattr(_clients.MetadataClient, "watermarks",
                        lambda self, parts: calls.append("watermarks") or watermarks(self, parts))
    reader = KafkaStreamReader(KafkaOptions.parse(options(kafka_broker.bootstrap_servers, topic, client)))
    try:
        start = reader.initialOffset()
        assert calls == ["topics", "watermarks"]
        read = 0
        for trigger in range(3):
            calls.clear()
            if trigger == 2:
                kafka_broker.produce(topic, [(f"k{i}", f"v{i}") for i in range(6, 9)])
            end = reader.latestOffset(start, reader.getDefaultReadLimit())
            assert reader.reportLatestOffset() == end
            ranges = reader.partitions(start, end)
            assert calls == ([] if trigger == 0 else ["topics", "watermarks"])
            read += sum(r.end - r.start for r in ranges)
            assert all((r.start, r.end) == (start[topic][str(r.partition)], end[topic][str(r.partition)])
                       for r in ranges)
            start = end
        assert read == 9
    finally:
        reader.stop()
