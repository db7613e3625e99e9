"""Table maintenance of deletion-vector tables: VACUUM keeps the DV files the log references,
OPTIMIZE and auto compaction rewrite files with many deleted rows, ``executePurge()`` (Delta's
REORG TABLE ... APPLY (PURGE)) rewrites every file with a DV.

Why: a DV file is part of the table's state: deleting one the log references makes its data
file unreadable (or, worse, brings deleted rows back), and a rewrite that loses or keeps the
wrong rows changes the table. delta-rs 1.6.6's full vacuum does not know DV files and lists
every one older than the retention, the live ones included: pinned here, so the day delta-rs
learns them is noticed. Every outcome is read back through delta-rs' ``scan()`` (which applies
DVs), independently of our scan.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any
from urllib.parse import unquote

import deltalake
import pyarrow as pa
import pyroaring
import pytest
from pyspark.sql import SparkSession

from streaming_merge import AutoCompact, DeltaTable, MergeSink
from streaming_merge.table.deletion_vectors import write_deletion_vectors
from streaming_merge.table.snapshot import DataFile, load_snapshot

DV = {"delta.enableDeletionVectors": "true"}
DAY = 24 * 3600


def rs_rows(path: str, version: int | None = None) -> list[dict[str, Any]]:
    """The table's rows as delta-rs reads them (DVs applied)."""
    table = pa.table(deltalake.DeltaTable(path, version=version).scan())
    return sorted(table.to_pylist(), key=lambda r: r["id"])


def our_rows(spark: SparkSession, path: str, version: int | None = None) -> list[dict[str, Any]]:
    return sorted((r.asDict() for r in DeltaTable.forPath(spark, path).toDF(version).collect()),
                  key=lambda r: r["id"])


def assert_rows(spark: SparkSession, path: str, expected: list[dict[str, Any]], version: int | None = None) -> None:
    assert rs_rows(path, version) == expected
    assert our_rows(spark, path, version) == expected


def delete_ids(spark: SparkSession, path: str, ids: list[int]) -> None:
    source = spark.createDataFrame([(i,) for i in ids], "id long")
    DeltaTable.forPath(spark, path).alias("t").merge(source.alias("s"), "t.id = s.id").whenMatchedDelete().execute()


def files(path: str) -> list[DataFile]:
    return load_snapshot(path).files


def dv_files_on_disk(path: str) -> set[str]:
    return {n for n in os.listdir(path) if n.startswith("deletion_vector_") and n.endswith(".bin")}


def backdate(path: str, relative: str, seconds: float) -> None:
    stamp = time.time() - seconds
    os.utime(os.path.join(path, relative), (stamp, stamp))


def commit_actions(path: str, version: int) -> list[dict[str, Any]]:
    with open(os.path.join(path, "_delta_log", f"{version:020d}.json")) as handle:
        return [json.loads(line) for line in handle if line.strip()]


def file_of(path: str, smallest_id: int) -> DataFile:
    """The live file whose smallest id (physical: deleted rows count) is ``smallest_id``."""
    snapshot = load_snapshot(path)
    smallest = {unquote(r["path"]): r["min.id"] for r in snapshot.stats.select(["path", "min.id"]).to_pylist()}
    found = [f for f in snapshot.files if smallest[f.path] == smallest_id]
    assert len(found) == 1, smallest
    return found[0]


def expected_rows(ids: list[int], **extra: Any) -> list[dict[str, Any]]:
    return [{"id": i, "v": i * 10, **extra} for i in sorted(ids)]


# ------------------------------------------------------------------ VACUUM


