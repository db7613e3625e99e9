"""Exactly once across SIGKILL: a real streaming query in a subprocess is killed (driver
and JVM together) at random points of random batches, restarted from the same
checkpoint, and must end in the reference state with no event lost or applied twice.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import deltalake
import pytest

from tests.streaming_support.cdc_events import expected_state, generate, table_state, write_files

BATCHES = 4
PHASES = ("before_merge", "mid_merge", "after_commit")
ROOT = Path(__file__).resolve().parents[2]


def kill_points(count: int, seed: int = 20261122) -> list[tuple[str, int]]:
    rng = random.Random(int(os.environ.get("KILL_SEED", seed)))
    points = [(phase, batch) for phase in PHASES for batch in range(BATCHES)]
    chosen = rng.sample(points, count - 1)
    if not any(p == "after_commit" for p, _ in chosen):  # the replay-skips case must be covered
        chosen.append(("after_commit", rng.randrange(BATCHES)))
    else:
        chosen.append(rng.choice([p for p in points if p not in chosen]))
    return chosen


def run_app(workdir: Path, kill_at: str | None) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "tests.streaming_support.streaming_app",
               "--source", str(workdir / "in"), "--target", str(workdir / "out"),
               "--checkpoint", str(workdir / "chk"), "--progress", str(workdir / "progress.jsonl")]
    if kill_at:
        command += ["--kill-at", kill_at]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600,
                          start_new_session=True, env={**os.environ, "PYTHONPATH": str(ROOT)})


def progress(workdir: Path) -> list[dict[str, Any]]:
    path = workdir / "progress.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.slow
def test_sigkills_at_random_points_and_restarts_end_in_the_reference_state(tmp_path: Path) -> None:
    """One query killed at every chosen point in turn: each restart resumes from the previous
    kill (and must replay the batch it died in, or skip it when its commit had landed) and runs
    on to the next point, so N kill points cost N + 1 JVM starts instead of 2N."""
    points = sorted(kill_points(int(os.environ.get("KILL_POINTS", "5"))),
                    key=lambda point: (point[1], PHASES.index(point[0])))
    batches = generate(100 + points[0][1], batches=BATCHES, events_per_batch=8, keys=6)
    write_files(str(tmp_path / "in"), batches)

    seen = 0
    previous: tuple[str, int] | None = None
    for point in [*points, None]:
        result = run_app(tmp_path, f"{point[0]}:{point[1]}" if point else None)
        records = progress(tmp_path)[seen:]
        seen += len(records)
        first = previous[1] if previous else 0
        if previous is not None:  # the restart begins with the batch the last run died in
            assert records and records[0]["batchId"] == previous[1], (previous, records)
            assert records[0]["skipped"] is (previous[0] == "after_commit"), (previous, records[0])
        if point is None:
            assert result.returncode == 0, result.stderr[-3000:]
            assert [p["batchId"] for p in records] == list(range(first, BATCHES))
            break
        phase, batch = point
        assert result.returncode == -signal.SIGKILL, (point, result.stderr[-3000:])
        assert [p["batchId"] for p in records] == list(range(first, batch + (phase == "after_commit"))), \
            (point, records)
        previous = point

    rows = deltalake.DeltaTable(str(tmp_path / "out")).to_pyarrow_table().to_pylist()
    assert table_state(rows) == expected_state(batches)
    assert len(rows) == len(table_state(rows))  # no key twice
    query_ids = {p["appId"] for p in progress(tmp_path)}
    assert len(query_ids) == 1  # the query id, kept in the checkpoint, is the app id across restarts
    assert deltalake.DeltaTable(str(tmp_path / "out")).transaction_version(query_ids.pop()) == BATCHES - 1
