"""DELETE and UPDATE (DeltaTable.delete / DeltaTable.update) on a deletion-vector table and on a
copy-on-write table.

Why: both rewrite what every reader of the table sees. After each operation the rows delta-rs
reads (its scan applies deletion vectors) must equal the expected rows and our own reader's;
the metrics and the commit must say what Delta's would; a DV table must not have a data file
rewritten (the old files stay live with DVs) and a plain table must get no DV; a failure (an
overflowing assignment, a concurrent commit) must leave the table as it was.

Every table starts as two files: k 0..9 and k 10..19 (``spark.range`` with two partitions).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import deltalake
import pyarrow as pa
import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from streaming_merge import DeltaTable
from streaming_merge.errors import (
    ConcurrentModificationError,
    DeltaTableError,
    DmlAnalysisError,
    MergeAssignmentOverflowError,
)
from streaming_merge.table import commit as table_commit
from streaming_merge.table.snapshot import load_snapshot
from tests.job_count import jobs_of

Row = tuple[Any, ...]
MODES = ["dv", "plain"]


def _create(spark: SparkSession, path: str, mode: str, partitioned: bool = False,
            properties: dict[str, str] | None = None) -> DeltaTable:
    """k bigint, v int (k * 10), p string ('even'/'odd'): two files, k 0..9 and 10..19 (four
    files when partitioned by p)."""
    frame = spark.range(0, 20, 1, 2).select(
        F.col("id").alias("k"), (F.col("id") * 10).cast("int").alias("v"),
        F.when(F.col("id") % 2 == 0, "even").otherwise("odd").alias("p"))
    props = {**({"delta.enableDeletionVectors": "true"} if mode == "dv" else {}), **(properties or {})}
    return DeltaTable.createFromDataFrame(frame, path, partitionBy=["p"] if partitioned else None,
                                          properties=props or None)


def _initial() -> list[Row]:
    return [(k, k * 10, "even" if k % 2 == 0 else "odd") for k in range(20)]


def _read_back(spark: SparkSession, path: str) -> list[Row]:
    """The rows delta-rs reads (DVs applied), checked equal to our reader's, sorted."""
    table = deltalake.DeltaTable(path)
    read = pa.table(table.scan())
    names = ["k", "v", "p"]
    theirs = sorted(tuple(row[n] for n in names) for row in read.to_pylist())
    ours = sorted(tuple(row[n] for n in names) for row in DeltaTable.forPath(spark, path).toDF().collect())
    assert theirs == ours, "delta-rs and our reader disagree"
    return theirs


def _files(path: str) -> dict[str, Any]:
    """Live files: path -> its deletion vector (None without one)."""
    return {f.path: f.deletion_vector for f in load_snapshot(path).files}


def _last_commit(path: str) -> dict[str, Any]:
    return DeltaTable.forPath(SparkSession.getActiveSession(), path).history(1)[0]  # type: ignore[arg-type]


def _check_layout(mode: str, before: dict[str, Any], after: dict[str, Any], metrics: Any) -> None:
    """DV table: nothing rewritten, every touched old file that keeps a row is still live with a
    DV. Plain table: no DV anywhere."""
    if mode == "dv":
        assert metrics["numCopiedRows"] == 0
        kept_with_dv = [p for p in before if p in after and after[p] != before[p]]
        assert all(after[p] is not None for p in kept_with_dv)
        assert len(kept_with_dv) == metrics["numDeletionVectorsAdded"] + metrics["numDeletionVectorsUpdated"]
    else:
        assert all(dv is None for dv in after.values())
        assert metrics["numDeletionVectorsAdded"] == metrics["numDeletionVectorsUpdated"] == 0


@pytest.mark.parametrize("mode", MODES)
def test_delete_with_a_condition(spark: SparkSession, tmp_path: Path, mode: str) -> None:
    path = str(tmp_path / "t")
    table = _create(spark, path, mode)
    before = _files(path)
    # Every row of file 2 (k >= 10) and four rows of file 1 (k 0, 3, 6, 9).
    jobs, metrics = jobs_of(spark, lambda: table.delete("k >= 10 OR k % 3 = 0"))

    expected = [r for r in _initial() if not (r[0] >= 10 or r[0] % 3 == 0)]
    assert _read_back(spark, path) == expected
    after = _files(path)
    assert metrics["numDeletedRows"] == metrics["num_affected_rows"] == 14
    assert metrics["tableVersion"] == 1 and metrics["numAddedChangeFiles"] == 0
    if mode == "dv":  # one job: the bitmaps of the matching rows' positions
        assert jobs == 1
        assert (metrics["numRemovedFiles"], metrics["numAddedFiles"], metrics["numDeletionVectorsAdded"]) == (1, 0, 1)
        assert set(after) < set(before)  # the fully deleted file removed without a rewrite, no new file
    else:  # the positions, then the rewrite of the file that keeps rows (the other is only removed)
        assert jobs == 2
        assert (metrics["numRemovedFiles"], metrics["numAddedFiles"], metrics["numCopiedRows"]) == (2, 1, 6)
        assert not set(after) & set(before)
    _check_layout(mode, before, after, metrics)
    commit = _last_commit(path)
    assert commit["operation"] == "DELETE"
    assert json.loads(commit["operationParameters"]["predicate"]) == ["k >= 10 OR k % 3 = 0"]
    assert {k: int(v) for k, v in commit["operationMetrics"].items() if k != "executionTimeMs"
            and not k.endswith("TimeMs")} == {k: v for k, v in metrics.delta_metrics().items()
                                              if not k.endswith("TimeMs")}


