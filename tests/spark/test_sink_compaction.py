"""MergeSink's opt-in auto compaction (``auto_compact=AutoCompact(...)``).

Why: a streaming upsert adds files every batch; compaction after a batch must fire exactly at
the configured trigger, compact only what the trigger names, leave the table's rows exactly as
the batches made them, be reported in that batch's progress, and, when it loses a conflict,
neither fail nor rerun the batch whose MERGE is already committed.
"""

from __future__ import annotations

import json
import os
from typing import Any

import deltalake
import pytest
from pyspark.sql import SparkSession

import streaming_merge.optimize.compact as compact_module
from streaming_merge import AutoCompact, MergeSink

SCHEMA = "id long, day string, v string"

# These tables are tiny; the sink would rewrite their small files whole with every update
# (sink.SMALL_CANDIDATES_BYTES), merging them before compaction sees them.
pytestmark = pytest.mark.usefixtures("without_small_table_rules")


def table_rows(path: str) -> dict[int, dict[str, Any]]:
    return {r["id"]: r for r in deltalake.DeltaTable(path).to_pyarrow_table().to_pylist()}


def file_count(path: str) -> int:
    return len(deltalake.DeltaTable(path).file_uris())


def run_batches(spark: SparkSession, sink: MergeSink, batches: list[list[tuple[int, str, str]]],
                expected: dict[int, dict[str, Any]], first: int = 0) -> None:
    for offset, batch in enumerate(batches):
        sink(spark.createDataFrame(batch, SCHEMA), first + offset)
        expected.update({i: {"id": i, "day": d, "v": v} for i, d, v in batch})


def test_every_n_batches_compacts_the_table_and_reports_it(spark: SparkSession, table_path: str) -> None:
    sink = MergeSink(table_path, keys=["id"], app_id="auto-every",
                     auto_compact=AutoCompact(every_batches=3, min_small_files=None))
    expected: dict[int, dict[str, Any]] = {}
    batches = [[(b * 10 + i, "a", f"b{b}") for i in range(10)] for b in range(6)]
    batches[4].append((3, "a", "updated in batch 4"))  # an update of a row compacted after batch 2
    files_after_batch = []
    for batch_id, batch in enumerate(batches):
        run_batches(spark, sink, [batch], expected, first=batch_id)
        files_after_batch.append(file_count(table_path))

    compactions = [p["compaction"] for p in sink.recentProgress]
    assert [c is not None for c in compactions] == [False, False, True, False, False, True]
    after_2, after_5 = compactions[2], compactions[5]
    assert after_2["trigger"] == "every_batches" and after_2["error"] is None
    assert (after_2["numFilesRemoved"], after_2["numFilesAdded"]) == (3, 1)
    assert after_2["tableVersion"] == sink.recentProgress[2]["tableVersion"] + 1
    assert after_2["durationMs"] >= 0 and after_2["numBytesRemoved"] > after_2["numBytesAdded"] > 0
    # batch 4's update rewrote the compacted file together with its inserts: 2 files, then 3
    assert (after_5["numFilesRemoved"], after_5["numFilesAdded"]) == (3, 1)
    assert files_after_batch == [1, 2, 1, 2, 2, 1]
    assert table_rows(table_path) == expected
    assert all(p["attempts"] == 1 for p in sink.recentProgress)
    assert deltalake.DeltaTable(table_path).transaction_version("auto-every") == 5

    version = after_5["tableVersion"]
    with open(os.path.join(table_path, "_delta_log", f"{version:020d}.json")) as handle:
        actions = [json.loads(line) for line in handle if line.strip()]
    changes = [a.get("add") or a.get("remove") for a in actions if "add" in a or "remove" in a]
    assert len(changes) == 4 and all(c["dataChange"] is False for c in changes)
    assert not any("txn" in a for a in actions)  # the batch's txn belongs to its MERGE commit
    info = next(a["commitInfo"] for a in actions if "commitInfo" in a)
    assert info["operationParameters"]["auto"] == "true"
    assert "compacted -3/+1 files" in sink.progress_for(5).summary()


