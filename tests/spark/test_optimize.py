"""OPTIMIZE (``DeltaTable.optimize().executeCompaction()``) end to end.

Why: a compaction rewrites every row it touches, so the one thing it must never do is change
the table's content; it must also follow the bin-packing rule exactly, commit
``dataChange=false`` (streaming readers skip it), conflict with a concurrent removal of a file
it compacted (nothing of it visible afterwards) but not with a concurrent append, and cost one
Spark write job. Tables are read back with delta-rs and the log JSON is read directly.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import deltalake
import pyarrow as pa
import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

import streaming_merge.optimize.compact as compact_module
from streaming_merge import DeltaTable
from streaming_merge.errors import ConcurrentModificationError, OptimizeAnalysisError
from streaming_merge.table.snapshot import load_snapshot
from tests.job_count import jobs_of

DAYS = ["2024-01-01", "2024-01-02", "2024-01-03"]


def rows(path: str) -> list[dict[str, Any]]:
    return sorted(deltalake.DeltaTable(path).to_pyarrow_table().to_pylist(), key=lambda r: r["id"])


def live_files(path: str) -> dict[str, int]:
    """Live files and their sizes, as delta-rs reads the log."""
    actions = pa.table(deltalake.DeltaTable(path).get_add_actions(flatten=True)).to_pylist()
    return {a["path"]: a["size_bytes"] for a in actions}


def log_actions(path: str, version: int) -> list[dict[str, Any]]:
    with open(os.path.join(path, "_delta_log", f"{version:020d}.json")) as handle:
        return [json.loads(line) for line in handle if line.strip()]


def parquet_on_disk(path: str) -> set[str]:
    found = set()
    for root, _, names in os.walk(path):
        if "_delta_log" in root:
            continue
        found |= {os.path.relpath(os.path.join(root, n), path) for n in names if n.endswith(".parquet")}
    return found


def small_files_table(spark: SparkSession, path: str, files: int, partitioned: bool = False) -> None:
    """``files`` tasks' worth of rows (one small file per task and partition)."""
    df = spark.range(0, 60 * files).selectExpr(
        "id", f"element_at(array({', '.join(repr(d) for d in DAYS)}), cast(id % 3 as int) + 1) as day",
        "concat('v', cast(id as string)) as v")
    DeltaTable.createFromDataFrame(df.repartition(files), path, partitionBy=["day"] if partitioned else None)


def test_unpartitioned_compaction_keeps_rows_and_commits_data_change_false(spark: SparkSession,
                                                                          table_path: str) -> None:
    small_files_table(spark, table_path, 24)
    before_rows, before_files = rows(table_path), live_files(table_path)
    assert len(before_files) == 24

    jobs, metrics = jobs_of(spark, lambda: DeltaTable.forPath(spark, table_path).optimize().executeCompaction())

    assert jobs == 1  # one write job; no listing job for <= 32 files, no shuffle
    assert rows(table_path) == before_rows
    after_files = live_files(table_path)
    assert len(after_files) == 1 and not set(after_files) & set(before_files)
    assert metrics.tableVersion == 1 == deltalake.DeltaTable(table_path).version()
    assert (metrics.numFilesRemoved, metrics.numFilesAdded, metrics.numBins, metrics.partitionsOptimized) == (
        24, 1, 1, 1)
    assert metrics.filesRemoved.totalSize == sum(before_files.values())
    assert metrics.filesAdded.totalSize == sum(after_files.values())
    assert (metrics.totalConsideredFiles, metrics.totalFilesSkipped) == (24, 0)

    actions = log_actions(table_path, 1)
    changes = [a.get("add") or a.get("remove") for a in actions if "add" in a or "remove" in a]
    assert len(changes) == 25 and all(c["dataChange"] is False for c in changes)
    entry = DeltaTable.forPath(spark, table_path).history(1)[0]
    assert entry["operation"] == "OPTIMIZE"
    assert entry["operationMetrics"]["numRemovedFiles"] == "24"
    assert entry["operationMetrics"]["numAddedFiles"] == "1"
    assert entry["operationMetrics"]["numAddedBytes"] == str(metrics.numBytesAdded)
    assert entry["operationMetrics"]["numRemovedBytes"] == str(metrics.numBytesRemoved)
    assert entry["operationParameters"]["predicate"] == "[]"


