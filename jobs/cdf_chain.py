"""Chain Delta tables exactly once: the change data feed of one table → MergeSink → another.

    python -m jobs.cdf_chain --source /lake/silver/orders --target /lake/gold/orders \\
        --keys order_id --checkpoint /chk/gold_orders --available-now

The source table must record its changes (``delta.enableChangeDataFeed=true``, e.g. a table
that ``jobs.kafka_cdc_ingest --change-data-feed`` fills). The query reads them with the
``delta_changes`` stream source and applies each micro-batch to the target with a MergeSink:
``insert`` and ``update_postimage`` rows are upserts, ``delete`` rows delete the key,
``update_preimage`` rows are dropped. The source's ``_commit_version`` becomes the target's
sequence column (``--sequence-column``, default ``_source_version``), so a key's changes apply
in the order the source committed them, and an older change never overwrites a newer one.

Exactly once across restarts and crashes: the source's offsets (version and file index) are in
Spark's checkpoint, and the sink commits each batch with its batch id as a Delta transaction,
so a batch replayed after a crash is skipped when its commit had landed. Without
``--starting-version`` the first batches are the source's rows as of the query's start (as
inserts), then every change after it. ``--change-data-feed`` gives the target a feed of its
own, for the next table downstream. SIGTERM/SIGINT let the running batch finish within ``--stop-timeout``
seconds, else abandon it before its commit (jobs/_graceful_stop.py); the job then exits 0.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from jobs._graceful_stop import DEFAULT_STOP_TIMEOUT_S, GracefulStop
from streaming_merge import MergeSink
from streaming_merge.cdf import SHORT_NAME, register
from streaming_merge.session import job_session, stop_session
from streaming_merge.streaming.sink import PhaseHook

log = logging.getLogger("jobs.cdf_chain")

CHANGE_TYPE = "_change_type"
COMMIT_VERSION = "_commit_version"
COMMIT_TIMESTAMP = "_commit_timestamp"
DELETE_WHEN = f"{CHANGE_TYPE} = 'delete'"


@dataclass(frozen=True)
class ChainConfig:
    """One source table's changes into one target table."""

    source: str
    target: str
    keys: list[str]
    checkpoint: str
    available_now: bool = False
    processing_time: str | None = None
    max_files_per_trigger: int | None = None
    max_bytes_per_trigger: int | None = None
    starting_version: str | None = None  # a version number, or "latest"
    sequence_column: str = "_source_version"
    change_data_feed: bool = False  # the target records its own feed
    deletion_vectors: bool = False
    storage_options: dict[str, str] = field(default_factory=dict)
    stop_timeout_s: float = DEFAULT_STOP_TIMEOUT_S  # --stop-timeout: a running batch's time to finish on SIGTERM


def changes(spark: SparkSession, config: ChainConfig) -> DataFrame:
    """The source table's change feed as a stream."""
    register(spark)
    reader = spark.readStream.format(SHORT_NAME).option("path", config.source)
    for key, value in config.storage_options.items():
        reader = reader.option(key, value)
    if config.starting_version is not None:
        reader = reader.option("startingVersion", config.starting_version)
    if config.max_files_per_trigger:
        reader = reader.option("maxFilesPerTrigger", str(config.max_files_per_trigger))
    if config.max_bytes_per_trigger:
        reader = reader.option("maxBytesPerTrigger", str(config.max_bytes_per_trigger))
    return reader.load()


def as_upserts(change_rows: DataFrame, sequence_column: str) -> DataFrame:
    """The change rows the sink applies: every change but the preimages (the postimage of the
    same version carries the new row), with the source version as the sequence."""
    return (change_rows.filter(F.col(CHANGE_TYPE) != "update_preimage")
            .withColumnRenamed(COMMIT_VERSION, sequence_column).drop(COMMIT_TIMESTAMP))


def sink_for(config: ChainConfig, phase_hook: PhaseHook | None = None) -> MergeSink:
    properties = {}
    if config.change_data_feed:
        properties["delta.enableChangeDataFeed"] = "true"
    if config.deletion_vectors:
        properties["delta.enableDeletionVectors"] = "true"
    return MergeSink(config.target, keys=config.keys, sequence_by=config.sequence_column, apply_as_deletes=DELETE_WHEN,
                     except_column_list=[CHANGE_TYPE], table_properties=properties or None,
                     storage_options=config.storage_options or None, phase_hook=phase_hook)


def start(spark: SparkSession, config: ChainConfig, on_batch: Callable[[MergeSink, int], None] | None = None,
          phase_hook: PhaseHook | None = None, on_start: Callable[[int], None] | None = None,
          stopping: GracefulStop | None = None) -> StreamingQuery:
    """Start the chained query (does not wait). ``on_batch(sink, batch_id)`` runs after each
    batch's MERGE (default: print its progress line), ``on_start(batch_id)`` before it;
    ``stopping`` lets a running batch finish on SIGTERM."""
    if stopping is not None:
        phase_hook = _both(stopping.phase_hook, phase_hook)
    sink = sink_for(config, phase_hook)
    report = on_batch or _print_progress

    def for_each_batch(batch: DataFrame, batch_id: int) -> None:
        if on_start is not None:
            on_start(batch_id)
        sink(as_upserts(batch, config.sequence_column), batch_id)
        report(sink, batch_id)

    writer = changes(spark, config).writeStream.foreachBatch(
        stopping.wrap(for_each_batch) if stopping else for_each_batch).option(
        "checkpointLocation", config.checkpoint)
    if config.available_now:
        writer = writer.trigger(availableNow=True)
    elif config.processing_time:
        writer = writer.trigger(processingTime=config.processing_time)
    return writer.queryName(f"cdf_chain:{config.target}").start()


