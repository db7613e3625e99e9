"""A checkable workload for MergeSink and Delta Lake's own commands writing one table at once.

Every row is ``(id, by_sink, by_delta)``. The writers own disjoint key ranges, but every data
file holds keys of all of them, so their commits do touch the same files:

- the sink increments ``by_sink`` of the keys of :data:`SINK_KEYS` it is given, and inserts a
  new key of its own per batch (1000 + batch id);
- Delta's MERGE increments ``by_delta`` of keys of :data:`MERGE_KEYS` and inserts a new key of
  its own (2000 + op index); Delta's DELETE deletes keys of :data:`DELETE_KEYS`; OPTIMIZE
  compacts the files everyone rewrites.

The increments are read-modify-writes of rows that share files, so a commit that missed a
concurrent one shows as a counter one short (a lost update), a deleted key back, or a key
twice (a compacted file and our rewrite of it both live). The counters commute, so the final
table follows from which batches and operations were applied, in any order
(:func:`expected_rows`), and each is applied exactly once or a counter is off.

Used by tests/spark/test_delta_concurrent_writers.py in its own process and by
tests/streaming_support/delta_writer_app.py, the Delta writer of another process.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from delta.exceptions import (
    ConcurrentAppendException,
    ConcurrentDeleteDeleteException,
    ConcurrentDeleteReadException,
    ConcurrentTransactionException,
    ConcurrentWriteException,
    DeltaConcurrentModificationException,
    MetadataChangedException,
    ProtocolChangedException,
)
from delta.tables import DeltaTable as DeltaLakeTable
from pyspark.sql import Column, SparkSession
from pyspark.sql import functions as F

from streaming_merge import MergeSink

log = logging.getLogger(__name__)

TABLE_ROWS = 400
FILES = 4
SINK_KEYS = range(0, 100)
MERGE_KEYS = range(100, 200)
DELETE_KEYS = range(200, 300)
SINK_NEW_KEY = 1000
DELTA_NEW_KEY = 2000
# Delta's concurrent-modification errors as PySpark raises them (delta.exceptions converts the
# JVM's io.delta.exceptions.*; the Python classes do not share a base).
DELTA_CONFLICTS: tuple[type[Exception], ...] = (
    ConcurrentAppendException, ConcurrentDeleteReadException, ConcurrentDeleteDeleteException,
    ConcurrentTransactionException, ConcurrentWriteException, MetadataChangedException,
    ProtocolChangedException, DeltaConcurrentModificationException)
CONFLICT_RETRIES = 30


@dataclass(frozen=True)
class DeltaOp:
    """One command of Delta's: ``kind`` merge (``keys`` of MERGE_KEYS incremented, key
    DELTA_NEW_KEY + ``index`` inserted), delete (``keys`` of DELETE_KEYS) or optimize."""

    kind: str
    index: int
    keys: tuple[int, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "index": self.index, "keys": list(self.keys)}

    @staticmethod
    def of(record: dict[str, Any]) -> DeltaOp:
        return DeltaOp(record["kind"], int(record["index"]), tuple(record["keys"]))


def sink_batch_keys(batch_id: int) -> list[int]:
    """The sink keys batch ``batch_id`` increments (a different stride of SINK_KEYS each time,
    always in every file), and its own new key."""
    start = (batch_id * 7) % 10
    return [*range(SINK_KEYS.start + start, SINK_KEYS.stop, 10), SINK_NEW_KEY + batch_id]


def delta_plan(kinds: Sequence[str]) -> list[DeltaOp]:
    """Delta's operations in order, each with keys of its own: MERGEs increment a stride of
    MERGE_KEYS, DELETEs delete ten keys of DELETE_KEYS no other DELETE deletes."""
    ops = []
    for index, kind in enumerate(kinds):
        if kind == "merge":
            keys = tuple(range(MERGE_KEYS.start + index % 10, MERGE_KEYS.stop, 10))
        elif kind == "delete":
            keys = tuple(range(DELETE_KEYS.start + 10 * index, DELETE_KEYS.start + 10 * index + 10))
        elif kind == "optimize":
            keys = ()
        else:
            raise ValueError(f"unknown Delta operation {kind!r}")
        ops.append(DeltaOp(kind, index, keys))
    return ops


def create_table(spark: SparkSession, path: str, *, deletion_vectors: bool, checkpoint_interval: int = 100) -> None:
    """The table, created and filled by Delta Lake: TABLE_ROWS keys in FILES files, each file
    holding keys of every writer's range."""
    spark.sql(f"CREATE TABLE delta.`{path}` (id BIGINT, by_sink BIGINT, by_delta BIGINT) USING delta "
              f"TBLPROPERTIES ('delta.enableDeletionVectors' = '{str(deletion_vectors).lower()}', "
              f"'delta.checkpointInterval' = '{checkpoint_interval}')")
    (spark.range(TABLE_ROWS).selectExpr("id", "0L AS by_sink", "0L AS by_delta")
     .repartition(FILES, F.col("id") % FILES).write.format("delta").mode("append").save(path))


