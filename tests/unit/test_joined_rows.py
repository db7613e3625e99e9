"""A one pass's double-match check from the log's record counts (see
streaming_merge.merge.rewrite.joined_twice): a target row joined with two source rows is
counted twice, so the rows the rewrite joined exceed the candidates' records."""

from __future__ import annotations

from streaming_merge.merge.rewrite import joined_twice
from streaming_merge.table.snapshot import DataFile


def _files(*records: int | None) -> list[DataFile]:
    return [DataFile(f"part-{i}.parquet", 1000 + i, n, {}) for i, n in enumerate(records)]


def test_as_many_joined_rows_as_records_is_no_double_match() -> None:
    counts = {"numTargetRowsCopied": 150, "numTargetRowsMatchedUpdated": 40, "numTargetRowsMatchedDeleted": 10}
    assert not joined_twice(counts, _files(100, 100))


def test_one_joined_row_more_than_the_records_is_a_double_match() -> None:
    counts = {"numTargetRowsCopied": 150, "numTargetRowsMatchedUpdated": 41, "numTargetRowsMatchedDeleted": 10}
    assert joined_twice(counts, _files(100, 100))


def test_a_candidate_without_a_record_count_leaves_the_check_to_the_source_side() -> None:
    counts = {"numTargetRowsCopied": 150, "numTargetRowsMatchedUpdated": 99}
    assert not joined_twice(counts, _files(100, None))
