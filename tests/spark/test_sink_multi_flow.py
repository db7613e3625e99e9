"""Several flows into one table (issue 41 part 5): two MergeSinks with their own app ids upsert
into one Delta table at once. A batch whose commit conflicts with the other flow's is rerun from
a fresh snapshot (its own bounded budget, with backoff, logged); the newest event wins whichever
flow brought it (sequence columns, the reserved ``__spark_autocdc_metadata`` column, SCD 2); a
delete one flow records as a tombstone only (a key the table did not hold) still stops the
other flow's older insert; each flow stays exactly once on its own txn. The interleavings are
forced: the batch's MERGE runs the other flow's batch in its ``before_commit`` phase, i.e.
after it read the table and the tombstones and before it commits; the last test runs two real
streaming queries side by side. Results are checked against the reference model of
tests/streaming_support/cdc_events.py over both flows' events."""

from __future__ import annotations

import datetime as dt
import json
import logging
import threading
import time
from pathlib import Path
from typing import Any

import deltalake
import pyarrow as pa
import pytest
from pyspark.sql import DataFrame, SparkSession

from streaming_merge import MergeSink
from streaming_merge.errors import ConcurrentModificationError
from streaming_merge.streaming import sink as sink_module
from streaming_merge.streaming import tombstones as tombstones_module
from streaming_merge.streaming.sequence_layout import CDC_METADATA
from tests.history_model import END, START
from tests.spark.test_sink import frame
from tests.spark.test_sink_sequence_metadata import rows_with_sequence
from tests.streaming_support.cdc_events import SCHEMA, expected_state, generate, table_state

FAST_BACKOFF = (0.01, 0.05)
LAYOUTS = {"columns": {}, "metadata": {"except_column_list": ["lsn"]}}


def ev(key: int | None, lsn: int, op: str, name: str | None = None) -> dict[str, Any]:
    return {"id": key, "lsn": lsn, "op": op, "name": name if op != "d" else None,
            "amount": None if op == "d" else lsn}


def flow(path: str, app_id: str, layout: str = "columns", **options: Any) -> MergeSink:
    options = {"stored_as_scd_type": 2, **options} if layout == "scd2" else {**LAYOUTS[layout], **options}
    return MergeSink(path, keys=["id"], sequence_by="lsn", apply_as_deletes="op = 'd'", app_id=app_id,
                     conflict_backoff=FAST_BACKOFF, **options)


def state(path: str) -> dict[int, dict[str, Any]]:
    return table_state(list(rows_with_sequence(path).values()))


def run_other_flow_first(other: MergeSink, spark: SparkSession, batches: list[tuple[list[dict[str, Any]], int]]
                         ) -> Any:
    """A phase hook: at this batch's first ``before_commit`` (the MERGE has read the table and
    the tombstones and written its files), the other flow applies ``batches`` in full."""
    pending = list(batches)

    def hook(phase: str, _: DataFrame) -> None:
        if phase == "before_commit" and pending:
            while pending:
                events, batch_id = pending.pop(0)
                other(frame(spark, events), batch_id)

    return hook


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_a_batch_conflicting_with_the_other_flow_reruns_and_the_newest_event_wins(
        spark: SparkSession, table_path: str, layout: str, caplog: pytest.LogCaptureFixture) -> None:
    live = flow(table_path, "live", layout)
    first = [ev(1, 10, "c", "a"), ev(2, 11, "c", "b"), ev(3, 12, "c", "c")]
    live(frame(spark, first), 0)
    # Committed by the live flow while the correction batch runs: newer than some of its events,
    # older than others; key 5 is deleted without ever being in the table (a tombstone only).
    during = [ev(1, 15, "u", "a-live"), ev(2, 16, "u", "b-live"), ev(3, 13, "u", "c-live"), ev(5, 8, "d"),
              ev(6, 14, "c", "f")]
    corrections = [ev(1, 5, "u", "stale"), ev(2, 20, "u", "b-fix"), ev(3, 9, "d"), ev(4, 7, "c", "d-fix"),
                   ev(5, 3, "c", "resurrected?")]
    fix = flow(table_path, "corrections", layout, phase_hook=run_other_flow_first(live, spark, [(during, 1)]))
    with caplog.at_level(logging.WARNING, logger=sink_module.__name__):
        fix(frame(spark, corrections), 0)

    assert state(table_path) == expected_state([first, during, corrections])
    assert sorted(state(table_path)) == [1, 2, 3, 4, 6]
    progress = fix.lastProgress
    assert progress is not None and progress["conflictRetries"] == 1 and progress["attempts"] == 2
    retries = [r for r in caplog.records if "conflict retry 1 of 8" in r.getMessage()]
    assert len(retries) == 1 and "'corrections'" in retries[0].getMessage()
    table = deltalake.DeltaTable(table_path)
    assert (table.transaction_version("live"), table.transaction_version("corrections")) == (1, 0)
    if layout == "metadata":
        assert CDC_METADATA in table.schema().to_arrow().names and "lsn" not in table.schema().to_arrow().names