def test_bins_follow_the_target_size(spark: SparkSession, table_path: str) -> None:
    small_files_table(spark, table_path, 25)
    sizes = live_files(table_path)
    before_rows = rows(table_path)
    assert 4 * min(sizes.values()) > 3 * max(sizes.values())  # so every bin holds exactly 3 files
    target = 3 * max(sizes.values())

    metrics = DeltaTable.forPath(spark, table_path).optimize().withOptions(target_file_size=target).executeCompaction()

    # 25 files -> 8 bins of 3; the 25th file would be a bin of one, which is left alone
    assert (metrics.numBins, metrics.numFilesRemoved, metrics.numFilesAdded) == (8, 24, 8)
    assert (metrics.totalConsideredFiles, metrics.totalFilesSkipped) == (25, 1)
    assert len(live_files(table_path)) == 9
    assert rows(table_path) == before_rows
    # only files below min_file_size are candidates: the compacted ones are now larger
    again = DeltaTable.forPath(spark, table_path).optimize().withOptions(
        target_file_size=target, min_file_size=max(sizes.values()) + 1).executeCompaction()
    assert again.tableVersion is None and again.numFilesRemoved == 0
    assert deltalake.DeltaTable(table_path).version() == 1


def test_where_restricts_to_matching_partitions(spark: SparkSession, table_path: str) -> None:
    small_files_table(spark, table_path, 8, partitioned=True)
    before_rows, before_files = rows(table_path), live_files(table_path)
    assert len(before_files) == 24

    metrics = DeltaTable.forPath(spark, table_path).optimize().where(f"day = '{DAYS[1]}'").executeCompaction()

    after_files = live_files(table_path)
    untouched = {p for p in before_files if DAYS[1] not in p}
    assert untouched <= set(after_files) and len(after_files) == len(untouched) + 1
    assert (metrics.numFilesRemoved, metrics.numFilesAdded, metrics.partitionsOptimized) == (8, 1, 1)
    assert metrics.totalConsideredFiles == 8
    assert rows(table_path) == before_rows
    parameters = DeltaTable.forPath(spark, table_path).history(1)[0]["operationParameters"]
    assert json.loads(parameters["predicate"]) == [f"day = '{DAYS[1]}'"]

    # a Column works too, several where() calls are ANDed, and everything is compacted in one job
    builder = (DeltaTable.forPath(spark, table_path).optimize().where(F.col("day") >= DAYS[0])
               .where("day <> '2024-01-03'"))
    jobs, metrics = jobs_of(spark, builder.executeCompaction)
    assert (metrics.numFilesRemoved, metrics.numFilesAdded, jobs) == (8, 1, 1)  # only 2024-01-01 left to do
    assert len(live_files(table_path)) == 8 + 2
    assert rows(table_path) == before_rows


def test_where_on_a_data_column_is_refused(spark: SparkSession, table_path: str, tmp_path: Path) -> None:
    small_files_table(spark, table_path, 4, partitioned=True)
    table = DeltaTable.forPath(spark, table_path)
    with pytest.raises(OptimizeAnalysisError, match=r"non-partition column 'id'.*\[day\]"):
        table.optimize().where("day = '2024-01-01' AND id > 3").executeCompaction()
    with pytest.raises(OptimizeAnalysisError, match="non-partition column 'nope'"):
        table.optimize().where("nope = 1").executeCompaction()
    with pytest.raises(OptimizeAnalysisError, match="Cannot parse"):
        table.optimize().where("day = = 1")
    unpartitioned = str(tmp_path / "flat")
    small_files_table(spark, unpartitioned, 4)
    with pytest.raises(OptimizeAnalysisError, match=r"non-partition column 'day'.*\[\]"):
        DeltaTable.forPath(spark, unpartitioned).optimize().where("day = '2024-01-01'").executeCompaction()
    assert deltalake.DeltaTable(table_path).version() == 0 == deltalake.DeltaTable(unpartitioned).version()


def test_nothing_to_compact_commits_nothing(spark: SparkSession, table_path: str) -> None:
    small_files_table(spark, table_path, 1, partitioned=True)  # one file per partition
    jobs, metrics = jobs_of(spark, lambda: DeltaTable.forPath(spark, table_path).optimize().executeCompaction())
    assert (jobs, metrics.tableVersion, metrics.numFilesRemoved, metrics.numBins) == (0, None, 0, 0)
    assert metrics.totalConsideredFiles == 3
    assert deltalake.DeltaTable(table_path).version() == 0
    # a predicate matching no partition: also nothing
    metrics = DeltaTable.forPath(spark, table_path).optimize().where("day = '1999-01-01'").executeCompaction()
    assert (metrics.tableVersion, metrics.totalConsideredFiles) == (None, 0)


def _racing(monkeypatch: pytest.MonkeyPatch, concurrent: Callable[[], None]) -> list[str]:
    """Run ``concurrent`` (another writer's commit) right after the compaction wrote its files and
    before it commits; returns the paths the compaction wrote."""
    written: list[str] = []
    real = compact_module.write_files

    def write_then_race(*args: Any, **kwargs: Any) -> Any:
        files = real(*args, **kwargs)
        written.extend(w.path for w in files)
        concurrent()
        return files

    monkeypatch.setattr(compact_module, "write_files", write_then_race)
    return written


