"""One flow of several into one table, as a subprocess the multi-flow SIGKILL test kills and
restarts while another flow (in the test's process) writes the same table.

JSON files → MergeSink(app_id=--name) → Delta, sequence in ``__spark_autocdc_metadata``
(``except_column_list=["lsn"]``). ``--kill-at PHASE:BATCH`` SIGKILLs the whole process group
(driver and JVM) at ``before_merge`` / ``mid_merge`` / ``after_commit`` of that batch, as
tests/streaming_support/streaming_app.py does; ``--pause-at before_commit:BATCH[,...]`` with
``--handshake DIR`` holds that batch's first attempt right before its MERGE commits until the
test acknowledges (the test has the other flow commit meanwhile, so this commit conflicts).
Every sink progress record is appended as one JSON line to ``--progress``.
"""

from __future__ import annotations

import argparse
import json
import sys

from pyspark.sql import DataFrame

from streaming_merge import MergeSink
from streaming_merge.session import local_session
from tests.streaming_support.cdc_events import SCHEMA
from tests.streaming_support.cluster import Handshake
from tests.streaming_support.kill_switch import KillSwitch


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--source", required=True)
    parser.add_argument("--target", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--progress", required=True)
    parser.add_argument("--name", required=True, help="the flow's name: query name and app id")
    parser.add_argument("--kill-at", default=None)
    parser.add_argument("--pause-at", default=None)
    parser.add_argument("--handshake", default=None)
    args = parser.parse_args()
    handshake = Handshake(args.handshake, args.pause_at)
    kill = KillSwitch(args.kill_at)

    def hook(phase: str, _: DataFrame) -> None:
        kill.at_sink_phase(phase)
        handshake.reached(phase, kill.batch, {})

    spark = local_session(f"multi-flow-{args.name}", "local[2]", shuffle_partitions=2, short_run=True)
    sink = MergeSink(args.target, keys=["id"], sequence_by="lsn", apply_as_deletes="op = 'd'",
                     except_column_list=["lsn"], app_id=args.name, conflict_backoff=(0.05, 0.5), phase_hook=hook)

    def for_each_batch(batch: DataFrame, batch_id: int) -> None:
        kill.batch = batch_id
        sink(batch, batch_id)
        with open(args.progress, "a") as handle:
            handle.write(json.dumps(sink.lastProgress) + "\n")
        kill.die_if("after_commit")

    query = (spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).json(args.source)
             .writeStream.foreachBatch(for_each_batch).queryName(args.name)
             .option("checkpointLocation", args.checkpoint).trigger(availableNow=True).start())
    query.awaitTermination()
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
