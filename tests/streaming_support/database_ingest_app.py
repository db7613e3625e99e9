"""The multi-table Kafka CDC job (``--subscribe-pattern``) in a subprocess, for the
exactly-once kill test of tests/kafka/test_database_e2e.py.

Runs ``jobs._database.start_database(...)`` with ``availableNow`` as the job's CLI does, and
appends one JSON line per event to ``--progress``:

- ``{"event": "table", ...}``: a table's MergeSink progress of a batch, right after its
  commit and before the next table's MERGE starts;
- ``{"event": "batch", ...}``: the batch is done (before Spark commits its offsets).

``--kill-at BATCH:TABLES`` SIGKILLs the whole process group (the Python driver and the JVM,
like a machine dying) in batch BATCH right after its TABLES-th table committed: the tables
after it have not, and Spark's offsets of the batch are not committed, so the restart
replays the batch.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
from typing import Any

from jobs._database import DatabaseConfig, start_database
from streaming_merge.session import local_session
from streaming_merge.spark.packages import KAFKA_CONNECTOR, package_conf


def _append_line(path: str, record: dict[str, Any]) -> None:
    """One line per event, flushed and closed at once: the process may die right after."""
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(record, default=str) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap-servers", required=True)
    parser.add_argument("--subscribe-pattern", required=True)
    parser.add_argument("--target-root", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--dead-letter", required=True)
    parser.add_argument("--max-offsets-per-trigger", type=int, required=True)
    parser.add_argument("--progress", required=True)
    parser.add_argument("--source-format", default="kafka_py", help="kafka_py, or kafka: Spark's connector")
    parser.add_argument("--kill-at", default=None, help="BATCH:TABLES")
    args = parser.parse_args(argv)
    kill_batch, kill_tables = (int(x) for x in args.kill_at.split(":")) if args.kill_at else (-1, -1)
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("kafka").setLevel(logging.ERROR)
    committed: dict[int, int] = {}

    def on_table(progress: dict[str, Any]) -> None:
        _append_line(args.progress, {"event": "table", **progress})
        batch_id = int(progress["batchId"])
        committed[batch_id] = committed.get(batch_id, 0) + 1
        if batch_id == kill_batch and committed[batch_id] == kill_tables:
            sys.stdout.flush()
            sys.stderr.flush()
            os.killpg(os.getpgid(0), signal.SIGKILL)

    def on_batch(progress: dict[str, Any]) -> None:
        _append_line(args.progress, {"event": "batch", **{k: v for k, v in progress.items() if k != "tables"}})

    conf = package_conf((KAFKA_CONNECTOR,)) if args.source_format == "kafka" else {}
    spark = local_session("database-ingest-app", "local[2]", shuffle_partitions=2, short_run=True, extra_conf=conf)
    config = DatabaseConfig(
        bootstrap_servers=args.bootstrap_servers, subscribe_pattern=args.subscribe_pattern,
        target_root=args.target_root, checkpoint=args.checkpoint, dead_letter=args.dead_letter, available_now=True,
        max_offsets_per_trigger=args.max_offsets_per_trigger, starting_offsets="earliest",
        source_format=args.source_format)
    query = start_database(spark, config, on_progress=on_batch, on_table_progress=on_table)
    query.awaitTermination()
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
