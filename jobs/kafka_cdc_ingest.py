"""Kafka CDC ingestion: Debezium topics → MergeSink → a Delta table, exactly once.

    python -m jobs.kafka_cdc_ingest --bootstrap-servers 127.0.0.1:9092 --topics db.public.orders \\
        --target /lake/orders --keys order_id --checkpoint /chk/orders --available-now

A whole database in one query (one table per topic, see ``jobs/_database.py``):

    python -m jobs.kafka_cdc_ingest --bootstrap-servers 127.0.0.1:9092 \\
        --subscribe-pattern 'dbserver1\\.inventory\\..*' --target-root /lake/inventory --checkpoint /chk/inventory

Logs one line per batch (text, or JSON with ``--log-format json``) once Spark has finished it: the
MERGE's metrics, the Kafka records read and the consumer lag per topic-partition. On SIGTERM/SIGINT
the running batch may finish within ``--stop-timeout`` seconds, else it is abandoned before its
commit (jobs/_graceful_stop.py); the job then exits 0. Under spark-submit it runs in the platform's
session as it is. ``--source-format kafka``
reads with Spark's own Kafka connector instead of ours; the rest of the pipeline is the same.
``--kafka-option kafka.NAME=VALUE`` (repeatable) passes client settings such as SASL/SSL.
"""

from __future__ import annotations

import argparse
import logging
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery
from pyspark.sql.types import StructType

from streaming_merge import MergeSink
from streaming_merge.kafka import debezium
from streaming_merge.kafka.source import SHORT_NAME, KafkaOptions, read_ranges, warm_up_records
from streaming_merge.merge.materialize import (
    DEFAULT_STORAGE_LEVELS,
    release,
    storage_level,
)
from streaming_merge.session import LOCAL_DEFAULT_NAMES, job_session, starts_jvm, stop_session
from streaming_merge.spark.interpreted import DEFAULT_INTERPRETED_MAX_ROWS, interpreted_if_small
from streaming_merge.spark.packages import KAFKA_CONNECTOR
from streaming_merge.spark.startup_marks import enabled, jvm_state, mark
from streaming_merge.streaming.background import BackgroundCall
from streaming_merge.table.append import append_rows
from streaming_merge.table.follow import FollowedTable
from streaming_merge.table.location import resolve
from streaming_merge.table.write import parquet_write_conf

if TYPE_CHECKING:
    from jobs._database import DatabaseConfig

from jobs._common import (
    CONNECTOR_FORMAT,
    SOURCE_FORMATS,
    ChangeSettings,
    MalformedRecordsError,
    change_options,
    checked_kafka_options,
    database_line,
    progress_line,
    row_columns,
    source_options,
    staged_again_on_lost_blocks,
    start_query,
)
from jobs._graceful_stop import DEFAULT_STOP_TIMEOUT_S, GracefulStop
from jobs._run_log import LOG_FORMATS, BatchLog, configure_logging, log_session

log = logging.getLogger("jobs.kafka_cdc_ingest")  # a stable name under `python -m` too
JIT_POLICIES = ("auto", "c1", "late-c2", "tiered")
mark("job_imports_done")


@dataclass(frozen=True)
class IngestConfig(ChangeSettings):
    """The single-table job's settings (``--topics ... --target ... --keys ...``)."""

    bootstrap_servers: str
    topics: str
    target: str
    keys: list[str]
    checkpoint: str
    row_schema: str | None = None


def _known_row_schema(config: IngestConfig, target: FollowedTable) -> StructType | None:
    """The table's schema once it exists (it is the contract), else the given one; None when
    it must be inferred from the records (first batch of a new table without --row-schema).
    ``target`` is followed from batch to batch: only the commits since the last batch are read."""
    snapshot = target.latest()
    if snapshot is not None:
        return row_columns(snapshot.schema)
    if config.row_schema:
        schema = StructType.fromDDL(config.row_schema)
        assert isinstance(schema, StructType), "a row schema is a list of columns"
        return schema
    return None


