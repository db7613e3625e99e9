"""MergeSink: CDC semantics, idempotency, retries, errors and progress.

Most tests call the sink the way foreachBatch does (``sink(df, batch_id)``); one runs
a real streaming query and joins Spark's progress with ours through the listener.
Results are read back with delta-rs and compared with the reference model.
"""

from __future__ import annotations

import os
import shutil
import threading
from typing import Any

import deltalake
import pyarrow.compute as pc
import pytest
from pyspark.sql import DataFrame, SparkSession

from streaming_merge import DeltaTable, MergeProgressListener, MergeSink
from streaming_merge.errors import MergeError, MultipleSourceRowMatchingTargetRowError
from streaming_merge.merge.materialize import checkpoint_rdd_id
from streaming_merge.spark.slots import task_slots
from streaming_merge.streaming.sink import FOLD_IN_ONE_TASK_MAX_ROWS
from streaming_merge.streaming.tombstones import Tombstones
from tests.streaming_support.cdc_events import SCHEMA, expected_state, generate, table_state, write_files


def read(path: str) -> list[dict[str, Any]]:
    return deltalake.DeltaTable(path).to_pyarrow_table().to_pylist()


def frame(spark: SparkSession, events: list[dict[str, Any]]) -> DataFrame:
    return spark.createDataFrame([(e["id"], e["lsn"], e["op"], e["name"], e["amount"]) for e in events], SCHEMA)


def cdc_sink(path: str, **kwargs: Any) -> MergeSink:
    kwargs.setdefault("app_id", "test-app")
    return MergeSink(path, keys=["id"], sequence_by="lsn", delete_when="op = 'd'", **kwargs)


@pytest.mark.parametrize("seed", [1, 2])
def test_out_of_order_cdc_batches_end_in_the_reference_state(spark: SparkSession, table_path: str,
                                                              seed: int) -> None:
    batches = generate(seed, batches=4, events_per_batch=12, keys=8)
    sink = cdc_sink(table_path)
    for batch_id, events in enumerate(batches):
        sink(frame(spark, events), batch_id)
    assert table_state(read(table_path)) == expected_state(batches)
    progress = sink.recentProgress
    assert [p["batchId"] for p in progress] == [0, 1, 2, 3]
    assert sum(p["numInputRows"] for p in progress) == sum(len(b) for b in batches)
    assert all(p["numRowsAfterDedupe"] <= p["numInputRows"] for p in progress)
    assert deltalake.DeltaTable(table_path).transaction_version("test-app") == 3


def test_late_insert_never_resurrects_a_deleted_row(spark: SparkSession, table_path: str) -> None:
    sink = cdc_sink(table_path)
    sink(frame(spark, [{"id": 1, "lsn": 10, "op": "c", "name": "a", "amount": 1}]), 0)
    sink(frame(spark, [{"id": 1, "lsn": 20, "op": "d", "name": None, "amount": None}]), 1)
    sink(frame(spark, [{"id": 1, "lsn": 15, "op": "u", "name": "late", "amount": 2},
                       {"id": 2, "lsn": 16, "op": "c", "name": "b", "amount": 3}]), 2)
    assert table_state(read(table_path)) == {2: {"id": 2, "lsn": 16, "op": "c", "name": "b", "amount": 3}}
    assert sink.lastProgress["numLateRowsDropped"] == 1
    tombstones = read(f"{table_path}_tombstones")
    assert [(t["id"], t["lsn"]) for t in tombstones] == [(1, 20)]
    # A newer re-insert brings the key back.
    sink(frame(spark, [{"id": 1, "lsn": 30, "op": "c", "name": "again", "amount": 4}]), 3)
    assert table_state(read(table_path))[1]["name"] == "again"


