"""How many files a MERGE writes: few (delta-rs writes one), but not one task for a big
rewrite while the other cores idle."""

from __future__ import annotations

import pytest

from streaming_merge.merge.command import MergeOptions
from streaming_merge.merge.rewrite import FileLayout, byte_size, scan_split_conf

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


@pytest.mark.parametrize(("text", "size"), [
    ("128MB", 128 * MB), ("64m", 64 * MB), ("1g", 1024 * MB), ("134217728b", 128 * MB), ("1024", 1024),
    (" 4 kb ", 4096),
])
def test_spark_byte_sizes_are_read_as_spark_reads_them(text: str, size: int) -> None:
    assert byte_size(text) == size


def test_a_byte_size_spark_would_refuse_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="not a byte size: '12 parsecs'"):
        byte_size("12 parsecs")


class _Conf:
    def __init__(self, settings: dict[str, str]) -> None:
        self.settings = settings

    def get(self, key: str, default: str | None = None) -> str | None:
        return self.settings.get(key, default)


class _Session:
    def __init__(self, settings: dict[str, str]) -> None:
        self.conf = _Conf(settings)


@pytest.mark.parametrize(("largest_mb", "session_setting", "split_mb"), [
    (5, None, 5),        # a file per partition, none cut: split = open cost = the largest file
    (300, None, 128),    # a file past Spark's split size is still cut at it
    (300, "64m", 64),    # ... at the session's own
    (0, None, 128),      # nothing known about the files: Spark's split size
])
def test_a_map_side_scan_gets_a_partition_per_file(largest_mb: int, session_setting: str | None,
                                                    split_mb: int) -> None:
    layout = FileLayout(repartition=True, target_file_size=128 * MB, estimated_bytes=400 * MB,
                        min_parallel_file_size=8 * MB, largest_file=largest_mb * MB)
    settings = {} if session_setting is None else {"spark.sql.files.maxPartitionBytes": session_setting}
    conf = scan_split_conf(_Session(settings), layout)  # type: ignore[arg-type]
    assert conf == {"spark.sql.files.maxPartitionBytes": str(split_mb * MB),
                    "spark.sql.files.openCostInBytes": str(split_mb * MB)}
