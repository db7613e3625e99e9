"""``DeltaTable.changes()`` against delta-rs ``load_cdf`` (every column, order-insensitive) on
tables Delta Lake on Spark and delta-rs wrote: change data files, versions without them
(appends, whole-file removes), deletion-vector commits, ranges, timestamps, and the errors."""

from __future__ import annotations

import datetime as dt
from collections import Counter
from pathlib import Path

import deltalake
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql import DataFrame, SparkSession

from streaming_merge import DeltaTable
from streaming_merge.cdf.errors import ChangeDataFeedError, ChangeDataNotRecordedError
from streaming_merge.table import deletion_vectors
from tests.cdf_support import (
    CDF_ON,
    append_commit,
    commit_actions,
    comparable,
    delta_rs_changes,
    with_change_data_feed_from_the_start,
    writable_copy,
)
from tests.delta_fixtures import FIXTURES


def ours(frame: DataFrame) -> Counter:
    return comparable(frame.toArrow())


def theirs(path: Path | str, start: int = 0, end: int | None = None, columns: list[str] | None = None) -> Counter:
    return comparable(delta_rs_changes(path, start, end), columns)


@pytest.mark.parametrize(("name", "rows"), [("cdf-table", 23), ("cdf-table-non-partitioned", 25)])
def test_changes_of_delta_lake_tables_equal_delta_rs(spark: SparkSession, name: str, rows: int) -> None:
    frame = DeltaTable.forPath(spark, str(FIXTURES / name)).changes()
    assert frame.columns[-3:] == ["_change_type", "_commit_version", "_commit_timestamp"]
    assert [f.dataType.simpleString() for f in frame.schema.fields[-3:]] == ["string", "bigint", "timestamp"]
    got = ours(frame)
    assert got == theirs(FIXTURES / name, columns=frame.columns)
    assert sum(got.values()) == rows


def test_ranges_and_timestamps_select_versions_as_delta_does(spark: SparkSession) -> None:
    path = FIXTURES / "cdf-table-non-partitioned"
    table = DeltaTable.forPath(spark, str(path))
    stamps = {v: next(a["commitInfo"]["timestamp"] for a in commit_actions(path, v) if "commitInfo" in a)
              for v in range(5)}

    def versions(frame: DataFrame) -> list[int]:
        return sorted({r[0] for r in frame.select("_commit_version").collect()})

    frame = table.changes(starting_version=1, ending_version=2)
    assert ours(frame) == theirs(path, 1, 2, frame.columns)
    at = dt.datetime.fromtimestamp(stamps[2] / 1000, dt.UTC)
    assert versions(table.changes(starting_timestamp=at)) == [2, 3, 4]
    assert versions(table.changes(starting_timestamp=at + dt.timedelta(milliseconds=1))) == [3, 4]
    assert versions(table.changes(starting_timestamp=at - dt.timedelta(seconds=1), ending_timestamp=at)) == [2]
    assert versions(table.changes(ending_timestamp=(at - dt.timedelta(milliseconds=1)).isoformat())) == [0, 1]
    assert versions(table.changes(starting_version=3, ending_version=99)) == [3, 4]  # an end past the latest
    after = dt.datetime.fromtimestamp(stamps[4] / 1000 + 1, dt.UTC)
    with pytest.raises(ChangeDataFeedError, match="after the latest version available"):
        table.changes(starting_timestamp=after)
    with pytest.raises(ChangeDataFeedError, match="at most one of starting_version and starting_timestamp"):
        table.changes(starting_version=1, starting_timestamp=at)


def test_changes_of_a_table_delta_rs_wrote_equal_its_load_cdf(spark: SparkSession, tmp_path: Path) -> None:
    """Change data files (MERGE, UPDATE, DELETE) and versions without any: an append, a
    partition overwritten and a partition deleted (whole files removed)."""
    path = str(tmp_path / "t")
    data = pa.table({"id": pa.array([1, 2, 3, 4], pa.int64()), "v": ["a", "b", "c", "d"],
                     "day": pa.array([dt.date(2024, 1, 1)] * 2 + [dt.date(2024, 1, 2)] * 2)})
    deltalake.write_deltalake(path, data, partition_by=["day"], configuration=CDF_ON)
    rs = deltalake.DeltaTable(path)
    source = pa.table({"id": pa.array([2, 5], pa.int64()), "v": ["B", "e"],
                       "day": pa.array([dt.date(2024, 1, 1), dt.date(2024, 1, 3)])})
    (rs.merge(source, "t.id = s.id", source_alias="s", target_alias="t")
     .when_matched_update_all().when_not_matched_insert_all().execute())
    rs.update(predicate="id = 3", updates={"v": "'C'"})
    rs.delete("id = 4")
    deltalake.write_deltalake(path, pa.table({"id": pa.array([6], pa.int64()), "v": ["f"],
                                              "day": pa.array([dt.date(2024, 1, 4)])}), mode="append")
    deltalake.write_deltalake(path, pa.table({"id": pa.array([7], pa.int64()), "v": ["g"],
                                              "day": pa.array([dt.date(2024, 1, 3)])}),
                              mode="overwrite", predicate="day = '2024-01-03'")
    deltalake.DeltaTable(path).delete("day = '2024-01-01'")
    without_cdc = [v for v in range(7) if not any("cdc" in a for a in commit_actions(Path(path), v))]
    assert without_cdc == [0, 4, 5, 6]
    frame = DeltaTable.forPath(spark, path).changes()
    got = ours(frame)
    assert got == theirs(path, columns=frame.columns)
    assert sum(n for row, n in got.items() if row[4] == 6) == 2  # the deleted partition's rows


