"""The fixed cost of a MERGE and of a sink batch, counted exactly, and Delta's rule for which
sources are materialized.

Spark jobs are counted by the status tracker for a job group around the call (broadcast and
shuffle-stage jobs included), log loads by the table layer's profile hook; every test also
checks the table it produced, read back through delta-rs, so a cheaper run cannot be a wrong one.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import deltalake
import pyarrow as pa
import pytest
from pyspark.sql import DataFrame, SparkSession

from streaming_merge import DeltaTable, MergeSink
from streaming_merge.merge.materialize import is_stable, should_materialize
from streaming_merge.spark.profile import profiling
from streaming_merge.streaming.sink import PROBE_TOUCHED_EVERY
from tests.job_count import jobs_of, stages_of


def by_id(path: str) -> dict[int, dict[str, Any]]:
    return {r["id"]: r for r in deltalake.DeltaTable(path).to_pyarrow_table().to_pylist()}


@pytest.fixture()
def orders(spark: SparkSession, tmp_path: Path) -> Iterator[str]:
    path = str(tmp_path / "orders")
    target = spark.range(0, 2000).selectExpr("id", "cast(id * 10 as bigint) as amount", "'old' as status")
    DeltaTable.createFromDataFrame(target.repartition(4), path)
    yield path


CDC_SCHEMA = "id long, lsn long, op string, v string"


def sink_with_tombstones_for_keys_1_and_2(spark: SparkSession, path: str, app_id: str) -> MergeSink:
    """A sink whose table holds keys 0..99 (lsn 1) minus 1 and 2, deleted at lsn 2 (tombstones)."""
    sink = MergeSink(path, keys="id", sequence_by="lsn", delete_when="op = 'd'", app_id=app_id)
    sink(spark.createDataFrame([(i, 1, "c", "a") for i in range(100)], CDC_SCHEMA), 0)
    sink(spark.createDataFrame([(1, 2, "d", None), (2, 2, "d", None)], CDC_SCHEMA), 1)
    return sink


def batch_the_merge_filters_and_materializes(spark: SparkSession, sink: MergeSink, rows: list[tuple[Any, ...]],
                                             batch_id: int, late: int) -> None:
    """Apply a batch whose tombstone lookup is needed and not predicted: the MERGE materializes
    the filtered batch in a job of its own, and ``late`` events are dropped."""
    with profiling() as profile:
        sink(spark.createDataFrame(rows, CDC_SCHEMA), batch_id)
    assert profile.phases["materialize"].jobs >= 1
    progress = sink.lastProgress
    assert progress is not None and progress["numLateRowsDropped"] == late


def parquet_source(spark: SparkSession, folder: Path, rows: list[tuple[int, int, str]]) -> DataFrame:
    spark.createDataFrame(rows, "id long, amount long, status string").coalesce(1).write.mode(
        "overwrite").parquet(str(folder))
    return spark.read.parquet(str(folder))


def test_upsert_merge_runs_at_most_four_jobs_and_loads_the_log_once(
        spark: SparkSession, orders: str, tmp_path: Path) -> None:
    source = parquet_source(spark, tmp_path / "src", [(5, 1, "new"), (1500, 2, "new"), (9000, 3, "new")])
    assert should_materialize("auto", source, insert_only=False)  # a Parquet folder can change

    def upsert() -> Any:
        return (DeltaTable.forPath(spark, orders).alias("t").merge(source.alias("s"), "t.id = s.id")
                .whenMatchedUpdateAll().whenNotMatchedInsertAll().execute())

    with profiling() as profile:
        jobs, metrics = jobs_of(spark, upsert)
    assert jobs <= 4, f"{jobs} Spark jobs for an upsert MERGE"
    assert profile.log_loads == 1
    assert (metrics["numTargetRowsUpdated"], metrics["numTargetRowsInserted"], metrics["numSourceRows"]) == (2, 1, 3)
    table = by_id(orders)
    assert len(table) == 2001
    assert table[5]["status"] == table[1500]["status"] == table[9000]["status"] == "new"
    assert table[6]["status"] == "old"


@pytest.mark.parametrize("on, expected_jobs", [
    ("t.id = s.id", 5),  # materialize, broadcast, findTouchedFiles, broadcast, write
    ("t.id = s.id AND t.amount >= 0", 5),  # a target-only conjunct: still decided by key
    ("t.id = s.id AND s.amount > 0", 4),  # a source column besides the key: the shuffled join
])
def test_large_scan_streams_the_target_past_the_broadcast_source(
        spark: SparkSession, orders: str, tmp_path: Path, on: str, expected_jobs: int) -> None:
    """``broadcast_scan_min_bytes=0`` makes every scan "large": findTouchedFiles broadcasts the
    source (one job more, no target key shuffled) and the inserts come from the source keys no
    match carried; a condition reading a source column besides the key keeps the shuffle."""
    rows = [(5, 1, "new"), (1500, 2, "new"), (1501, 3, "new"), (9000, 4, "new"), (9001, 5, "new")]
    source = parquet_source(spark, tmp_path / "src", rows)

    def upsert() -> Any:
        return (DeltaTable.forPath(spark, orders).alias("t").merge(source.alias("s"), on)
                .whenMatchedUpdateAll().whenNotMatchedInsertAll()
                .withOptions(broadcast_scan_min_bytes=0).execute())

    jobs, metrics = jobs_of(spark, upsert)
    assert jobs == expected_jobs
    assert (metrics["numTargetRowsUpdated"], metrics["numTargetRowsInserted"], metrics["numSourceRows"],
            metrics["numTargetRowsCopied"]) == (3, 2, 5, 997)
    table = by_id(orders)
    assert len(table) == 2002
    assert {i for i, r in table.items() if r["status"] == "new"} == {5, 1500, 1501, 9000, 9001}
    assert table[9001]["amount"] == 5 and table[1501]["amount"] == 3 and table[6]["amount"] == 60


def test_resolution_is_reused_across_python_wrappers_of_one_session(
        spark: SparkSession, orders: str, tmp_path: Path) -> None:
    """foreachBatch wraps the query's session in a new Python SparkSession every micro-batch;
    the same MERGE must still be resolved once, not once per batch, and the expressions
    derived from the resolution (hundreds of JVM round trips) built once."""
    from streaming_merge.merge import command

    def upsert(session: SparkSession, rows: list[tuple[int, int, str]], name: str) -> Any:
        parquet_source(spark, tmp_path / name, rows)
        source = session.read.parquet(str(tmp_path / name))
        return (DeltaTable.forPath(session, orders).alias("t").merge(source.alias("s"), "t.id = s.id")
                .whenMatchedUpdateAll().whenNotMatchedInsertAll().execute())

    upsert(spark, [(1, 1, "first")], "a")
    cached = len(command._resolved_cache)
    resolved = next(reversed(command._resolved_cache.values())).resolved  # the one just used
    derived = dict(resolved.derived)  # the rewrite's action codes, outputs and counts
    assert derived
    wrapper = SparkSession(spark.sparkContext, spark._jsparkSession)
    assert wrapper is not spark
    metrics = upsert(wrapper, [(2, 2, "second"), (7000, 3, "second")], "b")
    assert len(command._resolved_cache) == cached, "a new Python wrapper of the same session resolved again"
    assert all(resolved.derived[key] is value for key, value in derived.items()), "rewrite expressions rebuilt"
    assert (metrics["numTargetRowsUpdated"], metrics["numTargetRowsInserted"]) == (1, 1)
    table = by_id(orders)
    assert (table[1]["status"], table[2]["status"], table[7000]["status"]) == ("first", "second", "second")


def test_insert_only_merge_runs_at_most_three_jobs(spark: SparkSession, orders: str, tmp_path: Path) -> None:
    source = parquet_source(spark, tmp_path / "src", [(7, 1, "dup"), (5000, 2, "new")])

    def insert() -> Any:
        return (DeltaTable.forPath(spark, orders).alias("t").merge(source.alias("s"), "t.id = s.id")
                .whenNotMatchedInsertAll().execute())

    jobs, metrics = jobs_of(spark, insert)
    assert jobs <= 3, f"{jobs} Spark jobs for an insert-only MERGE"
    assert (metrics["numTargetRowsInserted"], metrics["numSourceRows"], metrics["numTargetFilesRemoved"]) == (1, 2, 0)
    table = by_id(orders)
    assert table[7]["status"] == "old" and table[5000]["status"] == "new" and len(table) == 2001


def test_sink_batch_with_sequence_and_tombstones_runs_at_most_six_jobs(
        spark: SparkSession, tmp_path: Path) -> None:
    path = str(tmp_path / "cdc")
    sink = sink_with_tombstones_for_keys_1_and_2(spark, path, "budget")
    # Batch 2: a late insert of deleted key 1 (older than its tombstone), a newer re-insert of 2,
    # duplicates of 3 (the newest wins), a delete of 4, a new key.
    batch = spark.createDataFrame([(1, 1, "u", "late"), (2, 3, "c", "back"), (3, 5, "u", "old"),
                                   (3, 6, "u", "newest"), (4, 7, "d", None), (500, 1, "c", "new")], CDC_SCHEMA)
    with profiling() as profile:
        jobs_outside_merge_phases, _ = jobs_of(spark, lambda: sink(batch, 2))
    # Under a profile each MERGE phase runs its jobs in a job group of its own: the batch's jobs
    # are those of the group around the call plus those of the phases.
    jobs = jobs_outside_merge_phases + profile.jobs
    assert jobs <= 6, f"{jobs} Spark jobs for one sink batch"
    # The target is followed from batch 1's snapshot (only the commits since are read); the
    # tombstone table, which batch 1's append created, is loaded once, then followed too.
    assert (profile.log_loads, profile.log_updates > 0) == (1, True)
    progress = sink.lastProgress
    assert progress is not None
    assert (progress["numInputRows"], progress["numRowsAfterDedupe"], progress["numLateRowsDropped"]) == (6, 5, 1)
    table = by_id(path)
    assert 1 not in table and 4 not in table
    assert table[2]["v"] == "back" and table[3]["v"] == "newest" and table[500]["v"] == "new"
    assert len(table) == 99


def test_auto_materializes_everything_but_local_data_and_pinned_table_scans(
        spark: SparkSession, orders: str, tmp_path: Path) -> None:
    local = spark.createDataFrame(pa.table({"id": [1], "amount": [2], "status": ["x"]}))  # a LocalRelation
    assert is_stable(local) and not should_materialize("auto", local, insert_only=False)
    table_scan = DeltaTable.forPath(spark, orders).toDF()
    assert is_stable(table_scan) and not should_materialize("auto", table_scan, insert_only=False)
    folder = parquet_source(spark, tmp_path / "src", [(1, 2, "x")])
    assert not is_stable(folder) and should_materialize("auto", folder, insert_only=False)
    # An RDD (PySpark builds one even from a Python list) can compute anything: materialized.
    rdd = spark.createDataFrame([(1, 2, "x")], "id long, amount long, status string")
    assert should_materialize("auto", rdd, insert_only=False)
    assert not should_materialize("auto", folder, insert_only=True)  # read once


def test_a_parquet_source_changing_between_the_scans_is_read_once(
        spark: SparkSession, orders: str, tmp_path: Path) -> None:
    folder = tmp_path / "src"
    source = parquet_source(spark, folder, [(5, 1, "first"), (6, 2, "first")])

    def rewrite_source(phase: str, frame: DataFrame) -> None:
        if phase == "after_find_touched_files":  # another job replaces the folder's data
            parquet_source(spark, folder, [(5, 9, "second"), (7000, 9, "second")])
            spark.catalog.clearCache()

    metrics = (DeltaTable.forPath(spark, orders).alias("t").merge(source.alias("s"), "t.id = s.id")
               .whenMatchedUpdateAll().whenNotMatchedInsertAll()
               .withOptions(phase_hook=rewrite_source).execute())
    table = by_id(orders)
    assert (table[5]["status"], table[6]["status"]) == ("first", "first")
    assert 7000 not in table
    assert (metrics["numTargetRowsUpdated"], metrics["numTargetRowsInserted"]) == (2, 0)


def test_partitioned_upsert_stays_within_four_jobs(spark: SparkSession, tmp_path: Path) -> None:
    path = str(tmp_path / "by_region")
    target = spark.range(0, 300).selectExpr("id", "cast(id as bigint) as amount",
                                            "case when id % 3 = 0 then 'eu' when id % 3 = 1 then 'us' end as region")
    DeltaTable.createFromDataFrame(target, path, partitionBy=["region"])
    source = parquet_source(spark, tmp_path / "src", [(3, 1, "x"), (4, 2, "y"), (900, 3, "z")]).selectExpr(
        "id", "amount", "case when id = 3 then 'eu' when id = 4 then 'us' else 'ap' end as region")

    def upsert() -> Any:
        return (DeltaTable.forPath(spark, path).alias("t").merge(source.alias("s"), "t.id = s.id")
                .whenMatchedUpdateAll().whenNotMatchedInsertAll().execute())

    jobs, metrics = jobs_of(spark, upsert)
    assert jobs <= 4, f"{jobs} Spark jobs for an upsert into a partitioned table"
    assert (metrics["numTargetRowsUpdated"], metrics["numTargetRowsInserted"]) == (2, 1)
    table = by_id(path)
    assert (table[3]["amount"], table[4]["amount"], table[900]["region"], table[5]["region"]) == (1, 2, "ap", None)
    assert len(table) == 301


@pytest.mark.usefixtures("without_small_table_rules")
def test_in_order_batch_newer_than_every_tombstone_skips_the_tombstone_lookup(
        spark: SparkSession, tmp_path: Path) -> None:
    path = str(tmp_path / "in_order")
    sink = sink_with_tombstones_for_keys_1_and_2(spark, path, "in-order")
    # Every event is newer than every tombstone: a re-insert of deleted key 2, an update, a new
    # key, a delete. Nothing can be late, so the MERGE takes the sink's own materialized batch.
    in_order = spark.createDataFrame([(2, 3, "c", "back"), (3, 4, "u", "x"), (600, 5, "c", "new"),
                                      (4, 6, "d", None)], CDC_SCHEMA)
    with profiling() as profile:
        sink(in_order, 2)
    merge_materialize = profile.phases.get("materialize")
    assert merge_materialize is None or merge_materialize.jobs == 0, "the MERGE materialized its source again"
    progress = sink.lastProgress
    assert progress is not None and progress["numLateRowsDropped"] == 0
    assert progress["metrics"]["numSourceRows"] == 4
    # One event older than a tombstone (key 4's, at lsn 6) makes the lookup necessary again.
    batch_the_merge_filters_and_materializes(spark, sink, [(4, 5, "u", "late"), (5, 8, "u", "y")], 3, late=1)
    table = by_id(path)
    assert 1 not in table and 4 not in table
    assert (table[2]["v"], table[3]["v"], table[5]["v"], table[600]["v"]) == ("back", "x", "y", "new")
    assert len(table) == 99  # 100 rows, keys 1 and 4 deleted, 600 new


@pytest.mark.usefixtures("without_small_table_rules")
def test_after_a_lookup_of_most_tombstones_the_next_batch_drops_late_events_while_materialized(
        spark: SparkSession, tmp_path: Path) -> None:
    path = str(tmp_path / "late_again")
    sink = sink_with_tombstones_for_keys_1_and_2(spark, path, "late-again")
    # A late update of deleted key 1 needs the lookup; the MERGE filters and materializes it.
    batch_the_merge_filters_and_materializes(spark, sink, [(1, 1, "u", "late"), (3, 4, "u", "x")], 2, late=1)
    # That lookup read every tombstone file, so the next batch drops its late events while the
    # sink materializes it: the MERGE takes that copy (no materialize job of its own).
    again = spark.createDataFrame([(2, 1, "u", "late"), (2, 2, "c", "same lsn"), (1, 5, "c", "back"),
                                   (7, 3, "d", None), (8, 6, "u", "y")], CDC_SCHEMA)
    with profiling() as profile:
        jobs_outside_merge_phases, _ = jobs_of(spark, lambda: sink(again, 3))
    merge_materialize = profile.phases.get("materialize")
    assert merge_materialize is None or merge_materialize.jobs == 0, "the MERGE materialized its source again"
    assert jobs_outside_merge_phases + profile.jobs <= 6
    progress = sink.lastProgress
    assert progress is not None
    # Key 2's events are both not newer than its tombstone (lsn 2); key 1 comes back after its delete.
    assert (progress["numInputRows"], progress["numRowsAfterDedupe"], progress["numLateRowsDropped"]) == (5, 4, 1)
    assert progress["metrics"]["numSourceRows"] == 3
    table = by_id(path)
    assert 2 not in table and 7 not in table
    assert (table[1]["v"], table[3]["v"], table[8]["v"]) == ("back", "x", "y")
    assert len(table) == 98  # 0..99 minus 2 and 7; key 1 back


@pytest.mark.usefixtures("without_small_table_rules")
def test_after_a_batch_that_touched_every_candidate_the_next_skips_find_touched_files(
        spark: SparkSession, tmp_path: Path) -> None:
    path = str(tmp_path / "touch_all")
    DeltaTable.createFromDataFrame(spark.createDataFrame([(i, 1, "c", "a") for i in range(100) if i != 60], CDC_SCHEMA)
                                   .repartitionByRange(4, "id"), path)
    sink = MergeSink(path, keys="id", sequence_by="lsn", delete_when="op = 'd'", app_id="touch-all")

    def batch(rows: list[tuple[Any, ...]], batch_id: int) -> tuple[dict[str, Any], dict[str, int]]:
        with profiling() as profile:
            sink(spark.createDataFrame(rows, CDC_SCHEMA), batch_id)
        progress = sink.lastProgress
        assert progress is not None
        return progress["metrics"], {name: stats.jobs for name, stats in profile.phases.items()}

    # Keys 0..99 but 60 in 4 files by range: keys 1 and 30 touch both files of the range [1, 30].
    metrics, jobs = batch([(1, 2, "u", "b"), (30, 2, "u", "b")], 0)
    assert jobs["findTouchedFiles"] >= 1
    assert metrics["numTargetFilesRemoved"] == metrics["numTargetFilesAfterSkipping"] == 2
    # So the next batch rewrites every candidate without the scan, though it leaves one of them
    # untouched (keys 50..74, whose range holds the new key 60 but no row of it matches): that
    # file's rows are copied, and the table is what the scan makes.
    metrics, jobs = batch([(2, 4, "u", "d"), (3, 4, "d", None), (60, 4, "c", "new60"), (90, 4, "u", "d"),
                           (500, 4, "c", "new")], 1)
    assert jobs.get("findTouchedFiles", 0) == 0
    assert metrics["numTargetFilesRemoved"] == metrics["numTargetFilesAfterSkipping"] == 3
    assert (metrics["numTargetRowsUpdated"], metrics["numTargetRowsDeleted"], metrics["numTargetRowsInserted"],
            metrics["numTargetRowsCopied"], metrics["numSourceRows"]) == (2, 1, 2, 96, 5)
    table = by_id(path)
    assert [table[k]["v"] for k in (1, 2, 60, 61, 90, 500)] == ["b", "d", "new60", "a", "d", "new"]
    assert 3 not in table and len(table) == 100
    # Every PROBE_TOUCHED_EVERY-th batch of such a run scans again, to notice keys that stop
    # touching every candidate.
    scanned = [batch([(60, batch_id, "u", "e")], batch_id)[1].get("findTouchedFiles", 0) > 0
               for batch_id in range(2, PROBE_TOUCHED_EVERY + 1)]
    assert scanned == [False] * (PROBE_TOUCHED_EVERY - 2) + [True]


def test_small_candidate_files_are_rewritten_whole_without_find_touched_files(
        spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Candidates within sink.SMALL_CANDIDATES_BYTES are rewritten whole from the first batch:
    findTouchedFiles's job costs more than copying their untouched rows. Above it, the scan
    runs and only the touched files are rewritten; the table is the same either way."""
    from streaming_merge.streaming import sink as sink_module

    def run(name: str) -> tuple[dict[str, Any], dict[str, int], str]:
        path = str(tmp_path / name)
        DeltaTable.createFromDataFrame(
            spark.createDataFrame([(i, 1, "c", "a") for i in range(100) if i != 80], CDC_SCHEMA)
            .repartitionByRange(4, "id"), path)
        sink = MergeSink(path, keys="id", sequence_by="lsn", delete_when="op = 'd'", app_id=name)
        # Keys 0..99 but 80 in 4 files by range: the batch has a key in the range of each (80 is
        # new, so that file is not touched); it touches 3.
        with profiling() as profile:
            sink(spark.createDataFrame([(1, 2, "u", "b"), (30, 2, "d", None), (60, 2, "u", "b"),
                                        (80, 2, "c", "new80"), (500, 2, "c", "new")], CDC_SCHEMA), 0)
        progress = sink.lastProgress
        assert progress is not None
        return progress["metrics"], {n: stats.jobs for n, stats in profile.phases.items()}, path

    metrics, jobs, path = run("small")
    assert jobs.get("findTouchedFiles", 0) == 0
    assert metrics["numTargetFilesRemoved"] == metrics["numTargetFilesAfterSkipping"] == 4
    assert (metrics["numTargetRowsUpdated"], metrics["numTargetRowsDeleted"], metrics["numTargetRowsInserted"],
            metrics["numTargetRowsCopied"]) == (2, 1, 2, 96)
    small = by_id(path)

    monkeypatch.setattr(sink_module, "SMALL_CANDIDATES_BYTES", 1)
    metrics, jobs, path = run("scanned")
    assert jobs["findTouchedFiles"] >= 1
    assert (metrics["numTargetFilesAfterSkipping"], metrics["numTargetFilesRemoved"]) == (4, 3)
    assert (metrics["numTargetRowsUpdated"], metrics["numTargetRowsDeleted"], metrics["numTargetRowsInserted"],
            metrics["numTargetRowsCopied"]) == (2, 1, 2, 72)
    assert by_id(path) == small
    assert 30 not in small and (small[1]["v"], small[60]["v"], small[500]["v"], small[2]["v"], small[80]["v"]) == \
        ("b", "b", "new", "a", "new80")
    assert len(small) == 100


