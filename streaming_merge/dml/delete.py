"""DELETE: Delta's DeleteCommand on Spark, returning its metrics.

Three cases, as Delta's:
1. no condition, or a deterministic one over partition columns only: the matching files are
   removed whole from what the log says (no Spark job when the log has every file's row count);
2. a table with ``delta.enableDeletionVectors=true``: one job finds the matching rows'
   positions (streaming_merge.dml._common.matching_rows); each touched file gets a deletion
   vector holding them merged with its old one, or is removed when no live row is left. No
   data file is read twice or rewritten;
3. otherwise (copy-on-write): the same job, then the touched files that keep some rows are
   rewritten without the deleted ones, in a second job. A file whose every row matches is
   removed without being rewritten (beyond Delta, which rewrites it into nothing).
With change data on (``delta.enableChangeDataFeed``), 2. and 3. also write the deleted rows as
``delete`` change rows (3. in its rewrite's job, 2. in a job of its own); 1. writes none, as
Delta's metadata-only delete: readers take a version's removed files as its deleted rows.
No matching row: nothing is written and nothing committed.
"""

from __future__ import annotations

import logging
import time

import numpy as np
from pyroaring import BitMap64
from pyspark.sql import Column, SparkSession
from pyspark.sql import functions as F

from streaming_merge.dml._common import (
    DmlMetrics,
    DmlPlan,
    commit_changes,
    file_metrics,
    matching_rows,
    millis_since,
    plan_dml,
    write_rows,
)
from streaming_merge.merge.change_data import DELETE as DELETE_CHANGE
from streaming_merge.merge.change_data import records_change_data
from streaming_merge.merge.dv_rewrite import deletion_vector_changes
from streaming_merge.spark.interpreted import DEFAULT_INTERPRETED_MAX_ROWS, interpreted_if_small, rows_of
from streaming_merge.spark.profile import phase
from streaming_merge.table.location import TableLocation
from streaming_merge.table.snapshot import DataFile
from streaming_merge.table.write import CHANGE_TYPE_COL, WrittenFile

log = logging.getLogger(__name__)

OPERATION = "DELETE"


def run_delete(spark: SparkSession, location: TableLocation, alias: str,
               condition: str | Column | None = None) -> DmlMetrics:
    """Delete the rows of the table at ``location`` for which ``condition`` is true (every row
    without one); returns Delta's DELETE metrics, ``tableVersion`` None when nothing matched."""
    started = time.monotonic()
    with phase(spark, "snapshot"):
        plan, _ = plan_dml(spark, location, alias, condition, OPERATION)
    candidates = plan.candidates
    metrics: dict[str, int] = {}
    written: list[WrittenFile] = []
    vectors: list[tuple[DataFile, BitMap64]] = []
    with interpreted_if_small(spark, rows_of([f.num_records for f in candidates]), DEFAULT_INTERPRETED_MAX_ROWS):
        if plan.exact:
            removed = [f for f in candidates if f.live_records != 0]
            metrics["numDeletedRows"] = _rows_of_files(spark, plan, removed)
            metrics["scanTimeMs"] = millis_since(started)
            if records_change_data(plan.snapshot) and any(f.deletion_vector is not None for f in removed):
                # Readers must take a removed file's rows less its deletion vector; delta-rs 1.6.6's
                # load_cdf returns the vector's rows instead, so these rows go to change files.
                written = _deleted_rows(spark, plan, removed)
        else:
            with phase(spark, "findTouchedFiles",
                       f"DELETE operation - finding the rows to delete in {len(candidates)} files"):
                positions = matching_rows(spark, plan, candidates)
            metrics["scanTimeMs"] = millis_since(started)
            metrics["numDeletedRows"] = sum(len(rows) for rows in positions.values())
            rewrite_started = time.monotonic()
            if plan.snapshot.writes_deletion_vectors:
                changes = deletion_vector_changes(plan.snapshot, candidates, positions)
                removed, vectors = changes.removed, changes.vectors
                metrics.update({name.replace("Target", ""): value for name, value in changes.metrics().items()})
                if records_change_data(plan.snapshot):
                    written = _deleted_rows(spark, plan, [candidates[p] for p in sorted(positions)])
            else:
                removed, written = _copy_on_write(spark, plan, positions)
            metrics["rewriteTimeMs"] = millis_since(rewrite_started)
    if not removed and not vectors:
        log.info("DELETE on %s: no row matched; nothing committed", plan.snapshot.table_path)
        return DmlMetrics(OPERATION, {**metrics, "executionTimeMs": millis_since(started)})
    metrics.update(file_metrics(written, removed))
    metrics["numCopiedRows"] = sum(w.num_records for w in written if not w.change_data)
    # A removed file's vector goes with it (counted by deletion_vector_changes on the DV path).
    metrics.setdefault("numDeletionVectorsRemoved", sum(1 for f in removed if f.deletion_vector is not None))
    metrics["executionTimeMs"] = millis_since(started)
    provisional = DmlMetrics(OPERATION, metrics)
    with phase(spark, "commit"):
        version = commit_changes(
            spark, plan, operation=OPERATION,
            parameters={"predicate": [plan.predicate] if plan.predicate is not None else []},
            metrics=provisional, written=written, removed=removed, vectors=vectors, read_files=candidates)
    return DmlMetrics(OPERATION, metrics, version)


