"""Run a compaction or a purge: plan the bins, rewrite them in one Spark job, commit dataChange=false.

A compaction (OPTIMIZE) rewrites the small files and those with many rows deleted by their
deletion vectors; a purge (REORG ... APPLY (PURGE)) rewrites every file with a deletion vector.
The scan applies the deletion vectors, so the new files hold only the live rows and carry no
deletion vector; the commit removes each old file with its DV.

The rewrite reads all the bins' files through one scan (one file listing) and gives every
bin a branch of its own: the scan filtered to the bin's files (Spark prunes the other files
by ``_metadata.file_path``), coalesced to one partition; the branches are unioned. So the
whole compaction is one Spark job with one task per bin, each task writing exactly one new
file, and no shuffle (a repartition by bin id would move every row through shuffle files and
cannot promise one bin per task: hash partitions collide). Spark adds one job of its own to
list the files when it reads more than 32 of them.

The commit is a MERGE-like transaction against the version the bins were planned on:
``read_files`` = the compacted files, so a concurrent commit that removed one of them makes
this one fail with ConcurrentModificationError (and the new files are deleted), while a
concurrent append cannot conflict (a compaction never reads appended files). Its actions
carry ``dataChange=false``: streaming readers of the table skip the commit, and an
append-only table accepts it (the rows are the same rows).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator, Sequence

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from streaming_merge.errors import CommitOutcomeUnknownError
from streaming_merge.optimize.binpack import Bin, plan_bins, plan_purge_bins
from streaming_merge.optimize.metrics import FileSizeMetrics, OptimizeMetrics
from streaming_merge.optimize.options import OptimizeOptions
from streaming_merge.spark.conf import temporary_conf
from streaming_merge.spark.profile import phase
from streaming_merge.table.commit import CommitRequest, commit
from streaming_merge.table.scan import FILE_PATH_COL, ROW_INDEX_COL, scan_files, spark_file_paths
from streaming_merge.table.snapshot import DataFile, Snapshot, check_writable
from streaming_merge.table.write import delete_written, write_files

log = logging.getLogger(__name__)

OPERATION = "OPTIMIZE"
PURGE_OPERATION = "REORG"


def compact(
    spark: SparkSession,
    snapshot: Snapshot,
    considered: Sequence[DataFile],
    options: OptimizeOptions,
    *,
    predicates: Sequence[str] = (),
    auto: bool = False,
) -> OptimizeMetrics:
    """Compact the small files among ``considered`` (files of ``snapshot``), and those whose
    deletion vector deletes too many of their rows; commit once.

    Nothing is written or committed when no bin has enough files; the metrics then carry
    ``tableVersion=None``.
    """
    started = _now_ms()
    check_writable(snapshot)
    target, min_size = options.sizes(snapshot.configuration)
    bins = plan_bins(considered, snapshot.partition_columns, max_file_size=target, min_file_size=min_size,
                     min_num_files=options.min_num_files,
                     max_deleted_rows_ratio=options.deleted_rows_ratio(spark))
    return _rewrite(spark, snapshot, bins, considered, started, OPERATION,
                    {"predicate": list(predicates), "zOrderBy": [], "auto": auto}, "compacting")


def purge(
    spark: SparkSession,
    snapshot: Snapshot,
    considered: Sequence[DataFile],
    options: OptimizeOptions,
    *,
    predicates: Sequence[str] = (),
) -> OptimizeMetrics:
    """Rewrite every file with a deletion vector among ``considered`` into files without one
    (Delta's ``REORG TABLE ... APPLY (PURGE)``), in bins up to the target size; commit once
    (operation REORG). Nothing is committed when no file has a deletion vector."""
    started = _now_ms()
    check_writable(snapshot)
    target, _ = options.sizes(snapshot.configuration)
    bins = plan_purge_bins(considered, snapshot.partition_columns, max_file_size=target)
    return _rewrite(spark, snapshot, bins, considered, started, PURGE_OPERATION,
                    {"predicate": list(predicates), "applyPurge": True}, "purging")


def _rewrite(spark: SparkSession, snapshot: Snapshot, bins: Sequence[Bin], considered: Sequence[DataFile],
             started: int, operation: str, parameters: dict[str, object], verb: str) -> OptimizeMetrics:
    """Write every bin as one new file and commit the swap (see the module docstring)."""
    removed = [f for b in bins for f in b.files]
    if not bins:
        log.info("%s %s: nothing to rewrite among %d file(s)", operation, snapshot.table_path, len(considered))
        return _metrics(bins, removed, [], considered, started, None)
    vectors_removed = sum(1 for f in removed if f.deletion_vector is not None)
    description = f"{operation} operation - {verb} {len(removed)} files into {len(bins)}"
    with phase(spark, "optimize", description), _compaction_conf(spark):
        written = write_files(spark, bins_frame(spark, snapshot, bins), snapshot.location, snapshot.schema,
                              snapshot.partition_columns)
    if len(written) > len(bins):
        log.warning("%s %s wrote %d files for %d bins (spark.sql.files.maxRecordsPerFile?)", operation,
                    snapshot.table_path, len(written), len(bins))
    try:
        with phase(spark, "commit"):
            provisional = _metrics(bins, removed, [w.size for w in written], considered, started, None)
            version = commit(CommitRequest(
                snapshot=snapshot,
                adds=written,
                removes=removed,
                operation=operation,
                operation_parameters=parameters,
                # Delta's OPTIMIZE / REORG commits count the deletion vectors the rewrite dropped.
                operation_metrics={**provisional.commit_metrics(), "numDeletionVectorsRemoved": vectors_removed},
                read_files=removed,
                data_change=False,
            ))
    except CommitOutcomeUnknownError:
        raise  # a landed commit may reference the files: they stay
    except BaseException:
        delete_written(spark, snapshot.location, written)
        raise
    result = _metrics(bins, removed, [w.size for w in written], considered, started, version)
    log.info("%s %s v%d: %d file(s) (%d bytes, %d with deletion vectors) -> %d file(s) (%d bytes) in %d ms",
             operation, snapshot.table_path, version, result.numFilesRemoved, result.numBytesRemoved,
             vectors_removed, result.numFilesAdded, result.numBytesAdded, result.durationMs)
    return result


# Spark 4 keeps a union's input partitioning when all its children share one, so a union of
# one-partition branches would run as ONE task (every bin in one file); off, the union
# concatenates its children's partitions: one task per bin. Read when the write is planned.
_UNION_PARTITIONING = "spark.sql.unionOutputPartitioning"


@contextlib.contextmanager
def _compaction_conf(spark: SparkSession) -> Iterator[None]:
    """Session settings while the compaction is planned and written. (How the files are listed
    is scan_files' own setting, for its read.)"""
    with temporary_conf(spark, {_UNION_PARTITIONING: "false"}):
        yield


def bins_frame(spark: SparkSession, snapshot: Snapshot, bins: Sequence[Bin]) -> DataFrame:
    """The rows of every bin, one Spark partition per bin (see the module docstring)."""
    files = [f for b in bins for f in b.files]
    spark_paths = spark_file_paths(spark, snapshot.location, files)
    by_path = dict(zip((f.path for f in files), spark_paths, strict=True))
    scan = scan_files(spark, snapshot, files, with_row_id=True, spark_paths=spark_paths)
    frame: DataFrame | None = None
    for b in bins:
        branch = (scan.filter(F.col(FILE_PATH_COL).isin([by_path[f.path] for f in b.files]))
                  .drop(FILE_PATH_COL, ROW_INDEX_COL).coalesce(1))
        frame = branch if frame is None else frame.union(branch)
    assert frame is not None
    return frame


def _metrics(bins: Sequence[Bin], removed: Sequence[DataFile], added_sizes: Sequence[int],
             considered: Sequence[DataFile], started: int, version: int | None) -> OptimizeMetrics:
    return OptimizeMetrics(
        numFilesAdded=len(added_sizes),
        numFilesRemoved=len(removed),
        filesAdded=FileSizeMetrics.of(list(added_sizes)),
        filesRemoved=FileSizeMetrics.of([f.size for f in removed]),
        partitionsOptimized=len({b.partition for b in bins}),
        numBins=len(bins),
        numBatches=1 if bins else 0,
        totalConsideredFiles=len(considered),
        totalFilesSkipped=len(considered) - len(removed),
        startTimeMs=started,
        endTimeMs=_now_ms(),
        tableVersion=version,
        _added_sizes=tuple(added_sizes),
    )


def _now_ms() -> int:
    return int(time.time() * 1000)
