"""End to end through the Kafka CDC ingestion job (``jobs.kafka_cdc_ingest``) against the
session's broker: Debezium topics → the ``kafka_py`` source → decode → MergeSink → Delta. The
SIGKILL test runs with Spark's own connector too (``--source-format kafka``).

What is checked, and why here rather than in unit tests: the guarantees only hold when
Spark's offset log, the sink's Delta transactions and the dead-letter appends work
together, so these tests run the real job code on real micro-batches:

- exactly once across a SIGKILL of the whole job (driver + JVM) and a restart, at two
  points of a batch (subprocess, like tests/spark/test_exactly_once_kill.py);
- malformed records go to the dead-letter table with their raw bytes, reason and
  coordinates, or fail the query (``on_malformed="fail"``) without touching the table;
- ``maxOffsetsPerTrigger`` bounds every batch; several partitions keep per-key order;
- new partitions (Apache Kafka only: Tansu has no CreatePartitions) and new topics
  matching ``subscribePattern`` are picked up by a running checkpoint;
- ``startingOffsets`` (earliest, latest, Spark's JSON form) and option errors.

Every Spark micro-batch costs seconds, so each test uses few records and few batches.
Results are compared the way jobs/kafka_cdc_demo.py does: the Delta table read back with
delta-rs against the state computed independently by jobs/cdc_generator.py.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import deltalake
import pyarrow as pa
import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery

from jobs import cdc_generator
from jobs.kafka_cdc_ingest import IngestConfig, batch_function, parse_args, start
from streaming_merge.kafka.broker import BrokerFeatureUnsupportedError, KafkaBrokerClient, ProducedRecord, Record
from streaming_merge.kafka.source import KafkaOptions, KafkaSourceError, KafkaStreamReader, register
from streaming_merge.table.snapshot import load_snapshot

ROOT = Path(__file__).resolve().parents[2]
ORDERS = cdc_generator.TABLES["orders"]
ORDER_KEY: str = ORDERS["key"]
ORDER_COLUMNS = [c.split()[0] for c in ORDERS["schema"].split(",")]
SIMPLE_SCHEMA = "id long, v string"
QUERY_TIMEOUT_S = 600.0  # a guard against hangs, not a synchronisation: busy CI machines are slow
TIE_TS_MS = 1_800_000_000_000


# ------------------------------------------------------------------------------ helpers


def change(key: int, lsn: int | None, v: str, op: str = "c", ts_ms: int | None = None) -> Record:
    """A Debezium change of the simple table ``(id long, v string)`` keyed by ``id``."""
    image = {"id": key, "v": v}
    source: dict[str, Any] = {"connector": "postgresql"}
    if lsn is not None:
        source["lsn"] = lsn
    if ts_ms is not None:
        source["ts_ms"] = ts_ms
    payload = {"before": image if op == "d" else None, "after": None if op == "d" else image, "op": op,
               "ts_ms": ts_ms, "source": source}
    return Record(value=json.dumps(payload).encode(), key=str(key).encode())


def produce_generated(broker: KafkaBrokerClient, topic: str, *, events: int, keys: int, seed: int
                      ) -> tuple[list[cdc_generator.Record], dict[int, dict[str, Any]], list[ProducedRecord]]:
    """A generated ``orders`` change stream (duplicates, late events, tombstones, five
    malformed records), produced with key partitioning; returns records, expected state, acks."""
    records, state = cdc_generator.generate("orders", events, keys, seed=seed)
    acks = broker.produce(topic, [(r.key, r.value) for r in records])
    return records, cdc_generator.expected_rows(state), acks


def orders_config(tmp_path: Path, bootstrap: str, topics: str, **overrides: Any) -> IngestConfig:
    settings: dict[str, Any] = {
        "bootstrap_servers": bootstrap, "topics": topics, "target": str(tmp_path / "orders"), "keys": [ORDER_KEY],
        "checkpoint": str(tmp_path / "checkpoint"), "dead_letter": str(tmp_path / "dead_letter"),
        "row_schema": ORDERS["schema"], "available_now": True, "starting_offsets": "earliest"}
    return IngestConfig(**{**settings, **overrides})


def simple_config(tmp_path: Path, bootstrap: str, topics: str, **overrides: Any) -> IngestConfig:
    """The job on the simple table ``(id long, v string)``, see :func:`change`."""
    return orders_config(tmp_path, bootstrap, topics, **{
        "target": str(tmp_path / "simple"), "keys": ["id"], "row_schema": SIMPLE_SCHEMA, **overrides})


def await_query(query: StreamingQuery) -> None:
    """Wait for an availableNow query; a failure surfaces as StreamingQueryException."""
    try:
        finished = query.awaitTermination(QUERY_TIMEOUT_S)
    finally:
        if query.isActive:
            query.stop()
    assert finished, f"query {query.name} did not finish within {QUERY_TIMEOUT_S:.0f}s"


def run_available_now(spark: SparkSession, config: IngestConfig) -> tuple[StreamingQuery, list[dict[str, Any]]]:
    """Run the job once to completion; returns the query (for Spark's progress) and the
    job's per-batch progress records."""
    assert config.available_now
    progress: list[dict[str, Any]] = []
    query = start(spark, config, on_progress=progress.append)
    await_query(query)
    return query, progress


def read_rows(path: str) -> list[dict[str, Any]]:
    """The table's rows through delta-rs' DataFusion scan, which applies deletion vectors
    (``to_pyarrow_table()`` refuses a table that has them)."""
    return pa.table(deltalake.DeltaTable(path).scan()).to_pylist()


def assert_table_equals(path: str, expected: Mapping[int, Mapping[str, Any]], key: str = ORDER_KEY,
                        columns: list[str] | None = None) -> list[dict[str, Any]]:
    """Compare as jobs/kafka_cdc_demo.py does (key → data columns), plus no key twice."""
    columns = columns or ORDER_COLUMNS
    rows = read_rows(path)
    actual = {r[key]: {c: r[c] for c in columns} for r in rows}
    assert len(rows) == len(actual), f"{len(rows) - len(actual)} key(s) appear more than once"
    missing, extra = sorted(set(expected) - set(actual)), sorted(set(actual) - set(expected))
    wrong = sorted(k for k in set(actual) & set(expected) if actual[k] != expected[k])
    assert actual == expected, f"missing {missing[:10]} extra {extra[:10]} differing {wrong[:10]}"
    return rows


def simple_state(path: str) -> dict[int, str]:
    rows = read_rows(path)
    state = {r["id"]: r["v"] for r in rows}
    assert len(rows) == len(state), "a key appears more than once"
    return state


def spark_input_rows(query: StreamingQuery) -> list[int]:
    """``numInputRows`` of every micro-batch Spark reported for this run of the query."""
    return [int(p["numInputRows"]) for p in query.recentProgress]


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = QUERY_TIMEOUT_S) -> None:
    """Poll ``condition`` until it holds; fail after ``timeout_s`` (a deadline, not a sleep)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(0.2)


def failure_text(exc: BaseException) -> str:
    """The exception's message and those of its causes (Spark wraps the foreachBatch error)."""
    parts, seen = [], set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        parts.append(str(current))
        current = getattr(current, "_cause", None) or current.__cause__
    return "\n".join(parts)


