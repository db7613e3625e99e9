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
