"""Debezium decoding on hand-made Kafka records, without a broker: every kind of change event
and every kind of malformed record, checked exactly; the decode is one Spark job whose copy
serves both the events and the dead letters; and the ingestion job's batch function restages
a batch whose decoded copy lost its blocks.

Why here and not only end to end (tests/kafka/test_ingest_e2e.py): a micro-batch through a
broker costs seconds, and what must hold per record (reason texts, sequence positions, raw
bytes kept) is cheapest to pin down on one small static batch.
"""

from __future__ import annotations

import json
import threading
import uuid
from pathlib import Path
from typing import Any

import deltalake
import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StringType, StructField, StructType

import jobs.kafka_cdc_ingest as job
from streaming_merge.kafka import debezium
from streaming_merge.kafka.source import SCHEMA
from streaming_merge.merge.materialize import checkpoint_rdd_id
from streaming_merge.spark.profile import profiling
from tests.job_count import jobs_of

ROW_SCHEMA = StructType([StructField("id", LongType()), StructField("v", StringType())])
TOPIC = "db.public.items"
NO_IMAGE = "' without a row image ('after' for c/r/u, 'before' for d)"


def envelope(op: str, *, before: dict[str, Any] | None = None, after: dict[str, Any] | None = None,
             source: dict[str, Any] | None = None, ts_ms: int | None = None, wrapped: bool = False) -> bytes:
    payload: dict[str, Any] = {"before": before, "after": after, "op": op}
    if source is not None:
        payload["source"] = source
    if ts_ms is not None:
        payload["ts_ms"] = ts_ms
    body = {"schema": {"type": "struct", "name": "envelope"}, "payload": payload} if wrapped else payload
    return json.dumps(body).encode()


# (partition, offset, key, value, expected event row or None for a tombstone). An event row is
# (id, v, _cdc_op, _cdc_position, _cdc_ts_ms, _kafka_partition, _kafka_offset).
GOOD: list[tuple[int, int, bytes | None, bytes | None, tuple[Any, ...] | None]] = [
    (0, 0, b"1", envelope("c", after={"id": 1, "v": "a"}, source={"lsn": 10, "ts_ms": 5}, ts_ms=1000),
     (1, "a", "c", 10, 1000, 0, 0)),
    (0, 1, b"1", envelope("u", before={"id": 1, "v": "a"}, after={"id": 1, "v": "b"}, source={"lsn": 12},
                          ts_ms=1001, wrapped=True),
     (1, "b", "u", 12, 1001, 0, 1)),
    # no lsn: source.ts_ms is the position
    (0, 2, b"2", envelope("d", before={"id": 2, "v": "x"}, source={"ts_ms": 500}, ts_ms=1002),
     (2, "x", "d", 500, 1002, 0, 2)),
    (0, 3, b"2", None, None),  # the tombstone after a delete: skipped, not malformed
    # no source: the envelope's ts_ms is the position
    (1, 0, b"3", envelope("r", after={"id": 3, "v": None}, ts_ms=777, wrapped=True), (3, None, "r", 777, 777, 1, 0)),
    (1, 1, b"4", envelope("c", after={"id": 4, "v": "n"}), (4, "n", "c", None, None, 1, 1)),
    # Records the one typed parse rejects but the step-by-step reading accepts, as it always
    # did: a mistyped image that the op does not use, a payload sent as a JSON string, junk
    # outside a wrapped payload, a row image sent as a JSON string.
    (1, 2, b"5", envelope("c", before={"id": "not a number"}, after={"id": 5, "v": "e"}, source={"lsn": 13}),
     (5, "e", "c", 13, None, 1, 2)),
    (1, 3, b"6", json.dumps({"schema": {}, "payload": json.dumps(
        {"op": "c", "after": {"id": 6, "v": "s"}, "source": {"lsn": 14}})}).encode(),
     (6, "s", "c", 14, None, 1, 3)),
    (1, 4, b"7", json.dumps({"payload": {"op": "u", "after": {"id": 7, "v": "j"}, "source": {"lsn": 15}},
                             "ts_ms": "junk"}).encode(),
     (7, "j", "u", 15, None, 1, 4)),
    (1, 5, b"8", json.dumps({"op": "c", "after": json.dumps({"id": 8, "v": "q"})}).encode(),
     (8, "q", "c", None, None, 1, 5)),
]