def test_vacuum_keeps_referenced_dv_files_and_deletes_orphaned_ones(spark: SparkSession, table_path: str) -> None:
    path = table_path
    DeltaTable.createFromDataFrame(spark.range(0, 200, numPartitions=1).selectExpr("id", "id * 10 as v"), path,
                                   properties=DV)
    delete_ids(spark, path, list(range(0, 120, 2)))       # v1: DV A on the file (too large to go inline)
    (first,) = dv_files_on_disk(path)
    delete_ids(spark, path, [101, 111, 121])              # v2: DV B replaces A; A only in v2's remove
    (second,) = dv_files_on_disk(path) - {first}
    [live] = files(path)
    assert live.deletion_vector is not None and live.deletion_vector.relative_path() == second
    assert live.deleted_rows == 63
    [remove] = [a["remove"] for a in commit_actions(path, 2) if "remove" in a]
    assert remove["path"] == live.path and remove["deletionVector"]["cardinality"] == 60
    # A DV file of a MERGE whose commit never happened (the process died after writing it).
    snapshot = load_snapshot(path)
    orphan = write_deletion_vectors(snapshot.location.log_uri, snapshot.location.options,
                                    [pyroaring.BitMap64([1, 2, 3])]).file
    assert orphan is not None
    for name in (first, second, orphan):
        backdate(path, name, 8 * DAY)
    first_deleted = set(range(0, 120, 2))
    expected = expected_rows([i for i in range(200) if i not in first_deleted and i not in (101, 111, 121)])
    v1_rows = expected_rows([i for i in range(200) if i not in first_deleted])

    # delta-rs 1.6.6 alone would delete all three, the live DV too (the table would be corrupt).
    listed = deltalake.DeltaTable(path).vacuum(retention_hours=168, dry_run=True, enforce_retention_duration=False,
                                              full=True)
    assert {first, second, orphan} <= set(listed)

    table = DeltaTable.forPath(spark, path)
    assert table.vacuum(dry_run=True) == [orphan]
    version = table.version()
    assert table.vacuum() == [orphan]                     # the table's 7 days: A's remove is 0 days old
    assert dv_files_on_disk(path) == {first, second}
    assert [h["operation"] for h in table.history(2)] == ["VACUUM END", "VACUUM START"]
    start = table.history(2)[1]
    assert start["operationMetrics"]["numFilesToDelete"] in (1, "1")
    assert table.version() == version + 2
    assert_rows(spark, path, expected)
    assert_rows(spark, path, v1_rows, version=1)          # time travel within the retention still reads A

    # The remove is found in a checkpoint too (the log's commits may be cleaned up before the files).
    deltalake.DeltaTable(path).create_checkpoint()
    for name in os.listdir(os.path.join(path, "_delta_log")):
        if name.endswith(".json"):
            backdate(path, os.path.join("_delta_log", name), 8 * DAY)  # too old to hold a remove within 7 days
    assert table.vacuum(dry_run=True) == []

    # Retention 0: A's remove has expired, so A goes; B, which the live add references, stays.
    assert table.vacuum(0, enforce_retention_duration=False) == [first]
    assert dv_files_on_disk(path) == {second}
    assert_rows(spark, path, expected)
    assert table.vacuum(0, enforce_retention_duration=False) == []


# ------------------------------------------------------------------ OPTIMIZE


def test_optimize_rewrites_files_whose_dv_deletes_more_than_the_ratio(spark: SparkSession, table_path: str) -> None:
    path = table_path
    DeltaTable.createFromDataFrame(spark.range(0, 300, numPartitions=3).selectExpr("id", "id * 10 as v"), path,
                                   properties=DV)
    assert len(files(path)) == 3
    delete_ids(spark, path, [*range(0, 20), 100, 101])   # file 0-99: 20 %, file 100-199: 2 %, 200-299: none
    many, few, none = file_of(path, 0), file_of(path, 100), file_of(path, 200)
    assert (many.deleted_rows, few.deleted_rows, none.deletion_vector) == (20, 2, None)
    expected = expected_rows([i for i in range(300) if i >= 20 and i not in (100, 101)])
    table = DeltaTable.forPath(spark, path)

    # No file is small (min_file_size=1): only the one past Delta's 5 % is rewritten, alone.
    metrics = table.optimize().withOptions(min_file_size=1).executeCompaction()
    assert (metrics.numFilesRemoved, metrics.numFilesAdded, metrics.totalConsideredFiles) == (1, 1, 3)
    after = {f.path: f for f in files(path)}
    assert many.path not in after and few.path in after and none.path in after
    assert after[few.path].deleted_rows == 2
    [new] = [f for p, f in after.items() if p not in (few.path, none.path)]
    assert new.deletion_vector is None and new.num_records == 80
    info = commit_actions(path, metrics.tableVersion)[0]["commitInfo"]
    assert info["operation"] == "OPTIMIZE" and info["operationMetrics"]["numDeletionVectorsRemoved"] == "1"
    remove = next(a["remove"] for a in commit_actions(path, metrics.tableVersion) if "remove" in a)
    assert remove["deletionVector"]["cardinality"] == 20 and remove["dataChange"] is False
    assert_rows(spark, path, expected)

    # A lower ratio takes the 2 % file too; the file without a DV is still left alone.
    metrics = table.optimize().withOptions(min_file_size=1, max_deleted_rows_ratio=0.01).executeCompaction()
    assert (metrics.numFilesRemoved, metrics.numFilesAdded) == (1, 1)
    assert not any(f.deletion_vector for f in files(path)) and none.path in {f.path for f in files(path)}
    assert_rows(spark, path, expected)
    assert table.optimize().withOptions(min_file_size=1).executeCompaction().tableVersion is None


