"""Which files an OPTIMIZE rewrites, and into which new files: Delta's bin-packing rule.

Pure planning on the driver from the log's file sizes (no JVM), so the rule is tested
exactly (tests/unit/test_binpack.py). As Delta's ``OptimizeExecutor`` does, per partition:
1. the candidates are the files smaller than ``min_file_size`` (larger files are left alone:
   rewriting them would cost much and gain nothing), and the files whose deletion vector
   deletes more than ``max_deleted_rows_ratio`` of their rows (Delta's
   ``spark.databricks.delta.optimize.maxDeletedRowsRatio``, 0.05), whatever their size: the
   rewrite drops the deleted rows, which every reader otherwise skips at every scan;
2. sorted by size (smallest first), they are added to a bin until the next file would take
   the bin past ``max_file_size``; that file starts the next bin. A file's size here is the
   estimate of its live bytes (its size times the share of its rows not deleted), since the
   deleted rows are not rewritten;
3. a bin of fewer than ``min_num_files`` files (2, Delta's rule for OPTIMIZE) is dropped:
   rewriting one file into one file changes nothing, unless a file of the bin has a deletion
   vector (Delta keeps a one-file bin with a DV: the new file has none).
Every bin becomes exactly one new file, in the bin's partition (none when all its rows are deleted).

A purge (Delta's ``REORG TABLE ... APPLY (PURGE)``, :func:`plan_purge_bins`) takes every file
with a deletion vector, whatever its size, into bins of the same kind, and keeps every bin.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from streaming_merge.errors import InvalidArgumentError
from streaming_merge.table.snapshot import DataFile

PartitionKey = tuple[tuple[str, Any], ...]

DEFAULT_MIN_NUM_FILES = 2
DEFAULT_MAX_DELETED_ROWS_RATIO = 0.05  # Delta's spark.databricks.delta.optimize.maxDeletedRowsRatio


@dataclass(frozen=True)
class Bin:
    """Files of one partition that are rewritten together into one new file."""

    partition: PartitionKey
    files: tuple[DataFile, ...]

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def live_size(self) -> int:
        """The estimated bytes of the bin's live rows (see :func:`live_size`)."""
        return sum(live_size(f) for f in self.files)


def live_size(file: DataFile) -> int:
    """The file's bytes times the share of its rows that its deletion vector leaves live (its
    size when it has no DV or no row count)."""
    if file.deletion_vector is None or not file.num_records:
        return file.size
    return file.size * max(0, file.num_records - file.deleted_rows) // file.num_records


def has_many_deleted_rows(file: DataFile, max_deleted_rows_ratio: float) -> bool:
    """Whether the file's deletion vector deletes more than ``max_deleted_rows_ratio`` of its
    rows (Delta's ``shouldCompactBecauseOfDeletedRows``: a DV on a file without a row count
    always counts, so the rewrite gives it stats)."""
    if file.deletion_vector is None:
        return False
    if not file.num_records:
        return True
    return file.deleted_rows / file.num_records > max_deleted_rows_ratio


def partition_key(file: DataFile, partition_columns: Sequence[str]) -> PartitionKey:
    """The file's partition as a hashable key (the log's typed values, None for NULL)."""
    return tuple((c, file.partition_values.get(c)) for c in partition_columns)


def plan_bins(
    files: Iterable[DataFile],
    partition_columns: Sequence[str],
    *,
    max_file_size: int,
    min_file_size: int,
    min_num_files: int = DEFAULT_MIN_NUM_FILES,
    max_deleted_rows_ratio: float = DEFAULT_MAX_DELETED_ROWS_RATIO,
) -> list[Bin]:
    """The bins of ``files``, partitions in first-seen order, bins in size order."""
    if max_file_size < 1 or min_file_size < 1:
        raise InvalidArgumentError(f"file sizes must be positive, got max_file_size={max_file_size}, "
                         f"min_file_size={min_file_size}")
    if min_num_files < 2:
        raise InvalidArgumentError(f"min_num_files must be at least 2 (one file rewritten alone gains nothing), "
                         f"got {min_num_files}")
    candidates = [f for f in files if is_candidate(f, min_file_size, max_deleted_rows_ratio)]
    bins = _pack(candidates, partition_columns, max_file_size)
    return [b for b in bins
            if len(b.files) >= min_num_files or any(f.deletion_vector is not None for f in b.files)]


def plan_purge_bins(files: Iterable[DataFile], partition_columns: Sequence[str], *, max_file_size: int) -> list[Bin]:
    """The bins of a purge: every file with a deletion vector, packed as :func:`plan_bins`
    packs, every bin kept (even one file alone: its new file has no DV)."""
    if max_file_size < 1:
        raise InvalidArgumentError(f"max_file_size must be positive, got {max_file_size}")
    return _pack([f for f in files if f.deletion_vector is not None], partition_columns, max_file_size)


def is_candidate(file: DataFile, min_file_size: int, max_deleted_rows_ratio: float) -> bool:
    """Whether compaction rewrites the file: small, or too many of its rows deleted."""
    return file.size < min_file_size or has_many_deleted_rows(file, max_deleted_rows_ratio)


def _pack(candidates: Iterable[DataFile], partition_columns: Sequence[str], max_file_size: int) -> list[Bin]:
    """Per partition (first-seen order), the candidates smallest first (by live size) into
    bins of at most ``max_file_size`` live bytes (a larger file gets a bin of its own)."""
    by_partition: dict[PartitionKey, list[DataFile]] = {}
    for file in candidates:
        by_partition.setdefault(partition_key(file, partition_columns), []).append(file)
    bins: list[Bin] = []
    for key, partition_files in by_partition.items():
        current: list[DataFile] = []
        current_size = 0
        for file in sorted(partition_files, key=lambda f: (live_size(f), f.path)):
            size = live_size(file)
            if current and current_size + size > max_file_size:
                bins.append(Bin(key, tuple(current)))
                current, current_size = [], 0
            current.append(file)
            current_size += size
        if current:
            bins.append(Bin(key, tuple(current)))
    return bins


def small_files_per_partition(
    files: Iterable[DataFile], partition_columns: Sequence[str], min_file_size: int,
    max_deleted_rows_ratio: float | None = None,
) -> dict[PartitionKey, int]:
    """How many files each partition holds that compaction would rewrite (auto compaction's
    trigger): below ``min_file_size``, or, with ``max_deleted_rows_ratio``, with a deletion
    vector deleting more than that share of their rows."""
    counts: dict[PartitionKey, int] = {}
    for file in files:
        if file.size < min_file_size or (max_deleted_rows_ratio is not None
                                         and has_many_deleted_rows(file, max_deleted_rows_ratio)):
            key = partition_key(file, partition_columns)
            counts[key] = counts.get(key, 0) + 1
    return counts
