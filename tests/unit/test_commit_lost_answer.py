"""A commit whose put-if-absent landed but whose answer was lost is the writer's own commit:
not a conflict, not a second commit. (The same on moto behind a fault proxy:
tests/s3/test_s3_faults.py.) No JVM: a delta-rs table on the local disk, the put replaced."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import obstore
import pyarrow as pa
import pytest
from deltalake import DeltaTable as RsTable
from deltalake import write_deltalake

from streaming_merge.errors import CommitOutcomeUnknownError, DeltaTableError
from streaming_merge.table import commit as commit_module
from streaming_merge.table.commit import CommitRequest, commit
from streaming_merge.table.snapshot import load_snapshot
from streaming_merge.table.store import put_if_absent


def lands_then(failure: str) -> Any:
    """A put that writes the object, then fails as a lost answer looks to its caller."""

    def put(store: Any, path: str, data: bytes) -> bool:
        assert put_if_absent(store, path, data)
        if failure == "reset":
            raise ConnectionResetError("connection reset by peer after the request was sent")
        return False  # the client's retry of it, refused: the object exists

    return put


@pytest.mark.parametrize("failure", ["reset", "retry_refused"])
def test_a_landed_commit_with_a_lost_answer_is_ours(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   failure: str) -> None:
    write_deltalake(str(tmp_path), pa.table({"id": [1, 2]}))
    monkeypatch.setattr(commit_module, "put_if_absent", lands_then(failure))

    version = commit(CommitRequest(snapshot=load_snapshot(str(tmp_path)), adds=[], removes=[], operation="WRITE",
                                   app_id="app", app_version=7))

    assert version == 1
    table = RsTable(str(tmp_path))
    assert table.version() == 1
    assert table.transaction_version("app") == 7
    assert sorted(meta["path"] for batch in obstore.list(obstore.store.LocalStore(str(tmp_path / "_delta_log")))
                  for meta in batch if str(meta["path"]).endswith(".json")) == [
        "00000000000000000000.json", "00000000000000000001.json"]


def test_a_version_another_writer_won_is_still_a_race(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_deltalake(str(tmp_path), pa.table({"id": [1, 2]}))
    snapshot = load_snapshot(str(tmp_path))
    write_deltalake(str(tmp_path), pa.table({"id": [3]}), mode="append")  # version 1: someone else's

    version = commit(CommitRequest(snapshot=snapshot, adds=[], removes=[], operation="WRITE"))

    assert version == 2


def test_a_failed_put_the_log_cannot_settle_keeps_the_files_and_says_so(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing at the version after a timed-out put: it may still land, so the outcome is
    unknown, and the MERGE's cleanup must keep the data files a landed commit would name."""
    write_deltalake(str(tmp_path), pa.table({"id": [1, 2]}))

    def times_out(store: Any, path: str, data: bytes) -> bool:
        raise TimeoutError("the request timed out")

    monkeypatch.setattr(commit_module, "put_if_absent", times_out)
    with pytest.raises(CommitOutcomeUnknownError, match=r"at version 1 failed \(the request timed out\) and the "
                                                        r"log cannot tell whether the commit landed"):
        commit(CommitRequest(snapshot=load_snapshot(str(tmp_path)), adds=[], removes=[], operation="WRITE"))
    assert issubclass(CommitOutcomeUnknownError, DeltaTableError)
    assert RsTable(str(tmp_path)).version() == 0


def test_a_failed_put_where_another_writer_committed_is_a_plain_failure(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_deltalake(str(tmp_path), pa.table({"id": [1, 2]}))
    snapshot = load_snapshot(str(tmp_path))

    def loses_to_another_writer(store: Any, path: str, data: bytes) -> bool:
        write_deltalake(str(tmp_path), pa.table({"id": [3]}), mode="append")  # it takes version 1
        raise ConnectionResetError("connection reset by peer")

    monkeypatch.setattr(commit_module, "put_if_absent", loses_to_another_writer)
    with pytest.raises(DeltaTableError, match="connection reset by peer") as raised:
        commit(CommitRequest(snapshot=snapshot, adds=[], removes=[], operation="WRITE"))
    assert not isinstance(raised.value, CommitOutcomeUnknownError)
