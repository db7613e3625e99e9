"""Opt-in auto compaction after a MergeSink batch: ``MergeSink(..., auto_compact=AutoCompact(...))``.

Every micro-batch MERGE adds at least one file per partition it touches, so a streaming
table accumulates small files; reading them costs a file open each. After a batch's MERGE
has committed, the sink may compact:
- ``every_batches=N``: after every N-th batch (batch ids N-1, 2N-1, ...: restart-safe, since
  Spark keeps batch ids in the checkpoint), the small files of the whole table;
- ``min_small_files=M``: after any batch, the partitions this batch wrote to that now hold at
  least M small files (Delta's auto compaction threshold ``minNumFiles`` is 50).
A small file is one below ``min_file_size`` (default half the target, as Delta's auto
compaction); a file whose deletion vector deletes more than ``max_deleted_rows_ratio`` of its
rows (default the session's ``spark.databricks.delta.optimize.maxDeletedRowsRatio``, else 0.05)
counts as one too, whatever its size, and is rewritten without its deleted rows. A batch
"wrote to" a partition when it added a file there or gave one of its files a new deletion
vector. Bins grow up to ``target_file_size`` (default the table's ``delta.targetFileSize``,
else 128 MB).

The compaction is a transaction of its own (OPTIMIZE, dataChange=false, ``auto`` = true in
its operation parameters) after the batch's MERGE committed: it never reruns or changes the
MERGE, and a compaction that fails (a concurrent commit removed a file it compacted, or
anything else) is logged and reported in the batch's progress, never raised: the batch's data
is already committed, and the next trigger tries again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql import SparkSession

from streaming_merge.errors import InvalidArgumentError
from streaming_merge.optimize.binpack import (
    DEFAULT_MIN_NUM_FILES,
    PartitionKey,
    partition_key,
    small_files_per_partition,
)
from streaming_merge.optimize.compact import compact
from streaming_merge.optimize.options import OptimizeOptions
from streaming_merge.table.location import TableRef
from streaming_merge.table.snapshot import DataFile, Snapshot, advance, load_snapshot
from streaming_merge.table.write import partition_value_string

log = logging.getLogger(__name__)

DEFAULT_MIN_SMALL_FILES = 50  # Delta's spark.databricks.delta.autoCompact.minNumFiles


@dataclass(frozen=True)
class AutoCompact:
    """When the sink compacts after a batch, and how (see the module docstring)."""

    every_batches: int | None = None
    min_small_files: int | None = DEFAULT_MIN_SMALL_FILES
    target_file_size: int | None = None
    min_file_size: int | None = None
    min_num_files: int = DEFAULT_MIN_NUM_FILES
    max_deleted_rows_ratio: float | None = None

    def __post_init__(self) -> None:
        if self.every_batches is None and self.min_small_files is None:
            raise InvalidArgumentError("AutoCompact needs every_batches=N or min_small_files=M (or both)")
        for name in ("every_batches", "min_small_files", "target_file_size", "min_file_size"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise InvalidArgumentError(f"AutoCompact.{name} must be a positive integer, got {value}")
        OptimizeOptions(min_num_files=self.min_num_files, max_deleted_rows_ratio=self.max_deleted_rows_ratio)

    def optimize_options(self, configuration: dict[str, str | None]) -> OptimizeOptions:
        target, _ = OptimizeOptions(target_file_size=self.target_file_size).sizes(configuration)
        return OptimizeOptions(target, self.min_file_size or max(1, target // 2), self.min_num_files,
                               self.max_deleted_rows_ratio)


def run_auto_compaction(spark: SparkSession, settings: AutoCompact, batch_id: int, before: Snapshot | None,
                        location: TableRef) -> dict[str, Any] | None:
    """Compact if ``settings`` says so after batch ``batch_id``; the progress record's
    ``compaction`` entry, or None when no trigger fired. ``before``: the table as the batch
    found it (None when the batch created it), to tell which partitions the batch wrote to."""
    started = time.monotonic()
    try:
        latest = advance(before) if before is not None else load_snapshot(location)
        options = settings.optimize_options(latest.configuration)
        chosen = _choose(settings, batch_id, before, latest, options, options.deleted_rows_ratio(spark))
        if chosen is None:
            return None
        trigger, considered, predicates = chosen
        metrics = compact(spark, latest, considered, options, predicates=predicates, auto=True)
    except Exception as exc:  # the MERGE is committed: report, never fail or rerun the batch
        log.warning("Auto compaction of %s after batch %d failed; the batch is committed and the next trigger "
                    "retries: %s: %s", location, batch_id, type(exc).__name__, exc)
        return {"trigger": None, "numFilesRemoved": 0, "numFilesAdded": 0, "numBytesRemoved": 0,
                "numBytesAdded": 0, "partitionsOptimized": 0, "tableVersion": None,
                "durationMs": _ms(started), "error": f"{type(exc).__name__}: {exc}"}
    return {"trigger": trigger, "numFilesRemoved": metrics.numFilesRemoved, "numFilesAdded": metrics.numFilesAdded,
            "numBytesRemoved": metrics.numBytesRemoved, "numBytesAdded": metrics.numBytesAdded,
            "partitionsOptimized": metrics.partitionsOptimized, "tableVersion": metrics.tableVersion,
            "durationMs": _ms(started), "error": None}


def _choose(settings: AutoCompact, batch_id: int, before: Snapshot | None, latest: Snapshot,
            options: OptimizeOptions, max_deleted_rows_ratio: float) -> tuple[str, list[DataFile], list[str]] | None:
    """(trigger, files to consider, predicate text for the commit), or None."""
    if settings.every_batches is not None and (batch_id + 1) % settings.every_batches == 0:
        return "every_batches", list(latest.files), []
    if settings.min_small_files is None:
        return None
    columns = latest.partition_columns
    # A file is its path and its deletion vector: one the batch gave a new DV is new too.
    known = {f.key for f in before.files} if before is not None else set()
    touched = {partition_key(f, columns) for f in latest.files if f.key not in known}
    _, min_size = options.sizes(latest.configuration)
    counts = small_files_per_partition(latest.files, columns, min_size, max_deleted_rows_ratio)
    hot = {key for key in touched if counts.get(key, 0) >= settings.min_small_files}
    if not hot:
        return None
    considered = [f for f in latest.files if partition_key(f, columns) in hot]
    return "min_small_files", considered, [_partition_sql(key) for key in hot if key]


def _partition_sql(key: PartitionKey) -> str:
    """A partition as SQL text, for the commit's operation parameters (informational)."""
    parts: Sequence[str] = [
        f"`{name}` IS NULL" if value is None
        else f"`{name}` = '{_escaped(partition_value_string(value) or '')}'"
        for name, value in key
    ]
    return " AND ".join(parts)


def _escaped(text: str) -> str:
    return text.replace("\\", "\\\\").replace("'", "\\'")


def _ms(since: float) -> int:
    return int((time.monotonic() - since) * 1000)
