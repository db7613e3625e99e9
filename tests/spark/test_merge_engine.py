"""MERGE engine behaviours beyond the property test: errors, skipping, evolution,
materialized-source retries, concurrency, idempotency, job descriptions.

Every outcome is read back through delta-rs, independently of our reader.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import deltalake
import pyarrow as pa
import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from streaming_merge import DeltaTable, MergeMetrics
from streaming_merge.errors import (
    ConcurrentModificationError,
    MaterializedSourceLostError,
    MergeAnalysisError,
    MergeAssignmentOverflowError,
    MultipleSourceRowMatchingTargetRowError,
    NotADeltaTableError,
    UnsupportedTableFeatureError,
)
from streaming_merge.merge.command import EXCLUDED_RULES, LOCAL_ROWS_PROJECTION_RULE
from streaming_merge.merge.materialize import carries_local_rows, checkpoint_rdd_id, is_lost_block_error


def rows(path: str) -> list[dict[str, Any]]:
    return sorted(deltalake.DeltaTable(path).to_pyarrow_table().to_pylist(),
                  key=lambda r: tuple((v is None, str(v)) for v in r.values()))


def live_files(path: str) -> set[str]:
    from urllib.parse import unquote

    import pyarrow as pa

    return {unquote(p) for p in pa.table(deltalake.DeltaTable(path).get_add_actions()).column("path").to_pylist()}


def version(path: str) -> int:
    return deltalake.DeltaTable(path).version()


def parquet_files(path: str) -> set[str]:
    found = set()
    for folder, _, names in os.walk(path):
        found |= {os.path.relpath(os.path.join(folder, n), path) for n in names if n.endswith(".parquet")
                  and "_delta_log" not in folder}
    return found


@pytest.fixture()
def people(spark: SparkSession, table_path: str) -> DeltaTable:
    df = spark.createDataFrame(
        [(1, "ann", 10, "eu"), (2, "bob", 20, "us"), (3, "cid", 30, "eu"), (4, "dan", 40, "us")],
        "id int, name string, score int, region string",
    )
    return DeltaTable.createFromDataFrame(df.repartition(2), table_path)


def source(spark: SparkSession, data: list[tuple], schema: str = "id int, name string, score int, region string"
           ) -> DataFrame:
    return spark.createDataFrame(data, schema).alias("s")


# ---------------------------------------------------------------- bad input: clear errors, table untouched

@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda m: m.whenMatchedUpdate(set={"score": "s.nope"}), "s.nope"),
        (lambda m: m.whenMatchedUpdate(condition="s.missing > 1", set={"score": "s.score"}), "s.missing"),
        (lambda m: m.whenMatchedDelete().whenMatchedUpdateAll(), "only the last MATCHED clause"),
        (lambda m: m.whenNotMatchedInsertAll().whenNotMatchedInsert(condition="s.id > 1", values={"id": "s.id"})
         , "only the last NOT MATCHED clause"),
        (lambda m: m.whenMatchedUpdate(set={"score": "s.name"}), "not compatible"),
        (lambda m: m.whenMatchedUpdate(set={"nope": "s.score"}), "not a column of the target"),
        (lambda m: m.whenNotMatchedInsert(values={"id": "t.id"}), "can only refer to source columns"),
        (lambda m: m.whenNotMatchedBySourceDelete(condition="s.id > 1"), "can only refer to target columns"),
        (lambda m: m.whenMatchedUpdate(condition="s.score + 1", set={"score": "s.score"}), "must be a boolean"),
    ],
)
def test_invalid_merges_raise_analysis_error_and_leave_the_table(
    spark: SparkSession, people: DeltaTable, build: Callable[[Any], Any], message: str
) -> None:
    before = rows(people.path)
    builder = people.alias("t").merge(source(spark, [(1, "x", 1, "eu")]), "t.id = s.id")
    with pytest.raises(MergeAnalysisError, match=message):
        build(builder).execute()
    assert rows(people.path) == before and version(people.path) == 0


def test_unresolvable_merge_condition(spark: SparkSession, people: DeltaTable) -> None:
    with pytest.raises(MergeAnalysisError, match="MERGE condition"):
        people.alias("t").merge(source(spark, [(1, "x", 1, "eu")]), "t.id = s.ident").whenMatchedDelete().execute()
    assert version(people.path) == 0


def test_star_needs_every_target_column_in_the_source(spark: SparkSession, people: DeltaTable) -> None:
    narrow = spark.createDataFrame([(1, 5)], "id int, score int").alias("s")
    with pytest.raises(MergeAnalysisError, match=r"needs source column `name`"):
        people.alias("t").merge(narrow, "t.id = s.id").whenMatchedUpdateAll().execute()
    assert version(people.path) == 0


def test_no_clause_at_all(spark: SparkSession, people: DeltaTable) -> None:
    with pytest.raises(MergeAnalysisError, match="at least one WHEN clause"):
        people.alias("t").merge(source(spark, [(1, "x", 1, "eu")]), "t.id = s.id").execute()


def test_overflow_is_an_error_not_a_wrap(spark: SparkSession, table_path: str) -> None:
    table = DeltaTable.createFromDataFrame(spark.createDataFrame([(1, 1)], "id int, small tinyint"), table_path)
    files_before = parquet_files(table_path)
    src = spark.createDataFrame([(1, 300)], "id int, v int").alias("s")
    with pytest.raises(MergeAssignmentOverflowError, match=r"TINYINT.*`small`"):
        table.alias("t").merge(src, "t.id = s.id").whenMatchedUpdate(set={"small": "s.v"}).execute()
    assert rows(table_path) == [{"id": 1, "small": 1}]
    assert parquet_files(table_path) == files_before  # the failed write left nothing behind
    fits = spark.createDataFrame([(1, 100)], "id int, v int").alias("s")
    table.alias("t").merge(fits, "t.id = s.id").whenMatchedUpdate(set={"small": "s.v"}).execute()
    assert rows(table_path) == [{"id": 1, "small": 100}]


def test_not_a_delta_table(spark: SparkSession, tmp_path: Any) -> None:
    with pytest.raises(NotADeltaTableError, match=str(tmp_path)):
        DeltaTable.forPath(spark, str(tmp_path))


@pytest.mark.parametrize(
    ("configuration", "feature"),
    [({"delta.columnMapping.mode": "name"}, "column")],
)
def test_unsupported_table_features_are_refused(spark: SparkSession, table_path: str,
                                                configuration: dict[str, str], feature: str) -> None:
    import pyarrow as pa

    deltalake.write_deltalake(table_path, pa.table({"id": pa.array([1], pa.int32())}), configuration=configuration)
    before = version(table_path)
    src = spark.createDataFrame([(1,)], "id int").alias("s")
    with pytest.raises(UnsupportedTableFeatureError, match=feature):
        DeltaTable.forPath(spark, table_path).alias("t").merge(src, "t.id = s.id").whenMatchedDelete().execute()
    assert version(table_path) == before


# ---------------------------------------------------------------- multiple matches

def test_multiple_matches_name_the_keys_and_counts(spark: SparkSession, people: DeltaTable) -> None:
    src = source(spark, [(1, "a", 1, "eu"), (1, "b", 2, "eu"), (1, "c", 3, "eu"), (2, "d", 4, "us"),
                         (2, "e", 5, "us"), (3, "f", 6, "eu")])
    with pytest.raises(MultipleSourceRowMatchingTargetRowError) as info:
        people.alias("t").merge(src, "t.id = s.id").whenMatchedUpdateAll().execute()
    assert "multiple source rows matched" in str(info.value)
    assert "id=1 (matched by 3 source rows)" in str(info.value)
    assert ({"id": 2}, 2) in info.value.offending_rows
    assert all(key != {"id": 3} for key, _ in info.value.offending_rows)
    assert version(people.path) == 0


def test_multiple_matches_count_even_when_no_clause_condition_holds(spark: SparkSession, people: DeltaTable) -> None:
    src = source(spark, [(1, "a", 1, "eu"), (1, "b", 2, "eu")])
    with pytest.raises(MultipleSourceRowMatchingTargetRowError):
        (people.alias("t").merge(src, "t.id = s.id").whenMatchedUpdate(condition="s.score > 100",
                                                                        set={"score": "s.score"})
         .whenNotMatchedInsertAll().execute())


def test_unique_source_keys_skip_the_per_row_count_only_when_no_cast_can_merge_them(
        spark: SparkSession, people: DeltaTable) -> None:
    from streaming_merge.merge.skipping import SourceStats

    # Distinct strings "1" and "01" both equal the int target key 1: unique source keys do not
    # rule out a multiple match through a cast, so the check must still run.
    src = source(spark, [("1", "a"), ("01", "b")], "id string, name string")
    claimed = SourceStats(2, {"id": ("01", "1")}, unique_keys=("id",))
    with pytest.raises(MultipleSourceRowMatchingTargetRowError, match="id=1"):
        (people.alias("t").merge(src, "t.id = s.id").whenMatchedUpdate(set={"name": "s.name"})
         .withOptions(source_stats=claimed, materialize_source="none").execute())
    assert version(people.path) == 0
    # Same types: the unique keys are trusted and the upsert is applied.
    src = source(spark, [(1, "a"), (9, "z")], "id int, name string")
    metrics = (people.alias("t").merge(src, "t.id = s.id").whenMatchedUpdate(set={"name": "s.name"})
               .whenNotMatchedInsert(values={"id": "s.id", "name": "s.name"})
               .withOptions(source_stats=SourceStats(2, {"id": (1, 9)}, unique_keys=("id",)),
                            materialize_source="none").execute())
    assert (metrics["numTargetRowsUpdated"], metrics["numTargetRowsInserted"]) == (1, 1)
    assert {r["id"]: r["name"] for r in rows(people.path)} == {1: "a", 2: "bob", 3: "cid", 4: "dan", 9: "z"}


def test_lone_unconditional_delete_tolerates_duplicates_and_counts_once(spark: SparkSession,
                                                                        people: DeltaTable) -> None:
    src = source(spark, [(1, "a", 1, "eu"), (1, "b", 2, "eu"), (3, "c", 3, "eu")])
    metrics = people.alias("t").merge(src, "t.id = s.id").whenMatchedDelete().execute()
    assert [r["id"] for r in rows(people.path)] == [2, 4]
    assert metrics["numTargetRowsDeleted"] == 2 and metrics["numTargetRowsMatchedDeleted"] == 2
    assert metrics["numSourceRows"] == 3


def test_insert_only_merge_never_checks_multiple_matches(spark: SparkSession, people: DeltaTable) -> None:
    src = source(spark, [(1, "a", 1, "eu"), (1, "b", 2, "eu"), (9, "z", 9, "eu")])
    metrics = people.alias("t").merge(src, "t.id = s.id").whenNotMatchedInsertAll().execute()
    assert metrics["numTargetRowsInserted"] == 1 and metrics["numTargetFilesRemoved"] == 0
    assert [r["id"] for r in rows(people.path)] == [1, 2, 3, 4, 9]


def test_null_keys_never_match(spark: SparkSession, table_path: str) -> None:
    table = DeltaTable.createFromDataFrame(spark.createDataFrame([(None, 1), (1, 2)], "k int, v int"), table_path)
    src = spark.createDataFrame([(None, 10), (None, 11), (1, 20)], "k int, v int").alias("s")
    metrics = (table.alias("t").merge(src, "t.k = s.k").whenMatchedUpdateAll().whenNotMatchedInsertAll().execute())
    assert metrics["numTargetRowsUpdated"] == 1 and metrics["numTargetRowsInserted"] == 2
    assert sorted(rows(table_path), key=lambda r: r["v"]) == [
        {"k": None, "v": 1}, {"k": None, "v": 10}, {"k": None, "v": 11}, {"k": 1, "v": 20}]


# ---------------------------------------------------------------- data skipping

def test_partition_pruning_and_target_only_predicates(spark: SparkSession, table_path: str) -> None:
    df = spark.range(0, 400).select(F.col("id").cast("int").alias("id"), (F.col("id") % 4).cast("int").alias("p"),
                                    F.lit("x").alias("v"))
    table = DeltaTable.createFromDataFrame(df.repartition(2), table_path, partitionBy=["p"])
    files = len(live_files(table_path))
    src = spark.createDataFrame([(8, 0, "y"), (12, 0, "y")], "id int, p int, v string").alias("s")
    metrics = (table.alias("t").merge(src, "t.id = s.id AND t.p = 0").whenMatchedUpdateAll().execute())
    assert metrics["numTargetFilesBeforeSkipping"] == files
    assert metrics["numTargetPartitionsAfterSkipping"] == 1
    assert metrics["numTargetFilesAfterSkipping"] < files
    assert metrics["numTargetRowsUpdated"] == 2 and metrics["numTargetPartitionsRemovedFrom"] == 1
    updated = [r for r in rows(table_path) if r["v"] == "y"]
    assert sorted(r["id"] for r in updated) == [8, 12]


def test_source_key_range_skips_files_outside_it(spark: SparkSession, table_path: str) -> None:
    # 8 files with disjoint ranges of 100 ids each; string keys, which only the range prunes.
    df = spark.range(0, 800, numPartitions=8).select(F.lpad(F.col("id").cast("string"), 3, "0").alias("id"),
                                                     F.lit(0).alias("v"))
    table = DeltaTable.createFromDataFrame(df, table_path)
    src = spark.createDataFrame([("250", 1), ("260", 1), ("999", 1)], "id string, v int").alias("s")
    metrics = (table.alias("t").merge(src, "t.id = s.id").whenMatchedUpdateAll().whenNotMatchedInsertAll()
               .execute())
    assert metrics["numTargetFilesBeforeSkipping"] == 8
    assert metrics["numTargetFilesAfterSkipping"] == 6  # 200..799 overlap [250, 999]
    assert metrics["numTargetFilesRemoved"] == 1
    assert metrics["numTargetRowsUpdated"] == 2 and metrics["numTargetRowsInserted"] == 1
    assert metrics["numTargetRowsCopied"] == 98
    result = {r["id"]: r["v"] for r in rows(table_path)}
    assert len(result) == 801 and result["250"] == 1 and result["999"] == 1 and result["251"] == 0


def _merge_ids(table: DeltaTable, src: DataFrame, **options: Any) -> MergeMetrics:
    builder = table.alias("t").merge(src.alias("s"), "t.id = s.id")
    if options:
        builder = builder.withOptions(**options)
    return builder.whenMatchedUpdateAll().whenNotMatchedInsertAll().execute()


@pytest.mark.parametrize("materialize_source", ["auto", "none"])
def test_files_whose_key_range_holds_no_source_key_are_skipped(spark: SparkSession, table_path: str,
                                                               materialize_source: str) -> None:
    # Integer keys: each file's own [min, max] is tested against every source key while the source
    # is materialized (or, not materialized, in the pass that counts it). The source's range
    # [250, 5000] overlaps 6 files; only 200..299 holds a key.
    df = spark.range(0, 800, numPartitions=8).select(F.col("id").cast("int").alias("id"), F.lit(0).alias("v"))
    DeltaTable.createFromDataFrame(df, table_path)
    src = spark.createDataFrame([(250, 1), (260, 1), (5000, 1), (None, 1)], "id long, v int")
    metrics = _merge_ids(DeltaTable.forPath(spark, table_path), src, materialize_source=materialize_source)
    assert metrics["numTargetFilesBeforeSkipping"] == 8 and metrics["numTargetFilesAfterSkipping"] == 1
    assert metrics["numTargetFilesRemoved"] == 1 and metrics["numTargetRowsCopied"] == 98
    assert metrics["numTargetRowsUpdated"] == 2 and metrics["numTargetRowsInserted"] == 2
    result = sorted((r["id"] if r["id"] is not None else -1, r["v"]) for r in rows(table_path))
    assert len(result) == 802 and (250, 1) in result and (5000, 1) in result and (-1, 1) in result
    assert (251, 0) in result and (350, 0) in result


def test_key_presence_gives_way_to_the_range_alone_past_its_file_bound(
        spark: SparkSession, table_path: str, tmp_path: Path) -> None:
    df = spark.range(0, 800, numPartitions=8).select(F.col("id"), F.lit(0).alias("v"))
    DeltaTable.createFromDataFrame(df, table_path)
    shutil.copytree(table_path, tmp_path / "copy")
    src = spark.createDataFrame([(250, 1), (5000, 1)], "id long, v int")
    by_range = _merge_ids(DeltaTable.forPath(spark, table_path), src, key_presence_max_files=7)
    by_presence = _merge_ids(DeltaTable.forPath(spark, str(tmp_path / "copy")), src, key_presence_max_files=8)
    assert by_range["numTargetFilesAfterSkipping"] == 6 and by_presence["numTargetFilesAfterSkipping"] == 1
    assert by_range["numTargetFilesRemoved"] == by_presence["numTargetFilesRemoved"] == 1
    with pytest.raises(ValueError, match="key_presence_max_files must be 0 or more files, got -1"):
        _merge_ids(DeltaTable.forPath(spark, table_path), src, key_presence_max_files=-1)
    assert rows(table_path) == rows(str(tmp_path / "copy"))


def test_key_presence_compares_extreme_keys_exactly(spark: SparkSession, table_path: str) -> None:
    # Files at both ends of the long range, and a source key in each: the literals must be exact.
    low, high = -(2 ** 63), 2 ** 63 - 1
    df = spark.createDataFrame([(low, 0), (low + 1, 0), (0, 0), (1, 0), (high - 1, 0), (high, 0)], "id long, v int")
    DeltaTable.createFromDataFrame(df.repartitionByRange(3, "id"), table_path)
    src = spark.createDataFrame([(low, 1), (high, 1)], "id long, v int")
    metrics = _merge_ids(DeltaTable.forPath(spark, table_path), src)
    assert metrics["numTargetFilesBeforeSkipping"] == 3 and metrics["numTargetFilesAfterSkipping"] == 2
    assert metrics["numTargetRowsUpdated"] == 2
    assert {r["id"]: r["v"] for r in rows(table_path)} == {low: 1, low + 1: 0, 0: 0, 1: 0, high - 1: 0, high: 1}


def test_keys_outside_every_candidates_range_are_told_apart_exactly(spark: SparkSession, table_path: str) -> None:
    """The map-side pass inserts the source rows whose key is outside every candidate's range
    in its own job: ranges that touch are merged into one, a gap between ranges is outside,
    the extreme longs compare exactly and a NULL key is never outside. Keys other than integers,
    and more ranges than the bound, give no predicate."""
    from streaming_merge.merge.key_presence import outside_candidate_ranges
    from streaming_merge.table.location import resolve
    from streaming_merge.table.snapshot import load_snapshot

    low, high = -(2 ** 63), 2 ** 63 - 1
    for ids in ([low, 99], [100, 199], [300, high - 1]):  # one file each: [low, 199] and [300, high - 1]
        deltalake.write_deltalake(table_path, pa.table({"id": pa.array(ids, pa.int64())}), mode="append")
    snapshot = load_snapshot(resolve(table_path))
    keys = spark.createDataFrame([(k,) for k in (low, 0, 199, 200, 299, 300, high - 1, high, None)], "k long")
    outside = outside_candidate_ranges(snapshot, snapshot.files, [("id", "k")], keys.schema)
    assert outside is not None and str(outside).count(" OR ") == 1  # two ranges, not three
    assert [(r["k"], r["outside"]) for r in keys.select("k", outside.alias("outside")).collect()] == [
        (low, False), (0, False), (199, False), (200, True), (299, True), (300, False), (high - 1, False),
        (high, True), (None, False)]
    assert outside_candidate_ranges(snapshot, snapshot.files, [("id", "k")], keys.schema, max_ranges=1) is None
    strings = spark.createDataFrame([("a",)], "k string")
    assert outside_candidate_ranges(snapshot, snapshot.files, [("id", "k")], strings.schema) is None


def test_matched_only_merge_rewrites_only_files_whose_matches_satisfy_a_clause(spark: SparkSession,
                                                                              table_path: str) -> None:
    df = spark.range(0, 40, numPartitions=4).select(F.col("id"), F.lit(0).alias("v"))
    table = DeltaTable.createFromDataFrame(df, table_path)
    src = spark.createDataFrame([(1, 5), (15, -1), (25, -1)], "id long, v int").alias("s")
    metrics = (table.alias("t").merge(src, "t.id = s.id")
               .whenMatchedUpdate(condition="s.v > 0", set={"v": "s.v"}).execute())
    assert metrics["numTargetFilesRemoved"] == 1 and metrics["numTargetRowsUpdated"] == 1
    assert metrics["numTargetRowsCopied"] == 9
    assert {r["id"]: r["v"] for r in rows(table_path)}[1] == 5


# ---------------------------------------------------------------- schema evolution, idempotency

def test_schema_evolution_appends_new_source_columns(spark: SparkSession, people: DeltaTable) -> None:
    src = spark.createDataFrame([(1, "ann", 11, "eu", "vip"), (7, "eve", 70, "us", "new")],
                                "id int, name string, score int, region string, label string").alias("s")
    with pytest.raises(MergeAnalysisError):
        people.alias("t").merge(src, "t.id = s.id").whenMatchedUpdateAll().whenNotMatchedInsertAll() \
            .whenMatchedUpdate(set={"label": "s.label"}).execute()
    metrics = (people.alias("t").merge(src, "t.id = s.id").whenMatchedUpdateAll().whenNotMatchedInsertAll()
               .withSchemaEvolution().execute())
    assert metrics["numTargetRowsUpdated"] == 1 and metrics["numTargetRowsInserted"] == 1
    by_id = {r["id"]: r for r in rows(people.path)}
    assert by_id[1]["label"] == "vip" and by_id[7]["label"] == "new" and by_id[2]["label"] is None
    assert "label" in deltalake.DeltaTable(people.path).schema().to_json()


def test_app_transaction_makes_execute_idempotent(spark: SparkSession, people: DeltaTable) -> None:
    src = source(spark, [(1, "ann", 99, "eu")])

    def run(batch: int) -> Any:
        return (people.alias("t").merge(src, "t.id = s.id").whenMatchedUpdate(set={"score": "t.score + 1"})
                .execute(app_id="job-1", version=batch))

    first = run(0)
    assert not first["skipped"] and first["tableVersion"] == 1
    again = run(0)
    assert again["skipped"] and again["num_affected_rows"] == 0
    assert {r["id"]: r["score"] for r in rows(people.path)}[1] == 11
    assert deltalake.DeltaTable(people.path).transaction_version("job-1") == 0
    run(1)
    assert {r["id"]: r["score"] for r in rows(people.path)}[1] == 12
    history = people.history()
    assert history[0]["operation"] == "MERGE"
    assert history[0]["operationMetrics"]["numTargetRowsUpdated"] == "1"
    assert history[0]["operationParameters"]["predicate"] == "t.id = s.id"


def test_empty_merge_still_records_the_transaction(spark: SparkSession, people: DeltaTable) -> None:
    src = source(spark, [(99, "zed", 1, "eu")])
    metrics = people.alias("t").merge(src, "t.id = s.id").whenMatchedDelete().execute(app_id="a", version=3)
    assert metrics["num_affected_rows"] == 0 and metrics["numTargetFilesRemoved"] == 0
    assert deltalake.DeltaTable(people.path).transaction_version("a") == 3
    assert len(rows(people.path)) == 4


def test_a_local_source_is_projected_in_the_tasks_and_the_callers_excluded_rules_come_back(
        spark: SparkSession, people: DeltaTable) -> None:
    """Spark's ConvertToLocalRelation evaluates projections over local rows on the driver, row by
    row; during a MERGE of such a source it is excluded beside the caller's own exclusions,
    which are as they were afterwards."""
    callers_rule = "org.apache.spark.sql.catalyst.optimizer.ConstantFolding"
    local = spark.createDataFrame(pa.table({"id": pa.array([1, 5], pa.int32()), "name": ["ann", "fay"],
                                            "score": pa.array([100, 50], pa.int32()), "region": ["eu", "us"]}))
    assert carries_local_rows(local)
    seen: list[str | None] = []
    spark.conf.set(EXCLUDED_RULES, callers_rule)
    try:
        metrics = (_upsert(people, local.alias("s"))
                   .withOptions(phase_hook=lambda phase, _: seen.append(spark.conf.get(EXCLUDED_RULES, None)))
                   .execute())
        assert spark.conf.get(EXCLUDED_RULES) == callers_rule
    finally:
        spark.conf.unset(EXCLUDED_RULES)
    assert seen and set(seen) == {f"{callers_rule},{LOCAL_ROWS_PROJECTION_RULE}"}
    assert (metrics["numTargetRowsUpdated"], metrics["numTargetRowsInserted"]) == (1, 1)
    assert {r["id"]: r["score"] for r in rows(people.path)} == {1: 100, 2: 20, 3: 30, 4: 40, 5: 50}


# ---------------------------------------------------------------- materialized source: lost blocks

def _drop_blocks(spark: SparkSession, materialized: DataFrame) -> None:
    spark.sparkContext._jsc.sc().unpersistRDD(checkpoint_rdd_id(materialized), True)


def _upsert(table: DeltaTable, src: DataFrame) -> Any:
    return (table.alias("t").merge(src, "t.id = s.id").whenMatchedUpdateAll().whenNotMatchedInsertAll())


def test_lost_materialized_blocks_rerun_the_merge(spark: SparkSession, people: DeltaTable, tmp_path: Any) -> None:
    data = [(1, "ann", 100, "eu"), (5, "fay", 50, "us")]
    reference = DeltaTable.createFromDataFrame(people.toDF(), str(tmp_path / "reference"))
    expected_metrics = _upsert(reference, source(spark, data)).execute()
    attempts_seen: list[str] = []

    def lose_once(phase: str, materialized: DataFrame) -> None:
        attempts_seen.append(phase)
        if phase == "after_find_touched_files" and attempts_seen.count(phase) == 1:
            _drop_blocks(spark, materialized)

    metrics = (_upsert(people, source(spark, data))
               .withOptions(materialize_source="all", phase_hook=lose_once).execute())
    assert metrics["attempts"] == 2
    assert rows(people.path) == rows(reference.path)
    for name in ("numTargetRowsUpdated", "numTargetRowsInserted", "numSourceRows", "numTargetRowsCopied"):
        assert metrics[name] == expected_metrics[name]
    assert version(people.path) == 1


def test_blocks_lost_on_every_attempt_raise(spark: SparkSession, people: DeltaTable) -> None:
    def always_lose(phase: str, materialized: DataFrame) -> None:
        if phase == "after_find_touched_files":
            _drop_blocks(spark, materialized)

    with pytest.raises(MaterializedSourceLostError, match="all 3 attempts") as info:
        (_upsert(people, source(spark, [(1, "ann", 100, "eu")]))
         .withOptions(materialize_source="all", max_attempts=3, phase_hook=always_lose).execute())
    assert info.value.attempts == 3
    assert version(people.path) == 0 and rows(people.path)[0]["score"] == 10


def test_blocks_lost_from_the_callers_copy_are_left_to_the_caller(spark: SparkSession, people: DeltaTable) -> None:
    """A source the caller materialized (as MergeSink does, with materialize_source='none') that
    loses blocks cannot be healed by rerunning the MERGE, which would read the same lost copy:
    the lost-block error goes straight to the caller, after one attempt, with nothing written."""
    callers_copy = source(spark, [(1, "ann", 100, "eu")]).localCheckpoint(eager=True)
    phases: list[str] = []

    def lose_callers_blocks(phase: str, _: DataFrame) -> None:
        phases.append(phase)
        if phase == "after_find_touched_files":
            _drop_blocks(spark, callers_copy)

    with pytest.raises(Exception) as info:
        (_upsert(people, callers_copy.alias("s"))
         .withOptions(materialize_source="none", max_attempts=3, phase_hook=lose_callers_blocks).execute())
    assert is_lost_block_error(info.value) and not isinstance(info.value, MaterializedSourceLostError)
    assert phases.count("after_find_touched_files") == 1
    assert version(people.path) == 0 and rows(people.path)[0]["score"] == 10


# ---------------------------------------------------------------- concurrency

def test_concurrent_delete_of_a_read_file_conflicts(spark: SparkSession, people: DeltaTable) -> None:
    files_before = parquet_files(people.path)

    def other_writer(phase: str, _: DataFrame) -> None:
        if phase == "before_commit":
            deltalake.DeltaTable(people.path).delete("id = 3")

    with pytest.raises(ConcurrentModificationError, match="removed files this MERGE read"):
        (_upsert(people, source(spark, [(1, "ann", 100, "eu")])).withOptions(phase_hook=other_writer).execute())
    assert [r["id"] for r in rows(people.path)] == [1, 2, 4]  # only the other writer's change
    assert rows(people.path)[0]["score"] == 10
    assert parquet_files(people.path) - files_before <= {  # only delta-rs' rewrite remains
        f for f in parquet_files(people.path) if f in live_files(people.path)}


def test_concurrent_blind_append_outside_the_key_range_does_not_conflict(spark: SparkSession,
                                                                         people: DeltaTable) -> None:
    import pyarrow as pa

    def other_writer(phase: str, _: DataFrame) -> None:
        if phase == "before_commit":
            deltalake.write_deltalake(people.path, pa.table({
                "id": pa.array([100], pa.int32()), "name": ["zz"], "score": pa.array([1], pa.int32()),
                "region": ["eu"]}), mode="append")

    metrics = _upsert(people, source(spark, [(1, "ann", 100, "eu")])).withOptions(phase_hook=other_writer).execute()
    assert metrics["tableVersion"] == 2
    assert {r["id"]: r["score"] for r in rows(people.path)} == {1: 100, 2: 20, 3: 30, 4: 40, 100: 1}


# ---------------------------------------------------------------- Spark UI

def test_phases_are_named_in_spark_job_descriptions(spark: SparkSession, people: DeltaTable) -> None:
    store = spark.sparkContext._jsc.sc().statusStore()

    def descriptions(after_job: int) -> set[str]:
        spark.sparkContext._jsc.sc().listenerBus().waitUntilEmpty()  # the store is fed asynchronously
        jobs = [store.jobsList(None).apply(i) for i in range(store.jobsList(None).size())]
        return {str(j.description().get()) for j in jobs if j.jobId() > after_job and j.description().isDefined()}

    def last_job() -> int:
        jobs = store.jobsList(None)
        return max((jobs.apply(i).jobId() for i in range(jobs.size())), default=-1)

    before = last_job()
    _upsert(people, source(spark, [(1, "ann", 100, "eu"), (9, "x", 1, "us")])).execute()
    new = descriptions(before)
    assert "MERGE operation - scanning files for matches" in new
    assert any(d.startswith("MERGE operation - Rewriting") for d in new)


def test_a_map_side_rewrite_over_several_files_spreads_the_rewrite_and_the_inserts_over_them(
        spark: SparkSession, people: DeltaTable, table_path: str) -> None:
    """With the rewrite spread over two files (``min_parallel_file_size=1``), each rewritten file
    is a partition of its own and the inserts join one of them: no file (task) holds the
    inserts' few rows alone while the other gets every rewritten row, and no third file."""
    before = parquet_files(table_path)
    rewritten = sorted(sorted(r["id"] for r in pq_rows(os.path.join(table_path, f))) for f in before)
    metrics = (people.alias("t").merge(source(spark, [(1, "ann2", 11, "eu"), (2, "bob2", 21, "us"),
                                                      (3, "cid2", 31, "eu"), (4, "dan2", 41, "us"),
                                                      (7, "gus", 70, "us"), (8, "hal", 80, "eu")]),
                                       "t.id = s.id")
               .whenMatchedUpdateAll().whenNotMatchedInsertAll()
               .withOptions(min_parallel_file_size=1, single_pass=False).execute())
    assert (metrics["numTargetRowsUpdated"], metrics["numTargetRowsInserted"]) == (4, 2)
    added = sorted(live_files(table_path) - before)
    assert metrics["numTargetFilesRemoved"] == 2 and metrics["numTargetFilesAdded"] == len(added) == 2
    by_file = sorted(sorted(r["id"] for r in pq_rows(os.path.join(table_path, f))) for f in added)
    assert len(rewritten) == 2
    assert by_file in (sorted([sorted([*rewritten[0], 7, 8]), rewritten[1]]),
                       sorted([rewritten[0], sorted([*rewritten[1], 7, 8])]))
    assert sorted(i for ids in by_file for i in ids) == [1, 2, 3, 4, 7, 8]
    assert {r["id"]: r["name"] for r in rows(table_path)} == {1: "ann2", 2: "bob2", 3: "cid2", 4: "dan2",
                                                               7: "gus", 8: "hal"}


