"""Decode Debezium JSON change events into CDC rows, in Spark SQL (no Python per row).

Accepted: envelopes with or without the ``{"schema": ..., "payload": ...}`` wrapper.
``op`` c (create), r (snapshot read) and u (update) take the row image from ``after``;
d (delete) from ``before``. ``t`` (truncate) events go to the dead-letter table with that
reason by default; with ``truncates=True`` they come through as events without a row image
(every row column NULL, ``_cdc_op = 't'``) for ``MergeSink(apply_as_truncates=TRUNCATE_WHEN)``,
which truncates the table as of their position. Kafka tombstones (NULL value, emitted after
deletes for log compaction) are skipped.

Every decoded row carries ``_cdc_op``, ``_cdc_position`` (``source.lsn``, else
``source.ts_ms``, else the envelope's ``ts_ms``), ``_cdc_ts_ms`` and the Kafka
coordinates; ``SEQUENCE_COLUMNS`` orders the events of one key (position, then Kafka
partition and offset as tie-breakers). Anything that cannot be decoded comes back in the
second frame with the raw bytes and the reason, never dropped.

How a record is parsed, and why. JSON parsing is the cost of ingestion (one untyped parse
of the wrapper, one of the envelope and one of the row image ran at 16–20k records/s, and
Spark's optimizer copied those expressions into every consumer: 76–120 ``from_json`` per
executed plan). So a record is parsed **once**, by one ``from_json`` whose schema types
everything at once: the wrapper's ``payload`` and the bare envelope side by side, each with
``before``/``after`` typed as the row schema. When that parse is clean (the common case)
it decides everything. Only a record it rejects (the parser's corrupt-record column is set:
not JSON, or some field of the wrong type, possibly one that the old step-by-step reading
never looks at, such as a ``before`` image of an insert) is read again the step-by-step way,
which keeps every reason and every edge case (a payload given as a JSON string, a mistyped
field outside the envelope) exactly as before. Those fallback parses receive NULL for clean
records, so they cost nothing there.

:func:`decode_batch` is what a streaming job wants: the decode runs in one Spark job into
a local checkpoint, with the counts observed in that job, and the events and the malformed
records are both read from that copy (Kafka is read and JSON parsed once per record).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql import Column, DataFrame, Observation, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StringType, StructField, StructType

from streaming_merge.kafka.source import KafkaRange
from streaming_merge.merge.materialize import release, storage_level
from streaming_merge.spark.jvm import jvm_class
from streaming_merge.spark.per_context import PerContext
from streaming_merge.table.driver_rows import driver_rows

log = logging.getLogger(__name__)

__all__ = [
    "DEAD_LETTER_COLUMNS",
    "DELETE_WHEN",
    "INLINE_DEAD_LETTER_BYTES",
    "METADATA_COLUMNS",
    "OFFSET",
    "OP",
    "PARTITION",
    "POSITION",
    "SEQUENCE_COLUMNS",
    "TS_MS",
    "DecodedBatch",
    "decode",
    "decode_batch",
    "infer_row_schema",
    "prepare_decode",
]

# Debezium's default unavailable.value.placeholder: a TOASTed value the update did not change.
UNAVAILABLE_VALUE = "__debezium_unavailable_value"
OP = "_cdc_op"
POSITION = "_cdc_position"
TS_MS = "_cdc_ts_ms"
PARTITION = "_kafka_partition"
OFFSET = "_kafka_offset"
SEQUENCE_COLUMNS = (POSITION, PARTITION, OFFSET)
DELETE_WHEN = f"{OP} = 'd'"
TRUNCATE_WHEN = f"{OP} = 't'"
METADATA_COLUMNS = (OP, POSITION, TS_MS, PARTITION, OFFSET)
DEAD_LETTER_COLUMNS = ("key", "value", "error", "topic", "partition", "offset", "recorded_at")
# A malformed record whose key and value hold at most this many bytes reaches the dead letter
# from the batch job's observation (the driver receives it with the job's result); a larger
# one is read from Kafka again by its offset, so that a batch of large malformed records does
# not travel through the driver.
INLINE_DEAD_LETTER_BYTES = 16 * 1024

_CORRUPT = "__corrupt"
# PERMISSIVE from_json returns a struct of NULLs (not NULL) for text that is not JSON or
# whose values do not fit the schema; the corrupt-record column is how we can tell.
_PARSE = {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": _CORRUPT}
_WRAPPER = "struct<schema: string, payload: string>"
_ENVELOPE = ("struct<before: string, after: string, op: string, ts_ms: long, "
             f"source: struct<lsn: long, ts_ms: long>, {_CORRUPT}: string>")
_SOURCE = StructType([StructField("lsn", LongType()), StructField("ts_ms", LongType())])

# Columns of the staged (decoded, materialized) frame. Prefixed so that no row column
# (a table may well have columns named key, value or offset) can collide with them.
_KEY, _VALUE, _TOPIC, _PARTITION, _OFFSET = "__dbz_key", "__dbz_value", "__dbz_topic", "__dbz_partition", "__dbz_offset"
_TOMBSTONE, _ERROR, _IMAGE = "__dbz_tombstone", "__dbz_error", "__dbz_image"
_FAST, _SLOW_TEXT, _SLOW_ENV, _SLOW_IMAGE_JSON, _SLOW_IMAGE = (
    "__dbz_fast", "__dbz_slow_text", "__dbz_slow_env", "__dbz_slow_image_json", "__dbz_slow_image")
_ENV_BAD, _IMAGE_MISSING, _IMAGE_BAD = "__dbz_env_bad", "__dbz_image_missing", "__dbz_image_bad"

NOT_AN_ENVELOPE = "value is not a JSON Debezium envelope"
NO_OP = "envelope has no 'op' field"
TRUNCATE = "truncate event: not applied (apply truncates with --apply-truncates / decode(truncates=True))"
IMAGE_MISMATCH = "row image does not match the table schema"


@dataclass(frozen=True)
class DecodedBatch:
    """One micro-batch of Kafka records decoded once into a local checkpoint (``staged``);
    ``events`` and ``malformed`` are projections of that copy, so using both (and reading
    either several times) never reads Kafka or parses JSON again. The counts were observed
    in the job that wrote the copy. Call :meth:`release` when the batch is done."""

    staged: DataFrame
    events: DataFrame
    malformed: DataFrame
    num_records: int
    num_tombstones: int
    num_malformed: int

    @property
    def num_events(self) -> int:
        return self.num_records - self.num_tombstones - self.num_malformed

    def release(self) -> None:
        """Drop the checkpoint's blocks now rather than at garbage collection."""
        release(self.staged)