def batch_function(config: IngestConfig, on_progress: Callable[[dict[str, Any]], None],
                   prepare_with: SparkSession | None = None, on_phase: Callable[[str], None] | None = None
                   ) -> tuple[Callable[[DataFrame, int], None], MergeSink]:
    """The foreachBatch function: decode once, divert malformed records, merge.

    ``prepare_with``: a session to prepare the first batch with now, in the background, while
    the query starts: the target's log is loaded and, when the row schema is known (the table's,
    or ``--row-schema``), the decode plan is built (hundreds of Python→JVM calls, seconds in a
    new JVM); the first batch waits for that and redoes whatever failed.

    With the row schema known (every batch but a new table's first without ``--row-schema``),
    the Kafka records are decoded inside the MergeSink's own copy of the batch
    (``debezium.decode_observed``): one Spark job reads, decodes, folds and copies them.
    Otherwise, and when the sink skips a batch it committed before (a replay, whose dead
    letters may not have been), they are decoded in one job into a local checkpoint that the
    dead-letter append and the sink both read. A lost block of that copy cannot be healed by
    the sink (its retries re-read the same copy), so such a batch is staged again from the
    Kafka records at the next storage level. Either way the dead-letter append runs beside the
    MERGE, which commits only once it has ended (see ``_BatchWrites``); both are idempotent per
    batch (Delta txn), so a rerun never applies anything twice. ``on_phase`` hears each of the
    sink's phases first (a graceful stop abandons a batch there)."""
    running: list[_BatchWrites] = []  # the batch in the sink, for the sink's phase hook

    def phase_hook(phase: str, _: DataFrame) -> None:
        if on_phase is not None:
            on_phase(phase)
        if running:
            running[0].at_phase(phase)

    sink = MergeSink(config.target, keys=config.keys, dead_letter=config.dead_letter, phase_hook=phase_hook,
                     **change_options(config))
    followed: list[FollowedTable] = []  # the target, for its schema (made by the first batch: it needs the session)
    preparing = [_prepare_first_batch(prepare_with, config, followed)] if prepare_with is not None else []

    def through_sink(batch: _BatchWrites, events: DataFrame, rows_at_most: int | None) -> None:
        """The sink's MERGE of ``events``, and the batch's dead-letter append beside it."""
        spark = events.sparkSession
        running.append(batch)
        try:
            with parquet_write_conf(spark):  # held around both writes: the session's, shared by the two threads
                batch.start_dead_letters()
                sink(events, batch.batch_id, rows_at_most=rows_at_most)
                mark("merge_committed", once=True, batch=batch.batch_id, sink=sink.lastProgress, **jvm_state(spark))
                batch.finish_dead_letters()
        except BaseException:
            batch.stop_dead_letters()  # nothing may still read a copy once it is released
            raise
        finally:
            running.clear()

    def progress_of(records_read: int, tombstones: int, bad: int) -> dict[str, Any]:
        progress = dict(sink.lastProgress or {})
        progress.update(malformedRecords=bad, kafkaRecords=records_read, tombstones=tombstones)
        return progress

    def decoded_in_sink(records: DataFrame, batch_id: int, row_schema: StructType) -> dict[str, Any] | None:
        """The batch decoded inside the sink's copy; None when the sink skipped it."""
        spark = records.sparkSession
        decode = debezium.decode_observed(records, row_schema, keys=config.keys, truncates=config.apply_truncates)

        def malformed() -> DataFrame:  # asked only of a batch that has malformed records
            observed = decode.observed_malformed(spark)
            ranges = decode.malformed_ranges()  # records too large to be observed: read again (rare)
            if not ranges:
                return observed
            kafka = KafkaOptions.parse(source_options(config, ("subscribe", config.topics), config.bootstrap_servers))
            return observed.unionByName(decode.malformed(read_ranges(spark, kafka, ranges)))

        batch = _BatchWrites(spark, config, batch_id, decode, malformed)
        through_sink(batch, decode.events, config.max_offsets_per_trigger)
        return progress_of(*decode.counts()) if batch.copied else None  # no copy: committed before

    def run_staged(records: DataFrame, batch_id: int, level: str, row_schema: StructType | None
                   ) -> dict[str, Any]:
        spark = records.sparkSession
        # A trigger reads at most maxOffsetsPerTrigger records: with a small bound the decode runs
        # without generated code (streaming_merge.spark.interpreted), and the sink is told the count.
        with interpreted_if_small(spark, config.max_offsets_per_trigger, DEFAULT_INTERPRETED_MAX_ROWS):
            decoded = _decode(records, config, level, row_schema)
        try:
            batch = _BatchWrites(spark, config, batch_id, None, lambda: decoded.malformed)
            batch.decoded(decoded.num_malformed)
            through_sink(batch, decoded.events, decoded.num_records)
        finally:
            decoded.release()
        return progress_of(decoded.num_records, decoded.num_tombstones, decoded.num_malformed)

    def run_once(records: DataFrame, batch_id: int, level: str) -> dict[str, Any]:
        spark = records.sparkSession
        mark("batch_start", once=True, batch=batch_id, **jvm_state(spark))
        while preparing:
            preparing.pop().join()
        if not followed:
            followed.append(FollowedTable(resolve(config.target, spark, config.storage_options)))
        row_schema = _known_row_schema(config, followed[0])
        if row_schema is not None and level == DEFAULT_STORAGE_LEVELS[0] and config.source_format == SHORT_NAME:
            progress = decoded_in_sink(records, batch_id, row_schema)
            if progress is not None:
                return progress
        return run_staged(records, batch_id, level, row_schema)

    def run(records: DataFrame, batch_id: int) -> None:
        on_progress(staged_again_on_lost_blocks(run_once, records, batch_id))

    return run, sink


