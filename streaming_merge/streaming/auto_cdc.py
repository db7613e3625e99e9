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

``once=True`` is Databricks' one-time flow (a backfill, an initial hydration): the source is a
batch DataFrame or table, applied as one batch, exactly once per ``name`` (the sink's txn app id,
batch 0), and skipped on every later call with that name; there is no query, so the call
returns the batch's :class:`MergeProgress` (``skipped=True`` when an earlier call applied it).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from streaming_merge.errors import InvalidArgumentError
from streaming_merge.spark.conf import temporary_conf
from streaming_merge.streaming.arguments import ColumnArg, ScdType
from streaming_merge.streaming.progress import MergeProgress
from streaming_merge.streaming.sink import MergeSink

log = logging.getLogger(__name__)

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
    once: bool = False,
    spark: SparkSession | None = None,
    **sink_options: Any,
) -> StreamingQuery | MergeProgress:
    """Start a streaming query that applies the change events of ``source`` to the Delta table
    at ``target`` with AUTO CDC's semantics (a :class:`MergeSink` per micro-batch, exactly
    once), and return it; with ``once=True`` apply a batch source one time and return what that
    did (below).

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

    ``once=True`` (Databricks' one-time flow, e.g. a backfill or initial hydration beside a live
    flow into the same target): ``source`` is a batch DataFrame, or the name of a table or view
    read as a batch; its events are applied as one batch (batch id 0 of the app id ``name``,
    default the ``target`` string: name each backfill of one target differently, and never a
    live flow like a backfill). It runs in this call, which returns the batch's
    :class:`MergeProgress`; a later call with the same name finds txn(name, 0) in the table and
    does nothing but return a progress with ``skipped=True`` (and log that it skipped). Events
    older than the table's rows (or than a remembered delete) are dropped as in any batch, so a
    backfill run after a live flow never overwrites what the live flow wrote. ``trigger`` and
    ``checkpoint_location`` mean nothing here and are refused; ``spark_conf`` applies to the
    session while the call runs. A target deleted and created again has no txn: the flow runs
    again (as Databricks reruns a one-time flow on a full refresh).
    """
    if "app_id" in sink_options and name is not None:
        raise InvalidArgumentError("Pass name=... or app_id=..., not both: the flow's name is the sink's app_id.")
    if once:
        if trigger is not None or checkpoint_location is not None:
            raise InvalidArgumentError(
                "once=True applies a batch source one time, in this call: it takes no trigger and no "
                             "checkpoint_location")
        frame = _batch_frame(source, spark)
        if name is None and "app_id" not in sink_options:
            name = target.rstrip("/") or target
    else:
        frame = _streaming_frame(source, spark)
    sink = MergeSink(
        target, keys, sequence_by=sequence_by, apply_as_deletes=apply_as_deletes,
        apply_as_truncates=apply_as_truncates, column_list=column_list, except_column_list=except_column_list,
        stored_as_scd_type=stored_as_scd_type, track_history_column_list=track_history_column_list,
        track_history_except_column_list=track_history_except_column_list, ignore_null_updates=ignore_null_updates,
        ignore_null_updates_column_list=ignore_null_updates_column_list,
        ignore_null_updates_except_column_list=ignore_null_updates_except_column_list,
        **({"app_id": name} if name is not None else {}), **sink_options)  # type: ignore[arg-type]
    if once:
        return _run_once(sink, frame, spark_conf or {})
    writer = frame.writeStream.foreachBatch(sink).option(
        "checkpointLocation", checkpoint_location or f"{target.rstrip('/')}_checkpoints/{name or 'default'}")
    if name is not None:
        writer = writer.queryName(name)
    if trigger is not None:
        writer = writer.trigger(**_trigger(trigger))
    with _query_settings(frame.sparkSession, spark_conf or {}):
        return writer.start()


def _run_once(sink: MergeSink, frame: DataFrame, spark_conf: Mapping[str, str]) -> MergeProgress:
    """Apply ``frame`` as batch 0 of the sink's app id, or skip it when an earlier run did."""
    with _query_settings(frame.sparkSession, spark_conf):
        sink(frame, 0)
    progress = sink.progress_for(0)
    assert progress is not None
    if progress.skipped:
        log.info("One-time flow %r into %s already ran (txn %r in the table); skipped", progress.appId, sink.target,
                 progress.appId)
    return progress


def _batch_frame(source: DataFrame | str, spark: SparkSession | None = None) -> DataFrame:
    """A once flow's source as a batch DataFrame: as given, or the table or view it names."""
    if isinstance(source, str):
        spark = spark or SparkSession.builder.getOrCreate()
        source = spark.table(source)
    if not isinstance(source, DataFrame):
        raise InvalidArgumentError(
            f"source must be a DataFrame or the name of a table or view, got {type(source).__name__}")
    if source.isStreaming:
        raise InvalidArgumentError(
            "once=True needs a batch source (spark.read... or a table), as Databricks' one-time flows "
                         "do; for a stream that should stop when it has read what is there, use "
                         "trigger={'availableNow': True}")
    return source


def _streaming_frame(source: DataFrame | str, spark: SparkSession | None = None) -> DataFrame:
    """The source as a streaming DataFrame: as given, or the streaming view or table it names."""
    if isinstance(source, str):
        spark = spark or SparkSession.builder.getOrCreate()
        frame = spark.table(source)
        if not frame.isStreaming:
            frame = spark.readStream.table(source)
        return frame
    if not isinstance(source, DataFrame):
        raise InvalidArgumentError(f"source must be a streaming DataFrame or the name of a streaming view or table, "
                         f"got {type(source).__name__}")
    if not source.isStreaming:
        raise InvalidArgumentError(
            "create_auto_cdc_flow needs a streaming source (spark.readStream...); to apply a batch "
                         "DataFrame one time (a backfill), pass once=True.")
    return source


def _trigger(trigger: Mapping[str, Any]) -> dict[str, Any]:
    if len(trigger) != 1 or next(iter(trigger)) not in _TRIGGERS:
        raise InvalidArgumentError(
            f"trigger must be one of {{'processingTime': '10 seconds'}}, {{'availableNow': True}} or "
                         f"{{'once': True}}, got {dict(trigger)!r} (foreachBatch has no continuous mode)")
    return dict(trigger)


def _query_settings(spark: SparkSession, settings: Mapping[str, Any]) -> contextlib.AbstractContextManager[None]:
    """SQL settings on ``spark`` while the query starts: starting copies the session for the
    stream (with its settings then), so the stream keeps them and the session gets its own back."""
    return temporary_conf(spark, {key: str(value) for key, value in settings.items()})