def test_tombstone_table_is_compacted_and_still_drops_late_events(spark: SparkSession, table_path: str) -> None:
    """Each batch with deletes adds a tombstone file and every later lookup reads them all,
    so the sink bin-packs them at COMPACT_SMALL_FILES; the compacted tombstones still work."""
    from streaming_merge.streaming.tombstones import COMPACT_SMALL_FILES

    sink = cdc_sink(table_path)
    batches = COMPACT_SMALL_FILES + 2
    for batch_id in range(batches):
        sink(frame(spark, [{"id": batch_id, "lsn": 100 + batch_id, "op": "d", "name": None, "amount": None},
                           {"id": 1000 + batch_id, "lsn": 100 + batch_id, "op": "c", "name": "x", "amount": 1}]),
             batch_id)
    tombstones = deltalake.DeltaTable(f"{table_path}_tombstones")
    assert len(tombstones.file_uris()) < COMPACT_SMALL_FILES
    assert any(h.get("userOperation") == "OPTIMIZE" for h in tombstones.history())
    assert sorted((t["id"], t["lsn"]) for t in read(f"{table_path}_tombstones")) == [
        (i, 100 + i) for i in range(batches)]
    # Late inserts of keys deleted in the first (compacted) batches: dropped; a newer one: applied.
    sink(frame(spark, [{"id": 0, "lsn": 50, "op": "c", "name": "late", "amount": 2},
                       {"id": 1, "lsn": 99, "op": "u", "name": "late", "amount": 2},
                       {"id": 2, "lsn": 500, "op": "c", "name": "new", "amount": 3}]), batches)
    state = table_state(read(table_path))
    assert 0 not in state and 1 not in state and state[2]["name"] == "new"
    assert sink.lastProgress["numLateRowsDropped"] == 2
    assert sorted(k for k in state if k >= 1000) == [1000 + i for i in range(batches)]


def test_tombstones_past_retention_are_purged(spark: SparkSession, table_path: str) -> None:
    import datetime as dt

    sink = cdc_sink(table_path)
    sink(frame(spark, [{"id": 1, "lsn": 1, "op": "d", "name": None, "amount": None},
                       {"id": 2, "lsn": 2, "op": "d", "name": None, "amount": None}]), 0)
    assert len(read(f"{table_path}_tombstones")) == 2
    assert sink._tombstones is not None
    purged = sink._tombstones.purge(spark, now=dt.datetime.now(dt.UTC) + dt.timedelta(days=8))
    assert purged == 2 and read(f"{table_path}_tombstones") == []


def test_replayed_batch_is_skipped_and_reported(spark: SparkSession, table_path: str) -> None:
    sink = cdc_sink(table_path)
    events = [{"id": 1, "lsn": 1, "op": "c", "name": "a", "amount": 1}]
    sink(frame(spark, events), 0)
    version = deltalake.DeltaTable(table_path).version()
    sink(frame(spark, [{"id": 1, "lsn": 2, "op": "u", "name": "replay-differs", "amount": 9}]), 0)
    assert deltalake.DeltaTable(table_path).version() == version
    assert sink.lastProgress["skipped"] is True and sink.lastProgress["batchId"] == 0
    assert table_state(read(table_path))[1]["name"] == "a"


def test_without_sequence_the_last_row_of_the_batch_wins(spark: SparkSession, table_path: str) -> None:
    sink = MergeSink(table_path, keys="id", app_id="a")
    rows = [(1, "first"), (2, "x"), (1, "second"), (1, "third")]
    sink(spark.createDataFrame(rows, "id int, v string").coalesce(1), 0)
    assert sorted((r["id"], r["v"]) for r in read(table_path)) == [(1, "third"), (2, "x")]


def test_dedupe_error_fails_the_batch_on_duplicate_keys(spark: SparkSession, table_path: str) -> None:
    sink = MergeSink(table_path, keys="id", app_id="a", dedupe="error")
    with pytest.raises(MultipleSourceRowMatchingTargetRowError, match=r"id=1 \(2 events\)"):
        sink(spark.createDataFrame([(1, "a"), (1, "b")], "id int, v string"), 0)
    assert not os.path.exists(os.path.join(table_path, "_delta_log"))