class _BatchWrites:
    """One batch's malformed-record handling around the sink's MERGE, driven by the sink's phase
    hook. Decoded in the sink's copy (``decode``), the counts are known once that copy exists
    (``after_materialize``), before the MERGE: a batch with malformed records then fails with
    nothing committed (``--on-malformed fail``), or its dead-letter append starts beside the
    MERGE, with those records as the copy's job observed them (``malformed``: no Kafka read and
    no decode again; only records over ``debezium.INLINE_DEAD_LETTER_BYTES`` are read again by
    offset range, outside the stream's input; a batch without any pays nothing). Decoded into a checkpoint
    first (``decode`` None), :meth:`decoded` gives the count before the sink runs. Either way the
    MERGE waits for the append right before it commits (``before_commit``), so the commit that
    records the batch as done comes last."""

    def __init__(self, spark: SparkSession, config: IngestConfig, batch_id: int,
                 decode: debezium.ObservedDecode | None, malformed: Callable[[], DataFrame]) -> None:
        self.spark = spark
        self.config = config
        self.batch_id = batch_id
        self.decode = decode
        self.malformed = malformed
        self.copied = False  # the sink's copy of the batch exists (it was not skipped as committed)
        self._bad = 0
        self._dead_letters: BackgroundCall | None = None

    def decoded(self, bad: int) -> None:
        """The batch's malformed records are counted: fail now, or have them appended."""
        if bad and (self.config.on_malformed == "fail" or not self.config.dead_letter):
            raise _malformed_error(self.config, self.batch_id, bad, self.malformed())
        mark("batch_decoded", once=True, batch=self.batch_id)
        self._bad = bad

    def at_phase(self, phase: str) -> None:
        if phase == "after_materialize" and not self.copied:  # the first copy only (a rerun copies again)
            self.copied = True
            if self.decode is not None:
                self.decoded(self.decode.counts()[2])
                self.start_dead_letters()
        elif phase == "before_commit" and self._dead_letters is not None:
            self._dead_letters.wait_quietly()  # its failure fails the batch after the MERGE (a rerun skips it)

    def start_dead_letters(self) -> None:
        if self._bad and self._dead_letters is None:
            self._dead_letters = _dead_letters_beside(self.spark, self.config, self.malformed(), self.batch_id)

    def finish_dead_letters(self) -> None:
        if self._dead_letters is not None:
            self._dead_letters.result()

    def stop_dead_letters(self) -> None:
        if self._dead_letters is not None:
            self._dead_letters.wait_quietly()


