"""Partial updates in MergeSink (``ignore_null_updates``, Debezium's unavailable-value
placeholder): random event orders, duplicates of sequence values, deletes and late events
across batches, checked against the reference model in tests/partial_model.py (whose rule,
with every value present, is also that of whole-row upserts: mode "full"); events with a
NULL key go whole to the dead-letter table."""

from __future__ import annotations

import json
import tempfile
from collections import Counter
from typing import Any

import deltalake
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pyspark.sql import SparkSession

from streaming_merge import MergeSink
from streaming_merge.streaming.sink import FOLD_IN_ONE_TASK_MAX_ROWS
from tests.job_count import shuffled_bytes_of
from tests.partial_model import apply_batches
from tests.spark.test_deletion_vectors import delta_rs_rows
from tests.spark.test_sink import frame

PLACEHOLDER = "__debezium_unavailable_value"
DATA = ["op", "name", "amount"]

events = st.fixed_dictionaries({
    "id": st.none() | st.integers(0, 2),
    # about one event in eight without a sequence (NULL: older than every value)
    "lsn": st.integers(-2, 12).map(lambda n: None if n < 0 else n),
    "op": st.sampled_from(["c", "u", "u", "d"]),
    "name": st.sampled_from([None, "a", "b", PLACEHOLDER]),
    "amount": st.sampled_from([None, 1, 2]),
})
batches = st.lists(st.lists(events, min_size=1, max_size=8), min_size=1, max_size=3)


def _table(path: str) -> dict[Any, dict[str, Any]]:
    if not deltalake.DeltaTable.is_deltatable(path):
        return {}
    return {r["id"]: r for r in deltalake.DeltaTable(path).to_pyarrow_table().to_pylist()}


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(batches=batches, mode=st.sampled_from(["nulls", "placeholder", "both", "full"]))
# an event without a sequence wins over a row without one, in each column it carries a value for
# (as a whole-row upsert does), and loses to a row with one
@example(batches=[[{"id": 0, "lsn": None, "op": "c", "name": "a", "amount": 1},
                   {"id": 1, "lsn": 2, "op": "c", "name": "a", "amount": 1}],
                  [{"id": 0, "lsn": None, "op": "u", "name": None, "amount": 2},
                   {"id": 1, "lsn": None, "op": "u", "name": "b", "amount": 2}]], mode="nulls")
# a real NULL overwrites when only the placeholder means "unchanged"
@example(batches=[[{"id": 0, "lsn": 1, "op": "c", "name": "a", "amount": 1}],
                  [{"id": 0, "lsn": 2, "op": "u", "name": PLACEHOLDER, "amount": None}]], mode="placeholder")
# a delete newer than the row inside the batch: the row starts afresh, nothing of the old one survives
@example(batches=[[{"id": 0, "lsn": 1, "op": "c", "name": "a", "amount": 1}],
                  [{"id": 0, "lsn": 3, "op": "u", "name": None, "amount": 2},
                   {"id": 0, "lsn": 2, "op": "d", "name": None, "amount": None}]], mode="nulls")
# a late value older than the tombstone never comes back with a newer partial insert
@example(batches=[[{"id": 0, "lsn": 1, "op": "c", "name": "a", "amount": 1}],
                  [{"id": 0, "lsn": 5, "op": "d", "name": None, "amount": None}],
                  [{"id": 0, "lsn": 4, "op": "u", "name": "late", "amount": 2},
                   {"id": 0, "lsn": 6, "op": "u", "name": None, "amount": 3}]], mode="nulls")
# "full": whole-row upserts (the model with every value present); batch 1's late update reads
# every tombstone, so batch 2 drops its late events while the sink materializes it
@example(batches=[[{"id": 0, "lsn": 3, "op": "d", "name": None, "amount": None},
                   {"id": 1, "lsn": 3, "op": "d", "name": None, "amount": None}],
                  [{"id": 0, "lsn": 2, "op": "u", "name": "late", "amount": 1}],
                  [{"id": 1, "lsn": 1, "op": "c", "name": "late", "amount": 1},
                   {"id": 0, "lsn": 4, "op": "c", "name": None, "amount": 2},
                   {"id": None, "lsn": 5, "op": "c", "name": "b", "amount": 2}]], mode="full")
