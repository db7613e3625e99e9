"""The sequence left out of the table (AUTO CDC's ``except_column_list=["operation",
"sequenceNum"]``): SCD 1 keeps each row's sequence in ``__spark_autocdc_metadata`` and its
out-of-order guard, tombstones, truncates and partial updates (every column or per column)
work from it, checked against the reference models (tests/partial_model.py,
tests/history_model.py); SCD 2 simply leaves the column out; a table that has the sequence
column keeps it; schema evolution and the column lists interplay with the metadata column."""

from __future__ import annotations

import tempfile
from typing import Any

import deltalake
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pyspark.sql import SparkSession

from streaming_merge import MergeSink
from streaming_merge.errors import MergeAnalysisError
from streaming_merge.streaming.sequence_layout import CDC_METADATA
from tests.history_model import Scd2Model, scd1_with_truncates
from tests.partial_model import apply_batches
from tests.spark.test_sink import frame
from tests.spark.test_sink_history import e, history
from tests.spark.test_sink_partial import PLACEHOLDER, batches

MODES: dict[str, tuple[dict[str, Any], bool | set[str], str | None]] = {  # sink options, model's NULL rule, placeholder
    "full": ({}, False, None),
    "nulls": ({"ignore_null_updates": True}, True, None),
    "name_only": ({"ignore_null_updates_column_list": ["name"]}, {"name"}, None),
    "all_but_name": ({"ignore_null_updates_except_column_list": ["NAME"]}, {"op", "amount"}, None),
    "placeholder": ({"unavailable_value": PLACEHOLDER}, False, PLACEHOLDER),
}


def rows_with_sequence(path: str) -> dict[Any, dict[str, Any]]:
    """The table by key, the sequence read back as ``lsn`` from wherever the table keeps it."""
    if not deltalake.DeltaTable.is_deltatable(path):
        return {}
    rows = {}
    for row in deltalake.DeltaTable(path).to_pyarrow_table().to_pylist():
        if CDC_METADATA in row:
            metadata = row.pop(CDC_METADATA)
            assert metadata["deleteSequence"] is None  # the table holds live rows only
            row["lsn"] = metadata["upsertSequence"]
        rows[row["id"]] = row
    return rows


def columns(path: str) -> list[str]:
    return deltalake.DeltaTable(path).schema().to_arrow().names


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(batches=batches, mode=st.sampled_from(sorted(MODES)), excluded=st.booleans())
# an older event in a later batch never overwrites the row (its sequence is in the metadata column)
@example(batches=[[{"id": 0, "lsn": 5, "op": "c", "name": "a", "amount": 1}],
                  [{"id": 0, "lsn": 3, "op": "u", "name": "late", "amount": 2}]], mode="full", excluded=True)
# a delete's tombstone drops a late update, and a newer partial insert starts afresh
@example(batches=[[{"id": 0, "lsn": 1, "op": "c", "name": "a", "amount": 1}],
                  [{"id": 0, "lsn": 5, "op": "d", "name": None, "amount": None}],
                  [{"id": 0, "lsn": 4, "op": "u", "name": "late", "amount": 2},
                   {"id": 0, "lsn": 6, "op": "u", "name": None, "amount": 3}]], mode="nulls", excluded=True)
# only `name` keeps its value on a NULL; a NULL amount overwrites
@example(batches=[[{"id": 0, "lsn": 1, "op": "c", "name": "a", "amount": 1}],
                  [{"id": 0, "lsn": 2, "op": "u", "name": None, "amount": None}]], mode="name_only", excluded=True)
def test_scd1_agrees_with_the_partial_model_with_or_without_the_sequence_column(
        spark: SparkSession, batches: list[list[dict[str, Any]]], mode: str, excluded: bool) -> None:
    options, ignore_nulls, placeholder = MODES[mode]
    with tempfile.TemporaryDirectory() as folder:
        path = f"{folder}/t"
        sink = MergeSink(path, keys="id", sequence_by="lsn", apply_as_deletes="op = 'd'", app_id="meta",
                         dead_letter=f"{folder}/dl", except_column_list=["lsn"] if excluded else None, **options)
        for batch_id, batch in enumerate(batches):
            sink(frame(spark, batch), batch_id)
        keyed = [[ev for ev in batch if ev["id"] is not None] for batch in batches]
        expected = apply_batches(keyed, data_columns=["op", "name", "amount"], ignore_nulls=ignore_nulls,
                                 placeholder=placeholder)
        assert rows_with_sequence(path) == expected
        if expected:
            assert (CDC_METADATA in columns(path), "lsn" in columns(path)) == (excluded, not excluded)


def test_scd1_truncates_work_from_the_metadata_column(spark: SparkSession, table_path: str) -> None:
    batches = [[e(0, 1, "c"), e(1, 8, "c")], [e(None, 5, "t"), e(2, 6, "c"), e(3, 4, "c")], [e(0, 3, "u")]]
    sink = MergeSink(table_path, keys="id", sequence_by="lsn", apply_as_deletes="op = 'd'",
                     apply_as_truncates="op = 't'", except_column_list=["lsn"], app_id="meta-truncates")
    for batch_id, batch in enumerate(batches):
        sink(frame(spark, batch), batch_id)
    assert rows_with_sequence(table_path) == scd1_with_truncates(batches, ["op", "name", "amount"])
    assert columns(table_path) == ["id", "op", "name", "amount", CDC_METADATA]