# (offset in partition 2, key, value, reason)
MALFORMED: list[tuple[int, bytes | None, bytes, str]] = [
    (0, b"bad-0", b"not json at all", debezium.NOT_AN_ENVELOPE),
    (1, b"\x00\xff", b"\xff\xfe\x00 raw \x80 bytes", debezium.NOT_AN_ENVELOPE),  # not UTF-8: kept as it was
    (2, b"bad-2", b'{"op": "c", "after": {"id": 1', debezium.NOT_AN_ENVELOPE),  # truncated
    (3, b"bad-3", b'{"op": "c", "after": {"id": 1}, "ts_ms": "soon"}', debezium.NOT_AN_ENVELOPE),
    (4, None, b"", debezium.NOT_AN_ENVELOPE),  # an empty value is not a tombstone
    (5, b"bad-5", b'{"schema": {"type": "struct"}, "payload": {"after": {"id": 1}}}', debezium.NO_OP),
    (6, b"bad-6", b'{"op": "t", "ts_ms": 1, "source": {"lsn": 1}}', debezium.TRUNCATE),
    (7, b"bad-7", b'{"op": "x", "after": {"id": 7}}', "unknown op 'x'"),
    (8, b"bad-8", b'{"op": "c", "source": {"lsn": 2}}', "op 'c" + NO_IMAGE),
    (9, b"bad-9", b'{"op": "d", "after": {"id": 3}, "source": {"lsn": 3}}', "op 'd" + NO_IMAGE),
    (10, b"bad-10", b'{"op": "u", "after": {"id": "seven", "v": "x"}}', debezium.IMAGE_MISMATCH),
    (11, b"bad-11", b'{"op": "c", "after": {"id": 1.5}}', debezium.IMAGE_MISMATCH),
    (12, b"bad-12", b'{"op": "c", "after": {"v": "orphan"}}', "row image has NULL in key column(s) id"),
    (13, b"bad-13", b'{"op": "c", "after": {}}', "row image has NULL in key column(s) id"),
]


def kafka_records(spark: SparkSession) -> DataFrame:
    rows = [(key, value, TOPIC, partition, offset, None, 0, []) for partition, offset, key, value, _ in GOOD]
    rows += [(key, value, TOPIC, 2, offset, None, 0, []) for offset, key, value, _ in MALFORMED]
    return spark.createDataFrame(rows, SCHEMA)


def expected_events() -> list[tuple[Any, ...]]:
    return sorted((e for *_, e in GOOD if e is not None), key=lambda e: (e[5], e[6]))



def test_every_event_kind_and_every_malformed_kind_is_decoded_exactly(spark: SparkSession) -> None:
    decoded = debezium.decode_batch(kafka_records(spark), ROW_SCHEMA, keys=["id"])
    try:
        events = decoded.events.orderBy(debezium.PARTITION, debezium.OFFSET)
        assert events.columns == ["id", "v", *debezium.METADATA_COLUMNS]
        assert [tuple(r) for r in events.collect()] == expected_events()

        malformed = decoded.malformed.orderBy("offset").collect()
        assert decoded.malformed.columns == list(debezium.DEAD_LETTER_COLUMNS)
        assert [(r["key"], r["value"], r["error"]) for r in malformed] == [(k, v, e) for _, k, v, e in MALFORMED]
        assert {(r["topic"], r["partition"]) for r in malformed} == {(TOPIC, 2)}
        assert [r["offset"] for r in malformed] == [o for o, *_ in MALFORMED]
        assert all(r["recorded_at"] is not None for r in malformed)

        assert (decoded.num_records, decoded.num_tombstones, decoded.num_malformed, decoded.num_events) == \
            (len(GOOD) + len(MALFORMED), 1, len(MALFORMED), len(expected_events()))
    finally:
        decoded.release()


def test_lazy_decode_gives_the_same_frames(spark: SparkSession) -> None:
    events, malformed = debezium.decode(kafka_records(spark), ROW_SCHEMA, keys=["id"])
    assert sorted(tuple(r) for r in events.collect()) == sorted(expected_events(), key=lambda e: e)
    assert sorted((r["offset"], r["error"]) for r in malformed.collect()) == [(o, e) for o, _, _, e in MALFORMED]


def test_a_decode_observed_by_its_readers_job_counts_and_finds_the_malformed_records(spark: SparkSession) -> None:
    """decode_observed: the events' first reader's job decodes and counts, and observes the
    malformed records themselves (small ones: all of these), so that nothing is read again."""
    records = kafka_records(spark)
    decode = debezium.decode_observed(records, ROW_SCHEMA, keys=["id"])
    jobs, events = jobs_of(spark, lambda: decode.events.collect())
    assert jobs == 1
    assert sorted(tuple(r) for r in events) == sorted(expected_events())
    assert decode.counts() == (len(GOOD) + len(MALFORMED), 1, len(MALFORMED))
    assert decode.malformed_ranges() == [], "no record too large to be observed"
    observed, dead = jobs_of(spark, lambda: decode.observed_malformed(spark).collect())
    assert observed == 0, "the observed dead letters are the driver's rows"
    assert sorted((r["partition"], r["offset"], r["error"]) for r in dead) == [(2, o, e) for o, _, _, e in MALFORMED]
    again = records.filter(F.col("partition") == 2)  # a re-read returns only records too large to be observed
    assert decode.malformed(again).collect() == []