@example(batches=[[{"id": 0, "lsn": 3, "op": "d", "name": None, "amount": None},
                   {"id": 1, "lsn": 3, "op": "d", "name": None, "amount": None}],
                  [{"id": 0, "lsn": 2, "op": "u", "name": "late", "amount": 1}],
                  [{"id": 1, "lsn": 1, "op": "c", "name": "late", "amount": 1},
                   {"id": 0, "lsn": 4, "op": "c", "name": None, "amount": 2},
                   {"id": 1, "lsn": 5, "op": "u", "name": "a", "amount": None},
                   {"id": None, "lsn": 5, "op": "c", "name": "b", "amount": 2}]], mode="nulls")
# an event without a sequence after its key's delete is older than the tombstone: dropped
@example(batches=[[{"id": 1, "lsn": 0, "op": "d", "name": None, "amount": None}],
                  [{"id": 1, "lsn": None, "op": "c", "name": None, "amount": None}]], mode="full")
def test_partial_updates_agree_with_the_model(spark: SparkSession, batches: list[list[dict[str, Any]]],
                                              mode: str) -> None:
    ignore_nulls = mode in ("nulls", "both")
    placeholder = PLACEHOLDER if mode in ("placeholder", "both") else None
    with tempfile.TemporaryDirectory() as folder:
        path = f"{folder}/t"
        sink = MergeSink(path, keys="id", sequence_by="lsn", delete_when="op = 'd'", app_id="partial",
                         ignore_null_updates=ignore_nulls, unavailable_value=placeholder, dead_letter=f"{folder}/dl")
        for batch_id, batch in enumerate(batches):
            sink(frame(spark, batch), batch_id)
        keyed = [[e for e in batch if e["id"] is not None] for batch in batches]
        expected = apply_batches(keyed, data_columns=DATA, ignore_nulls=ignore_nulls, placeholder=placeholder)
        assert _table(path) == expected
        dead = deltalake.DeltaTable(f"{folder}/dl").to_pyarrow_table().to_pylist() \
            if deltalake.DeltaTable.is_deltatable(f"{folder}/dl") else []
        unkeyed = [{k: v for k, v in e.items() if v is not None} for batch in batches for e in batch if e["id"] is None]
        assert sorted(json.dumps(json.loads(r["record"]), sort_keys=True) for r in dead) == \
            sorted(json.dumps(record, sort_keys=True) for record in unkeyed)


def test_a_placeholder_never_overwrites_and_never_lands(spark: SparkSession, table_path: str) -> None:
    sink = MergeSink(table_path, keys="id", sequence_by="lsn", app_id="toast", unavailable_value=PLACEHOLDER)
    sink(frame(spark, [{"id": 1, "lsn": 1, "op": "c", "name": "long text", "amount": 1},
                       {"id": 2, "lsn": 1, "op": "c", "name": PLACEHOLDER, "amount": 2}]), 0)
    sink(frame(spark, [{"id": 1, "lsn": 2, "op": "u", "name": PLACEHOLDER, "amount": None}]), 1)
    assert _table(table_path) == {1: {"id": 1, "lsn": 2, "op": "u", "name": "long text", "amount": None},
                                  2: {"id": 2, "lsn": 1, "op": "c", "name": None, "amount": 2}}


def test_partial_options_refuse_what_they_cannot_do(table_path: str) -> None:
    with pytest.raises(ValueError, match="need keys"):
        MergeSink(table_path, condition="t.id = s.id", ignore_null_updates=True)
    with pytest.raises(ValueError, match="schema_evolution"):
        MergeSink(table_path, keys="id", ignore_null_updates=True, schema_evolution=True)


