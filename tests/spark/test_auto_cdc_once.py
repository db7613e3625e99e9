"""``create_auto_cdc_flow(..., once=True)`` (issue 41 part 6): Databricks' one-time flow, a
backfill of a batch source (a DataFrame or a table) applied once per flow name and skipped on
later runs; a live flow into the same table afterwards applies newer events on top, and no
older event of a backfill ever overwrites a newer row or resurrects a deleted one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import deltalake
import pytest
from pyspark.sql import SparkSession
from pyspark.sql.functions import col, expr

from streaming_merge import MergeProgress, create_auto_cdc_flow
from streaming_merge.streaming.sequence_layout import CDC_METADATA
from tests.spark.test_sink import frame
from tests.streaming_support.cdc_events import SCHEMA, expected_state

SNAPSHOT = [  # an initial hydration: the source system's rows as of lsn 10
    {"id": 1, "lsn": 10, "op": "c", "name": "a", "amount": 1},
    {"id": 2, "lsn": 10, "op": "c", "name": "b", "amount": 2},
    {"id": 3, "lsn": 10, "op": "c", "name": "c", "amount": 3},
]
LIVE = [  # the change feed after it, one of its events older than the hydration
    {"id": 1, "lsn": 11, "op": "u", "name": "a2", "amount": 10},
    {"id": 2, "lsn": 12, "op": "d", "name": None, "amount": None},
    {"id": 4, "lsn": 13, "op": "c", "name": "d", "amount": 4},
    {"id": 3, "lsn": 5, "op": "u", "name": "older than the hydration", "amount": 0},
]
LATE_BACKFILL = [  # a second, older backfill run after the live flow
    {"id": 1, "lsn": 9, "op": "c", "name": "stale", "amount": -1},
    {"id": 2, "lsn": 9, "op": "c", "name": "deleted since", "amount": -2},
    {"id": 5, "lsn": 9, "op": "c", "name": "e", "amount": 5},
]


def state(path: str) -> dict[int, dict[str, Any]]:
    rows = deltalake.DeltaTable(path).to_pyarrow_table().to_pylist()
    return {r["id"]: {"id": r["id"], "lsn": r[CDC_METADATA]["upsertSequence"], **{c: r[c] for c in
                                                                                     ("op", "name", "amount")}}
            for r in rows}


def backfill(source: Any, target: str, name: str | None, **options: Any) -> Any:
    return create_auto_cdc_flow(source, target=target, keys=["id"], sequence_by=col("lsn"),
                                apply_as_deletes=expr("op = 'd'"), except_column_list=["lsn"], name=name, once=True,
                                **options)


def test_a_backfill_runs_once_then_a_live_flow_applies_newer_events_on_top(spark: SparkSession,
                                                                          tmp_path: Path) -> None:
    target = str(tmp_path / "customers")
    first = backfill(frame(spark, SNAPSHOT), target, "hydrate")
    assert isinstance(first, MergeProgress)
    assert (first.skipped, first.appId, first.batchId, first.numInputRows) == (False, "hydrate", 0, 3)
    assert first.metrics["numTargetRowsInserted"] == 3
    assert state(target) == expected_state([SNAPSHOT])

    # A second run with the same name does nothing, whatever its source now holds, and says so.
    spark.createDataFrame([(1, 99, "u", "changed", 0)], SCHEMA).createOrReplaceTempView("customers_snapshot")
    again = backfill("customers_snapshot", target, "hydrate")
    assert isinstance(again, MergeProgress) and again.skipped and again.tableVersion == first.tableVersion
    assert deltalake.DeltaTable(target).version() == first.tableVersion
    assert state(target) == expected_state([SNAPSHOT])

    # The live flow (a stream, its own name) applies the newer events; its older one is dropped.
    folder = tmp_path / "feed"
    folder.mkdir()
    (folder / "part-0.json").write_text("".join(json.dumps(e) + "\n" for e in LIVE))
    query = create_auto_cdc_flow(spark.readStream.schema(SCHEMA).json(str(folder)), target=target, keys=["id"],
                                 sequence_by=col("lsn"), apply_as_deletes=expr("op = 'd'"),
                                 except_column_list=["lsn"], name="live", trigger={"availableNow": True})
    assert query.awaitTermination(120) and query.exception() is None
    assert state(target) == expected_state([SNAPSHOT, LIVE])

    # Another backfill with older events (by name, a view over Parquet files this time): it
    # never overwrites the live flow's rows nor resurrects its delete; its new key lands.
    frame(spark, LATE_BACKFILL).write.parquet(str(tmp_path / "late.parquet"))
    spark.read.parquet(str(tmp_path / "late.parquet")).createOrReplaceTempView("late_backfill_source")
    late = backfill("late_backfill_source", target, "late-backfill", spark=spark)
    assert isinstance(late, MergeProgress) and not late.skipped and late.numLateRowsDropped == 1
    assert state(target) == expected_state([SNAPSHOT, LIVE, LATE_BACKFILL])
    assert sorted(state(target)) == [1, 3, 4, 5] and state(target)[1]["name"] == "a2"
    table = deltalake.DeltaTable(target)
    assert [table.transaction_version(n) for n in ("hydrate", "live", "late-backfill")] == [0, 0, 0]


def test_once_defaults_its_name_to_the_target_and_refuses_streams_and_stream_options(
        spark: SparkSession, tmp_path: Path) -> None:
    target = str(tmp_path / "t")
    progress = backfill(frame(spark, SNAPSHOT[:1]), target, None)
    assert isinstance(progress, MergeProgress) and progress.appId == target and not progress.skipped
    assert backfill(frame(spark, SNAPSHOT[:1]), target + "/", None).skipped  # the same flow
    stream = spark.readStream.format("rate").load()
    with pytest.raises(ValueError, match="once=True needs a batch source"):
        backfill(stream, target, "x")
    with pytest.raises(ValueError, match="no trigger and no checkpoint_location"):
        backfill(frame(spark, SNAPSHOT), target, "x", trigger={"availableNow": True})
    with pytest.raises(ValueError, match="once=True"):  # the streaming flow points at it for batch sources
        create_auto_cdc_flow(frame(spark, SNAPSHOT), target=target, keys="id", sequence_by="lsn")
