"""The one-pass MERGE (MergeOptions.single_pass): every candidate file rewritten in one Spark job
that also observes which candidates were touched and whether a target row could have matched
two source rows. Each case runs the same MERGE on two copies of one table, one pass and Delta's
two passes, and compares the tables, the metrics and the files left in the folder; each runs
the shuffled one pass and the map-side one (a broadcast source and a target past
``broadcast_scan_min_bytes``, here 0), whose inserts follow in a job of their own.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import deltalake
import pyarrow as pa
import pytest
from pyspark.sql import SparkSession

from streaming_merge import DeltaTable
from streaming_merge.errors import MultipleSourceRowMatchingTargetRowError
from streaming_merge.merge.skipping import SourceStats
from streaming_merge.spark.profile import profiling
from streaming_merge.table import file_ids

# Times, and the new files' bytes: the two plans write the same rows in another order.
PHYSICAL_METRICS = {"executionTimeMs", "scanTimeMs", "rewriteTimeMs", "numTargetBytesAdded"}
# The map-side pass writes the inserts into a file of their own (at the sizes it is chosen for,
# the rewrite is spread over several files and Delta's two passes do the same).
MAP_SIDE_PHYSICAL_METRICS = PHYSICAL_METRICS | {"numTargetFilesAdded"}
PASSES = {"shuffled": {}, "map-side": {"broadcast_scan_min_bytes": 0}}
# Spark jobs of a conclusive pass: materialize and the pass; map-side also the source's
# broadcast (its rows per key counted on the way, the source's keys not being known unique
# here). The map-side pass writes the inserts of keys outside every candidate's range in its
# own job; only a new key inside a range needs an insert job after it.
CONCLUSIVE_JOBS = {"shuffled": 2, "map-side": 3}


@pytest.fixture(params=list(PASSES))
def one_pass(request: pytest.FixtureRequest) -> str:
    return str(request.param)
SCHEMA = "id long, amount long, status string"


@pytest.fixture(params=["distinct file sizes", "equal file sizes", "two files of one size",
                        "two files of one size, path hashes colliding"])
def even_ids(tmp_path: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Ids 0, 2, .., 3998 in 4 files of 500, one per range of 1,000 ids: an odd id inside a file's
    range is a new key. The MERGE tells the candidates' rows apart by their files' sizes, and the
    rows of files that share a size by a hash of their paths (or, when two hashes collide, by a
    lookup of the paths): with a constant amount the sizes repeat (in every file, or in two)."""
    path = str(tmp_path / "even")
    constant = {"distinct file sizes": (), "equal file sizes": (0, 1000, 2000, 3000)}.get(request.param, (1000, 3000))
    if "colliding" in request.param:
        monkeypatch.setattr(file_ids, "path_hash_id", lambda _: -5)
    for start in range(0, 4000, 1000):  # one append, one file per range of 1,000 ids
        ids = list(range(start, start + 1000, 2))
        deltalake.write_deltalake(path, pa.table({"id": pa.array(ids, pa.int64()),
                                                  "amount": pa.array([1 if start in constant else i * 10
                                                                      for i in ids], pa.int64()),
                                                  "status": pa.array(["old"] * len(ids))}), mode="append")
    sizes = [p.stat().st_size for p in Path(path).glob("*.parquet")]
    assert len(sizes) == 4 and (len(set(sizes)) == 4) == (not constant)
    assert len(constant) != 2 or len(set(sizes)) == 3  # two files share a size, two do not
    return path


def rows_by_id(path: str) -> list[dict[str, Any]]:
    return sorted(deltalake.DeltaTable(path).to_pyarrow_table().to_pylist(),
                  key=lambda r: (r["id"], r["amount"]))


def parquet_files(path: str) -> int:
    return sum(1 for _ in Path(path).rglob("*.parquet"))