def _both(first: PhaseHook, then: PhaseHook | None) -> PhaseHook:
    def hook(phase: str, frame: DataFrame) -> None:
        first(phase, frame)
        if then is not None:
            then(phase, frame)
    return hook


def _print_progress(sink: MergeSink, batch_id: int) -> None:
    progress: dict[str, Any] = sink.lastProgress or {}
    if progress.get("skipped"):
        print(f"[batch {batch_id}] skipped (already committed)", flush=True)
        return
    m = progress.get("metrics", {})
    print(f"[batch {batch_id}] {progress.get('target')} v{progress.get('tableVersion')} "
          f"in={progress.get('numInputRows')} inserted={m.get('numTargetRowsInserted', 0)} "
          f"updated={m.get('numTargetRowsUpdated', 0)} deleted={m.get('numTargetRowsDeleted', 0)} "
          f"{progress.get('durationMs', {}).get('total', 0)}ms", flush=True)


def parse_args(argv: Sequence[str] | None) -> tuple[ChainConfig, str]:
    parser = argparse.ArgumentParser(description="Apply one Delta table's change data feed to another, exactly "
                                                 "once (a silver -> gold chain).")
    parser.add_argument("--source", required=True, help="the table whose change data feed is read")
    parser.add_argument("--target", required=True, help="the table the changes are merged into (created if missing)")
    parser.add_argument("--keys", required=True, help="comma-separated key columns")
    parser.add_argument("--checkpoint", required=True, help="the query's checkpoint folder")
    parser.add_argument("--available-now", action="store_true", help="process what is there, then stop")
    parser.add_argument("--processing-time", default=None, help="trigger interval, e.g. '10 seconds'")
    parser.add_argument("--max-files-per-trigger", type=int, default=None,
                        help="at most this many of the source's data and change files per micro-batch (the "
                             "delta_changes source's maxFilesPerTrigger; default 1000, none when only "
                             "--max-bytes-per-trigger is given)")
    parser.add_argument("--max-bytes-per-trigger", type=int, default=None,
                        help="a soft cap on the bytes of source files per micro-batch (maxBytesPerTrigger: a "
                             "batch takes files until it holds at least this many bytes; default: no cap)")
    parser.add_argument("--starting-version", default=None,
                        help="the first source version to read (a number or 'latest'); default: the source's rows "
                             "as of the start, then its changes")
    parser.add_argument("--sequence-column", default="_source_version",
                        help="the target column that holds the source version of each row's last change")
    parser.add_argument("--change-data-feed", action="store_true", help="the target records its own feed")
    parser.add_argument("--deletion-vectors", action="store_true", help="create the target with deletion vectors")
    parser.add_argument("--storage-option", action="append", default=[], metavar="KEY=VALUE",
                        help="an object-store option for both tables (repeatable)")
    parser.add_argument("--stop-timeout", type=float, default=DEFAULT_STOP_TIMEOUT_S, metavar="SECONDS",
                        help="on SIGTERM/SIGINT the running batch may finish within this many seconds, else it is "
                        "abandoned before its commit; the job then exits 0 (default %(default).0f)")
    parser.add_argument("--master", default="local[2]",
                        help="Spark master of a session the job creates (default local[2]; under spark-submit the "
                        "platform's session is used as it is)")
    args = parser.parse_args(argv)
    keys = [k.strip() for k in args.keys.split(",") if k.strip()]
    if not keys:
        parser.error("--keys needs at least one column")
    options = {}
    for item in args.storage_option:
        key, sep, value = item.partition("=")
        if not sep or not key:
            parser.error(f"--storage-option expects KEY=VALUE, got {item!r}")
        options[key] = value
    config = ChainConfig(
        source=args.source, target=args.target, keys=keys, checkpoint=args.checkpoint,
        available_now=args.available_now, processing_time=args.processing_time,
        max_files_per_trigger=args.max_files_per_trigger, max_bytes_per_trigger=args.max_bytes_per_trigger,
        starting_version=args.starting_version, sequence_column=args.sequence_column, stop_timeout_s=args.stop_timeout,
        change_data_feed=args.change_data_feed, deletion_vectors=args.deletion_vectors, storage_options=options)
    return config, args.master


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config, master = parse_args(argv)
    stopping = GracefulStop(config.stop_timeout_s)
    stopping.install()
    spark = job_session("cdf_chain", master)
    if not stopping.requested.is_set():
        query = start(spark, config, stopping=stopping)
        stopping.attach(query)
        stopping.await_query(query)
    stop_session(spark)
    return 0


if __name__ == "__main__":
    sys.exit(main())
