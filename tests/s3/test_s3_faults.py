"""Faults between the writers and the object store (devtools/s3_faults.py in front of moto): a
commit PUT answered 503 SlowDown, and a commit PUT that lands while its answer is lost. The
commit must end exactly once at its version: no conflict reported, no second copy."""

from __future__ import annotations

from typing import Any

import pytest

from devtools.s3_faults import Fault, FaultProxy
from tests.s3.tables import commits, rs_rows, table_objects, txns
from tests.s3.worker import S3Worker

pytestmark = [pytest.mark.s3, pytest.mark.slow]

EXPECTED = [[1, "b0"], [2, "b0"], *[[i, "b1"] for i in range(3, 8)]]
FIRST_MERGE_COMMIT = r"/_delta_log/0{19}1\.json$"  # version 0 is the sink's CREATE TABLE


def check_two_batches_once(result: dict[str, Any], uri: str, options: dict[str, str], endpoint: str) -> None:
    assert result["ours"] == EXPECTED
    assert result["delta"] == EXPECTED
    assert rs_rows(uri, options) == EXPECTED
    assert result["operations"] == ["CREATE TABLE", "MERGE", "MERGE"]
    store, keys = table_objects(uri, endpoint)
    log = commits(store, keys)
    assert sorted(log) == [0, 1, 2]
    assert [t for v in (1, 2) for t in txns(log[v])] == [("tier-upserts", 0), ("tier-upserts", 1)]
    assert [(p["batchId"], p["skipped"], p["tableVersion"], p["conflictRetries"], p["attempts"])
            for p in result["progress"]] == [(0, False, 1, 0, 1), (1, False, 2, 0, 1)]


def test_commit_answered_slow_down_is_retried(s3_worker: S3Worker, faults: FaultProxy, faulty_table: str,
                                              s3_options: dict[str, str], moto_s3: Any) -> None:
    faults.arm(Fault("status", "PUT", FIRST_MERGE_COMMIT, times=2, status=503))
    faults.arm(Fault("status", "PUT", r"/sm-write-[0-9a-f]+/part-.*\.parquet$", times=1, status=500))

    result = s3_worker.run("upserts", uri=faulty_table)

    assert [(hit.kind, hit.path.rsplit("/", 1)[-1].endswith(".json")) for hit in faults.hits()] == [
        ("status", False), ("status", True), ("status", True)]
    check_two_batches_once(result, faulty_table, s3_options, moto_s3.endpoint)


def test_commit_that_landed_unanswered_is_taken_as_ours(s3_worker: S3Worker, faults: FaultProxy, faulty_table: str,
                                                         s3_options: dict[str, str], moto_s3: Any) -> None:
    faults.arm(Fault("drop_after_forward", "PUT", FIRST_MERGE_COMMIT))

    result = s3_worker.run("upserts", uri=faulty_table)

    hits = faults.hits()
    assert len(hits) == 1 and hits[0].kind == "drop_after_forward" and hits[0].upstream_status == 200
    check_two_batches_once(result, faulty_table, s3_options, moto_s3.endpoint)
