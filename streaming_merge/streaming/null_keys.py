"""Rows whose key is NULL cannot be applied to a keyed table: a MergeSink sends them to its
dead-letter table (with the reason and the record as JSON), or fails the batch naming them."""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from streaming_merge.errors import MergeError
from streaming_merge.streaming.cdc import DELETE_FLAG, NULL_KEY_FLAG, CdcSpec
from streaming_merge.table.append import append_rows
from streaming_merge.table.location import TableLocation


def route_null_keys(spark: SparkSession, spec: CdcSpec | None, dead_letter: TableLocation | None, target: str,
                    batch: DataFrame, batch_id: int, app_id: str, count: int) -> int:
    """Rows with a NULL key cannot be applied: to the dead-letter table, or fail the batch."""
    if spec is None or not count:
        return 0
    bad = batch.filter(F.col(NULL_KEY_FLAG)).drop(NULL_KEY_FLAG, DELETE_FLAG)
    if dead_letter is None:
        raise MergeError(
            f"Batch {batch_id}: {count} row(s) have NULL in key column(s) {list(spec.keys)} and cannot be "
            f"applied to `{target}`; nothing was written. Configure dead_letter='<path>' to divert them.")
    records = bad.select(
        F.lit(app_id).alias("app_id"), F.lit(batch_id).cast("long").alias("batch_id"),
        F.lit(f"NULL in key column(s) {', '.join(spec.keys)}").alias("reason"),
        F.to_json(F.struct(*[F.col(f"`{c}`") for c in bad.columns])).alias("record"),
        F.current_timestamp().alias("recorded_at"))
    append_rows(spark, records, dead_letter, app_id, batch_id)
    return count