def test_concurrent_removal_of_a_compacted_file_conflicts(spark: SparkSession, table_path: str,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    small_files_table(spark, table_path, 6)
    written = _racing(monkeypatch, lambda: deltalake.DeltaTable(table_path).delete("id = 7"))  # version 1

    with pytest.raises(ConcurrentModificationError, match="removed files this OPTIMIZE read"):
        DeltaTable.forPath(spark, table_path).optimize().executeCompaction()

    assert written and deltalake.DeltaTable(table_path).version() == 1
    assert not any(os.path.exists(os.path.join(table_path, p)) for p in written)
    assert parquet_on_disk(table_path).isdisjoint(written)
    assert [r["id"] for r in rows(table_path)] == [i for i in range(360) if i != 7]


def test_concurrent_append_does_not_conflict(spark: SparkSession, table_path: str,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    small_files_table(spark, table_path, 6, partitioned=True)
    before_rows = rows(table_path)
    appended = pa.table({"id": pa.array([1000, 1001], pa.int64()), "day": [DAYS[0], DAYS[1]], "v": ["x", "y"]})
    _racing(monkeypatch, lambda: deltalake.write_deltalake(table_path, appended, mode="append"))  # version 1

    metrics = DeltaTable.forPath(spark, table_path).optimize().executeCompaction()

    assert metrics.tableVersion == 2 and metrics.numFilesRemoved == 18 and metrics.numFilesAdded == 3
    assert rows(table_path) == sorted([*before_rows, *appended.to_pylist()], key=lambda r: r["id"])
    assert len(live_files(table_path)) == 3 + 2  # the appended files stay as they are


def test_append_only_table_can_be_compacted(spark: SparkSession, table_path: str) -> None:
    for i in range(3):
        deltalake.write_deltalake(table_path, pa.table({"id": pa.array([i], pa.int64())}), mode="append",
                                  configuration={"delta.appendOnly": "true"})
    metrics = DeltaTable.forPath(spark, table_path).optimize().executeCompaction()
    assert (metrics.numFilesRemoved, metrics.numFilesAdded, metrics.tableVersion) == (3, 1, 3)
    assert [r["id"] for r in rows(table_path)] == [0, 1, 2]
    assert load_snapshot(table_path).configuration["delta.appendOnly"] == "true"


def test_job_count_of_a_large_compaction(spark: SparkSession, table_path: str) -> None:
    """One job, whatever the number of bins: beyond 32 files Spark would list the files to read
    in a job of its own (spark.sql.sources.parallelPartitionDiscovery.threshold), which the
    scan avoids for local files."""
    small_files_table(spark, table_path, 20, partitioned=True)  # 60 files
    before_rows = rows(table_path)
    jobs, metrics = jobs_of(spark, lambda: DeltaTable.forPath(spark, table_path).optimize().executeCompaction())
    assert (jobs, metrics.numFilesRemoved, metrics.numFilesAdded) == (1, 60, 3)
    assert rows(table_path) == before_rows


def test_where_is_evaluated_with_sparks_types_over_typed_partitions(spark: SparkSession, table_path: str) -> None:
    """Integer, date and NULL partition values: the predicate is Spark's, not string matching."""
    df = spark.range(0, 240).selectExpr(
        "id", "cast(id % 4 as int) as n", "date_add(DATE'2024-01-01', cast(id % 2 as int)) as d",
        "CASE WHEN id % 4 = 3 THEN NULL ELSE 'x' END as tag")
    DeltaTable.createFromDataFrame(df.repartition(4), table_path, partitionBy=["n", "d", "tag"])
    before_rows, before_files = rows(table_path), live_files(table_path)
    table = DeltaTable.forPath(spark, table_path)

    metrics = table.optimize().where("n >= 2 AND d = DATE'2024-01-02'").executeCompaction()
    # n=2 pairs with even ids (d = 01-01), so only n=3 (odd ids, d = 01-02, tag NULL) matches
    assert (metrics.partitionsOptimized, metrics.numFilesRemoved, metrics.numFilesAdded) == (1, 4, 1)
    compacted = set(before_files) - set(live_files(table_path))
    assert compacted and all("n=3/" in p and "tag=__HIVE_DEFAULT_PARTITION__" in p for p in compacted)
    metrics = table.optimize().where("tag IS NULL").executeCompaction()
    assert metrics.tableVersion is None  # already compacted
    metrics = table.optimize().where(F.col("n").isin(0, 1)).executeCompaction()
    assert (metrics.partitionsOptimized, metrics.numFilesRemoved) == (2, 8)
    assert rows(table_path) == before_rows
