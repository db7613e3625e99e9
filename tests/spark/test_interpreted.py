"""Small MERGEs and sink batches run without generated code (streaming_merge.spark.interpreted).

The outcome checked is Spark's own count of Java compilations (Janino, ``CodegenMetrics``)
over an operation on a table of a schema no earlier test used: a compiled plan shape is
cached per JVM, so a familiar schema would compile nothing either way. Generated code names
no columns but spells out how many a row has, so each test's rows have a width of their own.
One class is generated whatever the settings: hash aggregation joins a group's key and buffer
rows with a generated joiner that has no interpreted twin; its schema does not depend on the
table's width, so each test first runs the same operation on a table of another width, and
then counts the compilations of the measured run, which must be none at all.
Also checked: the settings a phase hook sees, and that they are restored afterwards.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import deltalake
import pytest
from pyspark.sql import DataFrame, SparkSession

from streaming_merge import DeltaTable, MergeOptions, MergeSink
from streaming_merge.merge.skipping import SourceStats
from streaming_merge.spark.interpreted import INTERPRETED_CONF, rows_of, runs_interpreted

FACTORY_MODE = "spark.sql.codegen.factoryMode"
WHOLE_STAGE = "spark.sql.codegen.wholeStage"


def compilations(spark: SparkSession) -> int:
    return int(spark._jvm.org.apache.spark.metrics.source.CodegenMetrics.METRIC_COMPILATION_TIME().getCount())


def fresh_frame(spark: SparkSession, rows: list[tuple[Any, ...]], width: int) -> tuple[DataFrame, str]:
    """A frame with ``width`` extra int columns: give each test a width of its own (no other
    test has such a schema), so that its plans are new to the JVM."""
    column = "v"
    extra = ", ".join(f"x{i} int" for i in range(width))
    values = [(key, None if value is None else Decimal(value), lsn, op, *range(width)) for key, value, lsn, op in rows]
    return spark.createDataFrame(values, f"id long, {column} decimal(20,3), lsn long, op string, {extra}"), column


def D(value: int) -> Decimal:
    return Decimal(value)


def table_rows(path: str, column: str) -> dict[int, str]:
    return {r["id"]: r[column] for r in deltalake.DeltaTable(path).to_pyarrow_table().to_pylist()}


def merge(spark: SparkSession, path: str, source: DataFrame, keys: list[int], **options: Any) -> Any:
    """An upsert of a source whose statistics are handed in, as the streaming sink does: the
    MERGE's own jobs (findTouchedFiles, the rewrite) are then all it runs."""
    stats = SourceStats(len(keys), {"id": (min(keys), max(keys))})
    return (DeltaTable.forPath(spark, path).alias("t").merge(source.alias("s"), "t.id = s.id")
            .whenMatchedUpdateAll().whenNotMatchedInsertAll()
            .withOptions(materialize_source="none", source_stats=stats, **options).execute())


def test_row_bound_decides() -> None:
    assert runs_interpreted(10, 10) and runs_interpreted(0, 20_000)
    assert not runs_interpreted(11, 10)
    assert not runs_interpreted(None, 20_000)  # unknown: generated code
    assert not runs_interpreted(5, 0) and not runs_interpreted(0, 0)  # a bound of 0 turns it off
    assert rows_of([3, 4]) == 7 and rows_of([]) == 0
    assert rows_of([3, None]) is None


def test_negative_bound_is_rejected() -> None:
    with pytest.raises(ValueError, match="interpreted_max_rows must be 0 or more rows, got -1"):
        MergeOptions(interpreted_max_rows=-1)


def conf_of(spark: SparkSession) -> dict[str, str | None]:
    return {key: spark.conf.get(key, None) for key in INTERPRETED_CONF}


def upsert_case(spark: SparkSession, path: str, width: int) -> DataFrame:
    """Six target rows; returns a source updating two of them and inserting one."""
    target, _ = fresh_frame(spark, [(i, i, 1, "u") for i in range(6)], width)
    DeltaTable.createFromDataFrame(target, path)
    return fresh_frame(spark, [(i, 100 + i, 2, "u") for i in (4, 5, 6)], width)[0]


