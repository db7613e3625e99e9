"""Rows a MergeSink cannot apply: those whose key is NULL go to its dead-letter table (with
the reason and the record as JSON), or fail the batch naming them; events without a sequence
value fail an SCD type 2 batch."""

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


def refuse_unsequenced(spec: CdcSpec, scd_type: int, target: str, batch_id: int, count: int) -> None:
    """SCD type 2 opens and closes every version at an event's sequence value, so an event (or a
    truncate) without one has no place in the history; dropping it would lose a change without
    a word. Type 1 orders such an event before every value instead (docs/guides/streaming-sink.md).
    Raised before anything of the batch is written, the dead-letter table included."""
    if scd_type != 2 or not count:
        return
    raise MergeError(
        f"Batch {batch_id}: {count} event(s) have a NULL sequence_by value ({', '.join(spec.sequence_by)}); "
        f"stored_as_scd_type=2 starts and ends every version of `{target}` at a sequence value, so they "
        f"cannot be applied; nothing was written. Give every event a sequence value or filter these "
        f"events out before the sink.")
