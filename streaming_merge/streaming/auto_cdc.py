"""``create_auto_cdc_flow``: AUTO CDC in one call, a MergeSink started as a streaming query.

Spark 4.3's ``pyspark.pipelines.create_auto_cdc_flow`` and Databricks' AUTO CDC declare a
flow inside a pipeline, which the pipeline's server then runs; there is no pipeline here, so
the call builds the sink and starts ``source.writeStream.foreachBatch(sink)`` itself and
returns the StreamingQuery. It takes the same arguments under the same names, so a
documented AUTO CDC call runs with the import changed and ``target`` a table path (the
pipeline's table name has no meaning here): ``source`` is the streaming DataFrame, or the
name of a streaming temporary view or table (Databricks' ``source="users"`` names a view of
the pipeline). What only a pipeline can provide is replaced by arguments of the query:
``checkpoint_location`` (default ``<target>_checkpoints/<name>``, beside the table as its
tombstones are) and ``trigger``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from streaming_merge.streaming.arguments import ColumnArg, ScdType
from streaming_merge.streaming.sink import MergeSink

_TRIGGERS = ("processingTime", "availableNow", "once")


def create_auto_cdc_flow(
    source: DataFrame | str,
    *,
    target: str,
    keys: ColumnArg | Sequence[ColumnArg],
    sequence_by: ColumnArg | Sequence[ColumnArg],
    apply_as_deletes: str | Column | None = None,
    apply_as_truncates: str | Column | None = None,
    column_list: Sequence[ColumnArg] | None = None,
    except_column_list: Sequence[ColumnArg] | None = None,
    stored_as_scd_type: ScdType = 1,
    name: str | None = None,
    track_history_column_list: Sequence[ColumnArg] | None = None,
    track_history_except_column_list: Sequence[ColumnArg] | None = None,
    ignore_null_updates: bool = False,
    ignore_null_updates_column_list: Sequence[ColumnArg] | None = None,
    ignore_null_updates_except_column_list: Sequence[ColumnArg] | None = None,
    spark_conf: Mapping[str, str] | None = None,
    checkpoint_location: str | None = None,
    trigger: Mapping[str, Any] | None = None,
    spark: SparkSession | None = None,
    **sink_options: Any,
) -> StreamingQuery:
    """Start a streaming query that applies the change events of ``source`` to the Delta table
    at ``target`` with AUTO CDC's semantics (a :class:`MergeSink` per micro-batch, exactly
    once), and return it.

    The AUTO CDC arguments mean what they mean to ``MergeSink`` (see the README's table
    "AUTO CDC side by side"). ``name``: the query's name and the sink's ``app_id`` (the
    idempotency id in the table's txn; default the query's id, kept in the checkpoint).
    ``spark_conf``: SQL settings for this query only (set while it starts, which copies the
    session's settings for the stream, then restored). ``trigger``: one of
    ``{"processingTime": "10 seconds"}``, ``{"availableNow": True}``, ``{"once": True}``
    (default: Spark's, a micro-batch as soon as the previous one ends). ``spark``: the session
    in which a ``source`` name is looked up (default: the application's default session, not
    PySpark's "active" one, which a running stream's batches may have changed). ``sink_options``:
    any other ``MergeSink`` option (``dead_letter``, ``partition_by``, ``tombstones``, ...).
    """
    if "app_id" in sink_options and name is not None:
        raise ValueError("Pass name=... or app_id=..., not both: the flow's name is the sink's app_id.")
    frame = _streaming_frame(source, spark)
    sink = MergeSink(
        target, keys, sequence_by=sequence_by, apply_as_deletes=apply_as_deletes,
        apply_as_truncates=apply_as_truncates, column_list=column_list, except_column_list=except_column_list,
        stored_as_scd_type=stored_as_scd_type, track_history_column_list=track_history_column_list,
        track_history_except_column_list=track_history_except_column_list, ignore_null_updates=ignore_null_updates,
        ignore_null_updates_column_list=ignore_null_updates_column_list,
        ignore_null_updates_except_column_list=ignore_null_updates_except_column_list,
        **({"app_id": name} if name is not None else {}), **sink_options)
    writer = frame.writeStream.foreachBatch(sink).option(
        "checkpointLocation", checkpoint_location or f"{target.rstrip('/')}_checkpoints/{name or 'default'}")
    if name is not None:
        writer = writer.queryName(name)
    if trigger is not None:
        writer = writer.trigger(**_trigger(trigger))
    with _settings(frame.sparkSession, spark_conf or {}):
        return writer.start()


def _streaming_frame(source: DataFrame | str, spark: SparkSession | None = None) -> DataFrame:
    """The source as a streaming DataFrame: as given, or the streaming view or table it names."""
    if isinstance(source, str):
        spark = spark or SparkSession.builder.getOrCreate()
        frame = spark.table(source)
        if not frame.isStreaming:
            frame = spark.readStream.table(source)
        return frame
    if not isinstance(source, DataFrame):
        raise ValueError(f"source must be a streaming DataFrame or the name of a streaming view or table, "
                         f"got {type(source).__name__}")
    if not source.isStreaming:
        raise ValueError("create_auto_cdc_flow needs a streaming source (spark.readStream...); to apply a batch "
                         "DataFrame once, call a MergeSink directly: MergeSink(...)(df, batch_id).")
    return source


def _trigger(trigger: Mapping[str, Any]) -> dict[str, Any]:
    if len(trigger) != 1 or next(iter(trigger)) not in _TRIGGERS:
        raise ValueError(f"trigger must be one of {{'processingTime': '10 seconds'}}, {{'availableNow': True}} or "
                         f"{{'once': True}}, got {dict(trigger)!r} (foreachBatch has no continuous mode)")
    return dict(trigger)


@contextlib.contextmanager
def _settings(spark: SparkSession, settings: Mapping[str, str]) -> Iterator[None]:
    """SQL settings on ``spark`` while the query starts: starting copies the session for the
    stream (with its settings then), so the stream keeps them and the session gets its own back."""
    before = {key: spark.conf.get(key, None) for key in settings}
    try:
        for key, value in settings.items():
            spark.conf.set(key, str(value))
        yield
    finally:
        for key, value in before.items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)