def _rows_of_files(spark: SparkSession, plan: DmlPlan, files: list[DataFile]) -> int:
    """The live rows of files removed whole: from the log, or counted by Spark for the files
    the log has no row count for (written by a writer without stats)."""
    unknown = [f for f in files if f.live_records is None]
    counted = 0
    if unknown:
        with phase(spark, "countRemovedRows", f"DELETE operation - counting the rows of {len(unknown)} files"):
            counted = plan.scan(spark, unknown).count()
    return counted + sum(f.live_records or 0 for f in files)


def _deleted_rows(spark: SparkSession, plan: DmlPlan, touched: list[DataFile]) -> list[WrittenFile]:
    """The change rows of a DELETE with deletion vectors (``delete``, the deleted rows as they
    were): the condition's rows of the touched files (all their live rows without one), read
    again in a job of their own."""
    columns = [F.col(f"`{n}`") for n in plan.snapshot.schema.fieldNames()]
    scan = plan.scan(spark, touched)
    frame = (scan.filter(plan.condition) if plan.condition is not None else scan).select(
        *columns, F.lit(DELETE_CHANGE).alias(CHANGE_TYPE_COL))
    with phase(spark, "changeData", f"DELETE operation - writing the deleted rows of {len(touched)} files as change "
                                    "data"):
        return write_rows(spark, plan.snapshot, frame, [], sum(f.size for f in touched), change_data=True)


def _copy_on_write(spark: SparkSession, plan: DmlPlan, positions: dict[int, np.ndarray]
                   ) -> tuple[list[DataFile], list[WrittenFile]]:
    """Remove every touched file; rewrite those that keep a live row without the deleted ones.
    The condition is evaluated again over those files (Delta's second pass): NULL keeps a row.
    With change data on, every touched file is read again and its deleted rows are written as
    ``delete`` change rows by the same job."""
    assert plan.condition is not None
    touched = [plan.candidates[p] for p in sorted(positions)]
    if records_change_data(plan.snapshot):
        deleted = F.coalesce(plan.condition, F.lit(False))
        columns = [F.col(f"`{n}`") for n in plan.snapshot.schema.fieldNames()]
        frame = plan.scan(spark, touched).select(*columns, F.when(deleted, F.lit(DELETE_CHANGE)).alias(CHANGE_TYPE_COL))
        with phase(spark, "rewrite", f"DELETE operation - Rewriting {len(touched)} files"):
            return touched, write_rows(spark, plan.snapshot, frame, touched, sum(f.size for f in touched),
                                       change_data=True)
    kept = [plan.candidates[p] for p in sorted(positions)
            if plan.candidates[p].live_records is None or len(positions[p]) < (plan.candidates[p].live_records or 0)]
    if not kept:
        return touched, []
    frame = plan.scan(spark, kept).filter(~F.coalesce(plan.condition, F.lit(False)))
    with phase(spark, "rewrite", f"DELETE operation - Rewriting {len(kept)} files"):
        written = write_rows(spark, plan.snapshot, frame, kept, sum(f.size for f in kept))
    return touched, written
