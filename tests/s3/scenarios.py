"""The object-storage tier's workloads, run inside the tier's worker (tests/s3/s3_app.py) on
its SparkSession, which has hadoop-aws and S3A settings for the moto bucket. Each returns plain
JSON values: what our reader and Delta Lake's reader see, the sinks' progress, the vacuum's
list; the tests check those and read the table once more without Spark (delta-rs, obstore).

Kept small (tens of rows): every S3 request goes to moto through Python."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from streaming_merge import DeltaTable, MergeSink

Rows = list[list[Any]]
CDC_SCHEMA = "id long, seq long, op string, v string"
ROW_SCHEMA = "id long, v string"
# A guard against a writer that died before the barrier, not a synchronisation delay.
BARRIER_TIMEOUT_S = 300.0


def _rows(df: DataFrame) -> Rows:
    return sorted([row["id"], row["v"]] for row in df.select("id", "v").collect())


def read_both(spark: SparkSession, uri: str) -> dict[str, Any]:
    """The table's (id, v) rows through our reader and through Delta Lake's, its version and
    its commits' operations, oldest first."""
    table = DeltaTable.forPath(spark, uri)
    return {"ours": _rows(table.toDF()), "delta": _rows(spark.read.format("delta").load(uri)),
            "version": table.version(), "operations": [c["operation"] for c in reversed(table.history())]}


def _progress(sink: MergeSink) -> list[dict[str, Any]]:
    keep = ("batchId", "appId", "tableVersion", "skipped", "attempts", "conflictRetries")
    return [{key: entry[key] for key in keep} for entry in sink.recentProgress]


def sink_batches(spark: SparkSession, uri: str) -> dict[str, Any]:
    """CDC batches through one MergeSink: upserts, a delete, batch 1 replayed with other rows
    (the txn must skip it), then a late event of the deleted key (its tombstone drops it)."""
    batches = [
        (0, [(1, 1, "u", "a"), (2, 1, "u", "b"), (3, 1, "u", "c")]),
        (1, [(2, 2, "u", "b2"), (3, 2, "d", None), (4, 2, "u", "d")]),
        (2, [(1, 3, "u", "a3"), (5, 3, "u", "e")]),
        (1, [(6, 9, "u", "replayed batch: must not land")]),
        (3, [(3, 1, "u", "late event of a deleted key")]),
    ]
    sink = MergeSink(uri, keys=["id"], sequence_by="seq", apply_as_deletes="op = 'd'", app_id="tier-sink")
    for batch_id, rows in batches:
        sink(spark.createDataFrame(rows, CDC_SCHEMA), batch_id)
    return {**read_both(spark, uri), "progress": _progress(sink)}


def _first_attempt_barrier(barrier: threading.Barrier) -> Callable[[str, DataFrame], None]:
    """A phase hook that holds the writer's first batch, once it has read its snapshot, until
    the other writer has read the same snapshot: the two commits then race for one version."""
    held = threading.Event()

    def hook(phase: str, _: DataFrame) -> None:
        if phase == "after_materialize" and not held.is_set():
            held.set()
            barrier.wait(BARRIER_TIMEOUT_S)

    return hook


def concurrent_writers(spark: SparkSession, uri: str) -> dict[str, Any]:
    """Two MergeSinks (own app ids, own threads) on one table, three batches each. Their first
    batches update interleaved keys of the one seed file after reading the same snapshot, so
    one of them must lose to the other's commit and rerun; the later batches insert and update
    disjoint keys."""
    seed = spark.createDataFrame([(i, "seed") for i in range(20)], ROW_SCHEMA).coalesce(1)
    DeltaTable.createFromDataFrame(seed, uri)
    barrier = threading.Barrier(2)
    plans = {
        "even": [[(i, "even-0") for i in range(0, 20, 2)], [(100 + i, "even-1") for i in range(5)],
                 [(100, "even-2"), (0, "even-2")]],
        "odd": [[(i, "odd-0") for i in range(1, 20, 2)], [(200 + i, "odd-1") for i in range(5)],
                [(200, "odd-2"), (1, "odd-2")]],
    }
    sinks = {name: MergeSink(uri, keys=["id"], app_id=f"writer-{name}", conflict_backoff=(0.05, 0.5),
                             phase_hook=_first_attempt_barrier(barrier)) for name in plans}
    failures: dict[str, BaseException] = {}

    def write(name: str) -> None:
        try:
            for batch_id, rows in enumerate(plans[name]):
                sinks[name](spark.createDataFrame(rows, ROW_SCHEMA), batch_id)
        except BaseException as exc:
            failures[name] = exc
            barrier.abort()  # the other writer must not wait for this one

    threads = [threading.Thread(target=write, args=(name,), name=f"writer-{name}") for name in plans]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        name, exc = next(iter(failures.items()))
        raise RuntimeError(f"writer {name} failed: {exc!r}") from exc
    return {**read_both(spark, uri), "progress": {name: _progress(sink) for name, sink in sinks.items()}}


def vacuum_and_checkpoint(spark: SparkSession, uri: str) -> dict[str, Any]:
    """Four upsert batches (each rewrites the table's file) with a checkpoint every two
    commits, then a vacuum at zero retention: the rewritten files go, the table reads on."""
    sink = MergeSink(uri, keys=["id"], app_id="tier-vacuum", table_properties={"delta.checkpointInterval": "2"})
    for batch_id in range(4):
        rows = [(i, f"v{batch_id}") for i in range(1, 11)]
        sink(spark.createDataFrame(rows, ROW_SCHEMA).coalesce(1), batch_id)
    table = DeltaTable.forPath(spark, uri)
    deleted = table.vacuum(0, enforce_retention_duration=False)
    return {**read_both(spark, uri), "deleted": deleted, "progress": _progress(sink)}


def upserts(spark: SparkSession, uri: str, batches: int = 2) -> dict[str, Any]:
    """``batches`` upsert batches through one MergeSink (keys 1-5, then 3-7, ...)."""
    sink = MergeSink(uri, keys=["id"], app_id="tier-upserts")
    for batch_id in range(batches):
        rows = [(i, f"b{batch_id}") for i in range(1 + 2 * batch_id, 6 + 2 * batch_id)]
        sink(spark.createDataFrame(rows, ROW_SCHEMA).coalesce(1), batch_id)
    return {**read_both(spark, uri), "progress": _progress(sink)}


SCENARIOS: dict[str, Callable[..., dict[str, Any]]] = {
    "sink_batches": sink_batches,
    "concurrent_writers": concurrent_writers,
    "vacuum_and_checkpoint": vacuum_and_checkpoint,
    "upserts": upserts,
}
