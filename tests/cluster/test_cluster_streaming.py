"""The streaming sink on a local-cluster: tests/streaming_support/streaming_app.py (JSON files →
MergeSink → Delta, one file per micro-batch) with executor JVMs, in a subprocess.

Two claims, checked in one run against the reference model of tests/streaming_support/cdc_events.py
with the table read back through delta-rs:

- the sink's batches (materialized on the executors, merged with shuffles between them) give
  exactly the reference state, each batch once, and the tasks really ran on the executors;
- executors SIGKILLed in the middle of a batch, holding the batch's materialized blocks, cost
  a rerun of that batch and nothing else: the state is still exact, no batch is lost or
  applied twice, the query does not fail. The app holds the batch at a sink phase
  (``--pause-at``) until the test has killed them, so the kills land at that point every run,
  without sleeps.

The batches without a kill are the normal path (merged at the first attempt); one app serves
both claims, since each local-cluster app costs three JVM starts (~50 s of CI on 2 cores).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import deltalake
import pytest

from tests.cluster.apps import MASTER, App, executors_by_id, is_alive, kill_executor, wait_for_file
from tests.streaming_support.cdc_events import expected_state, generate, table_state, write_files

BATCHES = 4
APP = "tests.streaming_support.streaming_app"


def app_args(workdir: Path, *extra: str) -> list[str]:
    return ["--source", str(workdir / "in"), "--target", str(workdir / "out"), "--checkpoint", str(workdir / "chk"),
            "--progress", str(workdir / "progress.jsonl"), "--master", MASTER, "--report", str(workdir / "report.json"),
            *extra]


def progress(workdir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (workdir / "progress.jsonl").read_text().splitlines()]


def assert_exact(workdir: Path, batches: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """The table equals the reference state, every batch was merged exactly once (the sink's
    progress, its txn in the Delta log and Spark's own commit log agree), and returns the
    sink's progress records."""
    records = progress(workdir)
    assert [p["batchId"] for p in records] == list(range(BATCHES)), records
    assert not any(p["skipped"] for p in records)
    rows = deltalake.DeltaTable(str(workdir / "out")).to_pyarrow_table().to_pylist()
    assert table_state(rows) == expected_state(batches)
    assert len(rows) == len(table_state(rows)), "a key appears twice"
    (app_id,) = {p["appId"] for p in records}
    assert deltalake.DeltaTable(str(workdir / "out")).transaction_version(app_id) == BATCHES - 1
    spark_commits = sorted(int(p.name) for p in (workdir / "chk" / "commits").iterdir() if p.name.isdigit())
    assert spark_commits == list(range(BATCHES)), "Spark's commit log: each batch committed once"
    return records


# Where the kills land: right after the batch is materialized (its checkpoint blocks are the
# only copy of the prepared batch), and between findTouchedFiles and the rewrite, which still
# has to read the materialized source.
KILLS = {1: "after_materialize", 2: "after_find_touched_files"}


def victims(paused: dict[str, Any]) -> list[str]:
    """Whom to kill at a pause, so that only a rerun of the whole batch can heal the loss.

    After materialization: one executor holding blocks of the sink's copy (the next read of the
    copy fails, and the sink has nothing else to read). Mid-MERGE: every executor holding blocks
    of the sink's copy or of the copy the MERGE is reading (the MERGE's own, when it filtered the
    source against tombstones): the MERGE's own lost-block retry re-materializes from the sink's
    copy, so with both gone it cannot heal the batch by itself. Which executors those are
    depends on where Spark placed the blocks, which the app reports in the pause marker."""
    batch_copy = {e for where in paused["batchBlocks"].values() for e in where}
    if paused["phase"] == "after_materialize":
        return [min(batch_copy)]
    return sorted(batch_copy | {e for where in paused["blocks"].values() for e in where})


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="finds the executor JVMs through /proc (Linux)")
def test_executor_sigkilled_mid_batch_reruns_the_batch_and_stays_exact(
        launch: Callable[[str, list[str]], App], tmp_path: Path) -> None:
    """Executors holding the batch's materialized blocks are SIGKILLed while the app holds the
    batch at a sink phase (the ack releases it), at two points of two batches in one run. Each
    of those batches must be rerun exactly once, by the sink, on the executors left and the
    ones the standalone master launches in their place; the table must end exact. The other
    batches take the normal path, once each; no task runs in the driver."""
    batches = generate(977, batches=BATCHES, events_per_batch=40, keys=25)
    write_files(str(tmp_path / "in"), batches)
    handshake = tmp_path / "handshake"
    handshake.mkdir()
    pause_at = ",".join(f"{phase}:{batch}" for batch, phase in sorted(KILLS.items()))
    app = launch(APP, app_args(tmp_path, "--pause-at", pause_at, "--handshake", str(handshake)))

    killed: dict[str, int] = {}  # executor id -> pid
    for batch, phase in sorted(KILLS.items()):
        paused = wait_for_file(handshake / f"pause-{batch}-{phase}.json", app)
        alive = {e["id"] for e in paused["executors"] if e["active"] and e["id"] != "driver"}
        chosen = victims(paused)
        assert chosen and set(chosen) <= alive, paused
        for victim in chosen:
            killed[victim] = kill_executor(app, paused["appId"], victim)
        (handshake / f"ack-{batch}-{phase}").touch()
    app.succeeds()

    records = assert_exact(tmp_path, batches)
    attempts = {p["batchId"]: p["attempts"] for p in records}
    assert attempts == {b: 2 if b in KILLS else 1 for b in range(BATCHES)}, \
        "each batch that lost its materialized blocks is rerun once, the others are not"
    assert not any(is_alive(pid) for pid in killed.values())
    report = json.loads((tmp_path / "report.json").read_text())
    executors = executors_by_id(report)
    assert all(not executors[victim]["active"] for victim in killed), f"the driver saw them die: {executors}"
    replacements = {i for i, e in executors.items() if i not in {"0", "1"}}
    assert replacements, f"the standalone master launched no replacement executor: {executors}"
    assert report["master"] == MASTER
    assert all(executors[i]["totalTasks"] > 0 for i in ("0", "1")), f"a task-less executor: {report['executors']}"
    assert next(e for e in report["executors"] if e["id"] == "driver")["totalTasks"] == 0