def run_merge(spark: SparkSession, path: str, folder: Path, rows: list[tuple[int, int, str]], clauses: str,
              **options: Any) -> tuple[Any, int, dict[str, int]]:
    """(metrics, Spark jobs, jobs per phase; counted by the status tracker) of a MERGE of ``rows``
    (a Parquet folder) into ``path``."""
    spark.createDataFrame(rows, SCHEMA).coalesce(1).write.mode("overwrite").parquet(str(folder))
    source = spark.read.parquet(str(folder))
    builder = DeltaTable.forPath(spark, path).alias("t").merge(source.alias("s"), "t.id = s.id")
    if "update" in clauses:
        builder = builder.whenMatchedUpdate(condition="s.amount > t.amount" if "conditional" in clauses else None,
                                            set={"amount": "s.amount", "status": "s.status"})
    if "insert" in clauses:
        builder = builder.whenNotMatchedInsertAll()
    with profiling() as profile:
        metrics = builder.withOptions(**options).execute()
    return metrics, profile.jobs, {name: stats.jobs for name, stats in profile.phases.items()}


def both_ways(spark: SparkSession, path: str, tmp_path: Path, rows: list[tuple[int, int, str]],
              clauses: str = "update insert", one_pass: str = "shuffled") -> tuple[dict[str, Any], int, dict[str, int]]:
    """Run the MERGE in one pass (``one_pass``: shuffled or map-side) and in two passes on a copy;
    assert the same table, metrics and folder; return the one-pass run's metrics, jobs and jobs
    per phase."""
    copy = str(tmp_path / "two_passes")
    shutil.copytree(path, copy)
    one, jobs, phases = run_merge(spark, path, tmp_path / "src1", rows, clauses, **PASSES[one_pass])
    two, _, two_phases = run_merge(spark, copy, tmp_path / "src2", rows, clauses, single_pass=False,
                                   **PASSES[one_pass])
    assert two_phases.get("findTouchedFiles", 0) >= 1
    assert rows_by_id(path) == rows_by_id(copy)
    physical = PHYSICAL_METRICS if one_pass == "shuffled" else MAP_SIDE_PHYSICAL_METRICS
    assert {k: v for k, v in one.items() if k not in physical} == {k: v for k, v in two.items() if k not in physical}
    if one_pass == "shuffled":
        assert parquet_files(path) == parquet_files(copy), "a discarded pass left files behind"
    else:
        added = one["numTargetFilesAdded"] - two["numTargetFilesAdded"]
        assert parquet_files(path) == parquet_files(copy) + added, "a discarded pass left files behind"
    return dict(one.items()), jobs, phases


def test_an_upsert_touching_every_candidate_is_one_job_after_materializing(
        spark: SparkSession, even_ids: str, tmp_path: Path, one_pass: str) -> None:
    # 40 updates spread over the 4 files plus 10 new ids: 10 source rows per candidate file.
    rows = [(i, 1_000_000 + i, "new") for i in range(0, 4000, 100)] + [(i, 7, "ins") for i in range(5001, 5011)]
    metrics, jobs, phases = both_ways(spark, even_ids, tmp_path, rows, one_pass=one_pass)
    assert jobs == CONCLUSIVE_JOBS[one_pass] and phases.get("findTouchedFiles", 0) == 0
    assert phases["writeAllChanges"] == CONCLUSIVE_JOBS[one_pass] - 1
    assert (metrics["numTargetFilesRemoved"], metrics["numTargetRowsUpdated"], metrics["numTargetRowsInserted"],
            metrics["numTargetRowsCopied"], metrics["numSourceRows"]) == (4, 40, 10, 1960, 50)
    table = {r["id"]: r for r in rows_by_id(even_ids)}
    assert len(table) == 2010 and table[100]["amount"] == 1_000_100 and table[102]["status"] == "old"
    assert table[5001]["status"] == "ins"


