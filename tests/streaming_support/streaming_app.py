"""A real streaming query for the exactly-once tests: JSON files → MergeSink → Delta.

Run as a subprocess; with ``--kill-at PHASE:BATCH`` it SIGKILLs its whole process group
(Python driver and JVM) at that point of that batch, like a machine dying:
``before_merge`` (batch materialized), ``mid_merge`` (files scanned, nothing committed),
``after_commit`` (Delta commit done, Spark's offset commit not yet).
Every sink progress record is appended as one JSON line to ``--progress``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys

from pyspark.sql import DataFrame

from streaming_merge import MergeSink
from streaming_merge.session import local_session
from tests.streaming_support.cdc_events import SCHEMA


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--source", required=True)
    parser.add_argument("--target", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--progress", required=True)
    parser.add_argument("--kill-at", default=None)
    args = parser.parse_args()
    kill_phase, kill_batch = (args.kill_at.split(":") if args.kill_at else (None, "-1"))
    current = {"batch": -1}

    def die_if(phase: str) -> None:
        if phase == kill_phase and current["batch"] == int(kill_batch):
            sys.stdout.flush()
            os.killpg(os.getpgid(0), signal.SIGKILL)

    def hook(phase: str, _: DataFrame) -> None:
        die_if({"after_materialize": "before_merge", "after_find_touched_files": "mid_merge"}.get(phase, phase))

    spark = local_session("exactly-once-app", "local[2]", shuffle_partitions=2)
    sink = MergeSink(args.target, keys=["id"], sequence_by="lsn", delete_when="op = 'd'", phase_hook=hook)

    def for_each_batch(batch: DataFrame, batch_id: int) -> None:
        current["batch"] = batch_id
        sink(batch, batch_id)
        with open(args.progress, "a") as handle:
            handle.write(json.dumps(sink.lastProgress) + "\n")
        die_if("after_commit")

    query = (spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).json(args.source)
             .writeStream.foreachBatch(for_each_batch).option("checkpointLocation", args.checkpoint)
             .trigger(availableNow=True).start())
    query.awaitTermination()
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
