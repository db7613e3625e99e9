"""SIGTERM at several points of the Kafka CDC ingestion job (``python -m jobs.kafka_cdc_ingest``'s
own ``main``, in a subprocess: tests/streaming_support/graceful_stop_app.py), each followed by a
restart on the same checkpoint; the last run catches up and the table must be exact.

1. before the session exists (the handler is installed first): exit 0, nothing read;
2. while batch 1 runs, within ``--stop-timeout``: it finishes, its offsets are committed (the
   next run starts at batch 2), exit 0;
3. while batch 2 waits before its commit, past a 1 s ``--stop-timeout``: it is abandoned with no
   commit (the table's version does not move), exit 0, and the next run runs it again.

The job's batch lines (``--log-format json``) say which batches each run committed.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import deltalake
import pytest

from jobs import cdc_generator
from streaming_merge.kafka.broker import KafkaBrokerClient

pytestmark = [pytest.mark.kafka, pytest.mark.spark, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
ORDERS = cdc_generator.TABLES["orders"]
KEY: str = ORDERS["key"]
COLUMNS = [c.split()[0] for c in ORDERS["schema"].split(",")]
RUN_LIMIT_S = 300.0  # a guard against a hang, not a synchronisation


class JobRun:
    def __init__(self, workdir: Path, name: str, job_args: list[str], hold: str | None = None) -> None:
        self.announce, self.stderr = workdir / f"{name}.points", workdir / f"{name}.stderr"
        command = [sys.executable, "-m", "tests.streaming_support.graceful_stop_app", "--announce",
                   str(self.announce), *(["--hold", hold] if hold else []), "--", *job_args]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        with open(self.stderr, "wb") as err:
            self.process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err, env=env,
                                            start_new_session=True)

    def points(self) -> list[str]:
        return self.announce.read_text().splitlines() if self.announce.exists() else []

    def wait_for_point(self, point: str) -> None:
        deadline = time.monotonic() + RUN_LIMIT_S
        while point not in self.points():
            assert self.process.poll() is None, f"the job exited before {point!r}:\n{self.output()}"
            assert time.monotonic() < deadline, f"the job never reached {point!r}:\n{self.output()}"
            time.sleep(0.05)

    def terminate(self) -> None:
        self.process.send_signal(signal.SIGTERM)

    def exit_code(self) -> int:
        try:
            return self.process.wait(RUN_LIMIT_S)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            raise

    def batches(self) -> list[dict[str, Any]]:
        """The job's batch lines, in order."""
        lines = [json.loads(line) for line in self.stderr.read_text().splitlines() if line.startswith("{")]
        return [line["batch"] for line in lines if "batch" in line]

    def output(self) -> str:
        return self.stderr.read_text()[-4000:]


def test_sigterm_at_each_point_stops_cleanly_and_the_restart_is_exact(
        kafka_broker: KafkaBrokerClient, kafka_topic: Callable[..., str], tmp_path: Path) -> None:
    topic = kafka_topic(partitions=1)
    records, state = cdc_generator.generate("orders", 48, 12, seed=59)
    kafka_broker.produce(topic, [(r.key, r.value) for r in records])
    target = tmp_path / "orders"
    job = ["--bootstrap-servers", kafka_broker.bootstrap_servers, "--topics", topic, "--target", str(target),
           "--keys", KEY, "--row-schema", ORDERS["schema"], "--checkpoint", str(tmp_path / "checkpoint"),
           "--dead-letter", str(tmp_path / "dead_letter"), "--log-format", "json",
           "--max-offsets-per-trigger", str(math.ceil(len(records) / 5))]

    before_session = JobRun(tmp_path, "before_session", job)
    before_session.wait_for_point("installed")
    before_session.terminate()
    assert before_session.exit_code() == 0, before_session.output()
    assert not target.exists() and before_session.batches() == []

    finishing = JobRun(tmp_path, "finishing", job, hold="after_materialize:1:requested")
    finishing.wait_for_point("after_materialize 1")
    finishing.terminate()
    assert finishing.exit_code() == 0, finishing.output()
    assert [b["batchId"] for b in finishing.batches()] == [0, 1], finishing.output()
    version = deltalake.DeltaTable(str(target)).version()

    abandoning = JobRun(tmp_path, "abandoning", [*job, "--stop-timeout", "1"], hold="before_commit:2:abandoned")
    abandoning.wait_for_point("before_commit 2")
    abandoning.terminate()
    assert abandoning.exit_code() == 0, abandoning.output()
    assert abandoning.points()[1] == "after_materialize 2", "batch 1's offsets were committed at the stop"
    assert abandoning.batches() == [] and deltalake.DeltaTable(str(target)).version() == version
    assert "abandoned" in abandoning.output()

    catching_up = JobRun(tmp_path, "catching_up", [*job, "--available-now"])
    assert catching_up.exit_code() == 0, catching_up.output()
    batches = catching_up.batches()
    assert [b["batchId"] for b in batches] == list(range(2, 2 + len(batches))) and len(batches) >= 3
    assert not any(b["skipped"] for b in batches), "no batch was committed twice"
    assert batches[-1]["consumerLag"] == {topic: {"0": 0}}
    assert sum(b["kafkaRecords"] for b in [*finishing.batches(), *batches]) == len(records)
    rows = deltalake.DeltaTable(str(target)).to_pyarrow_table().to_pylist()
    assert {r[KEY]: {c: r[c] for c in COLUMNS} for r in rows} == cdc_generator.expected_rows(state)
    assert len(rows) == len(cdc_generator.expected_rows(state))