# ------------------------------------------------------------------------------ exactly once across SIGKILL


def run_app(workdir: Path, bootstrap: str, topic: str, limit: int, kill_at: str | None,
            source_format: str = "kafka_py") -> subprocess.CompletedProcess[str]:
    """The job in a fresh interpreter and JVM (its own session, so its process-group kill
    takes nothing else with it)."""
    command = [sys.executable, "-m", "tests.streaming_support.kafka_ingest_app",
               "--bootstrap-servers", bootstrap, "--topic", topic, "--target", str(workdir / "orders"),
               "--checkpoint", str(workdir / "checkpoint"), "--dead-letter", str(workdir / "dead_letter"),
               "--keys", ORDER_KEY, "--row-schema", ORDERS["schema"], "--max-offsets-per-trigger", str(limit),
               "--progress", str(workdir / "events.jsonl"), "--source-format", source_format]
    if kill_at:
        command += ["--kill-at", kill_at]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=QUERY_TIMEOUT_S,
                          start_new_session=True, env={**os.environ, "PYTHONPATH": str(ROOT)})


def app_events(workdir: Path) -> list[dict[str, Any]]:
    path = workdir / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.slow
@pytest.mark.parametrize("source_format", ["kafka_py", "kafka"])  # ours, Spark's connector
def test_exactly_once_across_sigkills_and_restarts(tmp_path: Path, kafka_broker: KafkaBrokerClient,
                                                   kafka_topic: Callable[..., str], source_format: str) -> None:
    """Three lives, two kills in one batch with malformed records: ``after_dead_letter`` (its
    dead-letter rows committed, its MERGE not: the restart must apply the MERGE and skip the
    dead-letter append), then, in the restart's replay of that batch, ``after_commit`` (the
    MERGE committed, Spark's offsets not: the next restart must skip the batch by its txn)."""
    topic = kafka_topic(partitions=1)  # one partition: batch b holds offsets [b*limit, (b+1)*limit)
    records, expected, acks = produce_generated(kafka_broker, topic, events=40, keys=10, seed=7)
    limit = math.ceil(len(records) / 3)
    batches = math.ceil(len(records) / limit)
    malformed = {ack.offset: r.value for r, ack in zip(records, acks, strict=True) if r.key == b"bad"}
    assert len(malformed) == len(cdc_generator.MALFORMED)
    malformed_batches = sorted({offset // limit for offset in malformed})
    kill_batch = next((b for b in malformed_batches if b >= 1), malformed_batches[0])

    def life(kill_at: str | None) -> list[dict[str, Any]]:
        """One run of the job; its events."""
        seen = len(app_events(tmp_path))
        ended = run_app(tmp_path, kafka_broker.bootstrap_servers, topic, limit, kill_at, source_format)
        assert ended.returncode == (-signal.SIGKILL if kill_at else 0), ended.stderr[-3000:]
        return app_events(tmp_path)[seen:]

    def merged(events: list[dict[str, Any]]) -> list[tuple[int, bool]]:
        return [(e["batchId"], e["skipped"]) for e in events if e["event"] == "merge"]

    def dead_letter_versions(events: list[dict[str, Any]]) -> list[int | None]:
        return [e["version"] for e in events if e["event"] == "dead_letter" and e["batchId"] == kill_batch]

    first = life(f"after_dead_letter:{kill_batch}")
    assert merged(first) == [(b, False) for b in range(kill_batch)]
    assert first[-1]["event"] == "dead_letter" and first[-1]["batchId"] == kill_batch
    assert isinstance(first[-1]["version"], int), "the dead-letter rows were committed before the kill"

    second = life(f"after_commit:{kill_batch}")
    assert merged(second) == [(kill_batch, False)], "the replay applies the MERGE the kill cut off"
    assert dead_letter_versions(second) == [None], "the replay's dead-letter append found its txn"

    third = life(None)
    assert merged(third) == [(kill_batch, True)] + [(b, False) for b in range(kill_batch + 1, batches)]
    assert dead_letter_versions(third) == [None]

    target, dead_letter = str(tmp_path / "orders"), str(tmp_path / "dead_letter")
    assert_table_equals(target, expected)
    dead = read_rows(dead_letter)
    assert sorted(r["offset"] for r in dead) == sorted(malformed), "dead letters lost or duplicated by the replays"
    assert {r["offset"]: r["value"] for r in dead} == malformed
    assert {(r["topic"], r["partition"], r["key"]) for r in dead} == {(topic, 0, b"bad")}
    app_ids = {e["appId"] for e in first + second + third if e["event"] == "merge"}
    assert len(app_ids) == 1, "the query id (the sink's app id) must survive the restarts"
    app_id = app_ids.pop()
    assert deltalake.DeltaTable(target).transaction_version(app_id) == batches - 1
    assert deltalake.DeltaTable(dead_letter).transaction_version(f"{app_id}:malformed") == malformed_batches[-1]


# ------------------------------------------------------------------------------ malformed records


def test_malformed_records_go_to_the_dead_letter_table(spark: SparkSession, kafka_broker: KafkaBrokerClient,
                                                       kafka_topic: Callable[..., str], tmp_path: Path) -> None:
    topic = kafka_topic(partitions=2)
    good = [change(1, 10, "a"), change(2, 11, "b"), change(1, 12, "a2", op="u"), change(2, 13, "b", op="d"),
            Record(value=None, key=b"2"),  # the tombstone after a delete: skipped, not malformed
            change(3, 14, "c", op="r")]
    json_errors = {  # JSON-shaped malformed values and the reason each must carry
        b'{"op": "x", "after": {"id": 7}}': "unknown op 'x'",
        b'{"op": "t", "ts_ms": 1, "source": {"lsn": 1}}':
            "truncate event: not applied (apply truncates with --apply-truncates / decode(truncates=True))",
        b'{"op": "c", "source": {"lsn": 2}}': "op 'c' without a row image ('after' for c/r/u, 'before' for d)",
        b'{"op": "d", "after": {"id": 3}, "source": {"lsn": 3}}':
            "op 'd' without a row image ('after' for c/r/u, 'before' for d)",
        b'{"schema": {"type": "struct"}, "payload": {"after": {"id": 1}}}': "envelope has no 'op' field",
    }
    not_json = b"\xff\xfe\x00 raw \x80 bytes"  # not UTF-8: the dead letter must keep the bytes as they were
    bad = [Record(value=v, key=f"bad-{i}".encode(), partition=i % 2) for i, v in enumerate(json_errors)]
    bad.append(Record(value=not_json, key=b"\x00\xff", partition=1))
    acks = kafka_broker.produce(topic, good + bad)
    bad_acks = acks[len(good):]

    config = simple_config(tmp_path, kafka_broker.bootstrap_servers, topic)
    _, progress = run_available_now(spark, config)

    assert simple_state(config.target) == {1: "a2", 3: "c"}
    assert sum(p["malformedRecords"] for p in progress) == len(bad)
    dead = {(r["partition"], r["offset"]): r for r in read_rows(str(config.dead_letter))}
    assert set(dead) == {(a.partition, a.offset) for a in bad_acks}, "exactly the malformed records, once each"
    for record, ack in zip(bad, bad_acks, strict=True):
        row = dead[(ack.partition, ack.offset)]
        assert (row["key"], row["value"], row["topic"]) == (record.key, record.value, topic)
        assert row["recorded_at"] is not None
        if record.value in json_errors:
            assert row["error"] == json_errors[record.value]
        else:
            assert row["error"], "every dead letter carries a reason"


def test_non_json_values_are_reported_as_not_json(spark: SparkSession) -> None:
    """The reason must say what is wrong: text that is not JSON is not 'an envelope without op'."""
    from pyspark.sql.types import StructType

    from streaming_merge.kafka import debezium
    from streaming_merge.kafka.source import SCHEMA

    values = [b"not json at all", b"\xff\xfe\x00 raw \x80", b'{"op": "c", "after": {"id": 1']
    records = spark.createDataFrame([(b"k", v, "t", 0, i, None, 0, []) for i, v in enumerate(values)], SCHEMA)
    _, malformed = debezium.decode(records, StructType.fromDDL(SIMPLE_SCHEMA))
    assert [r["error"] for r in malformed.orderBy("offset").collect()] == \
        ["value is not a JSON Debezium envelope"] * len(values)


def test_row_images_without_a_usable_key_go_to_the_dead_letter_table(
        spark: SparkSession, kafka_broker: KafkaBrokerClient, kafka_topic: Callable[..., str], tmp_path: Path) -> None:
    topic = kafka_topic(partitions=1)
    no_key = b'{"op": "c", "after": {"v": "orphan"}, "source": {"lsn": 5}}'
    bad_key = b'{"op": "u", "after": {"id": "seven", "v": "x"}, "source": {"lsn": 6}}'
    kafka_broker.produce(topic, [Record(value=b"not json", key=b"bad"), change(1, 1, "v1"),
                                 Record(value=no_key, key=b"?"), Record(value=bad_key, key=b"7"), change(2, 2, "v2")])
    config = simple_config(tmp_path, kafka_broker.bootstrap_servers, topic)
    run_available_now(spark, config)

    assert simple_state(config.target) == {1: "v1", 2: "v2"}
    dead = {r["offset"]: r for r in read_rows(str(config.dead_letter))}
    assert sorted(dead) == [0, 2, 3]
    assert (dead[2]["value"], dead[3]["value"]) == (no_key, bad_key)
    assert all(dead[o]["error"] for o in dead)


def test_on_malformed_fail_stops_the_query_and_leaves_the_table_unchanged(
        spark: SparkSession, kafka_broker: KafkaBrokerClient, kafka_topic: Callable[..., str], tmp_path: Path) -> None:
    topic = kafka_topic(partitions=1)
    kafka_broker.produce(topic, [change(i, i, f"v{i}") for i in (1, 2, 3)])
    config = simple_config(tmp_path, kafka_broker.bootstrap_servers, topic, on_malformed="fail")
    run_available_now(spark, config)
    version = deltalake.DeltaTable(config.target).version()
    assert simple_state(config.target) == {1: "v1", 2: "v2", 3: "v3"}

    kafka_broker.produce(topic, [change(4, 4, "v4"), Record(value=b"{oops", key=b"bad"), change(1, 5, "v1b", "u")])
    with pytest.raises(StreamingQueryException) as failure:
        run_available_now(spark, config)

    text = failure_text(failure.value)
    assert "jobs._common.MalformedRecordsError: Batch 1: 1 Kafka record(s) could not be decoded" in text
    cause = getattr(failure.value, "_cause", None)
    if cause is not None:
        assert "MalformedRecordsError" in failure_text(cause)
    assert deltalake.DeltaTable(config.target).version() == version
    assert simple_state(config.target) == {1: "v1", 2: "v2", 3: "v3"}, "nothing of the failed batch was applied"
    assert not Path(str(config.dead_letter)).exists(), "on_malformed='fail' writes no dead letters"


# ------------------------------------------------------------------------------ batches and partitions


def test_max_offsets_per_trigger_bounds_every_batch(spark: SparkSession, kafka_broker: KafkaBrokerClient,
                                                    kafka_topic: Callable[..., str], tmp_path: Path) -> None:
    topic = kafka_topic(partitions=2)
    kafka_broker.produce(topic, [change(i, 100 + i, f"v{i}") for i in range(24)])
    config = simple_config(tmp_path, kafka_broker.bootstrap_servers, topic, max_offsets_per_trigger=10)
    query, progress = run_available_now(spark, config)

    sizes = spark_input_rows(query)
    assert all(size <= 10 for size in sizes), sizes
    assert sum(sizes) == 24, sizes
    assert len([s for s in sizes if s]) >= 3, sizes
    assert [p["batchId"] for p in progress] == list(range(len(sizes)))
    assert simple_state(config.target) == {i: f"v{i}" for i in range(24)}


def test_several_partitions_keep_per_key_order(spark: SparkSession, kafka_broker: KafkaBrokerClient,
                                               kafka_topic: Callable[..., str], tmp_path: Path) -> None:
    """Key partitioning puts all events of a key in one partition, so Kafka offsets order
    them. The generated stream is ordered by LSN anyway; the extra keys 500..504 get three
    updates each in the same millisecond and without an LSN (a MySQL-like source), so only
    the offset order within their partition can tell which is last."""
    topic = kafka_topic(partitions=3)
    records, expected, acks = produce_generated(kafka_broker, topic, events=60, keys=15, seed=11)
    ties: list[Record] = []
    for key in range(500, 505):
        for step, status in enumerate(["new", "paid", "shipped"]):
            row = {"order_id": key, "customer_id": step, "amount": float(step), "status": status}
            payload = {"before": None, "after": row, "op": "c" if step == 0 else "u", "ts_ms": TIE_TS_MS,
                       "source": {"ts_ms": TIE_TS_MS, "connector": "mysql"}}
            ties.append(Record(value=json.dumps(payload).encode(), key=str(key).encode()))
        expected[key] = row
    tie_acks = kafka_broker.produce(topic, ties)

    partitions_of: dict[bytes, set[int]] = {}
    for key, ack in [(r.key, a) for r, a in zip(records, acks, strict=True)] + \
                    [(r.key, a) for r, a in zip(ties, tie_acks, strict=True)]:
        partitions_of.setdefault(key or b"", set()).add(ack.partition)
    assert all(len(p) == 1 for p in partitions_of.values()), "key partitioning: one partition per key"
    assert len({a.partition for a in acks + tie_acks}) == 3

    total = len(records) + len(ties)
    limit = math.ceil(total / 2)
    config = orders_config(tmp_path, kafka_broker.bootstrap_servers, topic, max_offsets_per_trigger=limit)
    query, _ = run_available_now(spark, config)

    assert sum(spark_input_rows(query)) == total
    rows = assert_table_equals(config.target, expected)
    for row in rows:
        assert {row["_kafka_partition"]} == partitions_of[str(row[ORDER_KEY]).encode()]
        if row[ORDER_KEY] >= 500:
            assert row["_cdc_position"] == TIE_TS_MS


def test_deletion_vectors_flag_creates_the_table_with_them_and_upserts_mark_rows(
        spark: SparkSession, kafka_broker: KafkaBrokerClient, kafka_topic: Callable[..., str], tmp_path: Path) -> None:
    """``--deletion-vectors``: the job creates its target with deletion vectors, and the second
    batch's updates and deletes of the first batch's rows are marked in DVs (merge-on-read) rather
    than rewritten; the tables, read through delta-rs' ``scan()`` (which applies the DVs), hold
    exactly the expected state and the malformed records. Two batches on one partition: one batch
    only creates the table, so it cannot show a DV. 20 keys: the second batch changes 5 of the 10
    rows the first one left (with 10 keys it changes all 8, and a file whose rows are all deleted
    is removed, not given a DV)."""
    topic = kafka_topic(partitions=1)
    records, expected, acks = produce_generated(kafka_broker, topic, events=40, keys=20, seed=7)
    malformed = {ack.offset: r.value for r, ack in zip(records, acks, strict=True) if r.key == b"bad"}
    target, dead_letter = str(tmp_path / "orders"), str(tmp_path / "dead_letter")
    config, _, _ = parse_args([
        "--bootstrap-servers", kafka_broker.bootstrap_servers, "--topics", topic, "--target", target,
        "--keys", ORDER_KEY, "--checkpoint", str(tmp_path / "checkpoint"), "--dead-letter", dead_letter,
        "--row-schema", ORDERS["schema"], "--available-now",
        "--max-offsets-per-trigger", str(math.ceil(len(records) / 2)), "--deletion-vectors"])
    assert isinstance(config, IngestConfig) and config.deletion_vectors
    query, _ = run_available_now(spark, config)

    assert [rows for rows in spark_input_rows(query) if rows] == [math.ceil(len(records) / 2), len(records) // 2]
    assert_table_equals(target, expected)
    assert {r["offset"]: r["value"] for r in read_rows(dead_letter)} == malformed
    protocol = deltalake.DeltaTable(target).protocol()
    assert "deletionVectors" in (protocol.reader_features or []), protocol
    assert "deletionVectors" in (protocol.writer_features or []), protocol
    files = load_snapshot(target).files
    assert any(f.deletion_vector is not None for f in files), "the second batch marked no row in a DV"


def test_partitions_added_while_running_are_read_from_their_start(
        spark: SparkSession, kafka_broker: KafkaBrokerClient, kafka_topic: Callable[..., str], tmp_path: Path) -> None:
    """A running query (processing-time trigger) must pick up partitions added to its topic
    and read them from offset 0, as Spark's Kafka source does. Tansu cannot add partitions."""
    try:  # probe on a scratch topic first, so a broker without CreatePartitions costs no Spark batch
        kafka_broker.add_partitions(kafka_topic(partitions=1), 2)
    except BrokerFeatureUnsupportedError as exc:
        pytest.skip(str(exc))
    topic = kafka_topic(partitions=1)
    records, state = cdc_generator.generate("orders", 40, 10, seed=23)
    half = len(records) // 2
    kafka_broker.produce(topic, [(r.key, r.value) for r in records[:half]])
    config = orders_config(tmp_path, kafka_broker.bootstrap_servers, topic, available_now=False,
                           processing_time="1 second")
    query = start(spark, config, on_progress=lambda _: None)
    try:
        wait_for(lambda: sum(spark_input_rows(query)) >= half, "the first half to be ingested")
        kafka_broker.add_partitions(topic, 3)
        acks = kafka_broker.produce(topic, [(r.key, r.value) for r in records[half:]])
        assert {a.partition for a in acks} & {1, 2}, "some records must land in the new partitions"
        wait_for(lambda: sum(spark_input_rows(query)) >= len(records), "the second half to be ingested")
    finally:
        query.stop()
    ends: dict[str, int] = {}
    for progress in query.recentProgress:
        end = progress["sources"][0]["endOffset"]
        ends.update((json.loads(end) if isinstance(end, str) else end).get(topic, {}))
    assert {int(p) for p in ends} == {0, 1, 2}
    assert sum(spark_input_rows(query)) == len(records)
    assert_table_equals(config.target, cdc_generator.expected_rows(state))


def start_with_pattern(spark: SparkSession, config: IngestConfig, pattern: str,
                       on_progress: Callable[[dict[str, Any]], None]) -> StreamingQuery:
    """``jobs.kafka_cdc_ingest.start`` with ``subscribePattern`` instead of ``subscribe``
    (the job has no pattern option); the batch function is the job's own."""
    register(spark)
    function, _ = batch_function(config, on_progress)
    return (spark.readStream.format("kafka_py")
            .option("kafka.bootstrap.servers", config.bootstrap_servers)
            .option("subscribePattern", pattern)
            .option("startingOffsets", config.starting_offsets)
            .load().writeStream.foreachBatch(function)
            .option("checkpointLocation", config.checkpoint)
            .trigger(availableNow=True).start())


def test_subscribe_pattern_picks_up_new_topics(spark: SparkSession, kafka_broker: KafkaBrokerClient,
                                               kafka_topic: Callable[..., str], tmp_path: Path) -> None:
    """A topic created between two runs of the same checkpoint is read from its start;
    the topics read before continue where they stopped; non-matching topics are ignored."""
    base = f"cdc{uuid.uuid4().hex[:8]}"
    pattern = re.escape(base) + r"\.shard\d+-.*"
    first = kafka_topic(prefix=f"{base}.shard0")
    other = kafka_topic(prefix=f"{base}x.shard9")  # does not match the pattern
    kafka_broker.produce(first, [change(i, i, f"v{i}") for i in range(5)])
    kafka_broker.produce(other, [change(99, 99, "not mine")])
    config = simple_config(tmp_path, kafka_broker.bootstrap_servers, "(pattern)")

    query = start_with_pattern(spark, config, pattern, lambda _: None)
    await_query(query)
    assert simple_state(config.target) == {i: f"v{i}" for i in range(5)}

    second = kafka_topic(prefix=f"{base}.shard1")
    kafka_broker.produce(second, [change(10, 20, "x10"), change(11, 21, "x11"), change(0, 30, "v0b", "u")])
    kafka_broker.produce(first, [change(5, 40, "v5"), change(1, 41, "v1", "d")])
    query = start_with_pattern(spark, config, pattern, lambda _: None)
    await_query(query)

    assert sum(spark_input_rows(query)) == 5, "only the new records: the old topic resumes at its offsets"
    assert simple_state(config.target) == {0: "v0b", 2: "v2", 3: "v3", 4: "v4", 5: "v5", 10: "x10", 11: "x11"}


# ------------------------------------------------------------------------------ startingOffsets and options


@pytest.mark.parametrize("how", ["earliest", "latest"])
def test_starting_offsets_earliest_and_latest(spark: SparkSession, kafka_broker: KafkaBrokerClient,
                                              kafka_topic: Callable[..., str], tmp_path: Path, how: str) -> None:
    """``startingOffsets`` applies to a new checkpoint only: records produced after the first
    run are read by the next run either way (with ``latest`` the first run reads nothing
    but still fixes the starting point in the checkpoint)."""
    topic = kafka_topic(partitions=2)
    kafka_broker.produce(topic, [change(i, i, f"old{i}") for i in range(3)])
    config = simple_config(tmp_path, kafka_broker.bootstrap_servers, topic, starting_offsets=how)
    query, _ = run_available_now(spark, config)
    assert sum(spark_input_rows(query)) == (3 if how == "earliest" else 0)

    kafka_broker.produce(topic, [change(i, i, f"new{i}") for i in range(10, 13)])
    query, _ = run_available_now(spark, config)
    assert sum(spark_input_rows(query)) == 3
    expected = {i: f"new{i}" for i in range(10, 13)}
    if how == "earliest":
        expected.update({i: f"old{i}" for i in range(3)})
    assert simple_state(config.target) == expected


def test_starting_offsets_json(spark: SparkSession, kafka_broker: KafkaBrokerClient,
                               kafka_topic: Callable[..., str], tmp_path: Path) -> None:
    """Spark's JSON form: an offset per partition, -2 = earliest, -1 = latest."""
    topic = kafka_topic(partitions=3)
    for partition in range(3):
        kafka_broker.produce(topic, [change(10 * partition + i, 10 * partition + i, f"p{partition}o{i}")
                                     for i in range(4)], partition=partition)
    starting = json.dumps({topic: {"0": 2, "1": -2, "2": -1}})
    config = simple_config(tmp_path, kafka_broker.bootstrap_servers, topic, starting_offsets=starting)
    run_available_now(spark, config)
    assert simple_state(config.target) == {2: "p0o2", 3: "p0o3", 10: "p1o0", 11: "p1o1", 12: "p1o2", 13: "p1o3"}


@pytest.mark.parametrize(("overrides", "message"), [
    ({"starting_offsets": "bogus"},
     "KafkaSourceError: startingOffsets must be 'earliest', 'latest' or JSON like {\"topic\":{\"0\":23}}, "
     "got 'bogus'"),
    ({"max_offsets_per_trigger": -5}, "KafkaSourceError: maxOffsetsPerTrigger must be a positive integer, got '-5'"),
    ({"topics": "no-such-topic-e2e"}, "KafkaSourceError: Subscribed topic(s) ['no-such-topic-e2e'] do not exist"),
], ids=["startingOffsets", "maxOffsetsPerTrigger", "missing-topic"])
def test_bad_source_options_fail_the_job_with_a_clear_message(
        spark: SparkSession, kafka_broker: KafkaBrokerClient, kafka_topic: Callable[..., str], tmp_path: Path,
        overrides: dict[str, Any], message: str) -> None:
    topic = kafka_topic(partitions=1)
    kafka_broker.produce(topic, [change(1, 1, "v1")])
    config = simple_config(tmp_path, kafka_broker.bootstrap_servers, **{"topics": topic, **overrides})
    with pytest.raises(StreamingQueryException) as failure:
        run_available_now(spark, config)
    assert message in failure_text(failure.value)
    assert not Path(config.target).exists()


BASE_OPTIONS = {"kafka.bootstrap.servers": "127.0.0.1:9", "subscribe": "t"}
ONE_OF = "Set exactly one of the options 'subscribe' (comma list) or 'subscribePattern'."


@pytest.mark.parametrize(("options", "message"), [
    ({"subscribe": "t"}, "Option 'kafka.bootstrap.servers' is required (host:port[,host:port])."),
    ({**BASE_OPTIONS, "subscribePattern": "t.*"}, ONE_OF),
    ({"kafka.bootstrap.servers": "h:1"}, ONE_OF),
    ({**BASE_OPTIONS, "maxOffsetsPerTrigger": "0"}, "maxOffsetsPerTrigger must be a positive integer, got '0'."),
    ({**BASE_OPTIONS, "maxOffsetsPerTrigger": "-1"}, "maxOffsetsPerTrigger must be a positive integer, got '-1'."),
    ({**BASE_OPTIONS, "maxOffsetsPerTrigger": "ten"}, "maxOffsetsPerTrigger must be a positive integer, got 'ten'."),
    ({**BASE_OPTIONS, "maxOffsetsPerTrigger": "1.5"}, "maxOffsetsPerTrigger must be a positive integer, got '1.5'."),
    pytest.param({**BASE_OPTIONS, "failOnDataLoss": "maybe"}, "failOnDataLoss must be 'true' or 'false', got 'maybe'"),
])
def test_option_errors(options: dict[str, str], message: str) -> None:
    with pytest.raises(KafkaSourceError) as failure:
        KafkaOptions.parse(options)
    assert message in str(failure.value)


@pytest.mark.parametrize(("value", "expected"), [("false", False), ("FALSE", False), ("true", True), ("True", True)])
def test_fail_on_data_loss_values(value: str, expected: bool) -> None:
    options = KafkaOptions.parse({**BASE_OPTIONS, "FAILONDATALOSS": value, "MaxOffsetsPerTrigger": "7"})
    assert (options.fail_on_data_loss, options.max_offsets_per_trigger) == (expected, 7)
    assert KafkaOptions.parse(BASE_OPTIONS).fail_on_data_loss is True  # Spark's default


@pytest.mark.parametrize("starting", ['{"TOPIC": 5}', '{"TOPIC": {"0": "x"}}', '[1, 2]'])
def test_starting_offsets_json_of_the_wrong_shape(kafka_broker: KafkaBrokerClient, kafka_topic: Callable[..., str],
                                                 starting: str) -> None:
    topic = kafka_topic(partitions=1)
    with pytest.raises(KafkaSourceError, match="startingOffsets must be"):
        options = KafkaOptions.parse({"kafka.bootstrap.servers": kafka_broker.bootstrap_servers, "subscribe": topic,
                                      "startingOffsets": starting.replace("TOPIC", topic)})
        reader = KafkaStreamReader(options)
        try:
            reader.initialOffset()
        finally:
            reader.stop()