def decode_batch(records: DataFrame, row_schema: StructType, keys: Sequence[str] = (),
                 storage_level_name: str = "DISK_ONLY", truncates: bool = False) -> DecodedBatch:
    """Decode ``records`` (the Kafka source's key/value/topic/partition/offset) in one Spark
    job into a local checkpoint at ``storage_level_name``, counting records, tombstones and
    malformed records in the same job (``DataFrame.observe``).

    ``keys``: row images with NULL in one of these columns are malformed too (they cannot be
    merged, and the dead-letter table keeps their raw bytes). ``truncates``: truncate events
    are events (without a row image) rather than malformed records."""
    plan = _plan_for(records, row_schema, keys, truncates)
    observation = Observation()
    observed = plan.stage(records).observe(observation, *plan.counts)
    # Tombstones are counted above, then dropped before the copy is written.
    frame = observed.filter(plan.not_tombstone).drop(_TOMBSTONE).localCheckpoint(
        eager=True, storageLevel=storage_level(storage_level_name))
    counts = {name: int(observation.get[name] or 0) for name in ("records", "tombstones", "malformed")}
    log.debug("Decoded %s", counts)
    return DecodedBatch(staged=frame, events=plan.events(frame), malformed=plan.malformed(frame),
                        num_records=counts["records"], num_tombstones=counts["tombstones"],
                        num_malformed=counts["malformed"])


