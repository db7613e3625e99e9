"""Idempotent blind appends of a micro-batch's side rows (tombstones, dead letters): write +
commit with a txn."""

from __future__ import annotations

import datetime as dt

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from streaming_merge.errors import DeltaTableError
from streaming_merge.table.commit import CommitRequest, commit
from streaming_merge.table.create import create_table
from streaming_merge.table.driver_rows import delete_from_driver, held_rows, write_from_driver
from streaming_merge.table.location import TableLocation, TableRef, resolve
from streaming_merge.table.snapshot import Snapshot, check_writable, load_snapshot, table_exists
from streaming_merge.table.write import WrittenFile, delete_written, write_files


def recorded_now(now: dt.datetime | None = None) -> Column:
    """The current time (UTC, microseconds) for a side row's "recorded at" column, as an
    expression that does not change Spark's generated code from one micro-batch to the next.

    ``current_timestamp()`` becomes a timestamp literal, which whole-stage codegen writes into
    the generated Java source as a number: every append then compiles a new class (Janino) and
    the JIT compiles it again, for the same plan. A string literal reaches the generated code
    by reference instead. The optimizer folds or pushes a cast into a CASE, so the string is
    parsed by ``to_timestamp`` with a format (which it leaves alone), behind a condition on the
    task's partition (never false) that keeps the whole from being folded into a literal."""
    text = (now or dt.datetime.now(dt.UTC)).astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return F.to_timestamp(F.when(F.spark_partition_id() >= 0, F.lit(text)), _RECORDED_FORMAT)


_RECORDED_FORMAT = "yyyy-MM-dd'T'HH:mm:ss.SSSSSSX"


def append_rows(spark: SparkSession, df: DataFrame, path: TableRef, app_id: str, version: int,
                snapshot: Snapshot | None = None) -> int | None:
    """Append ``df`` to the table at ``path`` (created from ``df``'s schema if missing) unless
    txn(app_id) >= version is already recorded; returns the new version or None if skipped.
    ``snapshot``: the table as the caller already read it (saves a log load)."""
    location = resolve(path, spark)
    if snapshot is None:
        if not table_exists(location):
            _create_unless_created_meanwhile(spark, df, location)
        snapshot = load_snapshot(location)
    check_writable(snapshot)
    applied = snapshot.transaction_version(app_id)
    if applied is not None and applied >= version:
        return None
    held = held_rows(df, snapshot)
    if held is not None:  # rows the driver holds: one file, no Spark job
        if not held.num_rows:
            return _commit_append(snapshot, [], app_id, version)
        file, store = write_from_driver(location, held, snapshot.schema)
        try:
            return _commit_append(snapshot, [file], app_id, version)
        except BaseException:
            delete_from_driver(store, file)
            raise
    # One file per append: these are a micro-batch's side rows (its deletes, its dead letters),
    # few, and written with the batch's partitioning they made one tiny file per partition,
    # which every later tombstone lookup had to open.
    # Reordered only when needed: the select costs round trips to the JVM for every column.
    names = [f.name for f in snapshot.schema.fields]
    rows = df.coalesce(1)
    written = write_files(spark, rows if df.columns == names else rows.select(*[f"`{n}`" for n in names]),
                          location, snapshot.schema, snapshot.partition_columns)
    try:
        return _commit_append(snapshot, written, app_id, version)
    except BaseException:
        delete_written(spark, location, written)
        raise


def _commit_append(snapshot: Snapshot, written: list[WrittenFile], app_id: str, version: int) -> int:
    return commit(CommitRequest(snapshot=snapshot, adds=written, removes=[], operation="WRITE",
                                operation_parameters={"mode": "Append"},
                                operation_metrics={"numFiles": len(written),
                                                   "numOutputRows": sum(w.num_records for w in written)},
                                app_id=app_id, app_version=version))


def _create_unless_created_meanwhile(spark: SparkSession, df: DataFrame, location: TableLocation) -> None:
    """Create the side table, empty, with ``df``'s schema; when another writer created it
    between our existence check and our commit (two streaming queries sharing one dead-letter
    table, each appending its first malformed records), append to theirs instead of failing."""
    try:
        create_table(spark, df.limit(0), location)
    except DeltaTableError:
        if not table_exists(location):
            raise