def _malformed_error(config: IngestConfig, batch_id: int, bad: int, malformed: DataFrame) -> MalformedRecordsError:
    sample = [r["error"] for r in malformed.limit(3).collect()]
    return MalformedRecordsError(
        f"Batch {batch_id}: {bad} Kafka record(s) could not be decoded, e.g. {sample}; "
        "configure --dead-letter (on_malformed=dead_letter) to divert them.")


def _prepare_first_batch(spark: SparkSession, config: IngestConfig, followed: list[FollowedTable]
                         ) -> threading.Thread:
    """``batch_function``'s preparation of the first batch, started in a daemon thread: the
    target's log, the decode plan, and (first query of the JVM only) the decode of no records
    read by an executor Python worker (``kafka.source.warm_up_records``), which leaves that
    worker ready for the first read and the decode's classes loaded and its code compiled."""
    def prepare() -> None:
        try:
            target = FollowedTable(resolve(config.target, spark, config.storage_options))
            followed.append(target)
            row_schema = _known_row_schema(config, target)
            mark("first_batch_prepared_log", once=True)
            if row_schema is not None:
                debezium.prepare_decode(spark, row_schema, keys=config.keys, truncates=config.apply_truncates)
            records = warm_up_records(spark) if config.source_format == SHORT_NAME else None
            if records is not None:
                spark.sparkContext.setJobDescription("kafka_cdc_ingest: the first batch's decode, on no records")
                if row_schema is None:
                    records.collect()
                else:
                    debezium.decode_batch(records, row_schema, keys=config.keys,
                                          truncates=config.apply_truncates).release()
            mark("first_batch_prepared", once=True)
        except Exception:  # the first batch does it again, and reports what fails
            log.debug("Preparing the first batch failed", exc_info=True)

    thread = threading.Thread(target=prepare, name="prepare-first-batch", daemon=True)
    thread.start()
    return thread


def _dead_letters_beside(spark: SparkSession, config: IngestConfig, malformed: DataFrame,
                         batch_id: int) -> BackgroundCall:
    """The malformed records' append to the dead-letter table, started beside the batch's MERGE.

    The two writes go to different tables and each is idempotent per batch (its own Delta
    txn), so their order does not matter: the batch ends when both have committed, and a
    failure of either fails the batch, whose replay skips what was already committed. Run one
    after the other, the first batch's append (which creates the table) took 1.4-2.5 s of the
    demo's critical path."""
    assert config.dead_letter is not None
    app_id = spark.sparkContext.getLocalProperty("sql.streaming.queryId") or "kafka_cdc_ingest"
    dead_letter = resolve(config.dead_letter, spark, config.storage_options)

    # With the session's settings as they are: a thread of its own must not change them (the
    # MERGE's thread sets and restores some while this runs), so no interpreted block here.
    return BackgroundCall(lambda: append_rows(spark, malformed, dead_letter, f"{app_id}:malformed", batch_id),
                          "dead-letter-append")


def _decode(records: DataFrame, config: IngestConfig, level: str, row_schema: StructType | None
            ) -> debezium.DecodedBatch:
    """The batch's records decoded once (a local checkpoint at ``level``) with ``row_schema``
    (the table's or configured one, :func:`_known_row_schema`), else with the schema inferred
    from this batch (a new table's first only)."""
    inferred_from: DataFrame | None = None
    if row_schema is None:  # first batch of a new table only: inference needs a pass of its own
        records = inferred_from = records.localCheckpoint(eager=True, storageLevel=storage_level(level))
        row_schema = debezium.infer_row_schema(records)
    try:
        return debezium.decode_batch(records, row_schema, keys=config.keys, storage_level_name=level,
                                     truncates=config.apply_truncates)
    finally:
        if inferred_from is not None:
            release(inferred_from)