def test_with_few_tombstones_late_events_are_dropped_while_the_batch_is_materialized(
        spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before any lookup has seen a tombstone (here the first batch after the first deletes), a
    tombstone table within tombstones.SMALL_TABLE_BYTES is checked in the batch's own
    materialization: the MERGE then needs no materialization of its own. An in-order stream's
    next lookups find nothing to read, and it goes back to no tombstone check at all. Above the
    bound, the lookup after the materialization finds the late event and the MERGE
    materializes the filtered batch. The table is the same either way."""
    from streaming_merge.streaming import tombstones

    filters: list[bool] = []  # per tombstone filter: True while materializing, False in the MERGE
    original = tombstones.Tombstones.without_late

    def recorded(self: Any, *args: Any, partitioned_by_keys: bool = False, **kwargs: Any) -> DataFrame:
        filters.append(partitioned_by_keys)
        return original(self, *args, partitioned_by_keys=partitioned_by_keys, **kwargs)

    monkeypatch.setattr(tombstones.Tombstones, "without_late", recorded)
    late_batch = [(1, 1, "u", "late"), (3, 4, "u", "x"), (2, 5, "c", "back")]
    path = str(tmp_path / "few")
    sink = sink_with_tombstones_for_keys_1_and_2(spark, path, "few")
    filters.clear()
    with profiling() as profile:
        sink(spark.createDataFrame(late_batch, CDC_SCHEMA), 2)
    merge_materialize = profile.phases.get("materialize")
    assert merge_materialize is None or merge_materialize.jobs == 0, "the MERGE materialized its source again"
    assert filters == [True]
    progress = sink.lastProgress
    assert progress is not None and progress["numLateRowsDropped"] == 1
    assert progress["metrics"]["numSourceRows"] == 2
    # In order from here: the lookup after batch 2 read every tombstone, so batch 3 still filters
    # while materializing; its own lookup finds nothing to read, so batch 4 does no check.
    filters.clear()
    sink(spark.createDataFrame([(5, 6, "u", "y")], CDC_SCHEMA), 3)
    sink(spark.createDataFrame([(6, 7, "u", "z")], CDC_SCHEMA), 4)
    assert filters == [True]

    monkeypatch.setattr(tombstones, "SMALL_TABLE_BYTES", 0)
    other = str(tmp_path / "looked_up")
    batch_the_merge_filters_and_materializes(spark, sink_with_tombstones_for_keys_1_and_2(spark, other, "looked-up"),
                                             late_batch, 2, late=1)
    table = by_id(path)
    assert {k: v for k, v in by_id(other).items() if k not in (5, 6)} == \
        {k: v for k, v in table.items() if k not in (5, 6)}
    assert 1 not in table and (table[2]["v"], table[3]["v"], table[5]["v"], table[6]["v"]) == ("back", "x", "y", "z")
    assert len(table) == 99


def test_a_batch_folded_into_one_partition_meets_the_tombstones_in_its_own_task(
        spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A micro-batch has no size estimate (here, as from a streaming source: rows of an RDD), so
    Spark would shuffle a one-partition batch and the one-partition tombstones again before
    joining them; the sink's copy runs the fold, the late-event check and the copy in one stage,
    the tombstones' read in another."""
    from streaming_merge.streaming import batch_copy

    stages: list[int] = []
    original = batch_copy.materialize

    def counted(frame: DataFrame, *args: Any, **kwargs: Any) -> Any:
        ran, result = stages_of(spark, lambda: original(frame, *args, **kwargs))
        stages.append(ran)
        return result

    monkeypatch.setattr(batch_copy, "materialize", counted)
    path = str(tmp_path / "one_task")
    sink = sink_with_tombstones_for_keys_1_and_2(spark, path, "one-task")
    stages.clear()
    late_batch = [(1, 1, "u", "late"), (3, 4, "u", "x"), (2, 5, "c", "back"), (3, 6, "u", "x2")]
    sink(spark.createDataFrame(spark.sparkContext.parallelize(late_batch, 2), CDC_SCHEMA), 2, rows_at_most=4)
    assert stages == [2]
    progress = sink.lastProgress
    assert progress is not None and progress["numLateRowsDropped"] == 1 and progress["numRowsAfterDedupe"] == 3
    table = by_id(path)
    assert 1 not in table and (table[2]["v"], table[3]["v"]) == ("back", "x2") and len(table) == 99