def test_files_of_one_size_under_a_root_spark_quotes_are_told_apart_in_one_pass(
        spark: SparkSession, even_ids: str, tmp_path: Path, one_pass: str) -> None:
    """The path hashes are computed on the driver from the paths as Spark reports them (quoted):
    a root with a space and non-ASCII letters still gives every row its own file's id, so the
    pass is conclusive (a hash that differed from Spark's would send it to findTouchedFiles)."""
    quoted = str(tmp_path / "a folder" / "ümlaut table")
    shutil.copytree(even_ids, quoted)
    rows = [(i, 1_000_000 + i, "new") for i in range(0, 4000, 100)] + [(i, 7, "ins") for i in range(5001, 5011)]
    metrics, jobs, phases = both_ways(spark, quoted, tmp_path, rows, one_pass=one_pass)
    assert jobs == CONCLUSIVE_JOBS[one_pass] and phases.get("findTouchedFiles", 0) == 0
    assert (metrics["numTargetFilesRemoved"], metrics["numTargetRowsUpdated"]) == (4, 40)


def test_an_untouched_candidate_is_left_alone_after_the_pass(
        spark: SparkSession, even_ids: str, tmp_path: Path, one_pass: str) -> None:
    """The last file's range only receives new (odd) ids: it is a candidate the pass finds
    untouched, so its files are deleted and the three touched files are rewritten."""
    rows = [(i, 1_000_000 + i, "new") for i in range(0, 3000, 100)] + [(i, 7, "ins") for i in range(3001, 3999, 100)]
    metrics, jobs, phases = both_ways(spark, even_ids, tmp_path, rows, one_pass=one_pass)
    # Shuffled: the pass and the rewrite of the touched files; map-side, the pass is two jobs
    # (the source's broadcast, then the rewrite) and no insert follows a discarded pass.
    expected = {"shuffled": (2, 3), "map-side": (3, 4)}[one_pass]
    assert phases.get("findTouchedFiles", 0) == 0 and (phases["writeAllChanges"], jobs) == expected
    assert (metrics["numTargetFilesAfterSkipping"], metrics["numTargetFilesRemoved"]) == (4, 3)
    assert (metrics["numTargetRowsUpdated"], metrics["numTargetRowsInserted"]) == (30, 10)
    assert metrics["numTargetRowsCopied"] == 1500 - 30  # the untouched file's 500 rows were not copied


def test_matched_only_counts_a_file_touched_only_where_a_clause_applies(
        spark: SparkSession, even_ids: str, tmp_path: Path, one_pass: str) -> None:
    """Conditional update only: the matches in the first file all fail the clause's condition,
    so that file is not touched (Delta's findTouchedFiles rule for MATCHED-only MERGEs)."""
    rows = [(i, -1, "lower") for i in range(0, 1000, 20)] + [(i, 1_000_000, "new") for i in range(1000, 4000, 20)]
    metrics, _, phases = both_ways(spark, even_ids, tmp_path, rows, "update conditional", one_pass)
    assert phases.get("findTouchedFiles", 0) == 0
    assert (metrics["numTargetFilesRemoved"], metrics["numTargetRowsUpdated"]) == (3, 150)
    assert {r["status"] for r in rows_by_id(even_ids) if r["id"] < 1000} == {"old"}


def test_duplicate_keys_among_inserts_only_stay_one_pass(
        spark: SparkSession, even_ids: str, tmp_path: Path, one_pass: str) -> None:
    """Two source rows of one new key both insert (Delta's rule); no target row can match two."""
    rows = [(i, 1, "new") for i in range(0, 4000, 100)] + [(5001, 1, "a"), (5001, 2, "b")]
    metrics, jobs, _ = both_ways(spark, even_ids, tmp_path, rows, one_pass=one_pass)
    assert jobs == CONCLUSIVE_JOBS[one_pass] and metrics["numTargetRowsInserted"] == 2
    assert [r["status"] for r in rows_by_id(even_ids) if r["id"] == 5001] == ["a", "b"]