@dataclass(frozen=True)
class ObservedDecode:
    """Kafka records decoded inside whatever job first reads ``events`` (a sink's own copy of
    the batch), their counts observed there: no Spark job and no copy of the decode's own.
    The counts may be asked once a job has read ``events``, never before (they would wait).

    The same job observes the malformed records themselves (raw bytes, reason, coordinates)
    when a record's key and value hold at most ``INLINE_DEAD_LETTER_BYTES``: their dead letters
    are written from those values, without reading Kafka or decoding again. Only a larger one
    is named by its coordinates (``malformed_ranges``) and read again."""

    events: DataFrame
    observation: Observation
    plan: _DecodePlan

    def counts(self) -> tuple[int, int, int]:
        """(records, tombstones, malformed records) of the batch."""
        observed = self.observation.get
        return int(observed["records"] or 0), int(observed["tombstones"] or 0), int(observed["malformed"] or 0)

    def malformed_ranges(self) -> list[KafkaRange]:
        """Where the batch's malformed records too large to be observed are, as the least range
        of each partition that holds them (none in the common case)."""
        bounds: dict[tuple[str, int], tuple[int, int]] = {}
        for topic, partition, offset in self.observation.get["malformedAt"] or []:
            low, high = bounds.get((topic, partition), (offset, offset))
            bounds[(topic, partition)] = (min(low, offset), max(high, offset))
        return [KafkaRange(topic, partition, low, high + 1)
                for (topic, partition), (low, high) in sorted(bounds.items())]

    def observed_malformed(self, spark: SparkSession) -> DataFrame:
        """The malformed records observed in the batch's job (dead-letter columns), held by the
        driver: no Kafka read, no decode, and an append writes them without a Spark job."""
        rows = self.observation.get["malformedRows"] or []
        columns = list(zip(*rows, strict=True)) if rows else [()] * 6
        arrow = pa.table([pa.array([None if v is None else bytes(v) for v in columns[0]], pa.binary()),
                          pa.array([None if v is None else bytes(v) for v in columns[1]], pa.binary()),
                          pa.array(columns[2], pa.string()), pa.array(columns[3], pa.string()),
                          pa.array(columns[4], pa.int32()), pa.array(columns[5], pa.int64()),
                          pa.array([dt.datetime.now(dt.UTC)] * len(rows), pa.timestamp("us", tz="UTC"))],
                         names=list(DEAD_LETTER_COLUMNS))
        return driver_rows(spark, arrow)

    def malformed(self, records: DataFrame) -> DataFrame:
        """The malformed ones of ``records`` (the ranges of :meth:`malformed_ranges`, read again)
        that were too large to be observed, decoded again (dead-letter columns)."""
        return self.plan.malformed(self.plan.decoded(records)).filter(~_inline(F.col("key"), F.col("value")))


def decode_observed(records: DataFrame, row_schema: StructType, keys: Sequence[str] = (),
                    truncates: bool = False) -> ObservedDecode:
    """:func:`decode_batch` without its job: the events as a plan that decodes while its
    reader's job runs, counting records, tombstones and malformed records (and noting where
    the malformed ones are) as it goes. A streaming job then runs one Spark job, one copy and
    one pass of the driver's planning less per batch than a decode checkpoint that its sink
    copies again."""
    plan = _plan_for(records, row_schema, keys, truncates)
    observation = Observation()
    staged = plan.stage(records).observe(observation, *plan.counts, *plan.malformed_observed).filter(
        plan.not_tombstone)
    return ObservedDecode(events=plan.events(staged), observation=observation, plan=plan)


def decode(records: DataFrame, row_schema: StructType, keys: Sequence[str] = (), truncates: bool = False
           ) -> tuple[DataFrame, DataFrame]:
    """(events, malformed) from Kafka records, lazily: each action on either frame decodes
    the records again. Streaming jobs use :func:`decode_batch`."""
    plan = _plan_for(records, row_schema, keys, truncates)
    decoded = plan.decoded(records)
    return plan.events(decoded), plan.malformed(decoded)


