"""Delta Lake's own writer beside the soak's job (bench/soak.py): a long-lived process with
delta-spark's SparkSession that runs, on the job's target table, the commands the soak drops
into ``--commands`` at random points of its lives, each to its commit, rerun after Delta's
conflict errors as a user's job does:

- ``merge``: a MERGE of keys the generated stream never uses (:data:`WRITER_KEYS`, counters
  incremented, plus a new key of its own per command), so the final table is checkable: the
  generator's state plus :func:`expected_writer_rows`;
- ``optimize``: ``OPTIMIZE`` (bin-packing compaction), which removes the files the job's
  MERGEs read and rewrite.

Protocol (files, so neither side blocks the other): the soak writes ``NNNNN.json``
(``{"kind": ..., "index": ...}``, renamed into place); the writer runs them in order and writes
``NNNNN.done.json`` with the outcome (conflicts Delta raised, seconds, Delta's metrics, or the
error). ``stop`` ends it once every command is done. ``--ready`` is created when the session is up.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
import traceback
from pathlib import Path
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
from pyspark.sql import SparkSession

from streaming_merge.session import local_session
from streaming_merge.spark.packages import package_conf

log = logging.getLogger("soak.delta_writer")

# Far above any key of the generated stream (cdc_generator draws keys from 0 up to --keys).
WRITER_KEY_BASE = 1_000_000_000
WRITER_KEYS = range(WRITER_KEY_BASE, WRITER_KEY_BASE + 10)
WRITER_NEW_KEY = WRITER_KEY_BASE + 1000
WRITER_AMOUNT = 0.5
WRITER_STATUS = "delta-writer"
# Delta's concurrent-modification errors as PySpark raises them (the Python classes share no base).
DELTA_CONFLICTS: tuple[type[Exception], ...] = (
    ConcurrentAppendException, ConcurrentDeleteReadException, ConcurrentDeleteDeleteException,
    ConcurrentTransactionException, ConcurrentWriteException, MetadataChangedException,
    ProtocolChangedException, DeltaConcurrentModificationException)
CONFLICT_RETRIES = 30
COMMAND_POLL_S = 0.05


def expected_writer_rows(merges: list[int]) -> dict[int, dict[str, Any]]:
    """The rows the applied ``merge`` commands (their indexes) leave, in the soak's row shape:
    each of WRITER_KEYS counted once per MERGE in ``customer_id``, one new key per MERGE."""
    rows: dict[int, dict[str, Any]] = {}
    if merges:
        for key in WRITER_KEYS:
            rows[key] = {"order_id": key, "customer_id": len(merges), "amount": WRITER_AMOUNT,
                         "status": WRITER_STATUS}
    for index in merges:
        key = WRITER_NEW_KEY + index
        rows[key] = {"order_id": key, "customer_id": 1, "amount": WRITER_AMOUNT, "status": WRITER_STATUS}
    return rows


def run_command(spark: SparkSession, target: str, kind: str, index: int) -> dict[str, Any]:
    """One MERGE or OPTIMIZE with Delta Lake's DeltaTable API; a conflict commits nothing."""
    table = DeltaLakeTable.forPath(spark, target)
    if kind == "merge":
        keys = [*WRITER_KEYS, WRITER_NEW_KEY + index]
        source = spark.createDataFrame([(k,) for k in keys], "order_id BIGINT")
        metrics = (table.alias("t").merge(source.alias("s"), "t.order_id = s.order_id")
                   .whenMatchedUpdate(set={"customer_id": "t.customer_id + 1"})
                   .whenNotMatchedInsert(values={"order_id": "s.order_id", "customer_id": "1",
                                                 "amount": str(WRITER_AMOUNT), "status": f"'{WRITER_STATUS}'"})
                   .execute())
        row = metrics.collect()[0].asDict()
        return {k: int(v) for k, v in row.items()}
    if kind == "optimize":
        result = table.optimize().executeCompaction().collect()[0]["metrics"]
        return {"numFilesAdded": int(result["numFilesAdded"]), "numFilesRemoved": int(result["numFilesRemoved"])}
    raise ValueError(f"unknown Delta writer command {kind!r}")


def run_retrying(spark: SparkSession, target: str, kind: str, index: int) -> dict[str, Any]:
    started = time.monotonic()
    conflicts: list[str] = []
    while True:
        try:
            metrics = run_command(spark, target, kind, index)
            version = DeltaLakeTable.forPath(spark, target).history(1).collect()[0]["version"]
            return {"kind": kind, "index": index, "applied": True, "conflicts": conflicts, "metrics": metrics,
                    "tableVersionAfter": int(version), "seconds": round(time.monotonic() - started, 2),
                    "t": time.time()}
        except DELTA_CONFLICTS as exc:
            conflicts.append(type(exc).__name__)
            log.warning("Delta %s %d conflicted (%s); rerunning", kind, index, type(exc).__name__)
            if len(conflicts) > CONFLICT_RETRIES:
                raise


def write_json(path: Path, record: dict[str, Any]) -> None:
    """Renamed into place: the soak never reads half a record."""
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(record))
    partial.replace(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--commands", required=True, help="folder of the soak's commands and their outcomes")
    parser.add_argument("--ready", required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    commands = Path(args.commands)
    spark = local_session("soak-delta-writer", "local[2]", shuffle_partitions=2, short_run=True,
                          extra_conf={**package_conf(("delta",)), "spark.databricks.delta.snapshotPartitions": "2"})
    Path(args.ready).touch()
    index = 0
    while True:
        command = commands / f"{index:05d}.json"
        if command.exists():
            order = json.loads(command.read_text())
            try:
                outcome = run_retrying(spark, args.target, order["kind"], int(order["index"]))
            except Exception as exc:  # reported to the soak, which fails its verdict on it
                outcome = {"kind": order["kind"], "index": order["index"], "applied": False,
                           "error": f"{type(exc).__name__}: {exc}"[:4000], "traceback": traceback.format_exc()[-4000:],
                           "t": time.time()}
            write_json(commands / f"{index:05d}.done.json", outcome)
            index += 1
            continue
        if (commands / "stop").exists():
            break
        time.sleep(COMMAND_POLL_S)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
