"""A Kafka batch with malformed records runs the Spark jobs of a clean one, and each malformed
record reaches the dead-letter table exactly once, across a replay and a crash between the
dead-letter commit and the MERGE's.

The malformed records travel in the observation of the sink's copy of the batch
(``debezium.decode_observed``): the driver writes the dead letters from there
(``table.driver_rows``), without reading Kafka, decoding again or a Spark job. A record too
large for that (``INLINE_DEAD_LETTER_BYTES``) is read again by its offset range; here the
re-read is the batch itself (no broker), which also shows that the records the observation
carried are not written twice."""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession

import jobs.kafka_cdc_ingest as ingest
from jobs.kafka_cdc_ingest import IngestConfig, batch_function
from streaming_merge.kafka import debezium, source
from tests.job_count import jobs_of
from tests.spark.test_deletion_vectors import delta_rs_rows

RECORDS = 200  # a batch; 1 % of them malformed in the batches that have any
BAD = [b"not json at all", b'{"op": "x", "after": {}}']


def _records(spark: SparkSession, batch: int, malformed: Sequence[bytes] = ()) -> DataFrame:
    """``RECORDS`` records at offsets from ``batch * RECORDS``: upserts of keys 0.. (the same
    keys every batch, so every batch takes the same MERGE path), the last ones ``malformed``."""
    rows = []
    first = batch * RECORDS
    for i in range(RECORDS):
        offset = first + i
        if i >= RECORDS - len(malformed):
            value = malformed[i - (RECORDS - len(malformed))]
            rows.append((b"bad", value, "orders", 0, offset, None, 0, []))
            continue
        image = {"id": i, "v": f"b{batch}"}
        envelope = {"op": "u" if batch else "c", "before": None, "after": image, "source": {"lsn": offset},
                    "ts_ms": offset}
        rows.append((str(i).encode(), json.dumps(envelope).encode(), "orders", 0, offset, None, 0, []))
    return spark.createDataFrame(rows, source.SCHEMA)


def _dead_letters(path: Path) -> list[tuple[int, bytes]]:
    return sorted((r[5], bytes(r[1])) for r in delta_rs_rows(path))  # (offset, value)


def test_malformed_batch_runs_a_clean_ones_jobs_and_dead_letters_each_record_once(
        spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = IngestConfig(bootstrap_servers="127.0.0.1:9", topics="orders", target=str(tmp_path / "orders"),
                          keys=["id"], checkpoint=str(tmp_path / "checkpoint"), row_schema="id long, v string",
                          dead_letter=str(tmp_path / "dead_letter"), max_offsets_per_trigger=RECORDS)
    progress: list[dict[str, Any]] = []
    spark.sparkContext.setLocalProperty("sql.streaming.queryId", "query-malformed")
    try:
        run, _ = batch_function(config, progress.append)
        # 0 creates the target, 1 the dead-letter table; 2 (clean) and 3 (1 % malformed) are compared.
        batches = [_records(spark, 0), _records(spark, 1, BAD), _records(spark, 2), _records(spark, 3, BAD)]
        jobs = [jobs_of(spark, functools.partial(run, records, batch_id))[0]
                for batch_id, records in enumerate(batches)]
        assert jobs[3] == jobs[2], f"a malformed batch runs the Spark jobs of a clean one: {jobs}"
        assert [p["malformedRecords"] for p in progress] == [0, 2, 0, 2]

        # A restart replays batch 3, which the target holds: nothing is written again.
        replay, _ = batch_function(config, progress.append)
        replay(batches[3], 3)
        assert progress[-1]["skipped"]

        # A crash after batch 4's dead letters committed, before its MERGE did: the rerun's
        # dead-letter append finds its txn, the MERGE commits.
        original = ingest._BatchWrites.at_phase

        def crash_before_commit(self: ingest._BatchWrites, phase: str) -> None:
            original(self, phase)
            if phase == "before_commit":
                raise RuntimeError("killed before the MERGE's commit")

        batch4 = _records(spark, 4, BAD)
        monkeypatch.setattr(ingest._BatchWrites, "at_phase", crash_before_commit)
        with pytest.raises(RuntimeError, match="killed before"):
            batch_function(config, progress.append)[0](batch4, 4)
        monkeypatch.setattr(ingest._BatchWrites, "at_phase", original)
        batch_function(config, progress.append)[0](batch4, 4)

        # Batch 5's second malformed record is too large to be observed: it is read again (the
        # re-read here returns the whole batch) and only it comes from there.
        large = b"{" + b"x" * debezium.INLINE_DEAD_LETTER_BYTES
        batch5 = _records(spark, 5, [BAD[0], large])
        monkeypatch.setattr(ingest, "read_ranges", lambda *_: batch5)
        batch_function(config, progress.append)[0](batch5, 5)
    finally:
        spark.sparkContext.setLocalProperty("sql.streaming.queryId", None)  # type: ignore[arg-type]

    expected = [(b * RECORDS + RECORDS - len(BAD) + i, value) for b in (1, 3, 4) for i, value in enumerate(BAD)]
    expected += [(5 * RECORDS + RECORDS - 2, BAD[0]), (5 * RECORDS + RECORDS - 1, large)]
    assert _dead_letters(tmp_path / "dead_letter") == sorted(expected), "each malformed record exactly once"
    errors = {r[5]: r[2] for r in delta_rs_rows(tmp_path / "dead_letter")}
    assert errors[RECORDS + RECORDS - 1] == "unknown op 'x'"
    assert errors[5 * RECORDS + RECORDS - 1] == debezium.NOT_AN_ENVELOPE
    # The last two keys were malformed in every batch but 0 and 2.
    assert {row[:2] for row in delta_rs_rows(tmp_path / "orders")} == \
        {(i, "b5") for i in range(RECORDS - 2)} | {(RECORDS - 2, "b2"), (RECORDS - 1, "b2")}