def counting_sink(path: str, **options: Any) -> MergeSink:
    """The sink: +1 on ``by_sink`` of each batch key the table holds, a new row otherwise."""
    return MergeSink(path, keys=["id"], app_id="sink", conflict_backoff=(0.01, 0.05),
                     clauses=lambda merge: merge.whenMatchedUpdate(set={"by_sink": "t.by_sink + 1"})
                     .whenNotMatchedInsert(values={"id": "s.id", "by_sink": "1", "by_delta": "0"}), **options)


def run_sink_batch(spark: SparkSession, sink: MergeSink, batch_id: int) -> None:
    sink(spark.createDataFrame([(k,) for k in sink_batch_keys(batch_id)], "id BIGINT"), batch_id)


def run_delta_op(spark: SparkSession, path: str, op: DeltaOp, gate: Column | None = None) -> None:
    """Run ``op`` with Delta Lake's DeltaTable API. ``gate``: a boolean column (a UDF that waits
    for the test) evaluated in the command's own jobs, i.e. after it read the table and before
    it commits."""
    table = DeltaLakeTable.forPath(spark, path)
    if op.kind == "merge":
        source = spark.createDataFrame([(k,) for k in (*op.keys, DELTA_NEW_KEY + op.index)], "id BIGINT")
        if gate is not None:
            source = source.filter(gate)
        (table.alias("t").merge(source.alias("s"), "t.id = s.id")
         .whenMatchedUpdate(set={"by_delta": "t.by_delta + 1"})
         .whenNotMatchedInsert(values={"id": "s.id", "by_sink": "0", "by_delta": "1"}).execute())
    elif op.kind == "delete":
        condition = F.col("id").isin(list(op.keys))
        table.delete(condition & gate if gate is not None else condition)
    else:
        table.optimize().executeCompaction()


def run_delta_op_retrying(spark: SparkSession, path: str, op: DeltaOp) -> list[str]:
    """Run ``op`` until it commits, rerunning it after each of Delta's conflict errors, as a
    user's job does; returns the conflicts' class names. A conflict commits nothing, so a
    rerun applies the operation once."""
    conflicts: list[str] = []
    while True:
        try:
            run_delta_op(spark, path, op)
            return conflicts
        except DELTA_CONFLICTS as exc:
            conflicts.append(type(exc).__name__)
            log.info("Delta %s %d conflicted (%s); rerunning", op.kind, op.index, type(exc).__name__)
            if len(conflicts) > CONFLICT_RETRIES:
                raise


def expected_rows(sink_batches: Iterable[int], delta_ops: Iterable[DeltaOp]) -> dict[int, tuple[int, int]]:
    """id → (by_sink, by_delta) once each sink batch and Delta operation was applied once."""
    rows = {k: [0, 0] for k in range(TABLE_ROWS)}
    for batch_id in sink_batches:
        for k in sink_batch_keys(batch_id):
            rows.setdefault(k, [0, 0])[0] += 1
    for op in delta_ops:
        if op.kind == "merge":
            for k in (*op.keys, DELTA_NEW_KEY + op.index):
                rows.setdefault(k, [0, 0])[1] += 1
        elif op.kind == "delete":
            for k in op.keys:
                rows.pop(k, None)
    return {k: (v[0], v[1]) for k, v in rows.items()}


def table_rows(rows: Iterable[Any]) -> dict[int, tuple[int, int]]:
    """id → (by_sink, by_delta) of rows read back; a key twice is a failure of its own."""
    result: dict[int, tuple[int, int]] = {}
    for row in rows:
        key = int(row["id"])
        assert key not in result, f"key {key} is in the table twice"
        result[key] = (int(row["by_sink"]), int(row["by_delta"]))
    return result


def wait_for_file(path: str, timeout_s: float, what: str) -> None:
    """Poll for ``path`` with a deadline: the cross-process handshake of the gates."""
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: {path} did not appear within {timeout_s:.0f} s")
        time.sleep(0.02)
