"""The ``delta_changes`` stream reader driven in this process, as Spark drives it (initial
offset, latestOffset with a read limit, partitions, read on an "executor", a new reader
instance for a restart), over tables delta-rs writes: the offsets' exactly-once contract
without a JVM. tests/spark/test_cdf_stream.py runs the same source through Spark."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import deltalake
import pyarrow as pa
import pytest
from pyspark.sql.datasource import CaseInsensitiveDict
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxFiles

from streaming_merge.cdf.errors import ChangeDataFeedError, ChangeDataSchemaChangedError
from streaming_merge.cdf.source import DeltaChangesDataSource, DeltaChangesStreamReader
from tests.cdf_support import (
    CDF_ON,
    comparable,
    delta_rs_changes,
    with_change_data_feed_from_the_start,
    writable_copy,
)

COLUMNS = ["id", "v", "part", "_change_type", "_commit_version", "_commit_timestamp"]


def reader(path: Path, **options: str) -> DeltaChangesStreamReader:
    source = DeltaChangesDataSource(CaseInsensitiveDict({"path": str(path), **options}))
    return source.streamReader(source.schema())


def rows(source: DeltaChangesStreamReader, start: dict, end: dict) -> pa.Table:
    """What one batch returns: its partitions read one by one (pickled, as Spark ships them)."""
    import pickle

    executor = pickle.loads(pickle.dumps(source))
    batches = [b for p in source.partitions(start, end) for b in executor.read(pickle.loads(pickle.dumps(p)))]
    return pa.Table.from_batches(batches, schema=source._layout.schema)


def run(source: DeltaChangesStreamReader, start: dict | None = None, limit: ReadLimit | None = None,
        batches: int | None = None) -> tuple[dict, list[pa.Table]]:
    """Batches until no new data (or ``batches`` of them); offsets go through JSON, as Spark's
    checkpoint stores them."""
    start = source.initialOffset() if start is None else start
    out = []
    while batches is None or len(out) < batches:
        end = source.latestOffset(start, limit or source.getDefaultReadLimit())
        if end == start:
            break
        out.append(rows(source, start, end))
        source.commit(end)
        start = json.loads(json.dumps(end))
    return start, out


def make_table(path: Path) -> None:
    """v0 two partitions (CDF on), v1 an append, v2 a MERGE (cdc files), v3 a whole-partition delete."""
    data = pa.table({"id": pa.array([1, 2, 3, 4], pa.int64()), "v": ["a", "b", "c", "d"], "part": ["x", "x", "y", "y"]})
    deltalake.write_deltalake(str(path), data, partition_by=["part"], configuration=CDF_ON)
    deltalake.write_deltalake(str(path), pa.table({"id": pa.array([5], pa.int64()), "v": ["e"], "part": ["z"]}),
                              mode="append")
    source = pa.table({"id": pa.array([2, 6], pa.int64()), "v": ["B", "f"], "part": ["x", "y"]})
    (deltalake.DeltaTable(str(path)).merge(source, "t.id = s.id", source_alias="s", target_alias="t")
     .when_matched_update_all().when_not_matched_insert_all().execute())
    deltalake.DeltaTable(str(path)).delete("part = 'z'")


def total(tables: list[pa.Table], columns: list[str] = COLUMNS) -> Counter[tuple[Any, ...]]:
    result: Counter[tuple[Any, ...]] = Counter()
    for table in tables:
        result += comparable(table, columns)
    return result


def test_batches_of_two_files_and_a_restart_deliver_every_change_once(tmp_path: Path) -> None:
    path = tmp_path / "t"
    make_table(path)
    expected = comparable(delta_rs_changes(path), COLUMNS)
    first = reader(path, startingVersion="0", maxFilesPerTrigger="2")
    stopped_at, before = run(first, batches=2)
    assert all(len(b) for b in before)
    # A new reader, as after a restart, continues from the checkpointed offset.
    last, after = run(reader(path, startingVersion="0", maxFilesPerTrigger="2"), start=stopped_at)
    assert len(before) + len(after) == 3  # 6 change files (2 + 1 + 2 cdc + 1), 2 a batch
    assert total(before + after) == expected
    # More commits: the next batch holds exactly them.
    deltalake.write_deltalake(str(path), pa.table({"id": pa.array([7], pa.int64()), "v": ["g"], "part": ["x"]}),
                              mode="append")
    _, more = run(reader(path, startingVersion="0"), start=last)
    assert total(more) == comparable(delta_rs_changes(path, 4), COLUMNS)


def test_replanning_a_batch_returns_the_same_files(tmp_path: Path) -> None:
    path = tmp_path / "t"
    make_table(path)
    source = reader(path, startingVersion="1", maxFilesPerTrigger="2")
    start = source.initialOffset()
    end = source.latestOffset(start, source.getDefaultReadLimit())
    assert end["version"] == 2 and end["index"] == 1  # v1's file, then the first of v2's two
    again = reader(path, startingVersion="1")
    assert comparable(rows(again, start, end)) == comparable(rows(source, start, end))


def test_without_a_start_the_snapshot_comes_first_and_its_version_is_fixed_by_the_first_batch(tmp_path: Path
                                                                                              ) -> None:
    path = tmp_path / "t"
    make_table(path)
    source = reader(path)
    placeholder = source.initialOffset()
    assert placeholder["version"] == -1
    end = source.latestOffset(placeholder, ReadAllAvailable())
    assert (end["version"], end["isStartingVersion"]) == (3, True)
    snapshot = comparable(rows(source, placeholder, end), ["id", "v", "part", "_change_type", "_commit_version"])
    assert snapshot == Counter({(1, "a", "x", "insert", 3): 1, (2, "B", "x", "insert", 3): 1,
                                (3, "c", "y", "insert", 3): 1, (4, "d", "y", "insert", 3): 1,
                                (6, "f", "y", "insert", 3): 1})
    # A commit before the first batch is replayed (a crash before it was committed) changes nothing.
    deltalake.DeltaTable(str(path)).delete("id = 1")
    assert comparable(rows(reader(path), placeholder, end)) == comparable(rows(source, placeholder, end))
    _, after = run(source, start=end)
    assert total(after) == comparable(delta_rs_changes(path, 4), COLUMNS)


def test_starting_version_latest_reads_only_later_commits(tmp_path: Path) -> None:
    path = tmp_path / "t"
    make_table(path)
    source = reader(path, startingVersion="latest")
    start, batches = run(source)
    assert [b.num_rows for b in batches] == [0]
    deltalake.DeltaTable(str(path)).delete("id = 3")
    _, batches = run(source, start=start)
    assert total(batches) == comparable(delta_rs_changes(path, 4), COLUMNS)


def test_available_now_stops_at_the_version_current_when_it_started(tmp_path: Path) -> None:
    path = tmp_path / "t"
    make_table(path)
    source = reader(path, startingVersion="0", maxFilesPerTrigger="1")
    source.prepareForTriggerAvailableNow()
    start = source.initialOffset()
    end = source.latestOffset(start, ReadMaxFiles(1))
    deltalake.DeltaTable(str(path)).delete("id = 3")  # version 4, after the target
    last, batches = run(source, start=end)
    assert last["version"] == 4 and last["index"] == 0
    assert max(v for b in batches for v in b.column("_commit_version").to_pylist()) == 3


def test_deletion_vector_commits_are_read_on_executors_as_delta_rs_reads_them(tmp_path: Path) -> None:
    path = writable_copy("table-with-dv-large", tmp_path)
    with_change_data_feed_from_the_start(path)
    _, batches = run(reader(path, startingVersion="0"))
    columns = ["value", "_change_type", "_commit_version", "_commit_timestamp"]
    assert total(batches, columns) == comparable(delta_rs_changes(path), columns)


def test_a_schema_change_stops_the_stream(tmp_path: Path) -> None:
    path = tmp_path / "t"
    make_table(path)
    source = reader(path, startingVersion="0")
    start, _ = run(source)
    wider = pa.table({"id": pa.array([9], pa.int64()), "v": ["i"], "part": ["x"], "w": pa.array([1.0])})
    deltalake.write_deltalake(str(path), wider, mode="append", schema_mode="merge")
    with pytest.raises(ChangeDataSchemaChangedError, match=r"Version 4 .* changed its schema"):
        run(source, start=start)


def test_a_vacuumed_file_or_a_cleaned_up_commit_fails_the_stream_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "t"
    make_table(path)
    cdc = next(p for p in (path / "_change_data").rglob("*.parquet"))
    cdc.unlink()
    with pytest.raises(ChangeDataFeedError, match=r"change data file `_change_data/.*` of version 2 .* is missing"):
        run(reader(path, startingVersion="0"))
    deltalake.DeltaTable(str(path)).create_checkpoint()  # at version 3; log cleanup may then drop 0..2
    for version in (0, 1):
        (path / "_delta_log" / f"{version:020d}.json").unlink()
    with pytest.raises(ChangeDataFeedError, match=r"at version 2: its state at that version cannot be read"):
        reader(path, startingVersion="2").initialOffset()
    source = reader(path, startingVersion="3")
    with pytest.raises(ChangeDataFeedError, match=r"no longer holds commit 1 .* oldest commit is 2"):
        run(source, start={**source.initialOffset(), "version": 1})  # a checkpoint older than the cleanup
