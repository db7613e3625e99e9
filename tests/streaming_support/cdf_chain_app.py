"""The chained job (jobs/cdf_chain.py) as a subprocess for the SIGKILL test: a silver table's
change data feed → MergeSink → gold, ``trigger(availableNow)``, one change file a batch.

``--kill-at PHASE:BATCH`` SIGKILLs the whole process group (Python driver and JVM) at that
point of that batch: ``before_merge`` (batch materialized), ``mid_merge`` (files scanned, nothing
committed), ``after_commit`` (the gold commit landed, Spark's offset commit not yet). Every
batch's sink progress is appended as a JSON line to ``--progress``.
"""

from __future__ import annotations

import argparse
import json
import sys

from pyspark.sql import DataFrame

from jobs.cdf_chain import ChainConfig, start
from streaming_merge import MergeSink
from streaming_merge.session import local_session
from tests.streaming_support.kill_switch import KillSwitch


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--source", required=True)
    parser.add_argument("--target", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--progress", required=True)
    parser.add_argument("--kill-at", default=None)
    args = parser.parse_args()
    kill = KillSwitch(args.kill_at)

    def hook(phase: str, _frame: DataFrame) -> None:
        kill.at_sink_phase(phase)

    def on_batch(sink: MergeSink, batch_id: int) -> None:
        with open(args.progress, "a") as handle:
            handle.write(json.dumps(sink.lastProgress) + "\n")
        kill.die_if("after_commit")

    spark = local_session("cdf-chain-app", "local[2]", shuffle_partitions=2, short_run=True)
    config = ChainConfig(source=args.source, target=args.target, keys=["id"], checkpoint=args.checkpoint,
                         available_now=True, max_files_per_trigger=1, starting_version="0")
    query = start(spark, config, on_batch=on_batch, phase_hook=hook, on_start=lambda b: setattr(kill, "batch", b))
    query.awaitTermination()
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