def test_deletion_vector_commits_read_as_the_rows_the_vectors_changed(spark: SparkSession, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Delta Lake's DV DELETEs (remove and add of the same path with a new vector, no cdc
    actions) read as deletes of the newly deleted rows only; a vector dropped (a RESTORE)
    as inserts of the rows it brings back; a file added again unchanged as nothing. The
    vectors are read with one request per DV file."""
    large = writable_copy("table-with-dv-large", tmp_path)
    with_change_data_feed_from_the_start(large)
    requests: list[str] = []
    for function in ("get_range", "get_ranges"):
        original = getattr(deletion_vectors.obstore, function)
        monkeypatch.setattr(deletion_vectors.obstore, function,
                            lambda store, path, _f=original, **kw: requests.append(path) or _f(store, path, **kw))
    frame = DeltaTable.forPath(spark, str(large)).changes()
    assert sorted(requests) == sorted(p.name for p in large.glob("deletion_vector_*.bin"))
    got = ours(frame)
    assert got == theirs(large, columns=frame.columns)
    per_version = Counter({(v, kind): 0 for v in range(5) for kind in ("insert", "delete")})
    for row, n in got.items():
        per_version[(row[2], row[1])] += n
    assert [per_version[(v, "insert")] - per_version[(v, "delete")] for v in range(5)] == [2000, -5, 2, -6, 2]

    small = writable_copy("table-with-dv-small", tmp_path)
    with_change_data_feed_from_the_start(small)
    add = next(a["add"] for a in commit_actions(small, 1) if "add" in a)
    restored = {k: v for k, v in add.items() if k != "deletionVector"}
    version = append_commit(small, [{"remove": {**add, "dataChange": True}}, {"add": restored}], 1_800_000_000_000)
    # the same logical file added again, without a remove (Delta refuses a commit that adds and
    # removes one (path, DV) pair, and readers disagree on which of the two wins)
    append_commit(small, [{"add": {**restored, "dataChange": False}}], 1_800_000_001_000)
    frame = DeltaTable.forPath(spark, str(small)).changes(starting_version=version)
    assert sorted((r[0], r[1], r[2]) for r in frame.select("_change_type", "_commit_version", "value").collect()) \
        == [("insert", version, 0), ("insert", version, 9)]
    assert ours(frame) == theirs(small, version, columns=frame.columns)


def test_errors_name_the_table_the_versions_and_the_fix(spark: SparkSession, tmp_path: Path) -> None:
    table = DeltaTable.forPath(spark, str(FIXTURES / "cdf-table"))
    with pytest.raises(ChangeDataFeedError, match=r"start version \(9\) .* latest version of the table \(3\)"):
        table.changes(starting_version=9)
    with pytest.raises(ChangeDataFeedError, match=r"from start 2 to end 1 .* end cannot be before start"):
        table.changes(starting_version=2, ending_version=1)

    cleaned = writable_copy("cdf-table", tmp_path)
    (cleaned / "_delta_log" / f"{1:020d}.json").unlink()
    with pytest.raises(ChangeDataFeedError, match=r"no longer holds commit 1 .* delta.logRetentionDuration"):
        DeltaTable.forPath(spark, str(cleaned)).changes(starting_version=1, ending_version=1)

    vacuumed = writable_copy("cdf-table-non-partitioned", tmp_path)
    cdc = next(a["cdc"]["path"] for a in commit_actions(vacuumed, 3) if "cdc" in a)
    (vacuumed / cdc).unlink()
    gone = r"versions \[2, 4\]: the change data file `_change_data/cdc-.*` of version 3 is missing\. VACUUM"
    with pytest.raises(ChangeDataFeedError, match=gone):
        DeltaTable.forPath(spark, str(vacuumed)).changes(starting_version=2)

    path = str(tmp_path / "late")
    deltalake.write_deltalake(path, pa.table({"id": pa.array([1], pa.int64())}))
    deltalake.DeltaTable(path).alter.set_table_properties(CDF_ON)  # version 1
    deltalake.write_deltalake(path, pa.table({"id": pa.array([2], pa.int64())}), mode="append")
    deltalake.DeltaTable(path).alter.set_table_properties({"delta.enableChangeDataFeed": "false"})  # version 3
    late = DeltaTable.forPath(spark, path)
    with pytest.raises(ChangeDataNotRecordedError, match=r"range \[0 , 2\] .* not recorded for version \[0\]"):
        late.changes(ending_version=2)
    assert [tuple(r) for r in late.changes(starting_version=1, ending_version=2).select("id", "_change_type")
            .collect()] == [(2, "insert")]
    with pytest.raises(ChangeDataNotRecordedError, match=r"not recorded for version \[3\]"):
        late.changes(starting_version=1)


def test_data_files_with_a_change_type_column_read_by_their_action(spark: SparkSession, tmp_path: Path) -> None:
    """Delta Lake writes ``_change_type`` into the data files of a CDF table's UPDATE; a later
    whole-file remove of them (no cdc actions) is a delete of every row, whatever that column
    holds."""
    path = writable_copy("cdf-table", tmp_path)
    removed = [a["add"]["path"] for a in commit_actions(path, 1) if "add" in a]
    assert all("_change_type" in pq.read_schema(path / p).names for p in removed)
    deltalake.DeltaTable(str(path)).delete("birthday = '2023-12-22'")  # version 4: those files removed
    frame = DeltaTable.forPath(spark, str(path)).changes(starting_version=4)
    assert ours(frame) == theirs(path, 4, columns=frame.columns)
    assert sorted(tuple(r) for r in frame.select("id", "_change_type").collect()) == [
        (1, "delete"), (2, "delete"), (3, "delete"), (4, "delete")]