def test_the_decode_is_one_job_and_both_frames_read_its_copy(spark: SparkSession) -> None:
    records = kafka_records(spark)
    # Staging plan: one typed parse per record plus the three step-by-step parses that only
    # records rejected by the first one reach; each appears once (nothing copied per use).
    staged_plan = debezium._stage(ROW_SCHEMA, ["id"])(records)._jdf.queryExecution().executedPlan().toString()
    assert staged_plan.count("from_json") == 4

    jobs, decoded = jobs_of(spark, lambda: debezium.decode_batch(records, ROW_SCHEMA, keys=["id"]))
    try:
        assert jobs == 1, f"{jobs} Spark jobs to decode one batch (decode, counts and copy should be one)"
        for frame in (decoded.events, decoded.malformed):
            plan = frame._jdf.queryExecution().executedPlan().toString()
            assert "from_json" not in plan, plan
            assert checkpoint_rdd_id(frame) == checkpoint_rdd_id(decoded.staged)
        assert decoded.events.count() == len(expected_events())
        assert decoded.malformed.count() == len(MALFORMED)
    finally:
        decoded.release()


def test_an_empty_batch_decodes_to_nothing(spark: SparkSession) -> None:
    decoded = debezium.decode_batch(spark.createDataFrame([], SCHEMA), ROW_SCHEMA, keys=["id"])
    try:
        assert (decoded.num_records, decoded.num_tombstones, decoded.num_malformed) == (0, 0, 0)
        assert decoded.events.count() == 0 and decoded.malformed.count() == 0
    finally:
        decoded.release()


@pytest.fixture()
def query_id(spark: SparkSession) -> Any:
    """The batch function called directly, as Spark would inside a streaming query."""
    context = spark.sparkContext
    value = f"test-query-{uuid.uuid4().hex[:8]}"
    context.setLocalProperty("sql.streaming.queryId", value)
    yield value
    context.setLocalProperty("sql.streaming.queryId", None)  # type: ignore[arg-type]


