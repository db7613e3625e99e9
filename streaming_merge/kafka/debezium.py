"""Decode Debezium JSON change events into CDC rows, in Spark SQL (no Python per row).

Accepted: envelopes with or without the ``{"schema": ..., "payload": ...}`` wrapper.
``op`` c (create), r (snapshot read) and u (update) take the row image from ``after``;
d (delete) from ``before``. ``t`` (truncate) is not applied: truncating the target from
a stream would need a table-wide delete ordered against every partition, so truncate
events go to the dead-letter table with that reason and the query carries on. Kafka
tombstones (NULL value, emitted after deletes for log compaction) are skipped.

Every decoded row carries ``_cdc_op``, ``_cdc_position`` (``source.lsn``, else
``source.ts_ms``, else the envelope's ``ts_ms``), ``_cdc_ts_ms`` and the Kafka
coordinates; ``SEQUENCE_COLUMNS`` orders the events of one key (position, then Kafka
partition and offset as tie-breakers). Anything that cannot be decoded comes back in the
second frame with the raw bytes and the reason, never dropped.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType

OP = "_cdc_op"
POSITION = "_cdc_position"
TS_MS = "_cdc_ts_ms"
PARTITION = "_kafka_partition"
OFFSET = "_kafka_offset"
SEQUENCE_COLUMNS = (POSITION, PARTITION, OFFSET)
DELETE_WHEN = f"{OP} = 'd'"
METADATA_COLUMNS = (OP, POSITION, TS_MS, PARTITION, OFFSET)

_CORRUPT = "__corrupt"
# PERMISSIVE from_json returns a struct of NULLs (not NULL) for text that is not JSON or
# whose values do not fit the schema; the corrupt-record column is how we can tell.
_PARSE = {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": _CORRUPT}
_WRAPPER = "struct<schema: string, payload: string>"
_ENVELOPE = ("struct<before: string, after: string, op: string, ts_ms: long, "
             f"source: struct<lsn: long, ts_ms: long>, {_CORRUPT}: string>")
DEAD_LETTER_COLUMNS = ("key", "value", "error", "topic", "partition", "offset", "recorded_at")


def decode(records: DataFrame, row_schema: StructType, keys: Sequence[str] = ()
           ) -> tuple[DataFrame, DataFrame]:
    """(events, malformed) from Kafka records (the source's key/value/topic/partition/offset).

    ``keys``: row images with NULL in one of these columns are malformed too (they cannot be
    merged, and the dead-letter table keeps their raw bytes)."""
    text = F.col("value").cast("string")
    wrapped = F.from_json(text, _WRAPPER)
    payload = F.when(wrapped.getField("payload").isNotNull(), wrapped.getField("payload")).otherwise(text)
    envelope = F.from_json(payload, _ENVELOPE, _PARSE)
    op = envelope.getField("op")
    image_json = F.when(op == "d", envelope.getField("before")).otherwise(envelope.getField("after"))
    image = F.from_json(image_json, StructType([*row_schema.fields, StructField(_CORRUPT, StringType())]), _PARSE)
    staged = records.filter(F.col("value").isNotNull()).select(
        "*", envelope.alias("__env"), op.alias("__op"), image_json.alias("__image_json"), image.alias("__image"))
    error = _error(F.col("__env"), F.col("__op"), F.col("__image_json"), F.col("__image"), keys)
    staged = staged.withColumn("__error", error)

    events = staged.filter(F.col("__error").isNull()).select(
        *[F.col("__image").getField(f.name).alias(f.name) for f in row_schema.fields],
        F.col("__op").alias(OP),
        F.coalesce(F.col("__env.source.lsn"), F.col("__env.source.ts_ms"), F.col("__env.ts_ms")).alias(POSITION),
        F.col("__env.ts_ms").alias(TS_MS),
        F.col("partition").alias(PARTITION),
        F.col("offset").alias(OFFSET),
    )
    malformed = staged.filter(F.col("__error").isNotNull()).select(
        "key", "value", F.col("__error").alias("error"), "topic", "partition", "offset",
        F.current_timestamp().alias("recorded_at"))
    return events, malformed


def _error(envelope: Column, op: Column, image_json: Column, image: Column, keys: Sequence[str]) -> Column:
    null_key = F.lit(False)
    for key in keys:
        null_key = null_key | image.getField(key).isNull()
    return (
        F.when(envelope.isNull() | envelope.getField(_CORRUPT).isNotNull(),
               F.lit("value is not a JSON Debezium envelope"))
        .when(op.isNull(), F.lit("envelope has no 'op' field"))
        .when(op == "t", F.lit("truncate event: not applied by streaming_merge (see kafka/debezium.py)"))
        .when(~op.isin("c", "r", "u", "d"), F.concat(F.lit("unknown op '"), op, F.lit("'")))
        .when(image_json.isNull(), F.concat(F.lit("op '"), op, F.lit("' without a row image ('after' for c/r/u, "
                                                                        "'before' for d)")))
        .when(image.isNull() | image.getField(_CORRUPT).isNotNull(),
              F.lit("row image does not match the table schema"))
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
    jvm = spark._jvm
    as_strings = getattr(images._jdf, "as")(jvm.org.apache.spark.sql.Encoders.STRING())
    inferred = StructType.fromJson(json.loads(spark._jsparkSession.read().json(as_strings).schema().json()))
    return StructType([f for f in inferred.fields if f.name != "_corrupt_record"])
