"""The chained job (jobs/cdf_chain.py) exactly once across SIGKILL: a silver table's change
data feed is applied to a gold table by a query in a subprocess that is killed (driver and
JVM together) mid-MERGE and right after a gold commit, restarted from its checkpoint while
silver keeps changing, and must end with gold equal to silver: no change lost or applied twice.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import deltalake
import pyarrow as pa
import pytest
from pyspark.sql import SparkSession

from streaming_merge import DeltaTable

ROOT = Path(__file__).resolve().parents[2]
CDF = {"delta.enableChangeDataFeed": "true"}


def run_app(workdir: Path, kill_at: str | None) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "tests.streaming_support.cdf_chain_app", "--source", str(workdir / "silver"),
               "--target", str(workdir / "gold"), "--checkpoint", str(workdir / "chk"),
               "--progress", str(workdir / "progress.jsonl")]
    if kill_at:
        command += ["--kill-at", kill_at]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600,
                          start_new_session=True, env={**os.environ, "PYTHONPATH": str(ROOT)})


def progress(workdir: Path) -> list[dict[str, Any]]:
    path = workdir / "progress.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def rows(path: Path) -> list[tuple[Any, ...]]:
    """The table as delta-rs reads it (id, v)."""
    table = pa.table(deltalake.DeltaTable(str(path)).to_pyarrow_dataset().to_table(columns=["id", "v"]))
    return sorted(zip(table.column("id").to_pylist(), table.column("v").to_pylist(), strict=True))


def upsert(spark: SparkSession, silver: DeltaTable, data: list[tuple[int, str]]) -> None:
    source = spark.createDataFrame(data, "id long, v string").alias("s")
    silver.alias("t").merge(source, "t.id = s.id").whenMatchedUpdateAll().whenNotMatchedInsertAll().execute()


@pytest.mark.slow
def test_a_chained_job_is_exact_across_sigkills(spark: SparkSession, tmp_path: Path) -> None:
    silver = DeltaTable.createFromDataFrame(
        spark.createDataFrame([(i, f"a{i}") for i in range(8)], "id long, v string").coalesce(1),
        str(tmp_path / "silver"), properties=CDF)                                   # v0: 8 rows
    upsert(spark, silver, [(1, "b1"), (20, "b20")])                                # v1
    silver.delete("id in (2, 3)")                                                  # v2
    silver.update("id = 4", {"v": "'c4'"})                                         # v3

    # one change file a batch: batch 0 is v0's adds, 1 is v1's change file, ...
    killed = run_app(tmp_path, "mid_merge:1")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert [p["batchId"] for p in progress(tmp_path)] == [0]

    upsert(spark, silver, [(1, "d1"), (30, "d30")])                                # v4, while the job is down
    killed = run_app(tmp_path, "after_commit:2")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert [p["batchId"] for p in progress(tmp_path)] == [0, 1, 2]

    silver.delete("id = 20")                                                       # v5
    finished = run_app(tmp_path, None)
    assert finished.returncode == 0, finished.stderr[-3000:]
    records = progress(tmp_path)
    # the batch that died after its commit is replayed and skipped, the rest applied once each
    assert [p["batchId"] for p in records] == [0, 1, 2, 2, 3, 4, 5]
    assert records[3]["skipped"] is True and not any(p["skipped"] for p in records[4:])
    assert rows(tmp_path / "gold") == rows(tmp_path / "silver")
    # each gold commit is one batch: its txn versions are the batch ids, none twice
    history = deltalake.DeltaTable(str(tmp_path / "gold")).history()
    assert len([h for h in history if h.get("operation") == "MERGE" or h.get("userOperation") == "MERGE"]) == 6