def start(spark: SparkSession, config: IngestConfig,
          on_progress: Callable[[dict[str, Any]], None] | None = None,
          stopping: GracefulStop | None = None) -> StreamingQuery:
    """Start the ingestion query (does not wait); ``stopping`` lets a batch finish on SIGTERM."""
    function, _ = batch_function(config, on_progress or (lambda p: print(progress_line(p), flush=True)),
                                 prepare_with=spark, on_phase=stopping.phase_hook if stopping else None)
    return start_query(spark, config, ("subscribe", config.topics), stopping.wrap(function) if stopping else function,
                       config.bootstrap_servers, config.checkpoint)


def query_name(config: IngestConfig | DatabaseConfig) -> str:
    """The streaming query's name (Spark's UI, progress and the job's batch lines)."""
    return f"cdc_ingest:{config.topics if isinstance(config, IngestConfig) else config.subscribe_pattern}"


def session_packages(config: ChangeSettings, spark_conf: dict[str, str]) -> tuple[str, ...]:
    """The Spark packages a session the job creates gets: Spark's Kafka connector for
    ``--source-format kafka``, unless the user chose the packages (``--spark-conf
    spark.jars.packages=...``; under spark-submit, its ``--packages``)."""
    if config.source_format == CONNECTOR_FORMAT and "spark.jars.packages" not in spark_conf:
        return (KAFKA_CONNECTOR,)
    return ()


def driver_jit(config: ChangeSettings) -> str:
    """The ``--jit`` policy the job's session gets: ``auto`` is ``c1`` for an ``--available-now``
    run (it ends once it has caught up: on 2 cores C1 alone took a restart to its first MERGE in
    7.0 s, late-c2 in 9.5 s, the JVM's tiered default in 10.1 s; bench/startup.py) and
    ``late-c2`` for a run that goes on (C1 alone stays slower once warm, see
    ``session._short_run_conf``)."""
    if config.driver_jit != "auto":
        return config.driver_jit
    return "c1" if config.available_now else "late-c2"


