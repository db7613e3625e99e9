"""VACUUM (``DeltaTable.vacuum()``) through delta-rs, and which folders delta-rs never cleans.

Why: vacuum is the only thing that removes the files of failed or killed writes and the files
a compaction replaced, and it deletes for good: it must keep every file a version within the
retention needs, refuse a retention below the table's unless forced, and its blind spots must
be known to whoever chooses where writes put their files. Those blind spots (delta-rs 1.6,
full mode) are pinned here: only top-level names starting with ``_`` or ``.`` are skipped.
"""

from __future__ import annotations

import os
import time
from typing import Any

import deltalake
import pytest
from pyspark.sql import SparkSession

from streaming_merge import DeltaTable
from streaming_merge.errors import VacuumRetentionError

DAY = 24 * 3600


def rows(path: str) -> list[dict[str, Any]]:
    return sorted(deltalake.DeltaTable(path).to_pyarrow_table().to_pylist(), key=lambda r: r["id"])


def plant(table: str, relative: str, age_seconds: float) -> None:
    """A file the log never referenced (what a killed write leaves), ``age_seconds`` old."""
    path = os.path.join(table, relative)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as handle:
        handle.write(b"PAR1 not really")
    stamp = time.time() - age_seconds
    os.utime(path, (stamp, stamp))


def data_files(table: str) -> set[str]:
    return {os.path.relpath(os.path.join(root, n), table) for root, _, names in os.walk(table)
            if "_delta_log" not in root for n in names if n.endswith(".parquet")}


@pytest.fixture()
def table(spark: SparkSession, table_path: str) -> str:
    df = spark.range(0, 40).selectExpr("id", "cast(id % 2 as string) as day")
    DeltaTable.createFromDataFrame(df.repartition(4), table_path, partitionBy=["day"])
    return table_path


def test_vacuum_removes_old_orphans_and_keeps_live_and_recent_files(spark: SparkSession, table: str) -> None:
    live = {os.path.relpath(p.removeprefix("file://"), table) for p in deltalake.DeltaTable(table).file_uris()}
    plant(table, "sm-write-killed/day=0/part-00000-x.parquet", 8 * DAY)  # a killed write's finished file
    plant(table, "sm-write-killed/_temporary/0/_temporary/attempt_0/part-00001-x.parquet", 8 * DAY)
    plant(table, "orphan-at-root.parquet", 8 * DAY)
    plant(table, "sm-write-running/day=1/part-00000-y.parquet", 60)  # a write still running: recent
    version = deltalake.DeltaTable(table).version()
    expected = ["orphan-at-root.parquet", "sm-write-killed/_temporary/0/_temporary/attempt_0/part-00001-x.parquet",
                "sm-write-killed/day=0/part-00000-x.parquet"]

    assert DeltaTable.forPath(spark, table).vacuum(dry_run=True) == expected
    assert deltalake.DeltaTable(table).version() == version  # a dry run commits nothing
    deleted = DeltaTable.forPath(spark, table).vacuum()  # default retention: the table's 7 days

    assert deleted == expected
    remaining = data_files(table)
    assert live <= remaining
    assert "sm-write-running/day=1/part-00000-y.parquet" in remaining
    assert not remaining & set(expected)
    assert len(rows(table)) == 40
    assert [h["operation"] for h in DeltaTable.forPath(spark, table).history(2)] == ["VACUUM END", "VACUUM START"]


def test_vacuum_after_optimize_deletes_the_compacted_files_only_when_forced(spark: SparkSession,
                                                                           table: str) -> None:
    before = data_files(table)
    DeltaTable.forPath(spark, table).optimize().executeCompaction()
    assert DeltaTable.forPath(spark, table).vacuum() == []  # the removes are younger than the retention
    deleted = DeltaTable.forPath(spark, table).vacuum(0, enforce_retention_duration=False)
    assert {name for name in deleted if not name.endswith(".crc")} == before
    assert before.isdisjoint(data_files(table))
    assert len(rows(table)) == 40


def test_retention_below_the_tables_is_refused_unless_forced(spark: SparkSession, table: str) -> None:
    plant(table, "orphan.parquet", 3 * 3600)
    dt = DeltaTable.forPath(spark, table)
    with pytest.raises(VacuumRetentionError, match=r'such a low retention period.*not less than "168 hours"'):
        dt.vacuum(24)
    assert "orphan.parquet" in data_files(table)

    deltalake.DeltaTable(table).alter.set_table_properties({"delta.deletedFileRetentionDuration": "interval 2 hours"})
    with pytest.raises(VacuumRetentionError, match='not less than "2 hours"'):
        dt.vacuum(1.5)
    assert dt.vacuum(2) == ["orphan.parquet"]  # the table's own retention is allowed
    plant(table, "orphan2.parquet", 1800)
    assert dt.vacuum(0.25, enforce_retention_duration=False) == []  # rounded up to 1 hour: kept
    # (Hadoop's local file system leaves .crc checksum files beside the live files; at retention 0
    # they are unreferenced files too, harmlessly: a file without its .crc is read unchecked)
    deleted = dt.vacuum(0, enforce_retention_duration=False)
    assert [name for name in deleted if not name.endswith(".crc")] == ["orphan2.parquet"]
    assert len(rows(table)) == 40


def test_which_folders_delta_rs_vacuum_never_cleans(spark: SparkSession, table: str) -> None:
    """delta-rs full vacuum hides a path when its path relative to the table starts with '_'
    or '.' (top level only; _delta_index and _change_data are not hidden); nested dot or
    underscore folders are cleaned. So a write folder must not be named '.x' or '_x' at the top
    level if vacuum is to clean what a killed write leaves there."""
    hidden = [".sm-staging-0/part-0.parquet", ".sm-staging-0/day=0/part-1.parquet", "_sm-write-0/part-2.parquet",
              "_temporary/0/part-3.parquet"]
    cleaned = ["day=0/.sm-staging-1/part-4.parquet", "day=0/_tmp/part-5.parquet",
               "sm-write-1/_temporary/part-6.parquet", "sm-write-1/.hidden/part-7.parquet",
               "_change_data/part-8.parquet", "sm-staging-2/part-9.parquet"]
    for name in hidden + cleaned:
        plant(table, name, 30 * DAY)
    deleted = DeltaTable.forPath(spark, table).vacuum()
    assert deleted == sorted(cleaned)
    assert set(hidden) <= data_files(table)
