"""OPTIMIZE's planning rules without a JVM: bin packing, size settings, metrics, VACUUM's
retention property.

Why: which files a compaction rewrites is decided on the driver from the log alone; these
rules (Delta's OptimizeExecutor bin packing: candidates below min_file_size, sorted by size,
a bin closes before it would pass the target, single-file bins are dropped) are pinned here
exactly, independently of Spark.
"""

from __future__ import annotations

import pytest

from streaming_merge.errors import DeltaTableError
from streaming_merge.optimize.binpack import plan_bins, small_files_per_partition
from streaming_merge.optimize.metrics import FileSizeMetrics, OptimizeMetrics
from streaming_merge.optimize.options import DEFAULT_TARGET_FILE_SIZE, OptimizeOptions, parse_size
from streaming_merge.streaming.compaction import AutoCompact
from streaming_merge.table.snapshot import DataFile
from streaming_merge.table.vacuum import retention_hours_of


def f(name: str, size: int, day: str | None = None) -> DataFile:
    return DataFile(path=name, size=size, num_records=1, partition_values={"day": day} if day is not None else {})


def paths(bins: list) -> list[list[str]]:
    return [[x.path for x in b.files] for b in bins]


def test_bins_fill_smallest_first_up_to_the_target() -> None:
    files = [f("e", 50), f("a", 10), f("c", 30), f("b", 20), f("d", 40)]
    # sorted: a10 b20 c30 | d40 | e50 -> (60) (40 alone: 40+50 > 60) (50 alone)
    bins = plan_bins(files, [], max_file_size=60, min_file_size=1000)
    assert paths(bins) == [["a", "b", "c"]]  # single-file bins are dropped
    bins = plan_bins(files, [], max_file_size=90, min_file_size=1000)
    assert paths(bins) == [["a", "b", "c"], ["d", "e"]]


def test_large_files_are_never_candidates_and_partitions_never_mix() -> None:
    files = [f("big", 500, "1"), f("s1", 10, "1"), f("s2", 10, "1"), f("s3", 10, "2"), f("s4", 10, "2"),
             f("s5", 10, "3")]
    bins = plan_bins(files, ["day"], max_file_size=1000, min_file_size=100)
    assert paths(bins) == [["s1", "s2"], ["s3", "s4"]]
    assert [b.partition for b in bins] == [(("day", "1"),), (("day", "2"),)]
    assert bins[0].size == 20
    assert small_files_per_partition(files, ["day"], 100) == {(("day", "1"),): 2, (("day", "2"),): 2,
                                                              (("day", "3"),): 1}


def test_a_file_larger_than_the_target_starts_its_own_bin() -> None:
    files = [f("a", 10), f("b", 10), f("c", 200), f("d", 300)]
    bins = plan_bins(files, [], max_file_size=100, min_file_size=1000)
    assert paths(bins) == [["a", "b"]]
    assert plan_bins(files, [], max_file_size=100, min_file_size=1000, min_num_files=3) == []
    with pytest.raises(ValueError):
        plan_bins(files, [], max_file_size=100, min_file_size=1000, min_num_files=1)


def test_sizes_come_from_options_then_the_table_property_then_128_mb() -> None:
    assert OptimizeOptions().sizes({}) == (DEFAULT_TARGET_FILE_SIZE, DEFAULT_TARGET_FILE_SIZE)
    assert OptimizeOptions().sizes({"delta.targetFileSize": "1048576"}) == (1048576, 1048576)
    assert OptimizeOptions().sizes({"delta.targetFileSize": "64mb"}) == (64 << 20, 64 << 20)
    assert OptimizeOptions(target_file_size=1000, min_file_size=10).sizes({"delta.targetFileSize": "64mb"}) == (
        1000, 10)
    assert parse_size("2 GB", "x") == 2 << 30
    with pytest.raises(DeltaTableError, match="not a size"):
        OptimizeOptions().sizes({"delta.targetFileSize": "big"})
    with pytest.raises(ValueError):
        OptimizeOptions(target_file_size=0)
    # auto compaction: small means below half the target, as Delta's autoCompact.minFileSize
    assert AutoCompact(target_file_size=1000).optimize_options({}).sizes({}) == (1000, 500)
    with pytest.raises(ValueError, match="every_batches=N or min_small_files=M"):
        AutoCompact(min_small_files=None)


def test_metrics_use_deltas_names() -> None:
    metrics = OptimizeMetrics(
        numFilesAdded=4, numFilesRemoved=9, filesAdded=FileSizeMetrics.of([40, 10, 30, 20]),
        filesRemoved=FileSizeMetrics.of([10] * 9), partitionsOptimized=2, numBins=4, numBatches=1,
        totalConsideredFiles=12, totalFilesSkipped=3, startTimeMs=1000, endTimeMs=1500, tableVersion=7,
        _added_sizes=(40, 10, 30, 20))
    assert metrics.commit_metrics() == {
        "numAddedFiles": 4, "numRemovedFiles": 9, "numAddedBytes": 100, "numRemovedBytes": 90,
        "minFileSize": 10, "p25FileSize": 10, "p50FileSize": 20, "p75FileSize": 30, "maxFileSize": 40}
    assert metrics.filesAdded == FileSizeMetrics(10, 40, 25.0, 4, 100)
    assert metrics.durationMs == 500
    assert "_added_sizes" not in metrics.to_dict()
    assert metrics.to_dict()["filesRemoved"]["totalSize"] == 90


@pytest.mark.parametrize(("text", "hours"), [
    ("interval 1 week", 168), ("interval 7 days", 168), ("168 hours", 168), ("interval 1 day 12 hours", 36),
    ("interval 90 minutes", 1.5), ("INTERVAL 2 HOURS", 2)])
def test_retention_property_values(text: str, hours: float) -> None:
    assert retention_hours_of(text) == pytest.approx(hours)


@pytest.mark.parametrize("text", ["interval 1 month", "soon", "interval"])
def test_retention_property_refusals(text: str) -> None:
    with pytest.raises(DeltaTableError):
        retention_hours_of(text)