@pytest.mark.parametrize("layout", [*sorted(LAYOUTS), "scd2"])
def test_a_delete_recorded_only_as_a_tombstone_by_the_other_flow_stops_an_older_insert(
        spark: SparkSession, table_path: str, layout: str) -> None:
    """The live flow deletes key 5, which the table does not hold: its MERGE changes no file,
    only its tombstone says so. The correction batch read the tombstones before that and holds
    an older insert of key 5; nothing in the target's log conflicts with it, so the sink's check
    of the tombstone table right before the commit must make it rerun (and drop the event, or
    with SCD 2 close it at the delete)."""
    live = flow(table_path, "live", layout)
    live(frame(spark, [ev(1, 1, "c", "a")]), 0)
    fix = flow(table_path, "corrections", layout,
               phase_hook=run_other_flow_first(live, spark, [([ev(5, 8, "d")], 1)]))
    fix(frame(spark, [ev(5, 3, "c", "old"), ev(7, 4, "c", "g")]), 0)

    progress = fix.lastProgress
    assert progress is not None
    if layout == "scd2":
        rows = {(r["id"], r[START], r[END], r["name"])
                for r in deltalake.DeltaTable(table_path).to_pyarrow_table().to_pylist()}
        assert rows == {(1, 1, None, "a"), (5, 3, 8, "old"), (7, 4, None, "g")}
    else:
        assert sorted(state(table_path)) == [1, 7]
        assert progress["numLateRowsDropped"] == 1
    assert progress["conflictRetries"] == 1
    assert [(t["id"], t["lsn"]) for t in deltalake.DeltaTable(f"{table_path}_tombstones").to_pyarrow_table()
            .to_pylist()] == [(5, 8)]


def test_own_tombstones_and_other_keys_tombstones_cause_no_rerun(spark: SparkSession, table_path: str) -> None:
    """The check before the commit looks only for other writers' tombstones of the batch's keys:
    the batch's own deletes (appended beside its MERGE) and another flow's deletes of other keys
    let it commit on the first attempt (the other flow's commit adds no file the batch's keys
    could match: keys 100+ fall into a file of their own)."""
    live = flow(table_path, "live")
    live(frame(spark, [ev(100, 1, "c", "x"), ev(101, 1, "c", "y")]), 0)
    fix = flow(table_path, "corrections", phase_hook=run_other_flow_first(live, spark, [([ev(101, 2, "d")], 1)]))
    fix(frame(spark, [ev(1, 1, "c", "a"), ev(2, 2, "d"), ev(3, 3, "c", "c")]), 0)
    progress = fix.lastProgress
    assert progress is not None and progress["conflictRetries"] == 0 and progress["attempts"] == 1
    assert sorted(state(table_path)) == [1, 3, 100]
    tombstones = deltalake.DeltaTable(f"{table_path}_tombstones").to_pyarrow_table().to_pylist()
    assert sorted((t["id"], t["lsn"]) for t in tombstones) == [(2, 2), (101, 2)]


def test_each_flow_is_exactly_once_on_its_own_txn(spark: SparkSession, table_path: str) -> None:
    live = flow(table_path, "live")
    fix = flow(table_path, "corrections")
    live(frame(spark, [ev(1, 1, "c", "a")]), 0)
    fix(frame(spark, [ev(1, 2, "u", "b")]), 0)
    live(frame(spark, [ev(2, 3, "c", "c")]), 1)
    live(frame(spark, [ev(3, 4, "c", "d")]), 2)
    # A restarted correction flow replays its batch 0 after the live flow's commits: skipped by
    # its own txn, which the other flow's commits left alone; its batch 1 then applies.
    restarted = flow(table_path, "corrections")
    restarted(frame(spark, [ev(1, 2, "u", "b")]), 0)
    assert restarted.lastProgress is not None and restarted.lastProgress["skipped"] is True
    restarted(frame(spark, [ev(2, 5, "u", "c2")]), 1)
    # The live flow's replay of batch 1 is skipped too (its txn is at 2).
    live(frame(spark, [ev(2, 3, "c", "replayed")]), 1)
    assert live.lastProgress is not None and live.lastProgress["skipped"] is True
    table = deltalake.DeltaTable(table_path)
    assert (table.transaction_version("live"), table.transaction_version("corrections")) == (2, 1)
    assert {k: r["name"] for k, r in state(table_path).items()} == {1: "b", 2: "c2", 3: "d"}