def test_a_batch_filtered_while_materialized_keeps_its_partitioning_on_the_keys(spark: SparkSession,
                                                                                 table_path: str) -> None:
    """The late-event filter of partial updates ends in a projection: the local checkpoint of its
    output must state its hash partitioning in its own output's attributes, or the MERGE's join on
    the keys shuffles the copy once more."""
    seen: list[Any] = []

    def hook(phase: str, frame: Any) -> None:
        if phase == "after_materialize":
            seen.append(frame._jdf.queryExecution().executedPlan())

    sink = MergeSink(table_path, keys="id", sequence_by="lsn", delete_when="op = 'd'", app_id="parts",
                     ignore_null_updates=True, phase_hook=hook)
    sink(frame(spark, [{"id": 1, "lsn": 1, "op": "c", "name": "a", "amount": 1},
                       {"id": 2, "lsn": 3, "op": "d", "name": None, "amount": None}]), 0)
    # tombstones are few: batch 1 drops its late event (id 2, lsn 2) while it is materialized,
    # folded into a partition per task slot (a batch that may be large: one partition would pair
    # with the tombstones without any exchange, see test_job_budget)
    sink(frame(spark, [{"id": 2, "lsn": 2, "op": "u", "name": "late", "amount": 5},
                       {"id": 1, "lsn": 4, "op": "u", "name": None, "amount": 7}]), 1,
         rows_at_most=FOLD_IN_ONE_TASK_MAX_ROWS + 1)
    assert sink.progress_for(1).numLateRowsDropped == 1  # type: ignore[union-attr]
    assert _table(table_path) == {1: {"id": 1, "lsn": 4, "op": "u", "name": "a", "amount": 7}}
    plan = seen[-1]
    partitioning = plan.outputPartitioning()
    assert partitioning.getClass().getSimpleName() == "HashPartitioning"
    assert partitioning.references().subsetOf(plan.outputSet()), partitioning.toString()


def test_a_batch_of_whole_rows_writes_from_the_source_side_and_a_placeholder_keeps_the_table_value(
        spark: SparkSession, table_path: str) -> None:
    """Partial updates configured, but no event of the batch leaves a value unchanged: the
    batch takes the whole-row clauses, which read no target value, so the deletion-vector
    MERGE writes the source's rows without a shuffle; a batch with a placeholder keeps the
    partial clauses (the joined rows meet the source's in a shuffle) and the table's value."""
    sink = MergeSink(table_path, keys="id", sequence_by="lsn", app_id="whole", unavailable_value=PLACEHOLDER,
                     table_properties={"delta.enableDeletionVectors": "true"})
    sink(frame(spark, [{"id": i, "lsn": 1, "op": "c", "name": f"n{i}", "amount": i} for i in range(6)]), 0)
    whole = [{"id": 1, "lsn": 2, "op": "u", "name": "x", "amount": 10},
             {"id": 4, "lsn": 0, "op": "u", "name": "older", "amount": 40},
             {"id": 9, "lsn": 2, "op": "c", "name": "y", "amount": 9}]
    shuffled_whole, _ = shuffled_bytes_of(spark, lambda: sink(frame(spark, whole), 1))
    partial = [{"id": 2, "lsn": 3, "op": "u", "name": PLACEHOLDER, "amount": 20},
               {"id": 3, "lsn": 3, "op": "u", "name": "z", "amount": 30}]
    shuffled_partial, _ = shuffled_bytes_of(spark, lambda: sink(frame(spark, partial), 2))
    assert shuffled_whole == 0 < shuffled_partial
    expected = {i: {"id": i, "lsn": 1, "op": "c", "name": f"n{i}", "amount": i} for i in range(6)}
    expected[1] = {"id": 1, "lsn": 2, "op": "u", "name": "x", "amount": 10}
    expected[9] = {"id": 9, "lsn": 2, "op": "c", "name": "y", "amount": 9}
    expected[2] = {"id": 2, "lsn": 3, "op": "u", "name": "n2", "amount": 20}
    expected[3] = {"id": 3, "lsn": 3, "op": "u", "name": "z", "amount": 30}
    assert delta_rs_rows(table_path) == Counter(tuple(row.values()) for row in expected.values())