def parse_args(argv: list[str] | None) -> tuple[IngestConfig | DatabaseConfig, str, dict[str, str]]:
    """The single-table config (``--topics``) or the multi-table one (``--subscribe-pattern``)."""
    from jobs._database import DEBEZIUM_TOPIC_REGEX, DEFAULT_TABLE_PATH_TEMPLATE  # it imports this module

    parser = argparse.ArgumentParser(description="Ingest Debezium CDC topics into Delta tables, exactly once: "
                                     "--topics/--target/--keys for one table, --subscribe-pattern/--target-root "
                                     "for a whole database (one table per topic).")
    parser.add_argument("--bootstrap-servers", required=True, help="Kafka bootstrap servers host:port[,...]")
    parser.add_argument("--topics", default=None, help="comma-separated topics of ONE table's change events")
    parser.add_argument("--target", default=None, help="Delta table path (created from the first batch); with --topics")
    parser.add_argument("--subscribe-pattern", default=None, help="regex of topic names (a whole database): each "
                        "topic goes to its own table under --target-root")
    parser.add_argument("--target-root", default=None, help="with --subscribe-pattern: root folder/URI of the tables, "
                        "<root>/<schema>/<table> by Debezium's topic naming <prefix>.<schema>.<table>")
    parser.add_argument("--table-path-template", default=None, help="with --subscribe-pattern: table path as a "
                        "format string over {root}, {topic} and the --topic-regex groups "
                        f"(default {DEFAULT_TABLE_PATH_TEMPLATE!r})")
    parser.add_argument("--topic-regex", default=None, help="with --subscribe-pattern: regex with named groups over "
                        f"the topic name (default Debezium's {DEBEZIUM_TOPIC_REGEX!r}); a topic that does not match "
                        "goes to the dead letter")
    parser.add_argument("--keys", default=None, help="comma-separated primary key columns (required with --topics; "
                        "with --subscribe-pattern default: each table's Kafka record key fields)")
    parser.add_argument("--sequence", default="", help="extra leading sequence column(s) before the Debezium "
                        "position (e.g. a version column); default: source.lsn / ts_ms, partition, offset")
    parser.add_argument("--checkpoint", required=True, help="Spark checkpoint folder of this query")
    trigger = parser.add_mutually_exclusive_group()
    trigger.add_argument("--available-now", action="store_true", help="process what is there, then stop")
    trigger.add_argument("--processing-time", default=None, help="e.g. '10s' (default: as fast as possible)")
    parser.add_argument("--dead-letter", default=None, help="Delta table path for undecodable/NULL-key records")
    parser.add_argument("--on-malformed", choices=["dead_letter", "fail"], default="dead_letter")
    parser.add_argument("--row-schema", default=None, help="DDL of the row image, e.g. 'id long, name string' "
                        "(default: the table's schema, or inferred from the first batch)")
    parser.add_argument("--max-offsets-per-trigger", type=int, default=None)
    parser.add_argument("--starting-offsets", default="earliest")
    parser.add_argument("--source-format", choices=SOURCE_FORMATS, default=SHORT_NAME,
                        help="kafka_py (default): this project's source (Python clients, no jar); kafka: Spark's "
                        "own connector (spark-sql-kafka-0-10, added to a local session; under spark-submit give "
                        "--packages)")
    parser.add_argument("--kafka-option", action="append", default=[], metavar="kafka.NAME=VALUE",
                        help="Kafka client setting, named as Spark's Kafka connector names them, e.g. "
                        "kafka.security.protocol=SASL_SSL (repeatable; see docs/guides/kafka.md for SASL/SSL and "
                        "how each is translated for the Python clients)")
    parser.add_argument("--master", default="local[2]", help="Spark master of a session the job creates (under "
                        "spark-submit the platform's session is used as it is)")
    parser.add_argument("--ignore-null-updates", action="store_true",
                        help="a NULL in an update keeps the table's value (partial updates)")
    parser.add_argument("--unavailable-value", default=None,
                        help="string that stands for an unchanged value (Debezium's unavailable.value.placeholder); "
                        f"it never overwrites the table's value (default {debezium.UNAVAILABLE_VALUE!r}; "
                        "'' turns this off)")
    parser.add_argument("--apply-truncates", action="store_true",
                        help="Debezium truncate events (op 't') truncate the table as of their position "
                        "(default: they go to the dead letter with the reason)")
    parser.add_argument("--scd-type", type=int, choices=[1, 2], default=1,
                        help="2: keep every version of a row with __START_AT/__END_AT (SCD type 2)")
    parser.add_argument("--track-history-except", default=None,
                        help="with --scd-type 2: comma-separated columns whose changes update the current version "
                        f"in place (default: {debezium.OP},{debezium.TS_MS})")
    parser.add_argument("--change-data-feed", action="store_true",
                        help="create new target tables with Delta's change data feed "
                             "(delta.enableChangeDataFeed=true): every batch also writes its change rows, which "
                             "DeltaTable.changes() and the delta_changes stream source read")
    parser.add_argument("--deletion-vectors", action="store_true",
                        help="create new target tables with deletion vectors (delta.enableDeletionVectors=true): "
                        "each upsert marks the replaced rows deleted and writes only the changed rows, instead of "
                        "rewriting the files it touches (existing tables keep their setting)")
    parser.add_argument("--jit", choices=JIT_POLICIES, default="auto",
                        help="the local driver JVM's JIT compilers: c1 (the fast compiler only: the fastest start, "
                        "slower long runs), late-c2 (the optimizing compiler only for code that stays hot: faster "
                        "starts and restarts than tiered, hot code still optimized), tiered (the JVM's default); auto "
                        "(default): c1 with --available-now (the run ends once it has caught up; choose late-c2 "
                        "for a large backlog), late-c2 otherwise. Ignored under spark-submit")
    parser.add_argument("--stop-timeout", type=float, default=DEFAULT_STOP_TIMEOUT_S, metavar="SECONDS",
                        help="on SIGTERM/SIGINT the running batch may finish within this many seconds, else it is "
                        "abandoned before its commit; the job then exits 0 (default %(default).0f; keep it under the "
                        "platform's grace period, e.g. Kubernetes' terminationGracePeriodSeconds)")
    parser.add_argument("--log-format", choices=LOG_FORMATS, default="text",
                        help="text, or json: one JSON object a line (a batch's line carries its whole record)")
    parser.add_argument("--keep-spark-default", action="append", default=[], choices=LOCAL_DEFAULT_NAMES,
                        help="a local session this job creates keeps Spark's own value of this default of ours "
                        "(ui: no UI; partitions: 4 shuffle partitions; quiet-log: log level ERROR); repeatable. "
                        "Settings you make (--spark-conf, spark-defaults.conf, PYSPARK_SUBMIT_ARGS) always win, and "
                        "under spark-submit the platform's session is taken unchanged")
    parser.add_argument("--spark-conf", action="append", default=[], metavar="KEY=VALUE",
                        help="Spark setting for the job's session, e.g. spark.hadoop.fs.s3a.endpoint=http://minio:9000 "
                        "(repeatable; under spark-submit use its own --conf)")
    parser.add_argument("--storage-option", action="append", default=[], metavar="KEY=VALUE",
                        help="delta-rs storage option for the tables' logs, e.g. AWS_REGION=eu-west-1 "
                        "(repeatable; added to those derived from Spark's fs.s3a.* / fs.azure.* / fs.gs.* settings)")
    args = parser.parse_args(argv)
    if args.track_history_except is not None and args.scd_type != 2:
        parser.error("--track-history-except needs --scd-type 2")
    if args.unavailable_value is None:
        args.unavailable_value = debezium.UNAVAILABLE_VALUE
    spark_conf = _key_values(parser, "--spark-conf", args.spark_conf)
    kafka_options = _key_values(parser, "--kafka-option", args.kafka_option)
    try:
        checked_kafka_options(kafka_options, args.source_format)
    except ValueError as exc:
        parser.error(f"--kafka-option: {exc}")
    settings: dict[str, Any] = dict(  # ChangeSettings, the same in both modes
        dead_letter=args.dead_letter, available_now=args.available_now, processing_time=args.processing_time,
        max_offsets_per_trigger=args.max_offsets_per_trigger, starting_offsets=args.starting_offsets,
        on_malformed=args.on_malformed, source_format=args.source_format, kafka_options=kafka_options,
        extra_sequence=_names(args.sequence), storage_options=_key_values(parser, "--storage-option",
                                                                          args.storage_option),
        ignore_null_updates=args.ignore_null_updates, unavailable_value=args.unavailable_value or None,
        apply_truncates=args.apply_truncates, scd_type=args.scd_type, deletion_vectors=args.deletion_vectors,
        change_data_feed=args.change_data_feed, driver_jit=args.jit, keep_spark_defaults=tuple(args.keep_spark_default),
        stop_timeout_s=args.stop_timeout, log_format=args.log_format,
        track_history_except=None if args.track_history_except is None else _names(args.track_history_except))
    keys = _names(args.keys or "")
    if bool(args.topics) == bool(args.subscribe_pattern):
        parser.error("give either --topics (one table: with --target and --keys) or --subscribe-pattern (a whole "
                     "database: with --target-root)" + (", not both" if args.topics else ""))
    if args.subscribe_pattern:
        return _database_config(parser, args, keys, settings), args.master, spark_conf
    for flag in ("target_root", "table_path_template", "topic_regex"):
        if getattr(args, flag) is not None:
            parser.error(f"--{flag.replace('_', '-')} routes the topics of --subscribe-pattern to their tables; "
                         "with --topics give one --target")
    if not args.target or not keys:
        parser.error("--topics needs --target and --keys (one table)")
    return IngestConfig(bootstrap_servers=args.bootstrap_servers, topics=args.topics, target=args.target, keys=keys,
                        checkpoint=args.checkpoint, row_schema=args.row_schema, **settings), args.master, spark_conf