def test_new_keys_inside_a_candidates_range_are_inserted_after_the_map_side_pass(
        spark: SparkSession, even_ids: str, tmp_path: Path) -> None:
    """Odd ids inside the files' ranges may have matched as far as the pass knows before it
    runs: the pass writes the inserts of keys outside every range (5001..) in its own job, and
    the inserts' write after it adds those it saw match nothing, each once (a duplicate new
    key inside a range inserts both rows, as Delta does)."""
    rows = ([(i, 1_000_000 + i, "new") for i in range(0, 4000, 100)] + [(i, 7, "out") for i in range(5001, 5011)]
            + [(i, 8, "in") for i in range(1001, 1100, 20)] + [(2001, 9, "twice"), (2001, 10, "twice")])
    metrics, jobs, phases = both_ways(spark, even_ids, tmp_path, rows, one_pass="map-side")
    # The inserts after the pass: the matched keys' broadcast, then the write.
    assert phases.get("findTouchedFiles", 0) == 0 and jobs == CONCLUSIVE_JOBS["map-side"] + 2
    assert (metrics["numTargetRowsUpdated"], metrics["numTargetRowsInserted"], metrics["numSourceRows"],
            metrics["numSourceRowsInSecondScan"]) == (40, 17, 57, 57)
    table = rows_by_id(even_ids)
    assert len(table) == 2017 and [r["amount"] for r in table if r["id"] == 2001] == [9, 10]
    assert {r["id"] for r in table if r["status"] in ("out", "in")} == {*range(5001, 5011), *range(1001, 1100, 20)}


def test_two_source_rows_matching_one_target_row_fail_as_delta_does_and_leave_no_files(
        spark: SparkSession, even_ids: str, tmp_path: Path, one_pass: str) -> None:
    """The map-side pass tells the double match from the rows it joined, one more than the
    candidates' record counts in the log; findTouchedFiles then names the row."""
    before, files_before = rows_by_id(even_ids), parquet_files(even_ids)
    version = deltalake.DeltaTable(even_ids).version()
    rows = [(i, 1, "new") for i in range(0, 4000, 100)] + [(200, 2, "again")]
    with pytest.raises(MultipleSourceRowMatchingTargetRowError, match=r"id=200 \(matched by 2 source rows\)"):
        run_merge(spark, even_ids, tmp_path / "src", rows, "update insert", **PASSES[one_pass])
    assert deltalake.DeltaTable(even_ids).version() == version
    assert rows_by_id(even_ids) == before and parquet_files(even_ids) == files_before


def test_too_few_source_rows_per_candidate_keep_the_two_passes(
        spark: SparkSession, even_ids: str, tmp_path: Path) -> None:
    rows = [(i, 1, "new") for i in range(0, 4000, 500)]  # 2 rows per file, below 8
    _, _, phases = run_merge(spark, even_ids, tmp_path / "src", rows, "update insert")
    assert phases["findTouchedFiles"] >= 1
    assert {r["id"] for r in rows_by_id(even_ids) if r["status"] == "new"} == set(range(0, 4000, 500))


