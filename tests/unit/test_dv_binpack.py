"""Compaction planning with deletion vectors, without a JVM.

Why: which files OPTIMIZE, a purge and auto compaction rewrite is decided from the log alone.
With deletion vectors Delta adds rules (a file whose DV deletes more than
``maxDeletedRowsRatio`` of its rows is compacted whatever its size; a one-file bin with a DV is
kept; a purge takes every file with a DV); they are pinned here exactly.
"""

from __future__ import annotations

import pytest

from streaming_merge.errors import DeltaTableError
from streaming_merge.optimize.binpack import (
    has_many_deleted_rows,
    live_size,
    plan_bins,
    plan_purge_bins,
    small_files_per_partition,
)
from streaming_merge.optimize.options import OptimizeOptions
from streaming_merge.streaming.compaction import AutoCompact
from streaming_merge.table.deletion_vectors import DeletionVector
from streaming_merge.table.snapshot import DataFile


def f(name: str, size: int, records: int | None = 100, deleted: int = 0, day: str | None = None) -> DataFile:
    vector = DeletionVector("u", f"{name:0>20}", 1, 10, deleted) if deleted else None
    return DataFile(path=name, size=size, num_records=records,
                    partition_values={"day": day} if day is not None else {}, deletion_vector=vector)


def paths(bins: list) -> list[list[str]]:
    return [[x.path for x in b.files] for b in bins]


def test_the_ratio_is_deltas_deleted_over_physical_rows_and_a_dv_without_a_count_always_counts() -> None:
    assert not has_many_deleted_rows(f("a", 10), 0.05)
    assert not has_many_deleted_rows(f("a", 10, deleted=5), 0.05)       # exactly 5 %: not more
    assert has_many_deleted_rows(f("a", 10, deleted=6), 0.05)
    assert has_many_deleted_rows(f("a", 10, records=None, deleted=1), 0.05)
    assert has_many_deleted_rows(f("a", 10, deleted=1), 0.0)
    assert live_size(f("a", 1000, deleted=25)) == 750
    assert live_size(f("a", 1000)) == 1000 and live_size(f("a", 1000, records=None)) == 1000
    assert live_size(f("a", 1000, deleted=100)) == 0


def test_large_files_with_many_deleted_rows_are_rewritten_even_alone() -> None:
    files = [f("big-many", 500, deleted=10), f("big-few", 500, deleted=2), f("big", 500),
             f("s1", 10), f("s2", 10)]
    bins = plan_bins(files, [], max_file_size=1000, min_file_size=100)
    # candidates by live size: s1 10, s2 10, big-many 450 -> one bin up to 1000
    assert paths(bins) == [["s1", "s2", "big-many"]]
    bins = plan_bins(files, [], max_file_size=100, min_file_size=100)
    assert paths(bins) == [["s1", "s2"], ["big-many"]]  # a one-file bin is kept when it has a DV
    assert paths(plan_bins(files, [], max_file_size=100, min_file_size=100, max_deleted_rows_ratio=0.01)) == [
        ["s1", "s2"], ["big-many"], ["big-few"]]  # smallest live size first: 450, 490
    # a small file alone with a DV (even below the ratio) is rewritten, as Delta does; without one it is not
    assert paths(plan_bins([f("s", 10, deleted=1)], [], max_file_size=100, min_file_size=100)) == [["s"]]
    assert plan_bins([f("s", 10)], [], max_file_size=100, min_file_size=100) == []


def test_bins_are_packed_by_live_bytes() -> None:
    files = [f("a", 60, deleted=50), f("b", 60, deleted=50), f("c", 60)]  # live 30, 30, 60
    bins = plan_bins(files, [], max_file_size=60, min_file_size=100)
    assert paths(bins) == [["a", "b"]]  # c alone, without a DV, is dropped
    assert bins[0].live_size == 60 and bins[0].size == 120


def test_a_purge_takes_every_file_with_a_dv_per_partition() -> None:
    files = [f("a", 5000, deleted=1, day="1"), f("b", 10, deleted=1, day="1"), f("c", 10, day="1"),
             f("d", 10, deleted=3, day="2")]
    bins = plan_purge_bins(files, ["day"], max_file_size=1000)
    assert paths(bins) == [["b"], ["a"], ["d"]]
    assert [b.partition for b in bins] == [(("day", "1"),), (("day", "1"),), (("day", "2"),)]
    assert plan_purge_bins([f("c", 10)], [], max_file_size=1000) == []


def test_auto_compaction_counts_files_with_many_deleted_rows() -> None:
    files = [f("big-many", 500, deleted=10, day="1"), f("big-few", 500, deleted=1, day="1"),
             f("small", 10, day="2")]
    assert small_files_per_partition(files, ["day"], 100) == {(("day", "2"),): 1}
    assert small_files_per_partition(files, ["day"], 100, 0.05) == {(("day", "1"),): 1, (("day", "2"),): 1}
    assert AutoCompact(max_deleted_rows_ratio=0.2).optimize_options({}).max_deleted_rows_ratio == 0.2
    with pytest.raises(ValueError, match="between 0 and 1"):
        AutoCompact(max_deleted_rows_ratio=1.5)


def test_the_ratio_comes_from_the_option_then_the_session_then_005() -> None:
    class Conf:
        def __init__(self, value: str | None) -> None:
            self.value = value

        def get(self, key: str, default: str | None = None) -> str | None:
            assert key == "spark.databricks.delta.optimize.maxDeletedRowsRatio"
            return self.value if self.value is not None else default

    class Session:
        def __init__(self, value: str | None) -> None:
            self.conf = Conf(value)

    assert OptimizeOptions().deleted_rows_ratio(None) == 0.05
    assert OptimizeOptions().deleted_rows_ratio(Session(None)) == 0.05  # type: ignore[arg-type]
    assert OptimizeOptions().deleted_rows_ratio(Session("0.2")) == 0.2  # type: ignore[arg-type]
    assert OptimizeOptions(max_deleted_rows_ratio=0.3).deleted_rows_ratio(Session("0.2")) == 0.3  # type: ignore[arg-type]
    with pytest.raises(DeltaTableError, match="maxDeletedRowsRatio"):
        OptimizeOptions().deleted_rows_ratio(Session("lots"))  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        OptimizeOptions(max_deleted_rows_ratio=-0.1)