def test_min_small_files_compacts_only_the_touched_partitions_that_reach_it(spark: SparkSession,
                                                                             table_path: str) -> None:
    sink = MergeSink(table_path, keys=["id"], app_id="auto-small", partition_by=["day"],
                     auto_compact=AutoCompact(min_small_files=3))
    expected: dict[int, dict[str, Any]] = {}
    run_batches(spark, sink, [
        [(1, "a", "x"), (100, "b", "x"), (200, "c", "x")],
        [(2, "a", "x"), (101, "b", "x")],
        [(3, "a", "x"), (201, "c", "x")],   # a: 3 files, b: 2, c: 2 -> compact a only
        [(102, "b", "x")],                   # b: 3 files -> compact b (c has 2, untouched anyway)
    ], expected)

    compactions = [p["compaction"] for p in sink.recentProgress]
    assert compactions[:2] == [None, None]
    assert compactions[2]["trigger"] == "min_small_files"
    assert (compactions[2]["numFilesRemoved"], compactions[2]["numFilesAdded"],
            compactions[2]["partitionsOptimized"]) == (3, 1, 1)
    assert (compactions[3]["numFilesRemoved"], compactions[3]["numFilesAdded"]) == (3, 1)
    by_day: dict[str, int] = {}
    for uri in deltalake.DeltaTable(table_path).file_uris():
        day = uri.split("day=")[1].split("/")[0]
        by_day[day] = by_day.get(day, 0) + 1
    assert by_day == {"a": 1, "b": 1, "c": 2}
    assert table_rows(table_path) == expected
    history = deltalake.DeltaTable(table_path).history()
    optimize_predicates = [json.loads(h["operationParameters"]["predicate"]) for h in history
                           if h.get("userOperation") == "OPTIMIZE"]
    assert optimize_predicates == [["`day` = 'b'"], ["`day` = 'a'"]]


def test_a_compaction_that_loses_a_conflict_does_not_fail_or_rerun_the_batch(
        spark: SparkSession, table_path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    sink = MergeSink(table_path, keys=["id"], app_id="auto-conflict",
                     auto_compact=AutoCompact(every_batches=2, min_small_files=None))
    expected: dict[int, dict[str, Any]] = {}
    run_batches(spark, sink, [[(1, "a", "x"), (2, "a", "x")]], expected)

    compacted: list[str] = []
    real = compact_module.write_files

    def write_then_delete_concurrently(*args: Any, **kwargs: Any) -> Any:
        files = real(*args, **kwargs)
        compacted.extend(w.path for w in files)
        deltalake.DeltaTable(table_path).delete("id = 1")  # another writer removes a compacted file
        return files

    monkeypatch.setattr(compact_module, "write_files", write_then_delete_concurrently)
    run_batches(spark, sink, [[(3, "a", "x")]], expected, first=1)  # batch 1 triggers the compaction
    monkeypatch.undo()
    del expected[1]

    progress = sink.recentProgress[-1]
    assert progress["batchId"] == 1 and progress["attempts"] == 1 and not progress["skipped"]
    assert progress["compaction"]["error"].startswith("ConcurrentModificationError")
    assert progress["compaction"]["tableVersion"] is None
    assert compacted and not any(os.path.exists(os.path.join(table_path, p)) for p in compacted)
    assert table_rows(table_path) == expected
    assert deltalake.DeltaTable(table_path).transaction_version("auto-conflict") == 1

    # the next trigger compacts normally
    run_batches(spark, sink, [[(4, "a", "x")], [(5, "a", "x")]], expected, first=2)
    assert sink.recentProgress[-1]["compaction"]["error"] is None
    assert sink.recentProgress[-1]["compaction"]["numFilesAdded"] == 1
    assert file_count(table_path) == 1
    assert table_rows(table_path) == expected