def test_null_keys_fail_the_batch_without_a_dead_letter_table(spark: SparkSession, table_path: str) -> None:
    sink = cdc_sink(table_path)
    sink(frame(spark, [{"id": 1, "lsn": 1, "op": "c", "name": "a", "amount": 1}]), 0)
    version = deltalake.DeltaTable(table_path).version()
    bad = [{"id": None, "lsn": 2, "op": "c", "name": "x", "amount": 1},
           {"id": None, "lsn": 3, "op": "c", "name": "y", "amount": 1},
           {"id": 2, "lsn": 4, "op": "c", "name": "b", "amount": 1}]
    with pytest.raises(MergeError, match=r"Batch 1: 2 row\(s\) have NULL in key column\(s\) \['id'\]"):
        sink(frame(spark, bad), 1)
    assert deltalake.DeltaTable(table_path).version() == version


def test_null_keys_go_to_the_dead_letter_table_with_the_reason(spark: SparkSession, table_path: str,
                                                               tmp_path: Any) -> None:
    dead = str(tmp_path / "dead")
    sink = cdc_sink(table_path, dead_letter=dead)
    batch = [{"id": None, "lsn": 2, "op": "c", "name": "x", "amount": 1},
             {"id": 2, "lsn": 4, "op": "c", "name": "b", "amount": 1}]
    sink(frame(spark, batch), 0)
    sink(frame(spark, batch), 0)  # replay: neither table changes
    assert list(table_state(read(table_path))) == [2]
    letters = read(dead)
    assert len(letters) == 1
    assert letters[0]["reason"] == "NULL in key column(s) id" and letters[0]["batch_id"] == 0
    assert '"name":"x"' in letters[0]["record"]
    assert sink.lastProgress["skipped"] is True
    assert sink.recentProgress[0]["numNullKeyRows"] == 1


def test_empty_batch_commits_nothing_but_reports(spark: SparkSession, table_path: str) -> None:
    sink = cdc_sink(table_path)
    sink(frame(spark, [{"id": 1, "lsn": 1, "op": "c", "name": "a", "amount": 1}]), 0)
    version = deltalake.DeltaTable(table_path).version()
    sink(frame(spark, []), 1)
    assert deltalake.DeltaTable(table_path).version() == version
    assert sink.lastProgress["batchId"] == 1 and sink.lastProgress["numInputRows"] == 0
    assert sink.lastProgress["skipped"] is False


def test_the_batch_finds_which_target_files_its_keys_fall_into_while_materialized(
        spark: SparkSession, table_path: str) -> None:
    # 8 files of 100 ids each. The batch's keys span [250, 5000], which overlaps 6 files, but
    # only the file of 200..299 holds any of them: the MERGE reads and rewrites that one.
    rows = [{"id": i, "lsn": 1, "op": "c", "name": "a", "amount": i} for i in range(800)]
    DeltaTable.createFromDataFrame(frame(spark, rows).repartitionByRange(8, "id"), table_path)
    sink = cdc_sink(table_path)
    sink(frame(spark, [{"id": 250, "lsn": 2, "op": "u", "name": "b", "amount": -1},
                       {"id": 260, "lsn": 2, "op": "u", "name": "b", "amount": -1},
                       {"id": 270, "lsn": 2, "op": "d", "name": None, "amount": None},
                       {"id": 5000, "lsn": 2, "op": "c", "name": "n", "amount": 5}]), 0)
    metrics = sink.lastProgress["metrics"]
    assert metrics["numTargetFilesBeforeSkipping"] == 8 and metrics["numTargetFilesAfterSkipping"] == 1
    assert metrics["numTargetFilesRemoved"] == 1 and metrics["numTargetRowsCopied"] == 97
    assert (metrics["numTargetRowsUpdated"], metrics["numTargetRowsDeleted"], metrics["numTargetRowsInserted"]) == \
        (2, 1, 1)
    state = {r["id"]: r["amount"] for r in read(table_path)}
    assert len(state) == 800 and 270 not in state
    assert (state[250], state[260], state[5000], state[251], state[650]) == (-1, -1, 5, 251, 650)


