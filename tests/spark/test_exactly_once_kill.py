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
@pytest.mark.parametrize(("phase", "batch"), kill_points(int(os.environ.get("KILL_POINTS", "5"))))
def test_sigkill_and_restart_end_in_the_reference_state(tmp_path: Path, phase: str, batch: int) -> None:
    batches = generate(100 + batch, batches=BATCHES, events_per_batch=8, keys=6)
    write_files(str(tmp_path / "in"), batches)

    killed = run_app(tmp_path, f"{phase}:{batch}")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    before_restart = progress(tmp_path)
    assert [p["batchId"] for p in before_restart] == list(range(batch + (phase == "after_commit")))

    restarted = run_app(tmp_path, None)
    assert restarted.returncode == 0, restarted.stderr[-3000:]

    rows = deltalake.DeltaTable(str(tmp_path / "out")).to_pyarrow_table().to_pylist()
    assert table_state(rows) == expected_state(batches)
    assert len(rows) == len(table_state(rows))  # no key twice
    replayed = progress(tmp_path)[len(before_restart):]
    assert replayed[0]["batchId"] == batch
    assert replayed[0]["skipped"] is (phase == "after_commit")
    assert [p["batchId"] for p in replayed] == list(range(batch, BATCHES))
    query_ids = {p["appId"] for p in progress(tmp_path)}
    assert len(query_ids) == 1  # the query id, kept in the checkpoint, is the app id across restarts
    assert deltalake.DeltaTable(str(tmp_path / "out")).transaction_version(query_ids.pop()) == BATCHES - 1