def _database_config(parser: argparse.ArgumentParser, args: argparse.Namespace, keys: list[str],
                     settings: dict[str, Any]) -> DatabaseConfig:
    from jobs._database import DEBEZIUM_TOPIC_REGEX, DEFAULT_TABLE_PATH_TEMPLATE, DatabaseConfig

    if args.target:
        parser.error("--target names one table; with --subscribe-pattern give --target-root (and "
                     "--table-path-template for another layout)")
    if args.row_schema:
        parser.error("--row-schema is one table's; with --subscribe-pattern each table takes its schema from the "
                     "table, the Debezium schema or its first batch")
    config = DatabaseConfig(
        bootstrap_servers=args.bootstrap_servers, subscribe_pattern=args.subscribe_pattern,
        target_root=args.target_root, checkpoint=args.checkpoint, keys=keys,
        table_path_template=args.table_path_template or DEFAULT_TABLE_PATH_TEMPLATE,
        topic_regex=args.topic_regex or DEBEZIUM_TOPIC_REGEX, **settings)
    try:
        config.router()
    except ValueError as exc:
        parser.error(str(exc))
    return config


def _names(text: str) -> list[str]:
    """A comma-separated list of column names."""
    return [name.strip() for name in text.split(",") if name.strip()]


def _key_values(parser: argparse.ArgumentParser, flag: str, items: list[str]) -> dict[str, str]:
    pairs = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            parser.error(f"{flag} expects KEY=VALUE, got {item!r}")
        pairs[key.strip()] = value
    return pairs


