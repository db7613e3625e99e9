"""Test-side handle of the tier's worker (tests/s3/s3_app.py): start it, send it a scenario,
wait for its answer. Its stdout is drained by a thread (a full pipe would block the worker);
its stderr (Spark's log, tracebacks) goes to a file for failure messages."""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO, Any

from devtools.processes import log_tail, stop_group
from tests.s3.s3_app import READY, RESULT_MARK

ROOT = Path(__file__).resolve().parents[2]
# Guards against a hung worker, not synchronisation: a first run resolves the packages through
# Ivy and builds the driver's class archive; a busy 2-core machine is slow.
START_TIMEOUT_S = 600.0
SCENARIO_TIMEOUT_S = 600.0


class S3Worker:
    """The worker process and the answers it printed."""

    def __init__(self, buckets: dict[str, str], workdir: Path) -> None:
        """``buckets``: each bucket and the endpoint the worker's S3A reaches it at."""
        self._stderr = workdir / "s3-worker.stderr"
        bucket_args = [arg for name, endpoint in buckets.items() for arg in ("--bucket", f"{name}={endpoint}")]
        with self._stderr.open("wb") as stderr:
            self._process = subprocess.Popen(
                [sys.executable, "-m", "tests.s3.s3_app", *bucket_args],
                cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, start_new_session=True)
        self._answers: queue.Queue[dict[str, Any] | None] = queue.Queue()
        assert self._process.stdout is not None
        threading.Thread(target=self._drain, args=(self._process.stdout,), daemon=True).start()
        ready = self._answer(START_TIMEOUT_S, "start")
        assert ready == READY, f"the S3 tier's worker did not start: {ready}\n{self.output()}"

    def _drain(self, stdout: IO[bytes]) -> None:
        for raw in stdout:
            line = raw.decode(errors="replace")
            if line.startswith(RESULT_MARK):
                self._answers.put(json.loads(line[len(RESULT_MARK):]))
        self._answers.put(None)  # the worker's stdout closed: it ended

    def _answer(self, timeout_s: float, what: str) -> dict[str, Any]:
        try:
            answer = self._answers.get(timeout=timeout_s)
        except queue.Empty:
            self.stop()
            raise AssertionError(f"the S3 tier's worker gave no answer to {what} within {timeout_s:.0f} s\n"
                                 f"{self.output()}") from None
        if answer is None:
            raise AssertionError(f"the S3 tier's worker ended during {what}\n{self.output()}")
        return answer

    def run(self, scenario: str, **args: Any) -> dict[str, Any]:
        """Run ``scenario`` (tests/s3/scenarios.py) in the worker; its result, or a failed test
        with the worker's traceback."""
        assert self._process.stdin is not None
        self._process.stdin.write((json.dumps({"scenario": scenario, "args": args}) + "\n").encode())
        self._process.stdin.flush()
        answer = self._answer(SCENARIO_TIMEOUT_S, scenario)
        assert "error" not in answer, f"{scenario} failed in the worker:\n{answer['error']}"
        result: dict[str, Any] = answer["ok"]
        return result

    def output(self) -> str:
        return f"--- S3 tier worker stderr (tail) ---\n{log_tail(self._stderr, 60)}"

    def stop(self) -> None:
        """End of stdin ends the worker (its session stops, its class archive is written)."""
        if self._process.stdin is not None and not self._process.stdin.closed:
            self._process.stdin.close()
        try:
            self._process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            stop_group(self._process)  # type: ignore[arg-type]
