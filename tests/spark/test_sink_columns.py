"""Column selection in MergeSink (AUTO CDC's column_list / except_column_list): which source
columns reach the table, the keys always, the sequence where selected (else in the reserved
metadata column), read back with delta-rs and compared with the reference model's state
projected onto the selected columns."""

from __future__ import annotations

from typing import Any

import deltalake
import pytest
from pyspark.sql import SparkSession

from streaming_merge import MergeSink
from streaming_merge.errors import MergeAnalysisError
from streaming_merge.streaming.sequence_layout import CDC_METADATA
from tests.spark.test_sink import frame
from tests.streaming_support.cdc_events import expected_state, generate


def _state(path: str) -> dict[int, dict[str, Any]]:
    return {r["id"]: r for r in deltalake.DeltaTable(path).to_pyarrow_table().to_pylist()}


@pytest.mark.parametrize(("options", "kept"), [
    # the keys join the list; the sequence, left out, is kept in the metadata column
    ({"column_list": ["name"]}, ["id", "name", CDC_METADATA]),
    ({"except_column_list": ["op", "AMOUNT"]}, ["id", "lsn", "name"]),  # names as Spark resolves them
    ({"column_list": ["id", "lsn", "op", "name", "amount"]}, ["id", "lsn", "op", "name", "amount"]),
])
def test_selected_columns_reach_the_table(spark: SparkSession, table_path: str, options: dict[str, Any],
                                          kept: list[str]) -> None:
    batches = generate(7, batches=3, events_per_batch=12, keys=6)
    sink = MergeSink(table_path, keys="id", sequence_by="lsn", delete_when="op = 'd'", app_id="cols", **options)
    for batch_id, events in enumerate(batches):
        sink(frame(spark, events), batch_id)
    assert deltalake.DeltaTable(table_path).schema().to_arrow().names == kept
    expected = {key: {c: {"deleteSequence": None, "upsertSequence": row["lsn"]} if c == CDC_METADATA else row[c]
                      for c in kept} for key, row in expected_state(batches).items()}
    assert _state(table_path) == expected


def test_delete_when_may_use_a_column_the_table_does_not_keep(spark: SparkSession, table_path: str) -> None:
    sink = MergeSink(table_path, keys="id", sequence_by="lsn", delete_when="op = 'd'", app_id="cols",
                     except_column_list=["op"])
    sink(frame(spark, [{"id": 1, "lsn": 1, "op": "c", "name": "a", "amount": 1},
                       {"id": 2, "lsn": 1, "op": "c", "name": "b", "amount": 2}]), 0)
    sink(frame(spark, [{"id": 1, "lsn": 2, "op": "d", "name": None, "amount": None}]), 1)
    assert _state(table_path) == {2: {"id": 2, "lsn": 1, "name": "b", "amount": 2}}


def test_bad_selections_are_refused_naming_the_columns(spark: SparkSession, table_path: str) -> None:
    with pytest.raises(ValueError, match=r"\['id'\].*always kept"):
        MergeSink(table_path, keys="id", sequence_by="lsn", except_column_list=["ID"], app_id="x")
    with pytest.raises(ValueError, match="not both"):
        MergeSink(table_path, keys="id", column_list=["a"], except_column_list=["b"], app_id="x")
    with pytest.raises(ValueError, match="list of column names"):
        MergeSink(table_path, keys="id", column_list="name", app_id="x")  # type: ignore[arg-type]
    sink = MergeSink(table_path, keys="id", sequence_by="lsn", column_list=["name", "nope"], app_id="x")
    with pytest.raises(MergeAnalysisError, match=r"column_list names column\(s\) \['nope'\]"):
        sink(frame(spark, [{"id": 1, "lsn": 1, "op": "c", "name": "a", "amount": 1}]), 0)
    assert not deltalake.DeltaTable.is_deltatable(table_path)  # nothing was created or written