def main(argv: list[str] | None = None) -> int:
    config, master, spark_conf = parse_args(argv)
    configure_logging(config.log_format)
    stopping = GracefulStop(config.stop_timeout_s)
    stopping.install()
    mark("main")
    if stopping.requested.is_set():  # stopped while it started: nothing to let finish
        return 0
    jit = driver_jit(config)
    platform = not starts_jvm()
    spark = job_session("kafka_cdc_ingest", master, extra_conf=spark_conf,
                        packages=session_packages(config, spark_conf),
                        keep_spark_defaults=config.keep_spark_defaults, short_run=jit == "c1", late_c2=jit == "late-c2")
    mark("session_ready", **jvm_state(spark))
    log_session(spark, platform)
    query = run_query(spark, config, stopping)
    mark("query_terminated", **jvm_state(spark),
         progress=[p.json for p in query.recentProgress] if enabled() and query is not None else None)
    stop_session(spark)
    mark("spark_stopped")
    return 0


def run_query(spark: SparkSession, config: IngestConfig | DatabaseConfig, stopping: GracefulStop
              ) -> StreamingQuery | None:
    """Run the query until it ends, is stopped (SIGTERM/SIGINT) or fails (raised); with one
    log line per batch. None when a stop came before the query started."""
    if stopping.requested.is_set():
        return None
    batch_log = BatchLog(query_name(config), progress_line if isinstance(config, IngestConfig) else database_line)
    spark.streams.addListener(batch_log)
    if isinstance(config, IngestConfig):
        query = start(spark, config, on_progress=batch_log.record, stopping=stopping)
    else:
        from jobs._database import start_database  # it imports this module

        query = start_database(spark, config, on_progress=batch_log.record, stopping=stopping)
    stopping.attach(query)
    mark("query_started", **jvm_state(spark))
    stopping.await_query(query)
    batch_log.drain(query)
    return query


if __name__ == "__main__":
    sys.exit(main())