def test_deletes_of_missing_keys_are_harmless(spark: SparkSession, table_path: str) -> None:
    sink = cdc_sink(table_path)
    sink(frame(spark, [{"id": 5, "lsn": 1, "op": "d", "name": None, "amount": None},
                       {"id": 6, "lsn": 2, "op": "c", "name": "f", "amount": 1}]), 0)
    assert list(table_state(read(table_path))) == [6]
    assert sink.lastProgress["metrics"]["numTargetRowsDeleted"] == 0


def test_lost_batch_blocks_rerun_the_batch(spark: SparkSession, table_path: str) -> None:
    seen: dict[str, Any] = {"lost": False}

    def hook(phase: str, frame_: DataFrame) -> None:
        if phase in ("after_materialize", "after_prepare"):
            seen[phase] = frame_
        if phase == "after_find_touched_files" and not seen["lost"]:
            seen["lost"] = True  # drop every materialized block the batch has: its copy and its dedupe
            for name in ("after_materialize", "after_prepare"):
                spark.sparkContext._jsc.sc().unpersistRDD(checkpoint_rdd_id(seen[name]), True)

    sink = cdc_sink(table_path, phase_hook=hook)
    sink(frame(spark, [{"id": 1, "lsn": 1, "op": "c", "name": "a", "amount": 1}]), 0)
    seen["lost"] = False
    batch = [{"id": 1, "lsn": 2, "op": "u", "name": "b", "amount": 2},
             {"id": 3, "lsn": 3, "op": "c", "name": "c", "amount": 3}]
    sink(frame(spark, batch), 1)
    assert sink.lastProgress["attempts"] == 2
    assert table_state(read(table_path)) == expected_state([[{"id": 1, "lsn": 1, "op": "c", "name": "a",
                                                              "amount": 1}], batch])


def test_a_second_writer_during_the_batch_is_handled(spark: SparkSession, table_path: str) -> None:
    state = {"interfered": False}

    def hook(phase: str, _: DataFrame) -> None:
        if phase == "before_commit" and not state["interfered"]:
            state["interfered"] = True
            deltalake.DeltaTable(table_path).update(updates={"amount": "amount + 1000"}, predicate="id = 2")

    sink = cdc_sink(table_path)
    sink(frame(spark, [{"id": 1, "lsn": 1, "op": "c", "name": "a", "amount": 1},
                       {"id": 2, "lsn": 2, "op": "c", "name": "b", "amount": 2}]), 0)
    sink = cdc_sink(table_path, phase_hook=hook)
    sink(frame(spark, [{"id": 1, "lsn": 3, "op": "u", "name": "a2", "amount": 5}]), 1)
    assert state["interfered"] and sink.lastProgress["attempts"] == 2
    result = table_state(read(table_path))
    assert result[1]["name"] == "a2" and result[2]["amount"] == 1002


def test_the_next_batch_sees_what_another_writer_committed_between_batches(
        spark: SparkSession, table_path: str) -> None:
    sink = cdc_sink(table_path)
    sink(frame(spark, [{"id": 1, "lsn": 1, "op": "c", "name": "a", "amount": 1},
                       {"id": 2, "lsn": 2, "op": "c", "name": "b", "amount": 2}]), 0)
    deltalake.DeltaTable(table_path).update(updates={"amount": "amount + 1000"}, predicate="id = 2")
    sink(frame(spark, [{"id": 1, "lsn": 3, "op": "u", "name": "a2", "amount": 5},
                       {"id": 2, "lsn": 4, "op": "u", "name": "b2", "amount": None}]), 1)
    result = table_state(read(table_path))
    assert (result[1]["name"], result[2]["name"], result[2]["amount"]) == ("a2", "b2", None)
    assert sink.lastProgress["attempts"] == 1 and sink.lastProgress["tableVersion"] == 3  # create, 0, update, 1


