"""How many files a MERGE writes: few (delta-rs writes one), but not one task for a big
rewrite while the other cores idle."""

from __future__ import annotations

import pytest

from streaming_merge.merge.command import MergeOptions
from streaming_merge.merge.rewrite import FileLayout, scan_split_conf

MB = 1024 * 1024


@pytest.mark.parametrize(("estimated_mb", "parallelism", "files"), [
    (1, 2, 1),       # a small batch: one file, like delta-rs
    (15, 2, 1),      # two files would each be under 8 MB
    (16, 2, 2),      # each of two files gets 8 MB: both cores write
    (22, 2, 2),      # the 1M-row uniform rewrite of bench.merge_bench
    (22, 8, 2),      # more cores, but only two 8 MB files' worth of bytes
    (300, 2, 3),     # the target file size needs three files; more than the cores
])
def test_files_per_unpartitioned_write(estimated_mb: int, parallelism: int, files: int) -> None:
    layout = FileLayout(repartition=True, target_file_size=128 * MB, estimated_bytes=estimated_mb * MB,
                        min_parallel_file_size=8 * MB)
    assert layout.files(parallelism) == files


def test_partitioned_writes_are_cut_by_size_only() -> None:
    layout = FileLayout(repartition=True, target_file_size=128 * MB, estimated_bytes=300 * MB,
                        min_parallel_file_size=8 * MB)
    assert layout.files_by_size == 3
    assert FileLayout(repartition=True, target_file_size=128 * MB, estimated_bytes=0,
                      min_parallel_file_size=8 * MB).files_by_size == 1


def test_min_parallel_file_size_must_be_positive() -> None:
    with pytest.raises(ValueError, match="min_parallel_file_size must be a positive number of bytes, got 0"):
        MergeOptions(min_parallel_file_size=0)


@pytest.mark.parametrize(("largest_mb", "session_mb", "split_mb"), [
    (5, 128, 5),      # a file per partition, none cut: split = open cost = the largest file
    (300, 128, 128),  # a file past the session's split size is still cut at it
    (300, 64, 64),
    (0, 128, 128),    # nothing known about the files: the session's split size
])
def test_a_map_side_scan_gets_a_partition_per_file(largest_mb: int, session_mb: int, split_mb: int) -> None:
    layout = FileLayout(repartition=True, target_file_size=128 * MB, estimated_bytes=400 * MB,
                        min_parallel_file_size=8 * MB, largest_file=largest_mb * MB)
    assert scan_split_conf(layout, session_mb * MB) == {"spark.sql.files.maxPartitionBytes": str(split_mb * MB),
                                                         "spark.sql.files.openCostInBytes": str(split_mb * MB)}