Step = Callable[[DataFrame], DataFrame]


@dataclass(frozen=True)
class _DecodePlan:
    """The decode's DataFrame operations with their expressions already built: building them
    takes about 650 Python→JVM round trips (~170 ms on the driver for a row of 8 columns),
    which every micro-batch of a stream would pay again for the same schema."""

    stage: Step
    events: Step
    malformed: Step
    counts: list[Column]
    malformed_observed: list[Column]  # the malformed records, for decode_observed
    not_tombstone: Column

    def decoded(self, records: DataFrame) -> DataFrame:
        """``records`` decoded, tombstones dropped: what ``events`` and ``malformed`` select from."""
        return self.stage(records).filter(self.not_tombstone)


_PLANS: PerContext[_DecodePlan] = PerContext()


def prepare_decode(spark: SparkSession, row_schema: StructType, keys: Sequence[str] = (),
                   truncates: bool = False) -> None:
    """Build the decode plan of :func:`decode_batch` ahead of the first batch (a job that
    knows its row schema at start does it while its query starts): its hundreds of
    Python→JVM round trips take seconds in a JVM that has not run them yet."""
    _plan_in(spark.sparkContext, row_schema, keys, truncates)


def _plan_for(records: DataFrame, row_schema: StructType, keys: Sequence[str], truncates: bool) -> _DecodePlan:
    """The plan for this row schema, keys and truncate handling: built by the first batch
    (or :func:`prepare_decode`), kept for the next ones."""
    return _plan_in(records.sparkSession.sparkContext, row_schema, keys, truncates)


def _plan_in(context: Any, row_schema: StructType, keys: Sequence[str], truncates: bool) -> _DecodePlan:
    return _PLANS.get(context, (row_schema.json(), tuple(keys), truncates),
                      lambda: _DecodePlan(
                          stage=_stage(row_schema, keys, truncates), events=_events(row_schema),
                          malformed=_malformed(),
                          counts=[F.count(F.lit(1)).alias("records"),
                                  F.count(F.when(F.col(_TOMBSTONE), 1)).alias("tombstones"),
                                  F.count(F.when(F.col(_ERROR).isNotNull(), 1)).alias("malformed")],
                          malformed_observed=_malformed_observed(),
                          not_tombstone=~F.col(_TOMBSTONE)))


def _inline(key: Column, value: Column) -> Column:
    """Whether a record is small enough for its dead letter to travel in the batch's observation."""
    size = F.coalesce(F.octet_length(key), F.lit(0)) + F.coalesce(F.octet_length(value), F.lit(0))
    return size <= F.lit(INLINE_DEAD_LETTER_BYTES)


def _malformed_observed() -> list[Column]:
    """The malformed records of the batch, observed in its job: the small ones whole (the
    dead-letter columns but ``recorded_at``), the others by their coordinates alone."""
    bad = F.col(_ERROR).isNotNull()
    small = _inline(F.col(_KEY), F.col(_VALUE))
    whole = F.struct(*[F.col(source).alias(name) for source, name in zip(
        (_KEY, _VALUE, _ERROR, _TOPIC, _PARTITION, _OFFSET), DEAD_LETTER_COLUMNS, strict=False)])
    return [F.collect_list(F.when(bad & small, whole)).alias("malformedRows"),
            F.collect_list(F.when(bad & ~small, F.struct(F.col(_TOPIC), F.col(_PARTITION), F.col(_OFFSET))))
            .alias("malformedAt")]


def _events(row_schema: StructType) -> Step:
    is_event = F.col(_ERROR).isNull()
    columns = [*[F.col(_IMAGE).getField(f.name).alias(f.name) for f in row_schema.fields],
               F.col(OP), F.col(POSITION), F.col(TS_MS), F.col(_PARTITION).alias(PARTITION),
               F.col(_OFFSET).alias(OFFSET)]
    return lambda staged: staged.filter(is_event).select(*columns)