def test_small_files_with_dvs_are_compacted_without_their_deleted_rows(spark: SparkSession, table_path: str) -> None:
    path = table_path
    DeltaTable.createFromDataFrame(spark.range(0, 200, numPartitions=4).selectExpr("id", "id * 10 as v"), path,
                                   properties=DV)
    delete_ids(spark, path, [0, 1, 2, 60])
    metrics = DeltaTable.forPath(spark, path).optimize().executeCompaction()  # all four are small
    assert (metrics.numFilesRemoved, metrics.numFilesAdded) == (4, 1)
    [new] = files(path)
    assert new.deletion_vector is None and new.num_records == 196
    assert_rows(spark, path, expected_rows([i for i in range(200) if i not in (0, 1, 2, 60)]))


# ------------------------------------------------------------------ REORG ... APPLY (PURGE)


def test_purge_rewrites_every_file_with_a_dv_in_one_reorg_commit(spark: SparkSession, table_path: str) -> None:
    path = table_path
    df = spark.range(0, 400, numPartitions=4).selectExpr("id", "id * 10 as v", "cast(id div 200 as string) as day")
    DeltaTable.createFromDataFrame(df, path, partitionBy=["day"], properties=DV)
    delete_ids(spark, path, [*range(0, 10), 200, 201, 300])  # day 0: one file; day 1: two files, 1 % and 1 %
    before = files(path)
    with_dv = {f.path for f in before if f.deletion_vector is not None}
    assert len(before) == 4 and len(with_dv) == 3
    expected = [{**r, "day": str(r["id"] // 200)} for r in expected_rows(
        [i for i in range(400) if i >= 10 and i not in (200, 201, 300)])]
    table = DeltaTable.forPath(spark, path)

    metrics = table.optimize().where("day = '1'").executePurge()
    assert (metrics.numFilesRemoved, metrics.numFilesAdded) == (2, 1)  # both small: one bin of the partition
    after = files(path)
    assert {f.path for f in after if f.deletion_vector is not None} == {
        f.path for f in before if f.deletion_vector is not None and f.partition_values["day"] == "0"}
    assert sum(f.num_records for f in after if f.partition_values["day"] == "1") == 197
    history = table.history(1)[0]
    assert history["operation"] == "REORG"
    assert history["operationParameters"]["applyPurge"] in (True, "true")
    actions = commit_actions(path, metrics.tableVersion)
    changes = [a.get("add") or a.get("remove") for a in actions if "add" in a or "remove" in a]
    assert len(changes) == 3 and all(c["dataChange"] is False for c in changes)
    assert_rows(spark, path, expected)

    # Every remaining DV, whatever the file's size; then nothing is left to purge.
    metrics = table.optimize().withOptions(target_file_size=1).executePurge()
    assert (metrics.numFilesRemoved, metrics.numFilesAdded) == (1, 1)
    assert not any(f.deletion_vector for f in files(path))
    assert_rows(spark, path, expected)
    assert table.optimize().executePurge().tableVersion is None
    assert table.history(1)[0]["operation"] == "REORG"


# ------------------------------------------------------------------ auto compaction


@pytest.mark.usefixtures("without_small_table_rules")
def test_auto_compaction_counts_a_file_with_many_deleted_rows(spark: SparkSession, table_path: str) -> None:
    path = table_path
    DeltaTable.createFromDataFrame(spark.range(0, 100, numPartitions=1).selectExpr("id", "cast(id as string) as v"),
                                   path, properties=DV)
    # Nothing is small (min_file_size=1): only deleted rows can trigger it.
    sink = MergeSink(path, keys=["id"], app_id="dv-auto", tombstones=False,
                     auto_compact=AutoCompact(min_small_files=1, min_file_size=1))
    sink(spark.createDataFrame([(1, "x"), (2, "x")], "id long, v string"), 0)  # 2 % of the file updated
    assert sink.recentProgress[-1]["compaction"] is None
    assert [f.deleted_rows for f in files(path) if f.deletion_vector] == [2]

    sink(spark.createDataFrame([(i, "y") for i in range(10, 20)], "id long, v string"), 1)  # 12 % now
    compaction = sink.recentProgress[-1]["compaction"]
    assert compaction["trigger"] == "min_small_files" and compaction["error"] is None
    assert (compaction["numFilesRemoved"], compaction["numFilesAdded"]) == (1, 1)
    assert not any(f.deletion_vector for f in files(path))
    expected = {i: "x" if i in (1, 2) else "y" if 10 <= i < 20 else str(i) for i in range(100)}
    assert {r["id"]: r["v"] for r in rs_rows(path)} == expected
    assert {r["id"]: r["v"] for r in our_rows(spark, path)} == expected