def test_small_merge_compiles_no_java_and_restores_the_settings(spark: SparkSession, tmp_path: Any) -> None:
    merge(spark, str(tmp_path / "warm-up"), upsert_case(spark, str(tmp_path / "warm-up"), width=21), [4, 5, 6])
    table_path = str(tmp_path / "table")
    source = upsert_case(spark, table_path, width=11)
    seen: dict[str, str | None] = {}

    def hook(phase: str, _: DataFrame) -> None:
        if phase == "after_find_touched_files":
            seen.update(conf_of(spark))

    before = compilations(spark)
    metrics = merge(spark, table_path, source, [4, 5, 6], phase_hook=hook)

    assert compilations(spark) == before
    assert seen == INTERPRETED_CONF
    assert conf_of(spark) == {FACTORY_MODE: None, WHOLE_STAGE: None}
    assert (metrics["numTargetRowsUpdated"], metrics["numTargetRowsInserted"]) == (2, 1)
    assert table_rows(table_path, "v") == {0: D(0), 1: D(1), 2: D(2), 3: D(3), 4: D(104), 5: D(105), 6: D(106)}


@pytest.mark.parametrize(("bound", "width"), [(0, 12), (2, 13)], ids=["turned-off", "more-rows-than-the-bound"])
def test_merge_above_the_bound_generates_code(spark: SparkSession, table_path: str, bound: int,
                                              width: int) -> None:
    source = upsert_case(spark, table_path, width)  # reads 3 source rows and some target rows
    seen: dict[str, str | None] = {}

    def hook(phase: str, _: DataFrame) -> None:
        if phase == "after_find_touched_files":
            seen.update(conf_of(spark))

    before = compilations(spark)
    metrics = merge(spark, table_path, source, [4, 5, 6], phase_hook=hook, interpreted_max_rows=bound)

    assert compilations(spark) > before
    assert seen == {FACTORY_MODE: None, WHOLE_STAGE: None}
    assert (metrics["numTargetRowsUpdated"], metrics["numTargetRowsInserted"]) == (2, 1)
    assert table_rows(table_path, "v") == {0: D(0), 1: D(1), 2: D(2), 3: D(3), 4: D(104), 5: D(105), 6: D(106)}


def sink_batches(spark: SparkSession, path: str, width: int) -> tuple[MergeSink, DataFrame]:
    """A sink that applied a first batch of inserts and an update; returns it with a second
    batch: a delete and an update."""
    events, _ = fresh_frame(spark, [(1, 1, 1, "c"), (2, 2, 2, "c"), (1, 12, 3, "u"), (3, 3, 4, "c")], width)
    sink = MergeSink(path, keys="id", sequence_by="lsn", delete_when="op = 'd'", app_id="test")
    sink(events, 0, rows_at_most=4)
    return sink, fresh_frame(spark, [(2, None, 5, "d"), (3, 13, 6, "u")], width)[0]


def test_sink_batch_with_a_known_bound_compiles_no_java(spark: SparkSession, tmp_path: Any) -> None:
    warm_up, changes = sink_batches(spark, str(tmp_path / "warm-up"), width=24)
    warm_up(changes, 1, rows_at_most=2)
    table_path = str(tmp_path / "table")
    sink, changes = sink_batches(spark, table_path, width=14)

    before = compilations(spark)
    sink(changes, 1, rows_at_most=2)

    assert compilations(spark) == before
    assert table_rows(table_path, "v") == {1: D(12), 3: D(13)}
    assert sink.lastProgress is not None and sink.lastProgress["metrics"]["numTargetRowsDeleted"] == 1


def test_sink_batch_without_a_bound_still_merges_interpreted(spark: SparkSession, table_path: str) -> None:
    """Without a bound only the materialization (which counts the batch) generates code."""
    events, _ = fresh_frame(spark, [(1, 1, 1, "c"), (2, 2, 2, "c")], width=15)
    seen: list[dict[str, str | None]] = []

    def hook(phase: str, _: DataFrame) -> None:
        if phase in ("after_materialize", "after_find_touched_files"):
            seen.append({"phase": phase, **conf_of(spark)})

    sink = MergeSink(table_path, keys="id", sequence_by="lsn", delete_when="op = 'd'", app_id="test",
                     phase_hook=hook)
    sink(events, 0)
    seen.clear()
    sink(fresh_frame(spark, [(2, 22, 3, "u")], width=15)[0], 1)

    assert seen == [{"phase": "after_materialize", FACTORY_MODE: None, WHOLE_STAGE: None},
                    {"phase": "after_find_touched_files", **INTERPRETED_CONF}]
    assert table_rows(table_path, "v") == {1: D(1), 2: D(22)}