def _malformed() -> Step:
    is_malformed = F.col(_ERROR).isNotNull()
    columns = [F.col(_KEY).alias("key"), F.col(_VALUE).alias("value"), F.col(_ERROR).alias("error"),
               F.col(_TOPIC).alias("topic"), F.col(_PARTITION).alias("partition"),
               F.col(_OFFSET).alias("offset"), F.current_timestamp().alias("recorded_at")]
    return lambda staged: staged.filter(is_malformed).select(*columns)


def _typed_envelope(image: StructType) -> list[StructField]:
    return [StructField("before", image), StructField("after", image), StructField("op", StringType()),
            StructField("ts_ms", LongType()), StructField("source", _SOURCE)]


def _stage(row_schema: StructType, keys: Sequence[str], truncates: bool = False) -> Step:
    """Decoded records, one row per Kafka record: Kafka coordinates, a tombstone flag, the
    error (NULL for a change event), the typed row image and the CDC metadata columns.

    Each parse is its own projected column and later steps refer to it by name, so Spark
    does not copy a ``from_json`` into every expression that uses its result (it keeps a
    projection of a costly expression instead of inlining it where it is used twice)."""
    image_type = StructType([StructField(f.name, f.dataType, True, f.metadata) for f in row_schema.fields])
    envelope_fields = _typed_envelope(image_type)
    typed = StructType([StructField("payload", StructType(envelope_fields)), *envelope_fields,
                        StructField(_CORRUPT, StringType())])
    image_with_corrupt = StructType([*image_type.fields, StructField(_CORRUPT, StringType())])

    parsed = [
        F.col("key").alias(_KEY), F.col("value").alias(_VALUE), F.col("topic").alias(_TOPIC),
        F.col("partition").alias(_PARTITION), F.col("offset").alias(_OFFSET),
        F.col("value").isNull().alias(_TOMBSTONE),
        F.from_json(F.col("value").cast("string"), typed, _PARSE).alias(_FAST)]
    everything = F.col("*")
    fast = F.col(_FAST)
    fast_ok = fast.isNotNull() & fast.getField(_CORRUPT).isNull()
    # The step-by-step reading, fed only records the typed parse rejected (else NULL).
    slow_text = F.when(~fast_ok, F.col(_VALUE).cast("string")).alias(_SLOW_TEXT)
    text = F.col(_SLOW_TEXT)
    payload = F.coalesce(F.from_json(text, _WRAPPER).getField("payload"), text)
    slow_env = F.from_json(payload, _ENVELOPE, _PARSE).alias(_SLOW_ENV)
    env = F.col(_SLOW_ENV)
    slow_image_json = (F.when(env.getField("op") == "d", env.getField("before"))
                       .otherwise(env.getField("after")).alias(_SLOW_IMAGE_JSON))
    slow = F.from_json(F.col(_SLOW_IMAGE_JSON), image_with_corrupt, _PARSE).alias(_SLOW_IMAGE)

    # One envelope view over both readings.
    wrapped = fast.getField("payload").isNotNull()

    def fast_field(name: str) -> Column:
        return F.when(wrapped, fast.getField("payload").getField(name)).otherwise(fast.getField(name))

    fast_op = fast_field("op")
    fast_image = F.when(fast_op == "d", fast_field("before")).otherwise(fast_field("after"))
    slow_image = F.col(_SLOW_IMAGE)
    source = F.when(fast_ok, fast_field("source")).otherwise(env.getField("source"))
    ts_ms = F.when(fast_ok, fast_field("ts_ms")).otherwise(env.getField("ts_ms"))
    coordinates = [F.col(c) for c in (_KEY, _VALUE, _TOPIC, _PARTITION, _OFFSET, _TOMBSTONE)]
    normalized = [
        *coordinates,
        F.when(fast_ok, fast_op).otherwise(env.getField("op")).alias(OP),
        F.when(fast_ok, fast_image).otherwise(slow_image.dropFields(_CORRUPT)).alias(_IMAGE),
        F.coalesce(source.getField("lsn"), source.getField("ts_ms"), ts_ms).alias(POSITION),
        ts_ms.alias(TS_MS),
        # A clean typed parse has a well-formed envelope and a well-typed image by
        # construction; only records read step by step can fail those two checks.
        (~fast_ok & (env.isNull() | env.getField(_CORRUPT).isNotNull())).alias(_ENV_BAD),
        F.when(fast_ok, fast_image.isNull()).otherwise(F.col(_SLOW_IMAGE_JSON).isNull()).alias(_IMAGE_MISSING),
        (~fast_ok & (slow_image.isNull() | slow_image.getField(_CORRUPT).isNotNull())).alias(_IMAGE_BAD),
    ]
    classified = [*coordinates, *[F.col(c) for c in (_IMAGE, OP, POSITION, TS_MS)],
                  F.when(~F.col(_TOMBSTONE), _error(F.col(OP), F.col(_IMAGE), keys, truncates)).alias(_ERROR)]
    # Only dead letters need the raw bytes: the copy of a change event does not keep them.
    bad = F.col(_ERROR).isNotNull()
    result = [F.when(bad, F.col(_KEY)).alias(_KEY), F.when(bad, F.col(_VALUE)).alias(_VALUE),
              *[F.col(c) for c in (_TOPIC, _PARTITION, _OFFSET, _TOMBSTONE, _ERROR, _IMAGE, OP, POSITION, TS_MS)]]

    def stage(records: DataFrame) -> DataFrame:
        return (records.select(*parsed)
                .select(everything, slow_text)
                .select(everything, slow_env)
                .select(everything, slow_image_json)
                .select(everything, slow)
                .select(*normalized)
                .select(*classified)
                .select(*result))

    return stage


