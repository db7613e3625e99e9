"""The ``delta_changes`` source through Spark: availableNow batches split by
maxFilesPerTrigger equal ``changes()``, a restart from the checkpoint after more commits
continues exactly, and the initial snapshot and startingTimestamp modes. The offsets' finer
cases run in-process in tests/unit/test_cdf_stream_offsets.py."""

from __future__ import annotations

import datetime as dt
from collections import Counter
from pathlib import Path

import deltalake
import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession

from streaming_merge import DeltaTable
from streaming_merge.cdf import register
from tests.cdf_support import commit_actions, comparable, writable_copy

QUERY_TIMEOUT_S = 300.0  # a guard against hangs, not a synchronisation


def stream(spark: SparkSession, checkpoint: Path, **options: str) -> list[Counter]:
    """One availableNow run of the source into foreachBatch; the rows of each non-empty batch.
    Without a ``path`` option, ``table``'s ``changesStream()``."""
    register(spark)
    batches: list[Counter] = []

    def collect(frame: DataFrame, batch_id: int) -> None:
        rows = comparable(frame.toArrow())
        if rows:
            batches.append(rows)

    if "table" in options:
        frame = DeltaTable.forPath(spark, options.pop("table")).changesStream(**options)
    else:
        reader = spark.readStream.format("delta_changes")
        for key, value in options.items():
            reader = reader.option(key, value)
        frame = reader.load()
    query = (frame.writeStream.foreachBatch(collect).option("checkpointLocation", str(checkpoint))
             .trigger(availableNow=True).start())
    try:
        assert query.awaitTermination(QUERY_TIMEOUT_S), "the query did not finish"
    finally:
        if query.isActive:
            query.stop()
    assert query.exception() is None
    return batches


def changes(spark: SparkSession, path: Path, **versions: int) -> Counter:
    return comparable(DeltaTable.forPath(spark, str(path)).changes(**versions).toArrow())


def test_batches_equal_changes_and_a_restart_after_more_commits_continues_exactly(spark: SparkSession,
                                                                                  tmp_path: Path) -> None:
    path = writable_copy("cdf-table", tmp_path)  # 10 + 6 + 6 + 1 change files over versions 0..3
    checkpoint = tmp_path / "checkpoint"
    first = stream(spark, checkpoint, path=str(path), startingVersion="0", maxFilesPerTrigger="8")
    assert [sum(b.values()) for b in first] == [8, 8, 7]
    assert sum(first, Counter()) == changes(spark, path)

    rs = deltalake.DeltaTable(str(path))
    source = pa.table({"id": pa.array([1, 11], pa.int32()), "name": ["Steve2", "Zed"],
                       "birthday": pa.array([dt.date(2023, 12, 22), dt.date(2023, 12, 30)])})
    (rs.merge(source, "t.id = s.id", source_alias="s", target_alias="t")
     .when_matched_update_all().when_not_matched_insert_all().execute())  # version 4, change data files
    deltalake.DeltaTable(str(path)).delete("birthday = '2023-12-25'")  # version 5: whole files removed
    second = stream(spark, checkpoint, path=str(path), startingVersion="0", maxFilesPerTrigger="8")
    assert sum(second, Counter()) == changes(spark, path, starting_version=4)
    assert sum(first + second, Counter()) == changes(spark, path)


def test_initial_snapshot_then_changes_and_starting_timestamp(spark: SparkSession, tmp_path: Path) -> None:
    path = writable_copy("cdf-table-non-partitioned", tmp_path)
    snapshot = stream(spark, tmp_path / "snapshot", table=str(path))
    expected = DeltaTable.forPath(spark, str(path)).toDF().selectExpr(
        "*", "'insert' AS _change_type", "4L AS _commit_version",
        f"timestamp_millis({stamp(path, 4)}L) AS _commit_timestamp")
    assert sum(snapshot, Counter()) == comparable(expected.toArrow())

    at = dt.datetime.fromtimestamp(stamp(path, 3) / 1000, dt.UTC).isoformat()
    since = stream(spark, tmp_path / "since", path=str(path), startingTimestamp=at)
    assert sum(since, Counter()) == changes(spark, path, starting_version=3)


def stamp(path: Path, version: int) -> int:
    return next(a["commitInfo"]["timestamp"] for a in commit_actions(path, version) if "commitInfo" in a)
