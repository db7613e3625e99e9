"""SCD type 2 and truncates in MergeSink, against the reference models in
tests/history_model.py: random events, random batch splits and arrival orders, re-sends of
one sequence value, deletes, truncates and late events across batches."""

from __future__ import annotations

import tempfile
from typing import Any

import deltalake
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pyspark.sql import SparkSession

from streaming_merge import MergeSink
from streaming_merge.errors import MergeAnalysisError, MergeError
from tests.history_model import END, START, Scd2Model, full_history, scd1_with_truncates
from tests.spark.test_sink import frame

pytestmark = pytest.mark.spark

DATA = ["op", "name", "amount"]
TRACKING = {  # (sink options, tracked columns, untracked data columns besides lsn)
    "all": ({}, ["op", "name", "amount"], []),
    "except_op": ({"track_history_except_column_list": ["op"]}, ["name", "amount"], ["op"]),
    "name_only": ({"track_history_column_list": ["name"]}, ["name"], ["op", "amount"]),
}

changes = st.fixed_dictionaries({
    "id": st.integers(0, 2),
    "lsn": st.integers(0, 12),
    "op": st.sampled_from(["c", "u", "u", "d"]),
    "name": st.sampled_from([None, "a", "b"]),
    "amount": st.sampled_from([None, 1, 2]),
})
truncate = st.builds(lambda lsn: {"id": None, "lsn": lsn, "op": "t", "name": None, "amount": None},
                     st.integers(0, 12))
event = st.one_of(changes, changes, changes, changes, changes, truncate)
batches = st.lists(st.lists(event, min_size=1, max_size=7), min_size=1, max_size=3)

