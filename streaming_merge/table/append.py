"""Idempotent blind appends of a micro-batch's side rows (tombstones, dead letters): write +
commit with a txn."""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession

from streaming_merge.table.commit import CommitRequest, commit
from streaming_merge.table.create import create_table
from streaming_merge.table.location import TableRef, resolve
from streaming_merge.table.snapshot import Snapshot, check_writable, load_snapshot, table_exists
from streaming_merge.table.write import delete_written, write_files


def append_rows(spark: SparkSession, df: DataFrame, path: TableRef, app_id: str, version: int,
                snapshot: Snapshot | None = None) -> int | None:
    """Append ``df`` to the table at ``path`` (created from ``df``'s schema if missing) unless
    txn(app_id) >= version is already recorded; returns the new version or None if skipped.
    ``snapshot``: the table as the caller already read it (saves a log load)."""
    location = resolve(path, spark)
    if snapshot is None:
        if not table_exists(location):
            create_table(spark, df.limit(0), location)
        snapshot = load_snapshot(location)
    check_writable(snapshot)
    applied = snapshot.transaction_version(app_id)
    if applied is not None and applied >= version:
        return None
    # One file per append: these are a micro-batch's side rows (its deletes, its dead letters),
    # few, and written with the batch's partitioning they made one tiny file per partition,
    # which every later tombstone lookup had to open.
    written = write_files(spark, df.coalesce(1).select(*[f"`{f.name}`" for f in snapshot.schema.fields]),
                          location, snapshot.schema, snapshot.partition_columns)
    try:
        return commit(CommitRequest(snapshot=snapshot, adds=written, removes=[], operation="WRITE",
                                    operation_parameters={"mode": "Append"},
                                    operation_metrics={"numFiles": len(written),
                                                       "numOutputRows": sum(w.num_records for w in written)},
                                    app_id=app_id, app_version=version))
    except BaseException:
        delete_written(spark, location, written)
        raise