def test_a_target_deleted_and_created_again_between_batches_is_read_afresh(
        spark: SparkSession, table_path: str) -> None:
    """The sink follows its table's log from batch to batch; a table whose versions started over
    must not be committed to as if it were the old one (that would leave a gap in the log)."""
    sink = cdc_sink(table_path, tombstones=False)
    for batch_id in range(3):
        sink(frame(spark, [{"id": batch_id, "lsn": batch_id, "op": "c", "name": "old", "amount": 1}]), batch_id)
    old = deltalake.DeltaTable(table_path)
    assert old.version() == 3  # created, then a MERGE per batch
    kept = old.to_pyarrow_table().filter(pc.field("id") == 0)
    shutil.rmtree(table_path)
    deltalake.write_deltalake(table_path, kept)  # version 0 of a new table
    sink(frame(spark, [{"id": 8, "lsn": 8, "op": "c", "name": "new", "amount": 2}]), 3)
    new = deltalake.DeltaTable(table_path)
    assert [h["version"] for h in new.history()] == [1, 0]
    assert new.transaction_version("test-app") == 3
    assert sorted(table_state(read(table_path))) == [0, 8]


def test_two_streaming_queries_each_get_one_progress_record_per_batch(spark: SparkSession, tmp_path: Any) -> None:
    """Two queries at once in one session, each with its sink and listener: a listener hears
    both queries' progress (their batch ids repeat), and must pair each of its own query's
    batches with its own sink's record, once."""
    runs = {name: (generate(seed, batches=count, events_per_batch=10, keys=6), MergeSink(
        str(tmp_path / name / "out"), keys=["id"], sequence_by="lsn", delete_when="op = 'd'"))
        for name, seed, count in (("first", 7, 3), ("second", 8, 2))}
    records: dict[str, list[dict[str, Any]]] = {name: [] for name in runs}
    done = {name: threading.Event() for name in runs}
    listeners = []
    for name, (batches, sink) in runs.items():
        write_files(str(tmp_path / name / "in"), batches)

        def on_progress(record: dict[str, Any], name: str = name, expected: int = len(batches)) -> None:
            records[name].append(record)
            if len(records[name]) >= expected:
                done[name].set()

        listeners.append(MergeProgressListener(sink, on_progress))
        spark.streams.addListener(listeners[-1])
    try:
        queries = {name: (spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1)
                          .json(str(tmp_path / name / "in")).writeStream.foreachBatch(sink)
                          .option("checkpointLocation", str(tmp_path / name / "chk"))
                          .trigger(availableNow=True).start())
                   for name, (_, sink) in runs.items()}
        for name, query in queries.items():
            query.awaitTermination()
            assert done[name].wait(60), f"{name}'s listener saw {len(records[name])} progress events"
    finally:
        for listener in listeners:
            spark.streams.removeListener(listener)
    for name, (batches, sink) in runs.items():
        query_id, target = str(queries[name].id), str(tmp_path / name / "out")
        assert table_state(read(target)) == expected_state(batches)
        assert deltalake.DeltaTable(target).transaction_version(query_id) == len(batches) - 1
        assert sorted(r["batchId"] for r in records[name]) == list(range(len(batches))), records[name]
        for record in records[name]:
            assert record["id"] == query_id, "another query's progress reached this listener"
            merge = record["merge"]
            assert merge is not None and merge["batchId"] == record["batchId"], record
            assert (merge["queryId"], merge["appId"], merge["target"]) == (query_id, query_id, sink.target)
            assert merge["numInputRows"] == record["numInputRows"]
            assert "numTargetRowsInserted" in merge["metrics"]