def test_a_failed_insert_write_after_the_map_side_pass_leaves_nothing_behind(
        spark: SparkSession, even_ids: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The map-side pass writes the rewritten files before the inserts: when the inserts' write
    fails, the rewritten files are deleted too and nothing is committed."""
    from streaming_merge.merge import map_side_pass

    def failing_write(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("the inserts' write failed")

    monkeypatch.setattr(map_side_pass, "write_inserts_only", failing_write)
    before, files_before = rows_by_id(even_ids), parquet_files(even_ids)
    version = deltalake.DeltaTable(even_ids).version()
    # New keys outside every file's range are written by the pass itself; 1001 is a new key
    # inside a range, which only the inserts' write after the pass can tell unmatched.
    rows = ([(i, 1_000_000 + i, "new") for i in range(0, 4000, 100)] + [(i, 7, "ins") for i in range(5001, 5011)]
            + [(1001, 7, "ins")])
    with pytest.raises(RuntimeError, match="the inserts' write failed"):
        run_merge(spark, even_ids, tmp_path / "src", rows, "update insert", **PASSES["map-side"])
    assert deltalake.DeltaTable(even_ids).version() == version
    assert rows_by_id(even_ids) == before and parquet_files(even_ids) == files_before


def _small_table_and_source(spark: SparkSession, tmp_path: Path) -> tuple[str, list[tuple[Any, ...]]]:
    """Four files of 500 rows, and a source of 40 updates and 10 inserts: one output file."""
    path = str(tmp_path / "small")
    for start in range(0, 4000, 1000):
        ids = list(range(start, start + 1000, 2))
        deltalake.write_deltalake(path, pa.table({"id": pa.array(ids, pa.int64()), "amount": pa.array(ids, pa.int64()),
                                                  "status": pa.array(["old"] * len(ids))}), mode="append")
    rows = [(i, 1_000_000 + i, "new") for i in range(0, 4000, 100)] + [(i, 7, "ins") for i in range(5001, 5011)]
    spark.createDataFrame(rows, SCHEMA).coalesce(1).write.parquet(str(tmp_path / "src"))
    return path, rows


def _stages_of_merge(spark: SparkSession, group: str, build: Callable[[], Any]) -> tuple[list[int], Any]:
    """Run ``build().execute()`` in job group ``group``; the stages of each of its jobs."""
    context = spark.sparkContext
    context.setLocalProperty("spark.jobGroup.id", group)
    try:
        metrics = build().execute()
    finally:
        context.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
    tracker = context.statusTracker()
    jobs = tracker.getJobIdsForGroup(group)
    return [len(info.stageIds) for job in jobs if (info := tracker.getJobInfo(job)) is not None], metrics


def _assert_small_merge_applied(path: str, metrics: Any) -> None:
    assert (metrics["numTargetFilesRemoved"], metrics["numTargetFilesAdded"], metrics["numTargetRowsUpdated"],
            metrics["numTargetRowsInserted"], metrics["numTargetRowsCopied"]) == (4, 1, 40, 10, 1960)
    table = {r["id"]: r for r in rows_by_id(path)}
    assert len(table) == 2010 and table[100]["amount"] == 1_000_100 and table[5001]["status"] == "ins"


def test_a_small_one_pass_reads_joins_and_writes_in_one_stage(spark: SparkSession, tmp_path: Path) -> None:
    """One output file: both sides are taken in one partition as read, so the pass's job has no
    exchange (it had two: each side hashed on the key into that one partition)."""
    path, _ = _small_table_and_source(spark, tmp_path)
    source = spark.read.parquet(str(tmp_path / "src"))
    stages, metrics = _stages_of_merge(spark, "small-one-pass", lambda: (
        DeltaTable.forPath(spark, path).alias("t").merge(source.alias("s"), "t.id = s.id")
        .whenMatchedUpdateAll().whenNotMatchedInsertAll()))
    assert stages == [1, 1], stages  # materialize, then the pass
    _assert_small_merge_applied(path, metrics)


def test_a_small_rewrite_of_every_candidate_runs_in_one_stage(spark: SparkSession, tmp_path: Path) -> None:
    """The streaming sink's rewrite of every candidate without findTouchedFiles (unique source
    keys it observed) takes both sides in one partition too when they make one file: its job
    was three stages (two exchanges and a sort-merge join), 214 -> 150 ms per 1k-row batch."""
    path, rows = _small_table_and_source(spark, tmp_path)
    source = spark.read.parquet(str(tmp_path / "src"))
    ids = [r[0] for r in rows]
    stats = SourceStats(len(rows), {"id": (min(ids), max(ids))}, unique_keys=("id",))
    stages, metrics = _stages_of_merge(spark, "small-rewrite-all", lambda: (
        DeltaTable.forPath(spark, path).alias("t").merge(source.alias("s"), "t.id = s.id")
        .whenMatchedUpdateAll().whenNotMatchedInsertAll()
        .withOptions(materialize_source="none", source_stats=stats, rewrite_all_candidates_bytes=1 << 40)))
    assert stages == [1], stages  # the rewrite alone: no findTouchedFiles, no source pass
    _assert_small_merge_applied(path, metrics)
