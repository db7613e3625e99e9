"""What both modes of the Kafka CDC job share (one table: jobs/kafka_cdc_ingest.py; a whole
database: jobs/_database.py): how change events are applied, the Kafka query, the staging
retries and the progress line. Neither mode imports the other for these."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery
from pyspark.sql.types import StructType

from streaming_merge.errors import StreamingMergeError
from streaming_merge.kafka import debezium
from streaming_merge.kafka._clients import MetadataClient
from streaming_merge.kafka._clients.common import KAFKA_PYTHON
from streaming_merge.kafka.source import SHORT_NAME, KafkaOptions, KafkaSourceError, register
from streaming_merge.merge.materialize import DEFAULT_STORAGE_LEVELS, is_lost_block_error, level_for_attempt
from streaming_merge.spark.startup_marks import mark
from streaming_merge.streaming.scd2 import HISTORY_COLUMNS

log = logging.getLogger("jobs.kafka_cdc_ingest")
CONNECTOR_FORMAT = "kafka"  # Spark's own Kafka connector (spark-sql-kafka-0-10)
SOURCE_FORMATS = (SHORT_NAME, CONNECTOR_FORMAT)
# Options of the kafka_py source alone, and what they do there.
KAFKA_PY_ONLY_OPTIONS = {"kafka.client": "chooses the Python client of the kafka_py source"}


@dataclass(frozen=True, kw_only=True)
class ChangeSettings:
    """How the query runs and how change events are applied: the same in both job modes."""

    dead_letter: str | None = None
    available_now: bool = False
    processing_time: str | None = None
    max_offsets_per_trigger: int | None = None
    starting_offsets: str = "earliest"
    on_malformed: str = "dead_letter"
    source_format: str = "kafka_py"  # or "kafka": Spark's own connector (SOURCE_FORMATS)
    # kafka.* client options (--kafka-option), named as Spark's connector names them
    kafka_options: dict[str, str] = field(default_factory=dict)
    extra_sequence: list[str] = field(default_factory=list)
    # delta-rs options for the tables' logs (added to those derived from Spark's Hadoop configuration)
    storage_options: dict[str, str] = field(default_factory=dict)
    ignore_null_updates: bool = False
    # Debezium's stand-in for an unchanged TOASTed value (Postgres); never written over real data
    unavailable_value: str | None = debezium.UNAVAILABLE_VALUE
    apply_truncates: bool = False  # Debezium truncates truncate the table (else: dead letter)
    scd_type: int = 1
    track_history_except: list[str] | None = None  # SCD 2; default: the Debezium metadata columns
    # New tables get deletion vectors: an upsert marks replaced rows instead of rewriting files
    deletion_vectors: bool = False
    # New tables record Delta's change data feed, for jobs downstream (jobs/cdf_chain.py)
    change_data_feed: bool = False
    # The local driver JVM's JIT (--jit): auto (c1 with --available-now, else late-c2), late-c2 (C2 only for
    # code that stays hot), tiered (the JVM's default), c1 (C1 only)
    driver_jit: str = "auto"
    # Local defaults a session the job creates leaves at Spark's value (session.LOCAL_DEFAULT_NAMES).
    keep_spark_defaults: tuple[str, ...] = ()
    stop_timeout_s: float = 20.0  # --stop-timeout: how long a running batch may take to finish on SIGTERM
    log_format: str = "text"  # --log-format: text or json


class MalformedRecordsError(StreamingMergeError):
    """Raised with on_malformed='fail' when a batch holds records that cannot be decoded."""


def table_properties(config: ChangeSettings) -> dict[str, str]:
    """The properties new target tables are created with (the job's table flags)."""
    properties = {}
    if config.deletion_vectors:
        properties["delta.enableDeletionVectors"] = "true"
    if config.change_data_feed:
        properties["delta.enableChangeDataFeed"] = "true"
    return properties


def change_options(config: ChangeSettings) -> dict[str, Any]:
    """MergeSink's CDC options for Debezium change events, shared by both job modes."""
    options: dict[str, Any] = {
        "sequence_by": [*config.extra_sequence, *debezium.SEQUENCE_COLUMNS],
        "apply_as_deletes": debezium.DELETE_WHEN, "storage_options": config.storage_options,
        "ignore_null_updates": config.ignore_null_updates, "unavailable_value": config.unavailable_value,
        "stored_as_scd_type": config.scd_type,
        "table_properties": table_properties(config) or None}
    if config.apply_truncates:
        options["apply_as_truncates"] = debezium.TRUNCATE_WHEN
    if config.scd_type == 2:
        # _cdc_op and _cdc_ts_ms change with every event: tracked, every event would be a version.
        options["track_history_except_column_list"] = (config.track_history_except
                                                       if config.track_history_except is not None
                                                       else [debezium.OP, debezium.TS_MS])
    return options


def row_columns(schema: StructType) -> StructType:
    """A table's row-image columns: without the CDC metadata and SCD 2 history columns."""
    return StructType([f for f in schema.fields
                       if f.name not in debezium.METADATA_COLUMNS and f.name not in HISTORY_COLUMNS])


def staged_again_on_lost_blocks(run_once: Callable[[DataFrame, int, str], dict[str, Any]], records: DataFrame,
                                batch_id: int) -> dict[str, Any]:
    """``run_once(records, batch_id, storage_level)`` until it does not lose a block of its
    staged copy, at the next storage level each time (bounded). The sinks cannot heal such a
    loss (their retries re-read the same copy), so the batch is staged again from the Kafka
    records; every commit of the batch is idempotent (Delta txn), so a rerun applies nothing twice."""
    for attempt in range(1, len(DEFAULT_STORAGE_LEVELS) + 1):
        level = level_for_attempt(DEFAULT_STORAGE_LEVELS, attempt)
        try:
            return run_once(records, batch_id, level)
        except Exception as exc:
            if attempt == len(DEFAULT_STORAGE_LEVELS) or not is_lost_block_error(exc):
                raise
            log.warning("Batch %d: the staged copy lost blocks on attempt %d (%s); staging it again from the "
                        "Kafka records", batch_id, attempt, type(exc).__name__)
    raise AssertionError("unreachable: the last attempt returns or raises")


def source_options(config: ChangeSettings, subscription: tuple[str, str], bootstrap_servers: str) -> dict[str, str]:
    """The Kafka source's options of either job mode, the ``kafka.*`` client options included
    (checked: :func:`checked_kafka_options`)."""
    option, value = subscription
    options = {**checked_kafka_options(config.kafka_options, config.source_format),
               "kafka.bootstrap.servers": bootstrap_servers, option: value, "startingOffsets": config.starting_offsets}
    if config.max_offsets_per_trigger:
        options["maxOffsetsPerTrigger"] = str(config.max_offsets_per_trigger)
    return options


def checked_kafka_options(options: Mapping[str, str], source_format: str) -> dict[str, str]:
    """``kafka.*`` client options for ``source_format``; a ValueError names what is wrong: a name
    without the ``kafka.`` prefix, the bootstrap servers (``--bootstrap-servers``), or an option
    only ``kafka_py`` knows given to Spark's connector (which would pass it to the Java client
    as an unknown setting, and ignore it)."""
    if source_format not in SOURCE_FORMATS:
        raise ValueError(f"source format must be one of {', '.join(SOURCE_FORMATS)}, got {source_format!r}")
    for name in options:
        if not name.lower().startswith("kafka.") or name.lower() == "kafka.":
            raise ValueError(f"Kafka option {name!r} must be named kafka.<client setting>, e.g. "
                             "kafka.security.protocol (the names of Spark's Kafka connector)")
        if name.lower() == "kafka.bootstrap.servers":
            raise ValueError("give the bootstrap servers with --bootstrap-servers, not as a Kafka option")
        if source_format == CONNECTOR_FORMAT and name.lower() in KAFKA_PY_ONLY_OPTIONS:
            raise ValueError(f"Kafka option {name!r} {KAFKA_PY_ONLY_OPTIONS[name.lower()]}; Spark's connector "
                             "(--source-format kafka) reads with the Java client: leave it out")
    return dict(options)


def check_broker(config: ChangeSettings, subscription: tuple[str, str], bootstrap_servers: str) -> None:
    """Spark's connector only: fetch the topic list once with the job's options through a
    Python client before the query starts, so wrong credentials or an unreachable broker
    fail the job at once with the broker and the cause named (the connector retries for
    minutes and then names neither). Options only the Java client reads are not checked."""
    try:
        options = KafkaOptions.parse(source_options(config, subscription, bootstrap_servers))
    except KafkaSourceError as exc:
        log.info("Not checking the broker before the query: %s", exc)
        return
    try:
        client = MetadataClient(options.client)
    except KafkaSourceError as exc:
        if options.client.kind == KAFKA_PYTHON:
            raise  # kafka-python connects in its constructor: this is the broker's answer
        log.info("Not checking the broker before the query (an option librdkafka does not take): %s", exc)
        return
    try:
        client.topics()
    finally:
        client.close()


def start_query(spark: SparkSession, config: ChangeSettings, subscription: tuple[str, str],
                function: Callable[[DataFrame, int], None], bootstrap_servers: str,
                checkpoint: str) -> StreamingQuery:
    """The Kafka source → ``foreachBatch(function)`` query of either job mode, started."""
    if config.source_format == SHORT_NAME:
        register(spark)
        mark("source_registered")
    else:
        check_broker(config, subscription, bootstrap_servers)
    records = spark.readStream.format(config.source_format).options(
        **source_options(config, subscription, bootstrap_servers)).load()
    mark("source_loaded")
    writer = records.writeStream.foreachBatch(function).option("checkpointLocation", checkpoint)
    if config.available_now:
        writer = writer.trigger(availableNow=True)
    elif config.processing_time:
        writer = writer.trigger(processingTime=config.processing_time)
    return writer.queryName(f"cdc_ingest:{subscription[1]}").start()


def progress_line(progress: dict[str, Any]) -> str:
    """One human line per batch: what the MERGE did and how long it took (and the consumer lag
    left, when the batch's line has it)."""
    m = progress.get("metrics", {})
    lag = progress.get("consumerLag")
    behind = f" lag={sum(sum(parts.values()) for parts in lag.values())}" if lag is not None else ""
    if progress.get("skipped"):
        return f"[batch {progress.get('batchId')}] skipped (already committed){behind}"
    return (f"[batch {progress.get('batchId')}] {progress.get('target')} v{progress.get('tableVersion')} "
            f"in={progress.get('numInputRows')} malformed={progress.get('malformedRecords', 0)} "
            f"inserted={m.get('numTargetRowsInserted', 0)} updated={m.get('numTargetRowsUpdated', 0)} "
            f"deleted={m.get('numTargetRowsDeleted', 0)} late={progress.get('numLateRowsDropped', 0)} "
            f"files=-{m.get('numTargetFilesRemoved', 0)}/+{m.get('numTargetFilesAdded', 0)} "
            f"{progress.get('durationMs', {}).get('total', 0)}ms{behind}")


def database_line(progress: dict[str, Any]) -> str:
    """One human line per batch of the whole-database job: the Kafka counts, then each table's."""
    lag = progress.get("consumerLag") or {}
    tables = "; ".join(progress_line({k: v for k, v in t.items() if k != "consumerLag"}).split("] ", 1)[-1]
                       for t in progress.get("tables", []))
    return (f"[batch {progress.get('batchId')}] kafka={progress.get('kafkaRecords', 0)} "
            f"malformed={progress.get('malformedRecords', 0)} lag={sum(sum(p.values()) for p in lag.values())}"
            f"{' | ' + tables if tables else ''}")