def test_tombstone_append_runs_beside_the_merge_which_commits_only_after_it(
        spark: SparkSession, table_path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The append starts before the MERGE and may finish after the MERGE wrote its files, but the
    MERGE commits (recording the batch's txn) only once the append committed: here the append
    waits until the MERGE is about to commit and then fails, so the MERGE must not commit, and
    the rerun of the batch applies both."""
    sink = cdc_sink(table_path)
    sink(frame(spark, [{"id": 1, "lsn": 1, "op": "c", "name": "a", "amount": 1},
                       {"id": 2, "lsn": 2, "op": "c", "name": "b", "amount": 2}]), 0)
    version_before = deltalake.DeltaTable(table_path).version()
    files_before = set(os.listdir(table_path))
    merge_about_to_commit = threading.Event()

    def failing_record(self: Tombstones, *args: Any, **kwargs: Any) -> None:
        if not merge_about_to_commit.wait(timeout=120):
            raise AssertionError("the tombstone append did not run beside the MERGE")
        raise OSError("tombstone storage unavailable")

    def hook(phase: str, _: DataFrame) -> None:
        if phase == "before_commit":
            merge_about_to_commit.set()

    delete_batch = [{"id": 1, "lsn": 5, "op": "d", "name": None, "amount": None},
                    {"id": 2, "lsn": 6, "op": "u", "name": "b2", "amount": 3}]
    failing = cdc_sink(table_path, phase_hook=hook)
    with monkeypatch.context() as patch:
        patch.setattr(Tombstones, "record", failing_record)
        with pytest.raises(OSError, match="tombstone storage unavailable"):
            failing(frame(spark, delete_batch), 1)
    assert deltalake.DeltaTable(table_path).version() == version_before
    assert deltalake.DeltaTable(table_path).transaction_version("test-app") == 0
    assert set(os.listdir(table_path)) == files_before, "the aborted MERGE left files behind"

    sink(frame(spark, delete_batch), 1)  # the rerun, with a working tombstone table
    assert table_state(read(table_path)) == {2: {"id": 2, "lsn": 6, "op": "u", "name": "b2", "amount": 3}}
    assert [(t["id"], t["lsn"]) for t in read(f"{table_path}_tombstones")] == [(1, 5)]
    sink(frame(spark, [{"id": 1, "lsn": 4, "op": "u", "name": "late", "amount": 9}]), 2)
    assert 1 not in table_state(read(table_path)) and sink.lastProgress["numLateRowsDropped"] == 1


def test_a_small_batch_is_folded_in_one_partition_a_large_or_first_one_in_one_per_task_slot(
        spark: SparkSession, table_path: str) -> None:
    """The newest event per key needs each key's events in one partition: a batch known to be
    small is coalesced into one (no shuffle), one bounded above FOLD_IN_ONE_TASK_MAX_ROWS and a
    sink's first batch without a bound are hash-partitioned into one per task slot. Either way
    the newest event of each key wins, whichever input partition its events came from."""
    folded: list[int] = []

    def hook(phase: str, batch: DataFrame) -> None:
        if phase == "after_materialize":
            folded.append(batch.rdd.getNumPartitions())

    sink = cdc_sink(table_path, phase_hook=hook)
    slots = task_slots(spark)

    def spread(events: list[dict[str, Any]]) -> DataFrame:
        return frame(spark, events).repartition(3)  # a key's events in different input partitions

    sink(spread([{"id": k, "lsn": 10 + i, "op": "u", "name": f"v{i}", "amount": i}
                 for i in range(6) for k in (1, 2)]), 0)
    sink(spread([{"id": 1, "lsn": 30 - i, "op": "u", "name": f"w{i}", "amount": i} for i in range(5)]), 1)
    sink(spread([{"id": 2, "lsn": 40 + i, "op": "u", "name": f"x{i}", "amount": i} for i in range(5)]), 2,
         rows_at_most=FOLD_IN_ONE_TASK_MAX_ROWS + 1)
    sink(spread([{"id": 3, "lsn": 50 + i, "op": "d" if i == 4 else "u", "name": f"y{i}", "amount": i}
                 for i in range(5)] + [{"id": 1, "lsn": 29, "op": "d", "name": None, "amount": None}]), 3,
         rows_at_most=10)
    assert folded == [slots, 1, slots, 1]
    assert sorted((r["id"], r["lsn"], r["name"]) for r in read(table_path)) == [(1, 30, "w0"), (2, 44, "x4")]


def test_the_late_event_filter_is_built_once_per_batch_schema(spark: SparkSession, table_path: str,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The tombstone filter's expressions are kept for the next batch of the same columns, and
    each batch still drops its own late events."""
    built: list[tuple[str, ...]] = []
    real_filter = Tombstones._late_filter

    def counting_filter(self: Tombstones, columns: Any) -> Any:
        built.append(tuple(columns))
        return real_filter(self, columns)

    monkeypatch.setattr(Tombstones, "_late_filter", counting_filter)
    sink = cdc_sink(table_path)
    sink(frame(spark, [{"id": k, "lsn": 10, "op": "c", "name": "a", "amount": 1} for k in (1, 2, 3)]), 0)
    sink(frame(spark, [{"id": 1, "lsn": 20, "op": "d", "name": None, "amount": None},
                       {"id": 2, "lsn": 21, "op": "d", "name": None, "amount": None}]), 1)
    sink(frame(spark, [{"id": 1, "lsn": 15, "op": "u", "name": "late", "amount": 5},
                       {"id": 3, "lsn": 16, "op": "u", "name": "b", "amount": 2}]), 2)
    assert sink.lastProgress["numLateRowsDropped"] == 1
    sink(frame(spark, [{"id": 2, "lsn": 18, "op": "u", "name": "late", "amount": 7}]), 3)
    assert sink.lastProgress["numLateRowsDropped"] == 1
    assert len(built) == 1
    assert sorted((r["id"], r["lsn"], r["name"]) for r in read(table_path)) == [(3, 16, "b")]


def test_the_batch_plan_is_built_once_per_batch_schema(spark: SparkSession, table_path: str,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The CDC plan's expressions (hundreds of JVM round trips) are kept for the next batch
    of the same schema and fold partitioning; a batch with another schema gets a plan of its own."""
    from streaming_merge.streaming import cdc

    built: list[tuple[tuple[str, ...], int]] = []
    real_plan = cdc._plan

    def counting_plan(spec: Any, columns: Any, types: Any, partitions: int) -> Any:
        built.append((tuple(columns), partitions))
        return real_plan(spec, columns, types, partitions)

    monkeypatch.setattr(cdc, "_plan", counting_plan)
    sink = cdc_sink(table_path, schema_evolution=True)
    slots = task_slots(spark)
    sink(frame(spark, [{"id": 1, "lsn": 10, "op": "c", "name": "a", "amount": 1},
                       {"id": 1, "lsn": 11, "op": "u", "name": "b", "amount": 2}]), 0)
    sink(frame(spark, [{"id": 2, "lsn": 12, "op": "c", "name": "c", "amount": 3},
                       {"id": 1, "lsn": 13, "op": "d", "name": None, "amount": None}]), 1)
    sink(frame(spark, [{"id": 2, "lsn": 14, "op": "u", "name": "c", "amount": 3}]), 2)
    columns = ("id", "lsn", "op", "name", "amount")
    # The first batch has no previous one to say it is small: one partition per task slot.
    assert built == [(columns, slots), (columns, 1)]
    wider = spark.createDataFrame([(2, 15, "u", "d", 4, "x"), (3, 16, "c", "e", 5, "y")], f"{SCHEMA}, note string")
    sink(wider, 3)
    assert built == [(columns, slots), (columns, 1), ((*columns, "note"), 1)]
    assert sorted((r["id"], r["name"], r["amount"], r["note"]) for r in read(table_path)) == [
        (2, "d", 4, "x"), (3, "e", 5, "y")]