def _error(op: Column, image: Column, keys: Sequence[str], truncates: bool = False) -> Column:
    """The reason a record cannot be applied (NULL for a change event), first match wins,
    in the order and with the texts the dead-letter table has always used. A truncate to
    apply is an event: no image, no key."""
    null_key = F.lit(False)
    for key in keys:
        null_key = null_key | image.getField(key).isNull()
    return (
        F.when(F.col(_ENV_BAD), F.lit(NOT_AN_ENVELOPE))
        .when(op.isNull(), F.lit(NO_OP))
        .when(op == "t", F.lit(None).cast("string") if truncates else F.lit(TRUNCATE))
        .when(~op.isin("c", "r", "u", "d"), F.concat(F.lit("unknown op '"), op, F.lit("'")))
        .when(F.col(_IMAGE_MISSING),
              F.concat(F.lit("op '"), op, F.lit("' without a row image ('after' for c/r/u, 'before' for d)")))
        .when(F.col(_IMAGE_BAD), F.lit(IMAGE_MISMATCH))
        .when(null_key, F.lit(f"row image has NULL in key column(s) {', '.join(keys)}"))
    )


def infer_row_schema(records: DataFrame) -> StructType:
    """Row schema inferred (once, for a new table) from the row images of a batch."""
    text = F.col("value").cast("string")
    wrapped = F.from_json(text, _WRAPPER)
    payload = F.when(wrapped.getField("payload").isNotNull(), wrapped.getField("payload")).otherwise(text)
    envelope = F.from_json(payload, _ENVELOPE)
    images = records.select(F.coalesce(envelope.getField("after"), envelope.getField("before")).alias("j")) \
        .filter(F.col("j").isNotNull())
    spark = records.sparkSession
    as_strings = getattr(images._jdf, "as")(jvm_class(spark, "org.apache.spark.sql.Encoders").STRING())
    inferred = StructType.fromJson(json.loads(spark._jsparkSession.read().json(as_strings).schema().json()))
    return StructType([f for f in inferred.fields if f.name != "_corrupt_record"])
