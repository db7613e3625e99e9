"""Which files an OPTIMIZE rewrites, and into which new files: Delta's bin-packing rule.

Pure planning on the driver from the log's file sizes (no JVM), so the rule is tested
exactly (tests/unit/test_binpack.py). As Delta's ``OptimizeExecutor`` does, per partition:
1. the candidates are the files smaller than ``min_file_size`` (larger files are left alone:
   rewriting them would cost much and gain nothing);
2. sorted by size (smallest first), they are added to a bin until the next file would take
   the bin past ``max_file_size``; that file starts the next bin;
3. a bin of fewer than ``min_num_files`` files (2, Delta's rule for OPTIMIZE) is dropped:
   rewriting one file into one file changes nothing.
Every bin becomes exactly one new file, in the bin's partition.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from streaming_merge.table.snapshot import DataFile

PartitionKey = tuple[tuple[str, Any], ...]

DEFAULT_MIN_NUM_FILES = 2


@dataclass(frozen=True)
class Bin:
    """Files of one partition that are rewritten together into one new file."""

    partition: PartitionKey
    files: tuple[DataFile, ...]

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)


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
) -> list[Bin]:
    """The bins of ``files``, partitions in first-seen order, bins in size order."""
    if max_file_size < 1 or min_file_size < 1:
        raise ValueError(f"file sizes must be positive, got max_file_size={max_file_size}, "
                         f"min_file_size={min_file_size}")
    if min_num_files < 2:
        raise ValueError(f"min_num_files must be at least 2 (one file rewritten alone gains nothing), "
                         f"got {min_num_files}")
    by_partition: dict[PartitionKey, list[DataFile]] = {}
    for file in files:
        if file.size < min_file_size:
            by_partition.setdefault(partition_key(file, partition_columns), []).append(file)
    bins: list[Bin] = []
    for key, candidates in by_partition.items():
        current: list[DataFile] = []
        current_size = 0
        for file in sorted(candidates, key=lambda f: (f.size, f.path)):
            if current and current_size + file.size > max_file_size:
                bins.append(Bin(key, tuple(current)))
                current, current_size = [], 0
            current.append(file)
            current_size += file.size
        if current:
            bins.append(Bin(key, tuple(current)))
    return [b for b in bins if len(b.files) >= min_num_files]


def small_files_per_partition(
    files: Iterable[DataFile], partition_columns: Sequence[str], min_file_size: int
) -> dict[PartitionKey, int]:
    """How many files below ``min_file_size`` each partition holds (auto compaction's trigger)."""
    counts: dict[PartitionKey, int] = {}
    for file in files:
        if file.size < min_file_size:
            key = partition_key(file, partition_columns)
            counts[key] = counts.get(key, 0) + 1
    return counts