SETTINGS = settings(max_examples=12, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def history(path: str) -> list[dict[str, Any]]:
    if not deltalake.DeltaTable.is_deltatable(path):
        return []
    def order(row: dict[str, Any]) -> tuple[Any, ...]:
        start = row[START]
        return (row["id"], tuple(start.values()) if isinstance(start, dict) else start)

    return sorted(deltalake.DeltaTable(path).to_pyarrow_table().to_pylist(), key=order)


def scd2_sink(path: str, **options: Any) -> MergeSink:
    return MergeSink(path, keys="id", sequence_by="lsn", delete_when="op = 'd'", apply_as_truncates="op = 't'",
                     app_id="history", scd_type=2, **options)


def e(id: int | None, lsn: int, op: str = "u", name: str | None = "a", amount: int | None = 1) -> dict[str, Any]:
    return {"id": id, "lsn": lsn, "op": op, "name": name, "amount": amount}


@SETTINGS
@given(batches=batches, tracking=st.sampled_from(sorted(TRACKING)))
# a late event splits the closed interval it falls into
@example(batches=[[e(0, 1, "c", "a"), e(0, 5, "u", "b")], [e(0, 3, "u", "late")]], tracking="all")
# an untracked change updates the current row in place; a later tracked one opens a version
@example(batches=[[e(0, 1, "c", "a", 1)], [e(0, 2, "u", "a", 2), e(0, 4, "u", "b", 2)]], tracking="name_only")
# a delete that arrived before anything of its key closes the late insert (the tombstone remembers it)
@example(batches=[[e(1, 6, "d", None, None)], [e(1, 2, "c", "x")]], tracking="all")
# a truncate closes the current rows of keys the batch does not touch, and later late events
@example(batches=[[e(0, 1, "c"), e(1, 2, "c")], [e(None, 5, "t"), e(0, 7, "u", "b")], [e(2, 3, "c")]],
         tracking="all")
# a re-send of one sequence value in a later batch replaces the version it opened
@example(batches=[[e(0, 1, "c", "a"), e(0, 2, "u", "b")], [e(0, 2, "u", "B")]], tracking="all")
def test_scd2_agrees_with_the_model(spark: SparkSession, batches: list[list[dict[str, Any]]],
                                    tracking: str) -> None:
    options, tracked, untracked = TRACKING[tracking]
    model = Scd2Model(tracked, ["lsn", *untracked])
    with tempfile.TemporaryDirectory() as folder:
        path = f"{folder}/t"
        sink = scd2_sink(path, **options)
        for batch_id, batch in enumerate(batches):
            sink(frame(spark, batch), batch_id)
            model.apply(batch)
        assert history(path) == model.table()


distinct_events = st.lists(
    st.tuples(st.integers(0, 2), st.sampled_from(["c", "u", "d", "t"])), min_size=1, max_size=10)


@settings(max_examples=10, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(kinds=distinct_events, order=st.randoms(use_true_random=False), cuts=st.lists(st.booleans(), max_size=10))
def test_scd2_history_does_not_depend_on_arrival_order(spark: SparkSession, kinds: list[tuple[int, str]],
                                                       order: Any, cuts: list[bool]) -> None:
    """Every event at its own sequence value, every upsert with a new name: whatever the
    arrival order and the batch boundaries, the table is the history of all events."""
    events = [e(None if op == "t" else key, lsn, op, None if op in ("d", "t") else f"v{lsn}")
              for lsn, (key, op) in enumerate(kinds)]
    shuffled = list(events)
    order.shuffle(shuffled)
    batches: list[list[dict[str, Any]]] = [[]]
    for i, event in enumerate(shuffled):
        if i and i - 1 < len(cuts) and cuts[i - 1]:
            batches.append([])
        batches[-1].append(event)
    with tempfile.TemporaryDirectory() as folder:
        path = f"{folder}/t"
        sink = scd2_sink(path)
        for batch_id, batch in enumerate(batches):
            sink(frame(spark, batch), batch_id)
        assert history(path) == full_history(events, ["op", "name", "amount"], ["lsn"])


def test_scd2_replayed_batch_is_skipped_and_reports_history_metrics(spark: SparkSession, table_path: str) -> None:
    sink = scd2_sink(table_path)
    sink(frame(spark, [e(1, 1, "c", "a"), e(2, 1, "c", "x")]), 0)
    batch = [e(1, 3, "u", "b"), e(2, 2, "d", None, None)]
    sink(frame(spark, batch), 1)
    progress = sink.lastProgress
    assert progress is not None and not progress["skipped"]
    # one version opened (insert), two closed (updates of __END_AT)
    assert progress["metrics"]["numTargetRowsInserted"] == 1
    assert progress["metrics"]["numTargetRowsUpdated"] == 2
    before = history(table_path)
    sink(frame(spark, batch), 1)
    assert sink.lastProgress is not None and sink.lastProgress["skipped"]
    assert history(table_path) == before
    assert [(r["id"], r["name"], r[START], r[END]) for r in before] == [
        (1, "a", 1, 3), (1, "b", 3, None), (2, "x", 1, 2)]


def test_scd2_refuses_events_without_a_sequence_and_writes_nothing(spark: SparkSession, table_path: str) -> None:
    """A version starts and ends at sequence values: an upsert or a truncate without one fails
    its batch instead of vanishing (here with partial updates on; the copy's job counts those
    events the same way without); the table and its dead letter keep their version, and the
    same batch id with the event fixed then applies."""
    sink = scd2_sink(table_path, ignore_null_updates=True, dead_letter=f"{table_path}_dead")
    sink(frame(spark, [e(1, 1, "c", "a")]), 0)
    version = deltalake.DeltaTable(table_path).version()
    for bad in ([e(None, 2, "u"), {**e(2, 0, "c", "x"), "lsn": None}, e(1, 3, "u", "b")],
                [e(1, 3, "u", "b"), {**e(None, 0, "t"), "lsn": None}]):
        with pytest.raises(MergeError, match=r"Batch 1: 1 event\(s\) have a NULL sequence_by value \(lsn\); "
                                             r"stored_as_scd_type=2 .* nothing was written"):
            sink(frame(spark, bad), 1)
        assert deltalake.DeltaTable(table_path).version() == version
        assert not deltalake.DeltaTable.is_deltatable(f"{table_path}_dead")
    sink(frame(spark, [e(1, 3, "u", "b")]), 1)
    assert [(r["id"], r["name"], r[START], r[END]) for r in history(table_path)] == [(1, "a", 1, 3), (1, "b", 3, None)]


def test_scd2_with_several_sequence_columns_keeps_struct_intervals(spark: SparkSession, table_path: str) -> None:
    rows = [(1, 10, 0, "a"), (1, 10, 1, "b"), (1, 9, 5, "late")]
    schema = "id long, pos long, off long, name string"
    sink = MergeSink(table_path, keys="id", sequence_by=["pos", "off"], scd_type=2, app_id="struct")
    sink(spark.createDataFrame(rows[:2], schema), 0)
    sink(spark.createDataFrame(rows[2:], schema), 1)
    table = history(table_path)
    assert [(r["name"], r[START], r[END]) for r in table] == [
        ("late", {"pos": 9, "off": 5}, {"pos": 10, "off": 0}),
        ("a", {"pos": 10, "off": 0}, {"pos": 10, "off": 1}),
        ("b", {"pos": 10, "off": 1}, None)]


@SETTINGS
@given(batches=batches)
# a truncate deletes rows at or before it, keeps newer ones, and drops later late events
@example(batches=[[e(0, 1, "c"), e(1, 8, "c")], [e(None, 5, "t"), e(2, 6, "c"), e(3, 4, "c")], [e(0, 3, "u")]])
def test_scd1_truncates_agree_with_the_model(spark: SparkSession, batches: list[list[dict[str, Any]]]) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = f"{folder}/t"
        sink = MergeSink(path, keys="id", sequence_by="lsn", delete_when="op = 'd'", apply_as_truncates="op = 't'",
                         app_id="truncates")
        for batch_id, batch in enumerate(batches):
            sink(frame(spark, batch), batch_id)
        table = {r["id"]: r for r in history_rows(path)}
        assert table == scd1_with_truncates(batches, DATA)
        assert sink.lastProgress is not None
        assert sink.lastProgress["numTruncates"] == sum(1 for ev in batches[-1] if ev["op"] == "t")


def history_rows(path: str) -> list[dict[str, Any]]:
    if not deltalake.DeltaTable.is_deltatable(path):
        return []
    return deltalake.DeltaTable(path).to_pyarrow_table().to_pylist()


def test_truncate_with_partial_updates_forgets_values_from_before_it(spark: SparkSession, table_path: str) -> None:
    sink = MergeSink(table_path, keys="id", sequence_by="lsn", delete_when="op = 'd'", apply_as_truncates="op = 't'",
                     ignore_null_updates=True, app_id="partial-truncate")
    sink(frame(spark, [e(1, 1, "c", "a", 1), e(2, 2, "c", "b", 2)]), 0)
    # key 1: a value older than the truncate in the same batch must not survive it
    sink(frame(spark, [e(1, 3, "u", "old", None), e(None, 4, "t"), e(1, 5, "u", None, 7)]), 1)
    assert sorted(history_rows(table_path), key=lambda r: r["id"]) == [
        {"id": 1, "lsn": 5, "op": "u", "name": None, "amount": 7}]


def test_history_options_refuse_what_they_cannot_do(spark: SparkSession, table_path: str) -> None:
    with pytest.raises(ValueError, match="scd_type must be 1 or 2"):
        MergeSink(table_path, keys="id", sequence_by="lsn", scd_type=3)
    with pytest.raises(ValueError, match="needs keys"):
        MergeSink(table_path, keys="id", scd_type=2)
    with pytest.raises(ValueError, match="schema_evolution"):
        MergeSink(table_path, keys="id", sequence_by="lsn", scd_type=2, schema_evolution=True)
    with pytest.raises(ValueError, match="need stored_as_scd_type=2"):
        MergeSink(table_path, keys="id", sequence_by="lsn", track_history_column_list=["name"])
    with pytest.raises(ValueError, match="not both"):
        MergeSink(table_path, keys="id", sequence_by="lsn", scd_type=2, track_history_column_list=["name"],
                  track_history_except_column_list=["op"])
    with pytest.raises(ValueError, match="apply_as_truncates needs"):
        MergeSink(table_path, keys="id", apply_as_truncates="op = 't'")
    sink = scd2_sink(table_path, track_history_column_list=["nme"])
    with pytest.raises(MergeAnalysisError, match=r"track_history_column_list names \['nme'\]"):
        sink(frame(spark, [e(1, 1, "c")]), 0)
    assert not deltalake.DeltaTable.is_deltatable(table_path)


def test_scd2_refuses_a_batch_whose_columns_differ_from_the_table(spark: SparkSession, table_path: str) -> None:
    sink = scd2_sink(table_path)
    sink(frame(spark, [e(1, 1, "c")]), 0)
    narrower = spark.createDataFrame([(1, 2, "u", "b")], "id long, lsn long, op string, name string")
    with pytest.raises(MergeAnalysisError, match=r"Missing from the batch: \['amount'\]"):
        sink(narrower, 1)
    assert deltalake.DeltaTable(table_path).version() == 1


@pytest.mark.parametrize("scd_type", [1, 2])
def test_a_restarted_sink_still_knows_the_recorded_truncates(spark: SparkSession, table_path: str,
                                                             scd_type: int) -> None:
    """The truncate is read back from the tombstone table (only its files whose key stats count
    NULLs) by a new sink on the same table, as after a restart."""
    def sink() -> MergeSink:
        return MergeSink(table_path, keys="id", sequence_by="lsn", delete_when="op = 'd'",
                         apply_as_truncates="op = 't'", app_id="restart", scd_type=scd_type)

    sink()(frame(spark, [e(1, 1, "c"), e(2, 2, "d", None, None)]), 0)
    sink()(frame(spark, [e(None, 5, "t"), e(3, 6, "c", "kept")]), 1)
    sink()(frame(spark, [e(4, 4, "c", "late"), e(5, 7, "c", "new")]), 2)
    rows = history_rows(table_path)
    if scd_type == 1:
        assert sorted((r["id"], r["name"]) for r in rows) == [(3, "kept"), (5, "new")]
    else:
        assert sorted((r["id"], r["name"], r[START], r[END]) for r in rows) == [
            (1, "a", 1, 5), (3, "kept", 6, None), (4, "late", 4, 5), (5, "new", 7, None)]
