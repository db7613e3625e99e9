"""The Kafka ingestion job with SCD type 2 and Debezium truncates (``--scd-type 2``,
``--apply-truncates``), on hand-made Kafka records without a broker: the single-table batch
function and the multi-table one, plus the CLI's checks of the options."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import deltalake
import pytest
from pyspark.sql import DataFrame, SparkSession

from jobs._database import DatabaseBatches, DatabaseConfig
from jobs.kafka_cdc_ingest import IngestConfig, batch_function, parse_args
from streaming_merge.kafka import debezium
from streaming_merge.kafka.source import SCHEMA
from streaming_merge.streaming.scd2 import END_AT, START_AT

pytestmark = pytest.mark.spark


@pytest.fixture()
def query_id(spark: SparkSession) -> Iterator[str]:
    context = spark.sparkContext
    value = f"history-{uuid.uuid4().hex[:8]}"
    context.setLocalProperty("sql.streaming.queryId", value)
    yield value
    context.setLocalProperty("sql.streaming.queryId", None)  # type: ignore[arg-type]


def change(key: int, lsn: int, name: str, op: str = "c") -> tuple[bytes, bytes]:
    image = {"id": key, "name": name}
    payload = {"before": image if op == "d" else None, "after": None if op == "d" else image, "op": op,
               "ts_ms": 1_700_000_000_000 + lsn, "source": {"lsn": lsn}}
    return json.dumps({"id": key}).encode(), json.dumps(payload).encode()


def truncate(lsn: int) -> tuple[None, bytes]:
    return None, json.dumps({"op": "t", "ts_ms": 1_700_000_000_000 + lsn, "source": {"lsn": lsn}}).encode()


def records(spark: SparkSession, by_topic: dict[str, list[tuple[bytes | None, bytes]]], start: int = 0) -> DataFrame:
    rows = [(key, value, topic, 0, start + offset, None, 0, [])
            for topic, items in by_topic.items() for offset, (key, value) in enumerate(items)]
    return spark.createDataFrame(rows, SCHEMA)


def versions(path: str) -> list[tuple[Any, ...]]:
    """(id, name, start position, end position) per history row, in order."""
    rows = deltalake.DeltaTable(path).to_pyarrow_table().to_pylist()
    found = [(r["id"], r["name"], r[START_AT][debezium.POSITION],
              None if r[END_AT] is None else r[END_AT][debezium.POSITION]) for r in rows]
    return sorted(found, key=lambda v: (v[0], v[2]))


def test_single_table_job_keeps_history_and_applies_a_truncate(spark: SparkSession, tmp_path: Path,
                                                               query_id: str) -> None:
    target = str(tmp_path / "customers")
    config = IngestConfig(bootstrap_servers="unused:9092", topics="t", target=target, keys=["id"],
                          checkpoint=str(tmp_path / "chk"), dead_letter=str(tmp_path / "dlq"),
                          row_schema="id long, name string", unavailable_value=None, scd_type=2,
                          apply_truncates=True)
    progress: list[dict[str, Any]] = []
    run, _ = batch_function(config, progress.append)
    run(records(spark, {"t": [change(1, 10, "a"), change(2, 11, "b"), change(1, 12, "a2", "u")]}), 0)
    run(records(spark, {"t": [truncate(20), change(3, 21, "c"), change(1, 15, "late", "u")]}, start=3), 1)
    assert versions(target) == [(1, "a", 10, 12), (1, "a2", 12, 15), (1, "late", 15, 20), (2, "b", 11, 20),
                                (3, "c", 21, None)]
    assert progress[-1]["numTruncates"] == 1 and progress[-1]["malformedRecords"] == 0
    assert not deltalake.DeltaTable.is_deltatable(str(tmp_path / "dlq"))
    # a late change older than the truncate, in a later batch, ends at the truncate
    run(records(spark, {"t": [change(4, 18, "d")]}, start=6), 2)
    assert (4, "d", 18, 20) in versions(target)


@pytest.mark.parametrize("scd_type", [1, 2])
def test_database_job_truncates_one_table_from_a_keyless_batch(spark: SparkSession, tmp_path: Path,
                                                               query_id: str, scd_type: int) -> None:
    """The truncate is a table's only record in its batch: the keys come from the earlier batch."""
    config = DatabaseConfig(bootstrap_servers="unused:9092", subscribe_pattern=".*",
                            target_root=str(tmp_path / "lake"), checkpoint=str(tmp_path / "chk"),
                            dead_letter=str(tmp_path / "dlq"), unavailable_value=None, apply_truncates=True,
                            scd_type=scd_type)
    a, b = "db.inv.a", "db.inv.b"
    progress: list[dict[str, Any]] = []
    run = DatabaseBatches(config, progress.append)
    run(records(spark, {a: [change(1, 10, "x"), change(2, 11, "y")], b: [change(1, 12, "z")]}), 0)
    run(records(spark, {a: [truncate(20)], b: [change(2, 21, "w")]}, start=2), 1)
    table_a, table_b = str(tmp_path / "lake/inv/a"), str(tmp_path / "lake/inv/b")
    if scd_type == 1:
        assert deltalake.DeltaTable(table_a).to_pyarrow_table().num_rows == 0
        assert sorted((r["id"], r["name"]) for r in deltalake.DeltaTable(table_b).to_pyarrow_table().to_pylist()) == [
            (1, "z"), (2, "w")]
    else:
        assert versions(table_a) == [(1, "x", 10, 20), (2, "y", 11, 20)]
        assert versions(table_b) == [(1, "z", 12, None), (2, "w", 21, None)]
    assert not deltalake.DeltaTable.is_deltatable(str(tmp_path / "dlq"))


def test_cli_history_options(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["--bootstrap-servers", "b:9092", "--topics", "t", "--target", "/x", "--keys", "id",
            "--checkpoint", "/c"]
    config, _, _ = parse_args([*base, "--scd-type", "2", "--apply-truncates", "--ignore-null-updates"])
    assert isinstance(config, IngestConfig)  # SCD 2 takes partial updates, Debezium's placeholder by default
    assert (config.scd_type, config.apply_truncates, config.ignore_null_updates, config.unavailable_value) == (
        2, True, True, debezium.UNAVAILABLE_VALUE)
    config, _, _ = parse_args(base)
    assert isinstance(config, IngestConfig)
    assert (config.scd_type, config.apply_truncates, config.unavailable_value) == (1, False,
                                                                                   debezium.UNAVAILABLE_VALUE)
    config, _, _ = parse_args([*base, "--scd-type", "2", "--track-history-except", "_cdc_op, note"])
    assert isinstance(config, IngestConfig) and config.track_history_except == ["_cdc_op", "note"]
    for bad, message in (([*base, "--track-history-except", "x"], "needs --scd-type 2"),):
        with pytest.raises(SystemExit) as raised:
            parse_args(bad)
        assert raised.value.code == 2
        assert message in capsys.readouterr().err
