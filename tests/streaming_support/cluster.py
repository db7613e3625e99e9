"""What a support app (run as a subprocess by the cluster tests) reports about the cluster it
ran on, and the pause handshake that lets a test kill an executor at a precise point of a batch.

Both exist for tests/cluster/: a ``local-cluster[N,C,M]`` master starts real executor JVMs
beside the driver, and a test that claims "this ran on executors" or "this survived an
executor's death" must be able to prove it from outside the app. The driver's own status store
(the data behind Spark's UI, kept even with the UI off) knows every executor that ever
registered, whether it is still alive and how many tasks it ran, and where each block of a
cached or checkpointed RDD lives; the apps write that out as JSON.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from streaming_merge.merge.materialize import checkpoint_rdd_id

HANDSHAKE_TIMEOUT_S = 300.0  # a guard against a test that never answers, not a synchronisation


def write_json(path: str, record: dict[str, Any]) -> None:
    """Write atomically (temp file + rename): the test polls for the file and must never read
    half of it."""
    with open(path + ".tmp", "w", encoding="utf-8") as handle:
        json.dump(record, handle, default=str)
    os.replace(path + ".tmp", path)


def executors(spark: SparkSession) -> list[dict[str, Any]]:
    """Every executor the driver has seen (``driver`` included), alive or dead, with the
    number of tasks it ran. Waits for the listener bus first: the status store is fed by
    listener events, which trail the jobs that caused them."""
    context = spark.sparkContext._jsc.sc()
    context.listenerBus().waitUntilEmpty()
    summaries = context.statusStore().executorList(False)
    result = []
    for i in range(summaries.size()):
        summary = summaries.apply(i)
        result.append({"id": str(summary.id()), "active": bool(summary.isActive()),
                       "totalTasks": int(summary.totalTasks())})
    return result


def cluster_report(spark: SparkSession, **extra: Any) -> dict[str, Any]:
    """The master, application id, the size of the driver's executor table (driver + live
    executors) and every executor seen, plus ``extra``."""
    context = spark.sparkContext
    return {"master": context.master, "appId": context.applicationId,
            "memoryStatusSize": int(context._jsc.sc().getExecutorMemoryStatus().size()),
            "executors": executors(spark), **extra}


def block_executors(frame: DataFrame, timeout_s: float = 60.0) -> dict[str, list[str]]:
    """Block name → executor ids holding it, for the materialized (locally checkpointed) data
    under ``frame``. Polls until every partition's block is known to the status store, which
    learns of blocks through listener events, after the job that wrote them."""
    context = frame.sparkSession.sparkContext._jsc.sc()
    rdd_id = checkpoint_rdd_id(frame)
    deadline = time.monotonic() + timeout_s
    blocks: dict[str, list[str]] = {}
    while True:
        context.listenerBus().waitUntilEmpty()
        try:
            info = context.statusStore().rdd(rdd_id)
        except Exception:  # NoSuchElementException: the store has not heard of the RDD yet
            info = None
        if info is not None and info.partitions().isDefined():
            described = info.partitions().get()
            blocks = {}
            for i in range(described.size()):
                holders = described.apply(i).executors()
                blocks[str(described.apply(i).blockName())] = [str(holders.apply(j)) for j in range(holders.size())]
            if len(blocks) == info.numPartitions() and all(blocks.values()):
                return blocks
        if time.monotonic() > deadline:
            raise TimeoutError(f"blocks of RDD {rdd_id}: only {blocks} known after {timeout_s:.0f}s")
        time.sleep(0.1)


class Handshake:
    """Pause points ``PHASE:BATCH`` (comma-separated) in a folder shared with the test.

    At each point, the first time it is reached, the app writes ``pause-<batch>-<phase>.json``
    (the application id and the details given, e.g. which executors hold the batch's blocks)
    and waits for the test to create ``ack-<batch>-<phase>``: the test does its damage (kills
    an executor) while the batch is held at exactly that point, and the app resumes only once
    the damage is done. A point is paused once: the batch's rerun passes through it again.
    """

    def __init__(self, folder: str | None, points: str | None) -> None:
        self.folder = folder
        self.pending: set[tuple[str, int]] = set()
        for point in (points or "").split(","):
            if point:
                phase, batch = point.rsplit(":", 1)
                self.pending.add((phase, int(batch)))
        if self.pending and not folder:
            raise ValueError("pause points need a handshake folder")

    def reached(self, phase: str, batch_id: int, details: dict[str, Any]) -> None:
        if (phase, batch_id) not in self.pending:
            return
        self.pending.discard((phase, batch_id))
        assert self.folder is not None
        write_json(os.path.join(self.folder, f"pause-{batch_id}-{phase}.json"),
                   {"phase": phase, "batchId": batch_id, **details})
        ack = os.path.join(self.folder, f"ack-{batch_id}-{phase}")
        deadline = time.monotonic() + HANDSHAKE_TIMEOUT_S
        while not os.path.exists(ack):
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {ack} within {HANDSHAKE_TIMEOUT_S:.0f}s")
            time.sleep(0.05)