@pytest.mark.parametrize("mode", MODES)
def test_delete_everything_after_a_delete(spark: SparkSession, tmp_path: Path, mode: str) -> None:
    path = str(tmp_path / "t")
    table = _create(spark, path, mode)
    table.delete("k = 4")
    jobs, metrics = jobs_of(spark, lambda: table.delete())
    assert jobs == 0  # decided by the log alone
    assert _read_back(spark, path) == [] and _files(path) == {}
    assert metrics["numDeletedRows"] == 19
    assert metrics["numRemovedFiles"] == 2 and metrics["numAddedFiles"] == metrics["numCopiedRows"] == 0
    # The file the first DELETE marked carried a DV; it goes with its file.
    assert metrics["numDeletionVectorsRemoved"] == (1 if mode == "dv" else 0)
    commit = _last_commit(path)
    assert (commit["operation"], commit["operationParameters"]["predicate"]) == ("DELETE", "[]")


@pytest.mark.parametrize("mode", MODES)
def test_update_referencing_the_column_itself(spark: SparkSession, tmp_path: Path, mode: str) -> None:
    path = str(tmp_path / "t")
    table = _create(spark, path, mode)
    before = _files(path)
    jobs, metrics = jobs_of(spark, lambda: table.update("k % 4 = 0", {"v": "v + 1"}))

    expected = sorted((k, v + 1 if k % 4 == 0 else v, p) for k, v, p in _initial())
    assert _read_back(spark, path) == expected
    after = _files(path)
    assert metrics["numUpdatedRows"] == metrics["num_affected_rows"] == 5
    assert metrics["tableVersion"] == 1
    if mode == "dv":  # one job writes the updated rows and observes their positions
        assert jobs == 1
        assert (metrics["numAddedFiles"], metrics["numRemovedFiles"], metrics["numDeletionVectorsAdded"]) == (1, 0, 2)
        assert set(before) < set(after)
    else:
        assert jobs == 2
        assert (metrics["numRemovedFiles"], metrics["numCopiedRows"]) == (2, 15)
        assert not set(after) & set(before)
    _check_layout(mode, before, after, metrics)
    commit = _last_commit(path)
    assert (commit["operation"], commit["operationParameters"]) == ("UPDATE", {"predicate": "k % 4 = 0"})
    assert int(commit["operationMetrics"]["numUpdatedRows"]) == 5

    if mode == "dv":  # a second UPDATE of rows in the same old files merges with their DVs
        metrics = table.update(F.col("k") % 4 == 1, {"v": F.col("v") - 1})
        expected = sorted((k, v - 1 if k % 4 == 1 else v, p) for k, v, p in expected)
        assert _read_back(spark, path) == expected
        assert (metrics["numUpdatedRows"], metrics["numDeletionVectorsUpdated"], metrics["numCopiedRows"]) == (5, 2, 0)


@pytest.mark.parametrize("mode", MODES)
def test_update_of_the_partition_column(spark: SparkSession, tmp_path: Path, mode: str) -> None:
    path = str(tmp_path / "t")
    table = _create(spark, path, mode, partitioned=True)
    before = _files(path)
    metrics = table.alias("t").update("t.k < 5", {"t.p": "'low'", "V": "v * 2"})

    expected = sorted((k, v * 2, "low") if k < 5 else (k, v, p) for k, v, p in _initial())
    assert _read_back(spark, path) == expected
    after = _files(path)
    assert metrics["numUpdatedRows"] == 5
    assert {f.partition_values["p"] for f in load_snapshot(path).files} == {"even", "odd", "low"}
    if mode == "plain":
        assert metrics["numCopiedRows"] == 5  # the two files of k 0..9 (even, odd) were touched
    _check_layout(mode, before, after, metrics)

    # A condition on the partition column only: decided by the log, every row of its files matches.
    metrics = table.update("p = 'low'", {"p": "'LOW'"})
    expected = sorted((k, v, "LOW" if p == "low" else p) for k, v, p in expected)
    assert _read_back(spark, path) == expected
    assert (metrics["numUpdatedRows"], metrics["numCopiedRows"]) == (5, 0)


