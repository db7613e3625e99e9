"""MergeSink, two concurrent writers, vacuum and checkpoints on ``s3a://`` tables in moto's S3:
data files through Spark's S3A connector (hadoop-aws), commits through obstore's conditional
put. Each workload runs in the tier's worker (tests/s3/s3_app.py); the results are checked here
against what delta-rs and a plain object listing see, without Spark."""

from __future__ import annotations

import json
from typing import Any

import obstore
import pytest
from deltalake import DeltaTable as RsTable

from tests.s3.tables import commits, rs_rows, table_objects, txns
from tests.s3.worker import S3Worker

pytestmark = [pytest.mark.s3, pytest.mark.slow]


def test_sink_batches_into_an_s3a_table(s3_worker: S3Worker, s3_table: str, s3_options: dict[str, str],
                                        moto_s3: Any) -> None:
    result = s3_worker.run("sink_batches", uri=s3_table)

    expected = [[1, "a3"], [2, "b2"], [4, "d"], [5, "e"]]
    assert result["ours"] == expected
    assert result["delta"] == expected
    assert rs_rows(s3_table, s3_options) == expected
    progress = result["progress"]
    assert [(p["batchId"], p["skipped"]) for p in progress] == [(0, False), (1, False), (2, False), (1, True),
                                                                (3, False)]
    replayed = progress[3]
    assert replayed["tableVersion"] == progress[2]["tableVersion"]  # the replay committed nothing
    store, keys = table_objects(s3_table, moto_s3.endpoint)
    log = commits(store, keys)
    assert sorted(log) == list(range(result["version"] + 1))
    assert [t for v in sorted(log) for t in txns(log[v])] == [("tier-sink", b) for b in (0, 1, 2, 3)]
    # The data files are objects in the bucket, written by Spark's S3A connector.
    adds = [a["add"]["path"] for v in sorted(log) for a in log[v] if "add" in a]
    assert adds and all(path.endswith(".parquet") and path in keys for path in adds)


def test_two_concurrent_writers_lose_nothing(s3_worker: S3Worker, s3_table: str, s3_options: dict[str, str],
                                             moto_s3: Any) -> None:
    result = s3_worker.run("concurrent_writers", uri=s3_table)

    expected = sorted(
        [[i, ("even-2" if i == 0 else "even-0") if i % 2 == 0 else ("odd-2" if i == 1 else "odd-0")]
         for i in range(20)]
        + [[100 + i, "even-2" if i == 0 else "even-1"] for i in range(5)]
        + [[200 + i, "odd-2" if i == 0 else "odd-1"] for i in range(5)])
    assert result["ours"] == expected
    assert result["delta"] == expected
    assert rs_rows(s3_table, s3_options) == expected
    store, keys = table_objects(s3_table, moto_s3.endpoint)
    log = commits(store, keys)
    # The seed's commit and one per batch: contiguous, each batch exactly once.
    assert sorted(log) == list(range(7)) and result["version"] == 6
    batches = sorted(t for v in range(1, 7) for t in txns(log[v]))
    assert batches == [(f"writer-{name}", b) for name in ("even", "odd") for b in range(3)]
    assert all(len(txns(log[v])) == 1 for v in range(1, 7))
    progress = result["progress"]
    # Both first batches read version 0 and rewrote its one file: the later one had to rerun.
    first_batches = [progress[name][0] for name in ("even", "odd")]
    assert sorted(p["conflictRetries"] for p in first_batches)[0] == 0
    assert sum(p["conflictRetries"] for name in progress for p in progress[name]) >= 1
    assert all(p["attempts"] == p["conflictRetries"] + 1 for name in progress for p in progress[name])


def test_vacuum_and_checkpoints_on_s3a(s3_worker: S3Worker, s3_table: str, s3_options: dict[str, str],
                                       moto_s3: Any) -> None:
    result = s3_worker.run("vacuum_and_checkpoint", uri=s3_table)

    expected = [[i, "v3"] for i in range(1, 11)]
    assert result["ours"] == expected
    assert result["delta"] == expected
    assert rs_rows(s3_table, s3_options) == expected
    store, keys = table_objects(s3_table, moto_s3.endpoint)
    # The sink creates the table, merges four batches; delta-rs' vacuum records its start and end.
    assert result["operations"] == ["CREATE TABLE", *["MERGE"] * 4, "VACUUM START", "VACUUM END"]
    assert result["version"] == 6
    # delta.checkpointInterval=2: the commits of versions 2 and 4 had delta-rs write a checkpoint.
    assert {"_delta_log/00000000000000000002.checkpoint.parquet",
            "_delta_log/00000000000000000004.checkpoint.parquet"} <= set(keys)
    # (delta-rs' vacuum commits may checkpoint too, by its own rule: the newest is at least 4.)
    assert json.loads(bytes(obstore.get(store, "_delta_log/_last_checkpoint").bytes()))["version"] >= 4
    # Batches 1-3 each rewrote the table's one file: the three older files were vacuumed, the live
    # one stays. delta-rs' full vacuum also lists (and deletes) "", the table root's directory
    # marker object S3A keeps (and has again after the reads), which no reader needs.
    live = RsTable(s3_table.replace("s3a://", "s3://", 1), storage_options=s3_options).file_uris()
    deleted_files = [path for path in result["deleted"] if path]
    assert len(deleted_files) == 3 and all(path.endswith(".parquet") for path in deleted_files)
    assert not set(deleted_files) & set(keys)
    assert len(live) == 1 and [key for key in keys if key.endswith(".parquet") and "_delta_log" not in key] == [
        live[0].split(f"{s3_table.removeprefix('s3a://')}/", 1)[1]]
