"""Two flows into one table, one of them SIGKILLed and restarted (issue 41 part 5).

The live flow is a streaming query in the test's process; the correction flow runs in a
subprocess (tests/streaming_support/multi_flow_app.py), is killed at a point of its batch 1
(``KILL_AT``, default right after its Delta commit, before Spark's offset commit) while the live
flow keeps committing, and restarted from its checkpoint. At two batches of the correction flow
(one before the kill, one after the restart) the subprocess holds its MERGE right before the
commit until the live flow has committed a batch, so those commits conflict and rerun. The
table must end in the model state over both flows' events, each flow's txn at its last batch.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import deltalake
import pytest
from pyspark.sql import DataFrame, SparkSession

from tests.spark.test_sink_multi_flow import LAYOUTS, flow, split_flows, state, write_batches
from tests.streaming_support.cdc_events import SCHEMA, expected_state

ROOT = Path(__file__).resolve().parents[2]
BATCHES = 4


def start_app(workdir: Path, run: int, pause_at: str, kill_at: str | None) -> subprocess.Popen[str]:
    handshake = workdir / f"handshake-{run}"
    handshake.mkdir()
    command = [sys.executable, "-m", "tests.streaming_support.multi_flow_app", "--source", str(workdir / "fix"),
               "--target", str(workdir / "orders"), "--checkpoint", str(workdir / "chk-fix"),
               "--progress", str(workdir / "progress.jsonl"), "--name", "corrections",
               "--pause-at", pause_at, "--handshake", str(handshake)]
    if kill_at:
        command += ["--kill-at", kill_at]
    return subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, env={**os.environ, "PYTHONPATH": str(ROOT)})


def wait_for(condition: Any, what: str, timeout_s: float = 300.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.mark.slow
def test_two_flows_one_killed_and_restarted_end_in_the_model_state(spark: SparkSession, tmp_path: Path) -> None:
    kill_phase, kill_batch = os.environ.get("KILL_AT", "after_commit:1").split(":")
    live_batches, fix_batches = split_flows(int(os.environ.get("MULTI_FLOW_SEED", "7")), batches_per_flow=BATCHES)
    write_batches(tmp_path / "fix", fix_batches)
    (tmp_path / "live").mkdir()
    target = str(tmp_path / "orders")
    live = flow(target, "live", **LAYOUTS["metadata"])
    committed = {"batches": 0}
    lock = threading.Lock()

    def live_batch(batch: DataFrame, batch_id: int) -> None:
        live(batch, batch_id)
        with lock:
            committed["batches"] += 1

    fed = {"files": 0}

    def feed_live() -> None:
        """The live flow's next file, applied (its query picks it up within a trigger)."""
        index = fed["files"]
        path = tmp_path / "live" / f"batch-{index:04d}.json"
        (tmp_path / f"live-{index}.tmp").write_text("".join(json.dumps(e) + "\n" for e in live_batches[index]))
        os.replace(tmp_path / f"live-{index}.tmp", path)
        fed["files"] += 1
        wait_for(lambda: committed["batches"] >= fed["files"], f"the live flow's batch {index}")

    query = (spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).json(str(tmp_path / "live"))
             .writeStream.foreachBatch(live_batch).queryName("live")
             .option("checkpointLocation", str(tmp_path / "chk-live"))
             .trigger(processingTime="100 milliseconds").start())
    try:
        feed_live()
        # Run 1: batch 0 held before its commit while the live flow commits; killed in batch 1.
        app = start_app(tmp_path, 1, "before_commit:0", f"{kill_phase}:{kill_batch}")
        wait_for(lambda: (tmp_path / "handshake-1" / "pause-0-before_commit.json").exists() or app.poll() is not None,
                 "the correction flow's batch 0")
        assert app.poll() is None, app.stderr.read()[-3000:] if app.stderr else ""
        feed_live()
        (tmp_path / "handshake-1" / "ack-0-before_commit").touch()
        _, stderr = app.communicate(timeout=600)
        assert app.returncode == -signal.SIGKILL, stderr[-3000:]
        feed_live()  # while the correction flow is down
        # Run 2: restarted from its checkpoint; batch 2 held before its commit likewise.
        app = start_app(tmp_path, 2, "before_commit:2", None)
        wait_for(lambda: (tmp_path / "handshake-2" / "pause-2-before_commit.json").exists() or app.poll() is not None,
                 "the correction flow's batch 2")
        assert app.poll() is None, app.stderr.read()[-3000:] if app.stderr else ""
        feed_live()
        (tmp_path / "handshake-2" / "ack-2-before_commit").touch()
        _, stderr = app.communicate(timeout=600)
        assert app.returncode == 0, stderr[-3000:]
        query.processAllAvailable()
        assert query.exception() is None
    finally:
        query.stop()

    records = [json.loads(line) for line in (tmp_path / "progress.jsonl").read_text().splitlines()]
    replayed_skipped = kill_phase == "after_commit"
    died_in = int(kill_batch)
    assert [(p["batchId"], p["skipped"]) for p in records] == [
        *[(b, False) for b in range(died_in + (kill_phase == "after_commit"))],
        (died_in, replayed_skipped), *[(b, False) for b in range(died_in + 1, BATCHES)]]
    conflicts = {p["batchId"]: p["conflictRetries"] for p in records if not p["skipped"]}
    assert conflicts[0] >= 1 and conflicts[2] >= 1, records  # the held commits were rerun
    assert state(target) == expected_state([*live_batches, *fix_batches])
    table = deltalake.DeltaTable(target)
    assert (table.transaction_version("live"), table.transaction_version("corrections")) == (BATCHES - 1, BATCHES - 1)
    assert len(table.to_pyarrow_table()) == len(state(target))  # no key twice
