"""The object-storage tier's worker: one SparkSession with hadoop-aws on its classpath and S3A
pointed at the moto bucket, serving the tier's scenarios (tests/s3/scenarios.py) one request
at a time, for the whole test session.

Why a process of its own: Spark's jars are fixed when the JVM starts, and the suite's shared
session would start 3-6 s slower with the AWS SDK bundle (a 686 MB jar) for every run, S3
tests or not. One worker for the tier pays that once, only when the tier runs.

Protocol: a JSON line ``{"scenario": name, "args": {...}}`` on stdin; the answer is one line
on stdout, ``RESULT_MARK`` then ``{"ok": ...}`` or ``{"error": traceback}`` (Spark's Ivy
prints to stdout too). End of stdin ends the worker."""

from __future__ import annotations

import argparse
import json
import sys
import traceback

from devtools.s3_server import s3a_conf
from streaming_merge.session import local_session
from streaming_merge.spark.packages import package_conf
from tests.s3.scenarios import SCENARIOS

RESULT_MARK = "S3-TIER-RESULT "
READY = {"ok": "ready"}


def main() -> None:
    parser = argparse.ArgumentParser(description="the object-storage tier's worker")
    parser.add_argument("--bucket", action="append", required=True, metavar="NAME=ENDPOINT",
                        help="a bucket and the endpoint S3A reaches it at (repeatable: one per bucket)")
    args = parser.parse_args()
    buckets = {}
    for name, endpoint in (given.split("=", 1) for given in args.bucket):
        buckets.update(s3a_conf(name, endpoint))
    spark = local_session("streaming_merge-s3-tier", "local[2]", shuffle_partitions=2,
                          extra_conf={**package_conf(("delta", "s3a")), **buckets,
                                      "spark.databricks.delta.snapshotPartitions": "2"})
    answer(READY)
    for line in sys.stdin:
        request = json.loads(line)
        try:
            answer({"ok": SCENARIOS[request["scenario"]](spark, **request["args"])})
        except Exception:
            answer({"error": traceback.format_exc()})
    spark.stop()


def answer(result: dict[str, object]) -> None:
    print(RESULT_MARK + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
