"""The change data feed's planning rules (Delta's CDCReader) on hand-made commits, commit
timestamps, timestamp options and the stream's option parsing: no JVM, no table."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Sequence
from typing import Any

import pytest

from streaming_merge.cdf.errors import ChangeDataFeedError
from streaming_merge.cdf.log import Commit, parse_commit
from streaming_merge.cdf.plan import RowSelection, check_recorded, to_epoch_ms, version_changes
from streaming_merge.cdf.source import DEFAULT_MAX_FILES, ChangesOptions

DV_A = {"storageType": "u", "pathOrInlineDv": "ab^-aqEH.-t@S}K{vb[*k^", "offset": 1, "sizeInBytes": 40,
        "cardinality": 2}
DV_B = {**DV_A, "offset": 45, "cardinality": 3}


def add(path: str, *, dv: dict[str, Any] | None = None, data_change: bool = True, records: int = 10) -> dict[str, Any]:
    action = {"path": path, "partitionValues": {"p": "1"}, "size": 100, "dataChange": data_change,
              "stats": json.dumps({"numRecords": records})}
    return {**action, "deletionVector": dv} if dv else action


def remove(path: str, *, dv: dict[str, Any] | None = None, data_change: bool = True) -> dict[str, Any]:
    action = {"path": path, "partitionValues": {"p": "1"}, "size": 100, "dataChange": data_change}
    return {**action, "deletionVector": dv} if dv else action


def commit(adds: Sequence[dict[str, Any]] = (), removes: Sequence[dict[str, Any]] = (),
           cdcs: Sequence[dict[str, Any]] = ()) -> Commit:
    return Commit(version=7, timestamp_ms=1_700_000_000_000, adds=tuple(adds), removes=tuple(removes),
                  cdcs=tuple(cdcs), metadata=None)


def plan(c: Commit) -> list[tuple[str, str, RowSelection | None]]:
    changes = version_changes(c, "t", True, lambda path: None)
    assert all(f.version == 7 and f.timestamp_ms == 1_700_000_000_000 for f in changes.files)
    return [(f.kind, f.path, f.selection) for f in changes.files]


def test_a_version_with_cdc_actions_reads_only_its_change_data_files() -> None:
    cdc = {"path": "_change_data/p=1/cdc-1.parquet", "partitionValues": {"p": "1"}, "size": 5, "dataChange": False}
    changes = version_changes(commit([add("a")], [remove("b")], [cdc]), "t", True, lambda path: None)
    assert [(f.kind, f.path, f.partition_values, f.change_type) for f in changes.files] == [
        ("cdc", "_change_data/p=1/cdc-1.parquet", {"p": "1"}, None)]


def test_adds_and_removes_with_data_change_are_inserts_and_deletes_under_their_vectors() -> None:
    rows = plan(commit([add("a%20b", dv=DV_A), add("c", data_change=False)], [remove("d", dv=DV_B),
                                                                             remove("e", data_change=False)]))
    assert [(kind, path) for kind, path, _ in rows] == [("insert", "a b"), ("delete", "d")]
    assert rows[0][2] is not None and rows[0][2].vector is not None and not rows[0][2].keep
    assert rows[0][2].vector.cardinality == 2 and rows[1][2].vector.cardinality == 3  # type: ignore[union-attr]


def test_a_deletion_vector_update_emits_only_the_rows_the_vectors_differ_in() -> None:
    (kind_d, _, deleted), (kind_i, _, restored) = plan(commit([add("a", dv=DV_B)], [remove("a", dv=DV_A)]))
    assert (kind_d, kind_i) == ("delete", "insert")
    assert deleted.keep and deleted.vector.offset == 45 and deleted.minus.offset == 1  # type: ignore[union-attr]
    assert restored.keep and restored.vector.offset == 1 and restored.minus.offset == 45  # type: ignore[union-attr]
    # A first vector on a file: only deletes; a vector dropped (RESTORE): only inserts; the same: nothing.
    assert [k for k, _, _ in plan(commit([add("a", dv=DV_A)], [remove("a")]))] == ["delete"]
    assert [k for k, _, _ in plan(commit([add("a")], [remove("a", dv=DV_A)]))] == ["insert"]
    assert plan(commit([add("a", dv=DV_A)], [remove("a", dv=DV_A)])) == []


def test_a_remove_without_size_takes_it_from_the_live_add_before_the_commit() -> None:
    bare = {"path": "x", "dataChange": True}
    changes = version_changes(commit([], [bare]), "t", True, lambda path: {"size": 42, "partitionValues": {"p": "9"}})
    assert [(f.size, f.partition_values) for f in changes.files] == [(42, {"p": "9"})]
    with pytest.raises(ChangeDataFeedError, match="has no size"):
        version_changes(commit([], [bare]), "t", True, lambda path: None)


def test_absolute_paths_are_refused_with_the_version() -> None:
    with pytest.raises(ChangeDataFeedError, match=r"Commit 7 .* absolute path"):
        plan(commit([add("s3://bucket/other/a.parquet")]))


def test_commit_timestamps_prefer_in_commit_then_commit_info_then_file_time() -> None:
    def stamp(info: dict[str, Any] | None) -> int:
        lines = [json.dumps({"commitInfo": info})] if info is not None else []
        lines.append(json.dumps({"add": add("a")}))
        return parse_commit("\n".join(lines).encode(), "t", 3, lambda: 5).timestamp_ms

    assert stamp({"timestamp": 10, "inCommitTimestamp": 20}) == 20
    assert stamp({"timestamp": 10}) == 10
    assert stamp(None) == 5
    with pytest.raises(ChangeDataFeedError, match="Line 1 of commit 3"):
        parse_commit(b"{not json", "t", 3, lambda: 5)


def test_a_range_needs_the_feed_on_at_its_start_and_never_turned_off() -> None:
    on = {"delta.enableChangeDataFeed": "true"}
    off_at_9 = Commit(9, 0, (), (), (), {"configuration": {"delta.enableChangeDataFeed": "false"}})
    check_recorded("t", 8, 10, on, [Commit(8, 0, (), (), (), None)])
    with pytest.raises(ChangeDataFeedError, match=r"range \[8 , 10\].*not recorded for version \[9\]"):
        check_recorded("t", 8, 10, on, [off_at_9])
    with pytest.raises(ChangeDataFeedError, match=r"not recorded for version \[8\]"):
        check_recorded("t", 8, 10, {}, [])


def test_timestamp_options_are_utc_unless_they_carry_an_offset() -> None:
    assert to_epoch_ms("2024-01-31", "x") == 1_706_659_200_000
    assert to_epoch_ms("2024-01-31 00:00:01.5", "x") == 1_706_659_201_500
    assert to_epoch_ms("2024-01-31T01:00:00+01:00", "x") == to_epoch_ms("2024-01-31T00:00:00Z", "x")
    assert to_epoch_ms(dt.datetime(2024, 1, 31), "x") == 1_706_659_200_000
    with pytest.raises(ChangeDataFeedError, match="starting_timestamp must be an ISO-8601"):
        to_epoch_ms("yesterday", "starting_timestamp")


def test_stream_options() -> None:
    parsed = ChangesOptions.parse({"path": "/t", "startingVersion": "3", "maxBytesPerTrigger": "64m",
                                   "aws_region": "eu-west-1"})
    assert (parsed.starting_version, parsed.max_bytes, parsed.files_limit) == (3, 64 << 20, None)
    assert parsed.storage_options == (("aws_region", "eu-west-1"),)
    assert ChangesOptions.parse({"path": "/t", "startingversion": "LATEST"}).starting_latest
    assert ChangesOptions.parse({"path": "/t"}).files_limit == DEFAULT_MAX_FILES
    for bad, message in [({}, "'path' is required"),
                         ({"path": "/t", "startingVersion": "x"}, "startingVersion must be"),
                         ({"path": "/t", "startingVersion": "1", "startingTimestamp": "2024-01-01"}, "at most one"),
                         ({"path": "/t", "maxFilesPerTrigger": "0"}, "positive integer"),
                         ({"path": "/t", "maxBytesPerTrigger": "lots"}, "positive size")]:
        with pytest.raises(ChangeDataFeedError, match=message):
            ChangesOptions.parse(bad)