def test_a_batch_whose_decoded_copy_is_lost_is_staged_again(spark: SparkSession, tmp_path: Path, query_id: str,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The dead-letter append commits, then the decoded copy loses its blocks before the
    MERGE: the sink cannot heal that (its retries read the same copy), so the job decodes the
    batch again; the dead-letter rows are not appended twice and the MERGE is applied once.
    The append runs beside the MERGE, so the sink here starts each batch only once the append
    it runs beside has returned: that interleaving is the one under test. The batch goes the
    checkpointed way (Spark's own connector's; also a new table's first batch and a replay's):
    decoded in the sink's copy, a lost block is the sink's to heal (its retries copy again)."""
    config = job.IngestConfig(bootstrap_servers="unused:9092", topics=TOPIC, target=str(tmp_path / "items"),
                              keys=["id"], checkpoint=str(tmp_path / "chk"), dead_letter=str(tmp_path / "dead"),
                              row_schema="id long, v string", source_format="kafka")
    appended: list[int | None] = []
    append_returned = threading.Semaphore(0)
    original = job.append_rows

    def append_then_lose_the_copy(spark_: SparkSession, df: DataFrame, path: str, app_id: str,
                                  version: int) -> int | None:
        try:
            result = original(spark_, df, path, app_id, version)
            if not appended:
                spark_.sparkContext._jsc.sc().unpersistRDD(checkpoint_rdd_id(df), True)
            appended.append(result)
            return result
        finally:
            append_returned.release()

    class SinkAfterTheAppend(job.MergeSink):  # type: ignore[name-defined,misc]
        def __call__(self, batch_df: DataFrame, batch_id: int, **kwargs: Any) -> None:
            assert append_returned.acquire(timeout=120), "the dead-letter append never returned"
            super().__call__(batch_df, batch_id, **kwargs)

    monkeypatch.setattr(job, "append_rows", append_then_lose_the_copy)
    monkeypatch.setattr(job, "MergeSink", SinkAfterTheAppend)
    progress: list[dict[str, Any]] = []
    run, _ = job.batch_function(config, progress.append)
    run(kafka_records(spark), 0)

    assert appended[0] is not None and appended[1:] == [None], "dead letters committed once, skipped on the rerun"
    dead = deltalake.DeltaTable(str(config.dead_letter)).to_pyarrow_table().to_pylist()
    assert sorted((r["offset"], r["error"]) for r in dead) == [(o, e) for o, _, _, e in MALFORMED]
    rows = deltalake.DeltaTable(config.target).to_pyarrow_table().to_pylist()
    latest: dict[int, tuple[Any, ...]] = {}
    for event in expected_events():  # within this batch the position orders the events of id 1
        latest[event[0]] = event
    assert {r["id"]: r["v"] for r in rows} == {k: e[1] for k, e in latest.items() if e[2] != "d"}
    assert len(rows) == len({r["id"] for r in rows})
    assert [(p["batchId"], p["malformedRecords"], p["kafkaRecords"], p["tombstones"]) for p in progress] == \
        [(0, len(MALFORMED), len(GOOD) + len(MALFORMED), 1)]
    assert deltalake.DeltaTable(config.target).transaction_version(query_id) == 0


def test_a_new_table_without_a_row_schema_takes_the_inferred_one(spark: SparkSession, tmp_path: Path,
                                                                 query_id: str) -> None:
    """No --row-schema and no table yet: the schema is inferred from the first batch's row
    images (that batch is read once more for it), then the batch is decoded with it."""
    config = job.IngestConfig(bootstrap_servers="unused:9092", topics=TOPIC, target=str(tmp_path / "items"),
                              keys=["id"], checkpoint=str(tmp_path / "chk"), dead_letter=str(tmp_path / "dead"))
    clean = [(key, value, TOPIC, partition, offset, None, 0, []) for partition, offset, key, value, _ in GOOD[:5]]
    progress: list[dict[str, Any]] = []
    run, _ = job.batch_function(config, progress.append)
    run(spark.createDataFrame(clean, SCHEMA), 0)

    table = deltalake.DeltaTable(config.target)
    assert [(f.name, f.type.type) for f in table.schema().fields][:2] == [("id", "long"), ("v", "string")]
    assert {r["id"]: r["v"] for r in table.to_pyarrow_table().to_pylist()} == {1: "b", 3: None}
    assert [(p["malformedRecords"], p["tombstones"]) for p in progress] == [(0, 1)]


def test_once_its_tables_exist_a_batch_loads_no_delta_log_from_scratch(spark: SparkSession, tmp_path: Path,
                                                                      query_id: str) -> None:
    """The job reads the table's schema every batch (it is the decode's contract) and its sink
    reads the target and the tombstones: all three follow the logs from the batch before,
    reading only the commits since, instead of replaying them from the last checkpoint."""
    config = job.IngestConfig(bootstrap_servers="unused:9092", topics=TOPIC, target=str(tmp_path / "items"),
                              keys=["id"], checkpoint=str(tmp_path / "chk"), row_schema="id long, v string")
    clean = [(key, value, TOPIC, partition, offset, None, 0, []) for partition, offset, key, value, _ in GOOD]
    progress: list[dict[str, Any]] = []
    run, _ = job.batch_function(config, progress.append)
    for batch_id in range(2):
        run(spark.createDataFrame(clean, SCHEMA), batch_id)
    with profiling() as profile:
        run(spark.createDataFrame(clean, SCHEMA), 2)
    assert (profile.log_loads, profile.log_updates > 0) == (0, True)
    assert deltalake.DeltaTable(config.target).transaction_version(query_id) == 2
    assert deltalake.DeltaTable(f"{config.target}_tombstones").version() >= 0
    assert [p["batchId"] for p in progress] == [0, 1, 2]


def test_the_decode_plan_is_built_once_per_schema_and_options(spark: SparkSession) -> None:
    """A stream decodes every batch with the same schema: the plan's expressions (hundreds
    of JVM round trips) are built by the first batch and reused; other options get their own."""
    first = debezium._plan_for(kafka_records(spark), ROW_SCHEMA, ["id"], False)
    assert debezium._plan_for(kafka_records(spark), ROW_SCHEMA, ["id"], False) is first
    assert debezium._plan_for(kafka_records(spark), ROW_SCHEMA, ["id"], True) is not first
    assert debezium._plan_for(kafka_records(spark), ROW_SCHEMA, [], False) is not first
    decoded = debezium.decode_batch(kafka_records(spark), ROW_SCHEMA, keys=["id"])
    try:
        assert [tuple(r) for r in decoded.events.collect()] == expected_events()
    finally:
        decoded.release()
