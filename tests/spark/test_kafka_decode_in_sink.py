"""The Kafka job decodes a batch's records inside the MergeSink's copy of the batch
(debezium.decode_observed) rather than into a checkpoint of its own that the sink then copies
again: one Spark job fewer a batch, the same table and the same counts. The records here are a
batch DataFrame of the source's columns (no broker: a batch without malformed records never
goes back to Kafka); tests/kafka/test_ingest_e2e.py runs the path against a broker, with
malformed records, dead letters, ``--on-malformed fail`` and kills."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from jobs.kafka_cdc_ingest import IngestConfig, batch_function
from streaming_merge.kafka import source
from tests.job_count import jobs_of
from tests.spark.test_deletion_vectors import delta_rs_rows


def _records(spark: SparkSession, events: list[tuple[int, str, str, int]], first_offset: int) -> DataFrame:
    """Debezium records (id, v, op, lsn) as the kafka_py source's columns, one partition."""
    rows = []
    for i, (key, value, op, lsn) in enumerate(events):
        image = {"id": key, "v": value}
        envelope = {"op": op, "before": image if op == "d" else None, "after": None if op == "d" else image,
                    "source": {"lsn": lsn}, "ts_ms": lsn}
        rows.append((str(key).encode(), json.dumps(envelope).encode(), "orders", 0, first_offset + i, None, 0, []))
    return spark.createDataFrame(rows, source.SCHEMA)


def test_a_batch_is_decoded_in_the_sinks_copy_one_spark_job_fewer_than_through_a_checkpoint(
        spark: SparkSession, tmp_path: Path) -> None:
    batches = [_records(spark, [(1, "a", "c", 10), (2, "b", "c", 11), (3, "c", "c", 12)], 0),
               _records(spark, [(1, "a2", "u", 20), (2, "b", "d", 21), (4, "d", "c", 22), (1, "a3", "u", 23)], 3)]
    jobs: dict[str, list[int]] = {}
    progress: dict[str, list[dict[str, Any]]] = {}
    for name, source_format in (("in_sink", "kafka_py"), ("checkpointed", "kafka")):
        # "kafka" (Spark's own connector) never reaches the broker here: the batches are given.
        config = IngestConfig(bootstrap_servers="127.0.0.1:9", topics="orders", target=str(tmp_path / name),
                              keys=["id"], checkpoint=str(tmp_path / f"{name}-checkpoint"),
                              row_schema="id long, v string", source_format=source_format)
        progress[name] = []
        run, _ = batch_function(config, progress[name].append)
        # As inside a streaming query's foreachBatch: the sink's txn app id is the query's id.
        spark.sparkContext.setLocalProperty("sql.streaming.queryId", f"query-{name}")
        try:
            jobs[name] = [jobs_of(spark, functools.partial(run, records, batch_id))[0]
                          for batch_id, records in enumerate(batches)]
        finally:
            spark.sparkContext.setLocalProperty("sql.streaming.queryId", None)  # type: ignore[arg-type]

    expected = {(1, "a3"), (3, "c"), (4, "d")}
    for name in jobs:
        assert {row[:2] for row in delta_rs_rows(tmp_path / name)} == expected, name  # (id, v) lead
        assert [(p["kafkaRecords"], p["malformedRecords"], p["tombstones"]) for p in progress[name]] == \
            [(3, 0, 0), (4, 0, 0)], name
    def counts(name: str) -> list[dict[str, int]]:  # of rows and files (not times, nor bytes)
        return [{k: v for k, v in p["metrics"].items() if "Rows" in k or "Files" in k} for p in progress[name]]

    assert counts("in_sink") == counts("checkpointed")
    assert counts("in_sink")[1]["numTargetRowsInserted"] == 1
    assert jobs["in_sink"][1] == jobs["checkpointed"][1] - 1, jobs
