"""FollowedTable: a stream's view of a table it writes, kept current by reading only the new commits.

Why: the sink used to load both of its tables' logs from scratch every micro-batch (a replay
of up to 99 commits since the last checkpoint). Following them must still see every commit,
its own and other writers', and must never build on a log that is no longer there: a table
deleted, or deleted and created again (its versions start over), is read afresh.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from streaming_merge.spark.profile import profiling
from streaming_merge.table.follow import FollowedTable
from streaming_merge.table.location import resolve
from streaming_merge.table.snapshot import load_snapshot


def _append(path: Path, ids: list[int]) -> None:
    write_deltalake(str(path), pa.table({"id": pa.array(ids, pa.int64())}), mode="append")


def _files(path: Path) -> set[str]:
    return {f.path for f in load_snapshot(resolve(str(path))).files}


def test_the_commits_of_any_writer_are_followed_without_loading_the_log_again(tmp_path: Path) -> None:
    path = tmp_path / "t"
    _append(path, [1])
    followed = FollowedTable(resolve(str(path)))
    first = followed.latest()
    assert first is not None and first.version == 0
    _append(path, [2])
    _append(path, [3, 4])
    with profiling() as profile:
        latest = followed.latest()
        unchanged = followed.latest()
    assert latest is not None and unchanged is not None
    assert (latest.version, unchanged.version) == (2, 2)
    assert {f.path for f in latest.files} == _files(path) and len(latest.files) == 3
    assert sum(f.num_records or 0 for f in latest.files) == 4
    assert (profile.log_loads, profile.log_updates) == (0, 2)


def test_a_table_that_does_not_exist_yet_is_none_until_it_is_created(tmp_path: Path) -> None:
    path = tmp_path / "t"
    followed = FollowedTable(resolve(str(path)))
    assert followed.latest() is None
    _append(path, [1])
    created = followed.latest()
    assert created is not None and created.version == 0 and len(created.files) == 1


def test_a_deleted_table_is_none(tmp_path: Path) -> None:
    path = tmp_path / "t"
    _append(path, [1])
    followed = FollowedTable(resolve(str(path)))
    assert followed.latest() is not None
    shutil.rmtree(path)
    assert followed.latest() is None


@pytest.mark.parametrize(("versions_before", "versions_after"), [(4, 1), (2, 4), (2, 2)],
                         ids=["fewer-versions", "more-versions", "as-many-versions"])
def test_a_table_created_again_is_read_afresh(tmp_path: Path, versions_before: int, versions_after: int) -> None:
    """Fewer versions: the log no longer reaches the old one. As many or more: it does, but
    that version is another commit, and advancing onto it would mix two tables' files."""
    path = tmp_path / "t"
    for i in range(versions_before):
        _append(path, [i])
    followed = FollowedTable(resolve(str(path)))
    old = followed.latest()
    assert old is not None and old.version == versions_before - 1
    shutil.rmtree(path)
    for i in range(versions_after):
        _append(path, [10 + i, 20 + i])
    with profiling() as profile:
        again = followed.latest()
    assert again is not None and again.version == versions_after - 1
    assert {f.path for f in again.files} == _files(path)
    assert sum(f.num_records or 0 for f in again.files) == 2 * versions_after
    assert profile.log_loads == 1