@pytest.mark.parametrize("mode", MODES)
def test_partition_only_delete_removes_files_without_a_job(spark: SparkSession, tmp_path: Path, mode: str) -> None:
    path = str(tmp_path / "t")
    table = _create(spark, path, mode, partitioned=True)
    jobs, metrics = jobs_of(spark, lambda: table.delete("p = 'odd'"))
    assert jobs == 0
    assert _read_back(spark, path) == [r for r in _initial() if r[2] == "even"]
    assert (metrics["numDeletedRows"], metrics["numRemovedFiles"], metrics["numAddedFiles"]) == (10, 2, 0)


@pytest.mark.parametrize("mode", MODES)
def test_no_matching_row_commits_nothing(spark: SparkSession, tmp_path: Path, mode: str) -> None:
    path = str(tmp_path / "t")
    table = _create(spark, path, mode)
    # Skipped by the files' min/max (no job), then scanned and found nowhere (v is a multiple of 10).
    for operation in (lambda: table.delete("k > 1000"), lambda: table.delete("v = 5"),
                      lambda: table.update("v = 5", {"v": "0"}), lambda: table.update("k < 0", {"v": "0"})):
        jobs, metrics = jobs_of(spark, operation)
        assert metrics["tableVersion"] is None and metrics["num_affected_rows"] == 0
        assert jobs <= 1
    assert table.version() == 0
    assert _read_back(spark, path) == sorted(_initial())


@pytest.mark.parametrize("mode", MODES)
def test_overflowing_assignment_raises_and_leaves_the_table(spark: SparkSession, tmp_path: Path, mode: str) -> None:
    path = str(tmp_path / "t")
    table = _create(spark, path, mode)
    files_on_disk = sorted(str(p.relative_to(path)) for p in Path(path).rglob("*.parquet"))
    with pytest.raises(MergeAssignmentOverflowError, match="`v`"):
        table.update("k = 19", {"v": "v * 100000000000"})  # 19e12 does not fit an INT
    assert table.version() == 0
    assert _read_back(spark, path) == sorted(_initial())
    assert sorted(str(p.relative_to(path)) for p in Path(path).rglob("*.parquet")) == files_on_disk


def test_invalid_updates_are_refused_before_anything_runs(spark: SparkSession, tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    table = _create(spark, path, "dv")
    with pytest.raises(DmlAnalysisError, match="`nope`"):
        table.update("k = 1", {"nope": "1"})
    with pytest.raises(DmlAnalysisError, match="more than once"):
        table.update("k = 1", {"v": "1", "V": "2"})
    with pytest.raises(DmlAnalysisError, match="`w`"):
        table.update("k = 1", {"v": "w + 1"})
    with pytest.raises(DmlAnalysisError, match="boolean"):
        table.delete("k + 1")
    with pytest.raises(DmlAnalysisError, match="at least one assignment"):
        table.update("k = 1")
    assert table.version() == 0


@pytest.mark.parametrize("mode", MODES)
def test_append_only_tables_refuse_delete_and_update(spark: SparkSession, tmp_path: Path, mode: str) -> None:
    path = str(tmp_path / "t")
    table = _create(spark, path, mode, properties={"delta.appendOnly": "true"})
    with pytest.raises(DeltaTableError, match="only allow appends"):
        table.delete("k = 1")
    with pytest.raises(DeltaTableError, match="only allow appends"):
        table.update("k = 1", {"v": "0"})
    assert table.version() == 0


@pytest.mark.parametrize("mode", MODES)
def test_a_concurrent_commit_removing_a_read_file_fails_the_delete(spark: SparkSession, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch,
                                                                    mode: str) -> None:
    path = str(tmp_path / "t")
    table = _create(spark, path, mode)
    real_commit: Callable[..., int] = table_commit.commit
    calls: list[str] = []

    def racing_commit(request: Any) -> int:
        if not calls:  # another writer's DELETE of a row in the same file lands first
            calls.append("race")
            DeltaTable.forPath(spark, path).delete("k = 1")
        return real_commit(request)

    monkeypatch.setattr(table_commit, "commit", racing_commit)
    with pytest.raises(ConcurrentModificationError, match="removed files"):
        table.delete("k = 2")
    assert table.version() == 1  # only the racing DELETE
    assert _read_back(spark, path) == [r for r in _initial() if r[0] != 1]
    # Nothing of the failed DELETE lingers: no DV file beyond the committed ones, no new data file.
    snapshot = load_snapshot(path)
    referenced = {dv.path_or_inline_dv for f in snapshot.files
                  if (dv := f.deletion_vector) is not None and dv.storage_type != "i"}
    assert len(list(Path(path).glob("deletion_vector_*.bin"))) == len(referenced)
    assert len(list(Path(path).rglob("*.parquet"))) == 2 + (0 if mode == "dv" else 1)
