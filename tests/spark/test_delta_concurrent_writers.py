"""MergeSink and Delta Lake's own MERGE, DELETE and OPTIMIZE commit to one table at once
(issue 58 §4), with the workload of tests/streaming_support/delta_writers.py: each writer
increments counters of its own keys, in files every writer rewrites, so a conflict either side
missed shows in the final table as a counter off, a deleted key back or a key twice.

- Forced interleavings, both ways: Delta commits inside the sink's batch (its ``before_commit``
  phase, after it read the table): the sink detects it and reruns the batch; the sink commits
  while Delta's command waits in its own job (a UDF gate, after Delta read the table): Delta
  raises its concurrent-modification error, and its rerun applies the command once.
- Free-running: the sink and a stream of Delta commands at the same time, from two threads of
  this process and from a second process with its own SparkSession
  (tests/streaming_support/delta_writer_app.py).
- Checkpoints: one Delta wrote is read (and merged into) by us, one we wrote is read by Delta,
  with the commits before each checkpoint gone so that nothing but the checkpoint can be read.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import deltalake
import pytest
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from streaming_merge import DeltaTable
from tests.streaming_support.delta_writers import (
    DELTA_CONFLICTS,
    counting_sink,
    create_table,
    delta_plan,
    expected_rows,
    run_delta_op,
    run_delta_op_retrying,
    run_sink_batch,
    table_rows,
    wait_for_file,
)

ROOT = Path(__file__).resolve().parents[2]
GATE_TIMEOUT_S = 120.0
SINK_BATCHES = 4  # a guard against a gate never opened, not a synchronisation
pytestmark = pytest.mark.slow


def read_ours(spark: SparkSession, path: str) -> dict[int, tuple[int, int]]:
    """The table as our reader reads it (delta-rs' log replay, our deletion-vector reads)."""
    return table_rows(r.asDict() for r in DeltaTable.forPath(spark, path).toDF().collect())


def read_delta(spark: SparkSession, path: str) -> dict[int, tuple[int, int]]:
    """The table as Delta Lake on Spark reads it (a fresh snapshot)."""
    return table_rows(r.asDict() for r in spark.read.format("delta").load(path).collect())


def gate(folder: Path, key: int) -> Column:
    """True for every row; the row of ``key`` first marks ``started`` (the command has read the
    table and runs its jobs) and waits for ``go``. Only the task holding that row waits: the
    other task slot (local[2]) stays free for the sink's jobs meanwhile."""
    started, go = str(folder / "started"), str(folder / "go")

    def wait(value: Any) -> bool:
        import os as os_
        import time as time_

        if value != key:
            return True
        open(started, "a").close()
        deadline = time_.monotonic() + GATE_TIMEOUT_S
        while not os_.path.exists(go):  # polls a condition with a deadline (another process sets it)
            if time_.monotonic() > deadline:
                raise TimeoutError(f"the test never opened the gate {go}")
            time_.sleep(0.02)
        return True

    return F.udf(wait, "boolean")(F.col("id"))


@pytest.mark.parametrize(("kind", "deletion_vectors"), [("merge", True), ("delete", False), ("optimize", False)])
def test_the_sink_detects_a_delta_commit_during_its_batch_and_reruns_it(
        spark: SparkSession, table_path: str, kind: str, deletion_vectors: bool) -> None:
    create_table(spark, table_path, deletion_vectors=deletion_vectors)
    op = delta_plan([kind])[0]
    interfered: list[int] = []

    def hook(phase: str, _: DataFrame) -> None:
        if phase == "before_commit" and not interfered:  # the batch read the table and wrote its files
            interfered.append(1)
            run_delta_op(spark, table_path, op)

    sink = counting_sink(table_path, phase_hook=hook)
    run_sink_batch(spark, sink, 0)
    assert interfered and sink.lastProgress is not None
    assert (sink.lastProgress["attempts"], sink.lastProgress["conflictRetries"]) == (2, 1)
    assert read_ours(spark, table_path) == expected_rows([0], [op])


@pytest.mark.parametrize(("kind", "deletion_vectors", "conflict"), [
    ("merge", False, "ConcurrentAppendException"), ("delete", True, "ConcurrentAppendException")])
def test_delta_detects_a_sink_commit_during_its_command(
        spark: SparkSession, table_path: str, tmp_path: Path, kind: str, deletion_vectors: bool,
        conflict: str) -> None:
    create_table(spark, table_path, deletion_vectors=deletion_vectors)
    op = delta_plan([kind])[0]
    sink = counting_sink(table_path)
    errors: list[BaseException] = []

    def delta_command() -> None:
        try:
            run_delta_op(spark, table_path, op, gate(tmp_path, op.keys[0]))
        except BaseException as exc:
            errors.append(exc)

    worker = threading.Thread(target=delta_command)
    worker.start()
    try:
        wait_for_file(str(tmp_path / "started"), GATE_TIMEOUT_S, f"Delta's {kind}")
        run_sink_batch(spark, sink, 0)  # commits while Delta's command waits in its job
    finally:
        (tmp_path / "go").touch()
        worker.join(GATE_TIMEOUT_S)
    assert not worker.is_alive()
    assert len(errors) == 1 and isinstance(errors[0], DELTA_CONFLICTS), errors
    assert type(errors[0]).__name__ == conflict
    assert read_ours(spark, table_path) == expected_rows([0], [])  # Delta's command committed nothing
    run_delta_op(spark, table_path, op)  # its rerun applies it once
    assert read_ours(spark, table_path) == expected_rows([0], [op])


def test_the_sink_and_delta_commands_from_two_threads_lose_and_duplicate_nothing(
        spark: SparkSession, table_path: str) -> None:
    create_table(spark, table_path, deletion_vectors=True, checkpoint_interval=5)
    ops = delta_plan(["merge", "delete", "optimize"])
    start = threading.Barrier(2, timeout=GATE_TIMEOUT_S)
    conflicts: list[str] = []
    errors: list[BaseException] = []

    def delta_writer() -> None:
        try:
            start.wait()
            for op in ops:
                conflicts.extend(run_delta_op_retrying(spark, table_path, op))
        except BaseException as exc:
            errors.append(exc)

    worker = threading.Thread(target=delta_writer)
    worker.start()
    sink = counting_sink(table_path)
    start.wait()
    # A fixed number of batches: a sink committing for as long as Delta's commands run would
    # starve them (Delta's MERGE reads the whole table, so every sink commit fails its attempt).
    for batch_id in range(SINK_BATCHES):
        run_sink_batch(spark, sink, batch_id)
    worker.join(GATE_TIMEOUT_S)
    assert not errors, errors
    assert not worker.is_alive()
    expected = expected_rows(range(SINK_BATCHES), ops)
    assert read_ours(spark, table_path) == expected, f"Delta's conflicts: {conflicts}"
    assert deltalake.DeltaTable(table_path).transaction_version("sink") == SINK_BATCHES - 1


def test_the_sink_and_delta_in_another_process_lose_and_duplicate_nothing(
        spark: SparkSession, table_path: str, tmp_path: Path) -> None:
    create_table(spark, table_path, deletion_vectors=False, checkpoint_interval=5)
    ops = delta_plan(["merge", "optimize"])
    plan, report = tmp_path / "plan.json", tmp_path / "report.json"
    plan.write_text(json.dumps([op.to_json() for op in ops]))
    command = [sys.executable, "-m", "tests.streaming_support.delta_writer_app", "--table", table_path,
               "--plan", str(plan), "--report", str(report), "--ready", str(tmp_path / "ready"),
               "--go", str(tmp_path / "go")]
    app = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        wait_for_file(str(tmp_path / "ready"), 300, "the Delta writer's session")
        sink = counting_sink(table_path)
        (tmp_path / "go").touch()
        for batch_id in range(SINK_BATCHES):
            run_sink_batch(spark, sink, batch_id)
        output, _ = app.communicate(timeout=GATE_TIMEOUT_S)
    finally:
        if app.poll() is None:
            app.kill()
            app.wait()
    assert app.returncode == 0, output[-4000:]
    applied = json.loads(report.read_text())
    assert [r["index"] for r in applied["applied"]] == [op.index for op in ops]
    expected = expected_rows(range(SINK_BATCHES), ops)
    assert read_ours(spark, table_path) == expected, f"Delta's conflicts: {applied['conflicts']}"
    assert read_delta(spark, table_path) == expected


def _drop_commits_before_checkpoint(path: str, checkpoint: int) -> None:
    """Delete the commit files before ``checkpoint``: a reader can then only start from it."""
    log_dir = Path(path) / "_delta_log"
    assert (log_dir / f"{checkpoint:020d}.checkpoint.parquet").exists(), sorted(os.listdir(log_dir))
    for version in range(checkpoint):
        (log_dir / f"{version:020d}.json").unlink(missing_ok=True)


def test_each_reads_the_checkpoint_the_other_wrote_and_merges_into_it(spark: SparkSession, table_path: str) -> None:
    """Delta checkpoints version 2 (its MERGE), we read from it and merge; we checkpoint
    version 4 (our batch), and a fresh Delta reader reads from that. Each time the commits
    before the checkpoint are gone first, so nothing but the checkpoint can be read."""
    create_table(spark, table_path, deletion_vectors=True, checkpoint_interval=2)  # 0, 1
    op = delta_plan(["merge"])[0]
    run_delta_op(spark, table_path, op)  # 2, checkpointed by Delta
    _drop_commits_before_checkpoint(table_path, 2)
    sink = counting_sink(table_path)
    run_sink_batch(spark, sink, 0)  # 3
    assert read_ours(spark, table_path) == expected_rows([0], [op])
    run_sink_batch(spark, sink, 1)  # 4, checkpointed by us
    _drop_commits_before_checkpoint(table_path, 4)
    copy = f"{table_path}_copy"  # a path Delta has no cached log of: it starts from our checkpoint
    shutil.copytree(table_path, copy)
    assert read_delta(spark, copy) == expected_rows([0, 1], [op])