def test_conflict_retries_have_their_own_bounded_budget_with_backoff(
        spark: SparkSession, table_path: str, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    pauses: list[float] = []
    monkeypatch.setattr(sink_module, "_sleep", pauses.append)
    seed = flow(table_path, "seed")
    seed(frame(spark, [ev(1, 1, "c", "a"), ev(2, 2, "c", "b")]), 0)
    interfere = {"left": 2}

    def hook(phase: str, _: DataFrame) -> None:
        if phase == "before_commit" and interfere["left"]:
            interfere["left"] -= 1
            deltalake.DeltaTable(table_path).update(updates={"amount": "amount + 1000"}, predicate="id = 2")

    # max_attempts bounds the reruns after lost blocks only: two conflicts still rerun twice.
    sink = MergeSink(table_path, keys=["id"], sequence_by="lsn", apply_as_deletes="op = 'd'", app_id="bounded",
                     max_attempts=1, max_conflict_retries=2, conflict_backoff=(0.2, 0.3), phase_hook=hook)
    with caplog.at_level(logging.WARNING, logger=sink_module.__name__):
        sink(frame(spark, [ev(1, 3, "u", "a2")]), 0)
    assert sink.lastProgress is not None
    assert (sink.lastProgress["attempts"], sink.lastProgress["conflictRetries"]) == (3, 2)
    assert 0.1 <= pauses[0] < 0.2 and 0.15 <= pauses[1] < 0.3  # min(cap, first * 2**(n-1)) * [0.5, 1)
    assert [r.levelno for r in caplog.records if "conflict retry" in r.getMessage()] == [logging.WARNING] * 2
    assert state(table_path)[2]["amount"] == 2002 and state(table_path)[1]["name"] == "a2"

    # A conflict on every attempt: the batch fails after the budget, nothing of it committed.
    interfere["left"] = 10
    pauses.clear()
    with pytest.raises(ConcurrentModificationError, match=r"after 2 rerun\(s\) .*max_conflict_retries=2"):
        sink(frame(spark, [ev(1, 4, "u", "never")]), 1)
    assert len(pauses) == 2 and interfere["left"] == 7
    assert deltalake.DeltaTable(table_path).transaction_version("bounded") == 0
    assert state(table_path)[1]["name"] == "a2"


def test_conflict_backoff_bounds() -> None:
    import random

    rng = random.Random(7)
    for retry in range(1, 12):
        bound = min(5.0, 0.1 * 2 ** (retry - 1))
        pause = sink_module.conflict_backoff(retry, 0.1, 5.0, rng)
        assert bound / 2 <= pause < bound
    with pytest.raises(ValueError, match="max_conflict_retries"):
        MergeSink("/tmp/x", keys="id", max_conflict_retries=-1)
    with pytest.raises(ValueError, match="conflict_backoff"):
        MergeSink("/tmp/x", keys="id", conflict_backoff=(2.0, 1.0))


def test_both_flows_creating_the_table_with_their_first_batch(spark: SparkSession, table_path: str) -> None:
    """The second flow's first batch read that there was no table; the first flow's first batch
    creates it meanwhile: the second reruns against that table (its layout, its rows)."""
    live = flow(table_path, "live", "metadata")
    fix = flow(table_path, "corrections", "metadata",
               phase_hook=lambda phase, _: live(frame(spark, [ev(1, 5, "c", "new")]), 0)
               if phase == "after_materialize" and live.lastProgress is None else None)
    fix(frame(spark, [ev(1, 2, "c", "old"), ev(2, 3, "c", "b")]), 0)
    assert fix.lastProgress is not None and fix.lastProgress["conflictRetries"] == 1
    assert {k: r["name"] for k, r in state(table_path).items()} == {1: "new", 2: "b"}


# ------------------------------------------------------------------ two streaming queries at once


def split_flows(seed: int, batches_per_flow: int) -> tuple[list[list[dict[str, Any]]], list[list[dict[str, Any]]]]:
    """One out-of-order event stream over a few keys, split by sequence parity into two flows
    (odd: live, even: corrections), each cut into ``batches_per_flow`` small batches."""
    events = [e for batch in generate(seed, batches=2 * batches_per_flow, events_per_batch=5, keys=6) for e in batch]
    flows = []
    for parity in (1, 0):
        mine = [e for e in events if e["lsn"] % 2 == parity]
        size = -(-len(mine) // batches_per_flow)
        flows.append([mine[i:i + size] for i in range(0, len(mine), size)])
    return flows[0], flows[1]


def write_batches(folder: Path, batches: list[list[dict[str, Any]]]) -> None:
    folder.mkdir(parents=True)
    for index, batch in enumerate(batches):
        (folder / f"batch-{index:04d}.json").write_text("".join(json.dumps(e) + "\n" for e in batch))


def recorded_deletes(batch: list[dict[str, Any]]) -> set[tuple[int, int]]:
    """The tombstones a batch records: its keys whose newest event (ties: the last in batch
    order) is a delete."""
    newest: dict[int, dict[str, Any]] = {}
    for event in batch:
        if event["id"] not in newest or event["lsn"] >= newest[event["id"]]["lsn"]:
            newest[event["id"]] = event
    return {(e["id"], e["lsn"]) for e in newest.values() if e["op"] == "d"}


def seed_expired_tombstones(path: str) -> None:
    """Tombstones of keys no flow touches, recorded 30 days ago: the flows' purges remove them."""
    old = dt.datetime.now(dt.UTC) - dt.timedelta(days=30)
    deltalake.write_deltalake(path, pa.table({
        "id": pa.array([100, 101, 102], pa.int32()), "lsn": pa.array([1, 2, 3], pa.int64()),
        "deleted_at": pa.array([old] * 3, pa.timestamp("us", tz="UTC"))}))


def test_two_streaming_queries_into_one_table_end_in_the_model_state(
        spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A live and a correction query (their own names and app ids) run at the same time on
    overlapping keys with interleaved sequence values, the reserved metadata column holding the
    sequence; both purge the shared tombstone table every batch and compact it at 3 small files.
    The correction flow holds each batch right before its commit until the live flow committed
    one (the live flow's first batch waits for that), so its commits conflict and rerun."""
    monkeypatch.setattr(tombstones_module, "COMPACT_SMALL_FILES", 3)
    live_batches, fix_batches = split_flows(41, batches_per_flow=4)
    write_batches(tmp_path / "live", live_batches)
    write_batches(tmp_path / "fix", fix_batches)
    target = str(tmp_path / "orders")
    seed_expired_tombstones(f"{target}_tombstones")
    fix_waiting, live_done = threading.Event(), threading.Event()
    current = {"live": -1, "fix": -1}
    held: set[int] = set()

    def live_hook(phase: str, _: DataFrame) -> None:
        if phase == "after_materialize" and current["live"] == 0:
            fix_waiting.wait(120)

    def fix_hook(phase: str, _: DataFrame) -> None:
        batch = current["fix"]
        if phase != "before_commit" or batch in held or live_done.is_set():
            return
        held.add(batch)  # the first attempt only
        before = deltalake.DeltaTable(target).version()
        fix_waiting.set()
        deadline = time.monotonic() + 120
        while deltalake.DeltaTable(target).version() == before and not live_done.is_set():
            assert time.monotonic() < deadline, "the live flow committed nothing"
            time.sleep(0.05)

    options = {"tombstone_purge_every": 1, **LAYOUTS["metadata"]}
    sinks = {"live": flow(target, "live", phase_hook=live_hook, **options),
             "fix": flow(target, "corrections", phase_hook=fix_hook, **options)}

    def each_batch(name: str) -> Any:
        def run(batch: DataFrame, batch_id: int) -> None:
            current[name] = batch_id
            sinks[name](batch, batch_id)
            if name == "live" and batch_id == len(live_batches) - 1:
                live_done.set()
        return run

    queries = [spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).json(str(tmp_path / name))
               .writeStream.foreachBatch(each_batch(name)).queryName(f"multi-flow-{name}")
               .option("checkpointLocation", str(tmp_path / f"chk-{name}")).trigger(availableNow=True).start()
               for name in ("live", "fix")]
    try:
        for query in queries:
            assert query.awaitTermination(300), "a flow did not finish"
            assert query.exception() is None, query.exception()
    finally:
        for query in queries:
            query.stop()

    assert state(target) == expected_state([*live_batches, *fix_batches])
    table = deltalake.DeltaTable(target)
    assert (table.transaction_version("live"), table.transaction_version("corrections")) == (
        len(live_batches) - 1, len(fix_batches) - 1)
    fix_progress = [p for p in sinks["fix"].recentProgress if not p["skipped"]]
    assert sum(p["conflictRetries"] for p in fix_progress) >= 1
    # No tombstone lost: every delete of both flows is there, the expired ones were purged.
    deletes = {tombstone for batch in [*live_batches, *fix_batches] for tombstone in recorded_deletes(batch)}
    recorded = deltalake.DeltaTable(f"{target}_tombstones")
    assert {(t["id"], t["lsn"]) for t in recorded.to_pyarrow_table().to_pylist()} == deletes
    assert any(h.get("operation") == "MERGE" or h.get("userOperation") == "MERGE" for h in recorded.history())
