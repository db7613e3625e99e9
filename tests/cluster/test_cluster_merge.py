"""MERGE on a local-cluster: the engine's Spark jobs run on executor JVMs that share nothing in
memory with the driver (no driver-side objects reachable from tasks, shuffle blocks and
checkpoint blocks moved between processes), which ``local[2]`` cannot show.

The workload runs in tests/cluster/merge_app.py (a subprocess with its own driver); this test
reads the tables back with delta-rs, compares them with the state computed here in plain
Python, and checks the metrics both as the app received them and as the commit stored them.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import deltalake

from tests.cluster import merge_app
from tests.cluster.apps import MASTER, App, executors_by_id


def expected_merge() -> tuple[dict[int, tuple[str, int]], dict[str, int]]:
    """The target after the MERGE (id → (v, grp)) and its row counts, from merge_app's
    constants: matched deletes, matched updates, unmatched inserts."""
    state = {i: (f"t{i}", i % 5) for i in range(merge_app.TARGET_ROWS)}
    counts = {"numSourceRows": 0, "numTargetRowsUpdated": 0, "numTargetRowsInserted": 0,
              "numTargetRowsDeleted": 0}
    for i in range(merge_app.SOURCE_START, merge_app.SOURCE_END):
        counts["numSourceRows"] += 1
        delete = i % merge_app.DELETE_EVERY == 0
        if i in state and delete:
            del state[i]
            counts["numTargetRowsDeleted"] += 1
        elif i in state:
            state[i] = (f"s{i}", i % 5)
            counts["numTargetRowsUpdated"] += 1
        elif not delete:
            state[i] = (f"s{i}", i % 5)
            counts["numTargetRowsInserted"] += 1
    return state, counts


def test_upsert_merge_on_executors_matches_the_reference(
        launch: Callable[[str, list[str]], App], tmp_path: Path) -> None:
    """Both join plans (broadcast + map-side rewrite; shuffle join over a materialized source
    into a partitioned table) give the exact expected table and metrics, and the tasks ran on
    the two executors, not in the driver."""
    out = tmp_path / "merge.json"
    launch("tests.cluster.merge_app", ["--master", MASTER, "--root", str(tmp_path), "--out", str(out)]).succeeds()
    report: dict[str, Any] = json.loads(out.read_text())

    expected_state, expected_counts = expected_merge()
    assert expected_counts["numTargetRowsDeleted"] and expected_counts["numTargetRowsInserted"]
    assert set(report["merges"]) == set(merge_app.VARIANTS)
    for name, metrics in report["merges"].items():
        table = deltalake.DeltaTable(str(tmp_path / name))
        rows = table.to_pyarrow_table().to_pylist()
        assert {r["id"]: (r["v"], r["grp"]) for r in rows} == expected_state, name
        assert len(rows) == len(expected_state), f"{name}: a key appears twice"
        committed = table.history(1)[0]
        assert committed["userOperation"] == "MERGE", committed  # delta-rs names every commit of ours WRITE
        for metric, value in expected_counts.items():
            assert metrics[metric] == value, (name, metric, metrics)
            assert int(committed["operationMetrics"][metric]) == value, (name, metric, committed)
        assert metrics["num_affected_rows"] == sum(expected_counts.values()) - expected_counts["numSourceRows"]

    assert report["master"] == MASTER
    assert report["memoryStatusSize"] == 3, "the driver's block manager and one per executor"
    executors = executors_by_id(report)
    assert set(executors) == {"0", "1"} and all(e["active"] for e in executors.values()), report["executors"]
    assert all(e["totalTasks"] > 0 for e in executors.values()), f"a task-less executor: {report['executors']}"
    driver = next(e for e in report["executors"] if e["id"] == "driver")
    assert driver["totalTasks"] == 0, "in local-cluster mode no task may run in the driver"
