"""Delta Lake's writer in a process of its own, beside a MergeSink in the test's process
(tests/spark/test_delta_concurrent_writers.py): its own SparkSession with Delta's jar,
extension and catalog runs the operations of ``--plan`` (tests/streaming_support/delta_writers.py)
against ``--table`` in order, each rerun after Delta's conflict errors until it commits.

Handshake: the session up, it creates ``--ready`` and waits for ``--go``, so its commands and
the sink's batches start together. At the end it writes ``--report``: the operations applied
(each once) and the conflicts Delta raised.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from streaming_merge.session import local_session
from streaming_merge.spark.packages import package_conf
from tests.streaming_support.cluster import write_json
from tests.streaming_support.delta_writers import DeltaOp, run_delta_op_retrying, wait_for_file


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--table", required=True)
    parser.add_argument("--plan", required=True, help="JSON list of DeltaOp records")
    parser.add_argument("--report", required=True)
    parser.add_argument("--ready", required=True)
    parser.add_argument("--go", required=True)
    args = parser.parse_args()
    ops = [DeltaOp.of(record) for record in json.loads(Path(args.plan).read_text())]
    spark = local_session("delta-writer", "local[2]", shuffle_partitions=2, short_run=True,
                          extra_conf={**package_conf(("delta",)), "spark.databricks.delta.snapshotPartitions": "2"})
    spark.read.format("delta").load(args.table).count()  # Delta's classes loaded before the start
    Path(args.ready).touch()
    wait_for_file(args.go, 300, "the test's go")
    applied, conflicts = [], []
    for op in ops:
        conflicts.extend(run_delta_op_retrying(spark, args.table, op))
        applied.append(op.to_json())
    write_json(args.report, {"applied": applied, "conflicts": conflicts})
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
