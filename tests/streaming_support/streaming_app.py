"""A real streaming query for the exactly-once tests: JSON files → MergeSink → Delta.

Run as a subprocess; with ``--kill-at PHASE:BATCH`` it SIGKILLs its whole process group
(Python driver and JVM) at that point of that batch, like a machine dying:
``before_merge`` (batch materialized), ``mid_merge`` (files scanned, nothing committed),
``after_commit`` (Delta commit done, Spark's offset commit not yet).
Every sink progress record is appended as one JSON line to ``--progress``.

For the cluster tests (tests/cluster/): ``--master`` (default ``local[2]``, e.g.
``local-cluster[2,1,1024]``); ``--pause-at PHASE:BATCH[,...]`` with ``--handshake DIR`` holds
the batch at a sink phase (``after_materialize``, ``after_prepare``,
``after_find_touched_files``, ``before_commit``) until the test acknowledges, reporting which
executors hold the blocks of the materialized data the phase hands over (the sink's copy of
the batch, or the MERGE's own copy of it) and of the sink's copy (see ``cluster.Handshake``);
``--report``
receives the executors the driver saw, as JSON, when the query has finished.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from pyspark.sql import DataFrame

from streaming_merge import MergeSink
from streaming_merge.session import local_session
from tests.streaming_support.cdc_events import SCHEMA
from tests.streaming_support.cluster import Handshake, block_executors, cluster_report, write_json
from tests.streaming_support.kill_switch import KillSwitch


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--source", required=True)
    parser.add_argument("--target", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--progress", required=True)
    parser.add_argument("--kill-at", default=None)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--pause-at", default=None, help="PHASE:BATCH[,PHASE:BATCH...], sink phase names")
    parser.add_argument("--handshake", default=None, help="folder for the pause markers and acks")
    parser.add_argument("--report", default=None, help="JSON file: the cluster's executors at the end")
    args = parser.parse_args()
    handshake = Handshake(args.handshake, args.pause_at)
    kill = KillSwitch(args.kill_at)
    current: dict[str, Any] = {}

    def hook(phase: str, frame: DataFrame) -> None:
        kill.at_sink_phase(phase)
        if handshake.pending and phase == "after_materialize":
            current["copy"] = frame  # the sink's materialized copy of this batch
        if (phase, kill.batch) in handshake.pending:
            handshake.reached(phase, kill.batch, {
                "appId": spark.sparkContext.applicationId, "blocks": block_executors(frame),
                "batchBlocks": block_executors(current["copy"]), "executors": cluster_report(spark)["executors"]})

    spark = local_session("exactly-once-app", args.master, shuffle_partitions=2, short_run=True)
    sink = MergeSink(args.target, keys=["id"], sequence_by="lsn", apply_as_deletes="op = 'd'", phase_hook=hook)

    def for_each_batch(batch: DataFrame, batch_id: int) -> None:
        kill.batch = batch_id
        sink(batch, batch_id)
        with open(args.progress, "a") as handle:
            handle.write(json.dumps(sink.lastProgress) + "\n")
        kill.die_if("after_commit")

    query = (spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).json(args.source)
             .writeStream.foreachBatch(for_each_batch).option("checkpointLocation", args.checkpoint)
             .trigger(availableNow=True).start())
    query.awaitTermination()
    if args.report:
        write_json(args.report, cluster_report(spark))
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