def test_a_map_side_rewrite_of_many_files_gives_each_output_file_half_of_them(
        spark: SparkSession, table_path: str) -> None:
    """Six equal files rewritten map-side into two: each task (file) gets three files' rows, the
    inserts joining one. Packed by Spark's split size, the six were three partitions of two
    files, which a coalesce into two groups by count made one file of two files' rows and one
    of four's."""
    for part in range(6):  # one append, one file, per range of 500 ids
        deltalake.write_deltalake(table_path, pa.table({"id": pa.array(range(part * 500, (part + 1) * 500), pa.int32()),
                                                        "name": pa.array(["x"] * 500)}), mode="append")
    before = parquet_files(table_path)
    assert len(before) == 6
    changes = spark.range(0, 3000, 100).select(F.col("id").cast("int").alias("id"), F.lit("y").alias("name"))
    inserts = spark.createDataFrame([(5000, "new"), (5001, "new")], "id int, name string")
    metrics = (DeltaTable.forPath(spark, table_path).alias("t").merge(changes.unionByName(inserts).alias("s"),
                                                                      "t.id = s.id")
               .whenMatchedUpdateAll().whenNotMatchedInsertAll()
               .withOptions(min_parallel_file_size=1, broadcast_scan_min_bytes=0).execute())
    assert (metrics["numTargetRowsUpdated"], metrics["numTargetRowsInserted"]) == (30, 2)
    assert (metrics["numTargetFilesRemoved"], metrics["numTargetFilesAdded"]) == (6, 2)
    added = sorted(live_files(table_path) - before)
    per_file = sorted(len(pq_rows(os.path.join(table_path, f))) for f in added)
    assert per_file == [1500, 1502]
    assert len(rows(table_path)) == 3002


def pq_rows(path: str) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    return pq.read_table(path).to_pylist()
