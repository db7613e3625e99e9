"""The sink's internal columns never reach the table: with ``schema_evolution=True`` the MERGE's
evolution (table/schema.py ``evolve``) appended the sink's delete flag ``__sm_is_delete__``
(which its clauses read) to the target, from the first MergeSink on (the ``INTERNAL_PREFIX``
it defines for them was never applied). Now ``evolve`` skips ``__sm_`` columns; a table that
already got the column keeps it and keeps working."""

from __future__ import annotations

from typing import Any

import deltalake
from pyspark.sql import SparkSession
from pyspark.sql.types import BooleanType, LongType, StringType, StructField, StructType

from streaming_merge import DeltaTable, MergeSink
from streaming_merge.merge.builder import DeltaMergeBuilder
from streaming_merge.streaming.cdc import DELETE_FLAG
from streaming_merge.table.schema import INTERNAL_PREFIX, evolve
from tests.spark.test_sink import frame

WIDER = "id int, lsn long, op string, name string, amount int, note string"


def columns(path: str) -> list[str]:
    return deltalake.DeltaTable(path).schema().to_arrow().names


def rows(path: str) -> dict[int, dict[str, Any]]:
    return {r["id"]: r for r in deltalake.DeltaTable(path).to_pyarrow_table().to_pylist()}


def test_evolve_never_adds_internal_columns() -> None:
    target = StructType([StructField("id", LongType())])
    source = StructType([StructField("id", LongType()), StructField(DELETE_FLAG, BooleanType()),
                         StructField("note", StringType()), StructField(f"{INTERNAL_PREFIX}row__", LongType())])
    assert evolve(target, source).fieldNames() == ["id", "note"]
    kept = StructType([*target.fields, StructField(DELETE_FLAG, BooleanType())])
    assert evolve(kept, source).fieldNames() == ["id", DELETE_FLAG, "note"]  # a column the table has stays


def test_schema_evolution_adds_batch_columns_but_not_the_delete_flag(spark: SparkSession, tmp_path: Any) -> None:
    preset = MergeSink(str(tmp_path / "preset"), keys="id", sequence_by="lsn", apply_as_deletes="op = 'd'",
                       schema_evolution=True, app_id="evolve")

    def upsert_all(builder: DeltaMergeBuilder) -> DeltaMergeBuilder:
        return (builder.whenMatchedDelete(condition=f"s.`{DELETE_FLAG}`")
                .whenMatchedUpdateAll().whenNotMatchedInsertAll(condition=f"NOT s.`{DELETE_FLAG}`"))

    custom = MergeSink(str(tmp_path / "custom"), keys="id", apply_as_deletes="op = 'd'", schema_evolution=True,
                       clauses=upsert_all, app_id="evolve")
    for sink in (preset, custom):
        sink(frame(spark, [{"id": 1, "lsn": 1, "op": "c", "name": "a", "amount": 1},
                           {"id": 2, "lsn": 1, "op": "c", "name": "b", "amount": 2}]), 0)
        sink(spark.createDataFrame([(1, 2, "u", "a2", 3, "x"), (2, 2, "d", None, None, None),
                                    (3, 2, "c", "c", 4, "y")], WIDER), 1)
        path = sink.target
        assert columns(path) == ["id", "lsn", "op", "name", "amount", "note"]
        assert {k: (r["name"], r["note"]) for k, r in rows(path).items()} == {1: ("a2", "x"), 3: ("c", "y")}


def test_a_table_that_already_has_the_flag_keeps_working(spark: SparkSession, table_path: str) -> None:
    """Tables written before the fix hold ``__sm_is_delete__`` (always false on a live row): the
    sink goes on writing it as any other column, with or without schema evolution."""
    DeltaTable.createFromDataFrame(spark.createDataFrame(
        [], f"id int, lsn long, op string, name string, amount int, {DELETE_FLAG} boolean"), table_path)
    for evolving in (True, False):
        sink = MergeSink(table_path, keys="id", sequence_by="lsn", apply_as_deletes="op = 'd'",
                         schema_evolution=evolving, app_id=f"old-table-{evolving}")
        sink(frame(spark, [{"id": 1, "lsn": 1 + evolving, "op": "c", "name": "a", "amount": 1}]), 0)
    assert columns(table_path) == ["id", "lsn", "op", "name", "amount", DELETE_FLAG]
    assert [(r["lsn"], r[DELETE_FLAG]) for r in rows(table_path).values()] == [(2, False)]