def test_several_sequence_columns_go_into_one_struct(spark: SparkSession, table_path: str) -> None:
    schema = "id long, pos long, off long, name string"
    sink = MergeSink(table_path, keys="id", sequence_by=["pos", "off"], except_column_list=["pos", "off"],
                     app_id="meta-struct")
    sink(spark.createDataFrame([(1, 10, 1, "a")], schema), 0)
    sink(spark.createDataFrame([(1, 10, 0, "older"), (2, 3, 0, "b")], schema), 1)  # (10, 0) < (10, 1)
    rows = sorted(deltalake.DeltaTable(table_path).to_pyarrow_table().to_pylist(), key=lambda r: r["id"])
    assert rows == [{"id": 1, "name": "a", CDC_METADATA: {"deleteSequence": None,
                                                          "upsertSequence": {"pos": 10, "off": 1}}},
                    {"id": 2, "name": "b", CDC_METADATA: {"deleteSequence": None,
                                                          "upsertSequence": {"pos": 3, "off": 0}}}]


def test_a_table_with_the_sequence_column_keeps_it(spark: SparkSession, table_path: str) -> None:
    """Written before the sequence could be left out, the table keeps its layout: the column
    stays and goes on carrying the sequence, no metadata column appears."""
    MergeSink(table_path, keys="id", sequence_by="lsn", apply_as_deletes="op = 'd'", app_id="old")(
        frame(spark, [e(1, 5, "c", "a"), e(2, 5, "c", "b")]), 0)
    sink = MergeSink(table_path, keys="id", sequence_by="lsn", apply_as_deletes="op = 'd'", app_id="new",
                     except_column_list=["lsn"])
    sink(frame(spark, [e(1, 4, "u", "older"), e(2, 6, "u", "newer")]), 0)
    assert columns(table_path) == ["id", "lsn", "op", "name", "amount"]
    assert {k: (r["lsn"], r["name"]) for k, r in rows_with_sequence(table_path).items()} == {
        1: (5, "a"), 2: (6, "newer")}


def test_schema_evolution_and_column_lists_with_the_metadata_column(spark: SparkSession, tmp_path: Any) -> None:
    wider = "id long, lsn long, op string, name string, amount long, note string"
    evolving = MergeSink(str(tmp_path / "evolving"), keys="id", sequence_by="lsn", except_column_list=["lsn"],
                         schema_evolution=True, app_id="evolve")
    listed = MergeSink(str(tmp_path / "listed"), keys="id", sequence_by="lsn", column_list=["name"],
                       schema_evolution=True, app_id="listed")
    for sink in (evolving, listed):
        sink(frame(spark, [e(1, 1, "c", "a")]), 0)
        sink(spark.createDataFrame([(1, 2, "u", "b", 2, "x"), (1, 0, "u", "stale", 0, "y")], wider), 1)
    # New batch columns are appended after the metadata column; a column list keeps them out; the
    # sink's own delete flag never reaches the table (tests/spark/test_sink_internal_columns.py).
    def visible(path: str) -> tuple[list[str], dict[Any, dict[str, Any]]]:
        return columns(path), rows_with_sequence(path)

    assert visible(str(tmp_path / "evolving")) == (["id", "op", "name", "amount", CDC_METADATA, "note"], {
        1: {"id": 1, "lsn": 2, "op": "u", "name": "b", "amount": 2, "note": "x"}})
    assert visible(str(tmp_path / "listed")) == (["id", "name", CDC_METADATA], {1: {"id": 1, "lsn": 2, "name": "b"}})


def test_the_reserved_name_and_a_table_without_any_sequence_are_refused(spark: SparkSession, tmp_path: Any) -> None:
    clashing = spark.createDataFrame([(1, 1, "x")], f"id long, lsn long, {CDC_METADATA} string")
    sink = MergeSink(str(tmp_path / "a"), keys="id", sequence_by="lsn", app_id="reserved")
    with pytest.raises(MergeAnalysisError, match=rf"column `{CDC_METADATA}`: that name is reserved"):
        sink(clashing, 0)
    MergeSink(str(tmp_path / "a"), keys="id", sequence_by="lsn", app_id="reserved",
              except_column_list=[CDC_METADATA])(clashing, 0)  # left out, it is just another batch column
    assert columns(str(tmp_path / "a")) == ["id", "lsn"]
    MergeSink(str(tmp_path / "b"), keys="id", except_column_list=["lsn"], app_id="plain")(
        frame(spark, [e(1, 1, "c")]), 0)
    with pytest.raises(MergeAnalysisError, match=r"has neither the sequence_by column\(s\) \['lsn'\] nor"):
        MergeSink(str(tmp_path / "b"), keys="id", sequence_by="lsn", except_column_list=["lsn"], app_id="seq")(
            frame(spark, [e(1, 2, "u")]), 0)
    assert deltalake.DeltaTable(str(tmp_path / "b")).version() == 1


def test_scd2_leaves_the_sequence_column_out(spark: SparkSession, table_path: str) -> None:
    """``__START_AT`` / ``__END_AT`` carry the sequence: the history without the column, late
    events, a delete and a truncate placed as the model places them."""
    batches = [[e(0, 1, "c", "a"), e(0, 5, "u", "b"), e(1, 2, "c", "x")],
               [e(0, 3, "u", "late"), e(1, 4, "d", None, None)],
               [e(None, 6, "t"), e(2, 7, "c", "new")]]
    sink = MergeSink(table_path, keys="id", sequence_by="lsn", apply_as_deletes="op = 'd'",
                     apply_as_truncates="op = 't'", stored_as_scd_type="2", except_column_list=["lsn"],
                     app_id="scd2-meta")
    model = Scd2Model(["op", "name", "amount"], [])
    for batch_id, batch in enumerate(batches):
        sink(frame(spark, batch), batch_id)
        model.apply(batch)
    assert columns(table_path) == ["id", "op", "name", "amount", "__START_AT", "__END_AT"]
    assert history(table_path) == model.table()
