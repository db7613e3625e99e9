"""The Kafka CDC ingestion job in a subprocess, for the exactly-once kill tests.

Runs ``jobs.kafka_cdc_ingest.start(...)`` with ``availableNow`` exactly as the job's CLI
does, and appends one JSON line per event to ``--progress``:

- ``{"event": "merge", ...}``: the job's ``on_progress`` record of a batch (called after
  the MergeSink committed, before Spark commits the batch's offsets);
- ``{"event": "dead_letter", "batchId": N, "version": V}``: the job's dead-letter append
  for batch N returned; ``version`` is None when it was skipped as already applied.

With ``--kill-at PHASE:BATCH`` the process SIGKILLs its whole process group (the Python
driver and the JVM, like a machine dying) at that point of that batch:

- ``after_dead_letter``: the malformed records of the batch are committed to the
  dead-letter table, the MERGE has not started;
- ``after_commit``: the MERGE is committed (``on_progress``), Spark's offset commit is
  not done yet, so the restart replays the batch.

``--master`` (default ``local[2]``) runs it on another master, e.g. ``local-cluster[2,1,1024]``
for tests/cluster/, and ``--report`` receives the executors the driver saw, as JSON, at the end.

The dead-letter hook wraps the job module's ``append_rows`` name, which the batch
function looks up at call time; nothing in ``jobs/`` is changed.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
from typing import Any

import jobs.kafka_cdc_ingest as job
from streaming_merge.session import local_session
from streaming_merge.spark.packages import KAFKA_CONNECTOR, package_conf
from tests.streaming_support.cluster import cluster_report, write_json


def _append_line(path: str, record: dict[str, Any]) -> None:
    """One line per event, flushed and closed at once: the process may die right after."""
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(record, default=str) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap-servers", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--target", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--dead-letter", required=True)
    parser.add_argument("--keys", required=True)
    parser.add_argument("--row-schema", required=True)
    parser.add_argument("--max-offsets-per-trigger", type=int, required=True)
    parser.add_argument("--progress", required=True)
    parser.add_argument("--source-format", default="kafka_py", help="kafka_py, or kafka: Spark's connector")
    parser.add_argument("--kill-at", default=None, help="PHASE:BATCH, PHASE in after_dead_letter, after_commit")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--report", default=None, help="JSON file: the cluster's executors at the end")
    args = parser.parse_args(argv)
    kill_phase, kill_batch = args.kill_at.split(":") if args.kill_at else (None, "-1")
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("kafka").setLevel(logging.ERROR)

    def die_if(phase: str, batch_id: int) -> None:
        if phase == kill_phase and batch_id == int(kill_batch):
            sys.stdout.flush()
            sys.stderr.flush()
            os.killpg(os.getpgid(0), signal.SIGKILL)

    original_append = job.append_rows

    def append_then_maybe_die(spark: Any, df: Any, path: str, app_id: str, version: int) -> int | None:
        result = original_append(spark, df, path, app_id, version)
        _append_line(args.progress, {"event": "dead_letter", "batchId": version, "version": result})
        die_if("after_dead_letter", version)
        return result

    job.append_rows = append_then_maybe_die

    def on_progress(progress: dict[str, Any]) -> None:
        _append_line(args.progress, {"event": "merge", **progress})
        die_if("after_commit", int(progress["batchId"]))

    conf = package_conf((KAFKA_CONNECTOR,)) if args.source_format == "kafka" else {}
    spark = local_session("kafka-ingest-app", args.master, shuffle_partitions=2, short_run=True, extra_conf=conf)
    config = job.IngestConfig(
        bootstrap_servers=args.bootstrap_servers, topics=args.topic, target=args.target,
        keys=[k for k in args.keys.split(",") if k], checkpoint=args.checkpoint, dead_letter=args.dead_letter,
        row_schema=args.row_schema, available_now=True, max_offsets_per_trigger=args.max_offsets_per_trigger,
        starting_offsets="earliest", source_format=args.source_format)
    query = job.start(spark, config, on_progress=on_progress)
    query.awaitTermination()
    if args.report:
        write_json(args.report, cluster_report(spark))
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
