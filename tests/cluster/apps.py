"""Test-side helpers for the local-cluster tier: start a support app in its own interpreter,
wait for what it writes, and find (and kill) its executor JVMs.

Why subprocesses: a driver process holds one SparkContext and the test session already owns
a ``local[2]`` one (tests/conftest.py), while ``local-cluster[N,C,M]`` needs its own driver
(its Master and Workers live inside the driver JVM and launch the executor JVMs as children).
Each app runs in a new session (``start_new_session``) so that its whole process group,
executors included, can be ended by the process-group id it was given, and nothing else.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
MASTER = "local-cluster[2,1,1024]"  # 2 workers, 1 core and 1 GB each: one executor JVM per worker
APP_TIMEOUT_S = 600.0  # a guard against hangs, not a synchronisation: busy CI machines are slow
EXECUTOR_MAIN_CLASS = "org.apache.spark.executor.CoarseGrainedExecutorBackend"


@dataclass
class App:
    """A support app running as ``python -m module ...``; its output goes to files (a pipe
    nobody reads while the test polls would fill up and block the app)."""

    name: str
    process: subprocess.Popen[bytes]
    stdout: Path
    stderr: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def output(self, chars: int = 4000) -> str:
        """The tail of the app's stderr (Spark logs and Python tracebacks), for failure messages."""
        text = self.stderr.read_text(errors="replace") if self.stderr.exists() else ""
        return f"--- {self.name} stderr (tail) ---\n{text[-chars:]}"

    def wait(self, timeout_s: float = APP_TIMEOUT_S) -> int:
        """The app's exit code; a hang is ended (its process group) and fails the test."""
        try:
            return self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.end()
            raise AssertionError(f"{self.name} did not finish within {timeout_s:.0f}s\n{self.output()}") from None

    def succeeds(self, timeout_s: float = APP_TIMEOUT_S) -> None:
        """Wait for the app; it must exit cleanly."""
        code = self.wait(timeout_s)
        assert code == 0, f"{self.name} exited with {code}\n{self.output()}"

    def end(self) -> None:
        """SIGKILL the app's process group (driver, its JVM, the executors) if still running."""
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):  # it exited meanwhile
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


# The JVMs of a test app live for a minute or less: C1 alone compiles their hot code soon
# enough, and skipping C2 leaves the CPU to the work (a local-cluster app runs three JVMs, on
# CI machines with two cores). Measured here: the MERGE app in ~35-40 s instead of ~55 s.
_JVM_OPTIONS = "-XX:TieredStopAtLevel=1"
_SUBMIT_ARGS = (f"--conf spark.executor.extraJavaOptions={_JVM_OPTIONS} "
                f"--driver-java-options {_JVM_OPTIONS} pyspark-shell")


def start_app(module: str, args: list[str], workdir: Path) -> App:
    """Start ``python -m module args`` from the repository root, with ``tests`` importable by
    the driver and by the executors' Python workers (they inherit the environment)."""
    name = module.rsplit(".", 1)[-1]
    stdout, stderr = workdir / f"{name}.stdout", workdir / f"{name}.stderr"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.setdefault("PYSPARK_SUBMIT_ARGS", _SUBMIT_ARGS)
    with open(stdout, "ab") as out, open(stderr, "ab") as err:
        process = subprocess.Popen([sys.executable, "-m", module, *args], cwd=ROOT, stdout=out, stderr=err,
                                   start_new_session=True, env=env)
    return App(name, process, stdout, stderr)


def submit_job(script: str, args: list[str], workdir: Path, conf: dict[str, str]) -> App:
    """``spark-submit --master MASTER`` of a job's script from the repository root, as a user
    deploys it: the driver's and the executors' Python are spark-submit's settings
    (``spark.pyspark.driver.python``, ``spark.pyspark.python``), not the environment."""
    name = Path(script).stem
    stdout, stderr = workdir / f"{name}.stdout", workdir / f"{name}.stderr"
    env = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON",
                                                             "PYSPARK_SUBMIT_ARGS")}
    env["PYTHONPATH"] = str(ROOT)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"  # an activated virtualenv
    settings = {"spark.pyspark.python": sys.executable, "spark.pyspark.driver.python": sys.executable,
                "spark.executor.extraJavaOptions": _JVM_OPTIONS, **conf}
    command = [str(Path(sys.executable).parent / "spark-submit"), "--master", MASTER,
               "--driver-java-options", _JVM_OPTIONS,
               *(word for key, value in settings.items() for word in ("--conf", f"{key}={value}")),
               str(ROOT / script), *args]
    with open(stdout, "ab") as out, open(stderr, "ab") as err:
        process = subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=err, start_new_session=True, env=env)
    return App(name, process, stdout, stderr)


def wait_for_file(path: Path, app: App, timeout_s: float = APP_TIMEOUT_S) -> dict[str, Any]:
    """Poll for a JSON file the app writes atomically; fail at once if the app exits first."""
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        code = app.process.poll()
        if code is not None and not path.exists():
            raise AssertionError(f"{app.name} exited with {code} before writing {path.name}\n{app.output()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"{app.name} wrote no {path.name} within {timeout_s:.0f}s\n{app.output()}")
        time.sleep(0.05)
    return json.loads(path.read_text())


@dataclass(frozen=True)
class ExecutorProcess:
    pid: int
    app_id: str
    executor_id: str


def _parent_pids() -> dict[int, int]:
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as handle:
                    stat = handle.read()
            except OSError:  # exited meanwhile
                continue
            parents[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])  # the name may hold spaces and ')'
    return parents


def executor_processes(root_pid: int, app_id: str) -> list[ExecutorProcess]:
    """The executor JVMs of application ``app_id`` among the descendants of ``root_pid`` (the
    app's Python driver): walking the tree from our own subprocess, and matching the app id
    on the executor's command line, can never select another test's or another app's JVMs."""
    children: dict[int, list[int]] = {}
    for pid, parent in _parent_pids().items():
        children.setdefault(parent, []).append(pid)
    found, todo = [], list(children.get(root_pid, []))
    while todo:
        pid = todo.pop()
        todo += children.get(pid, [])
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                argv = [a.decode(errors="replace") for a in handle.read().split(b"\0")]
        except OSError:
            continue
        if EXECUTOR_MAIN_CLASS in argv and "--app-id" in argv and "--executor-id" in argv:
            executor_app = argv[argv.index("--app-id") + 1]
            if executor_app == app_id and is_alive(pid):
                found.append(ExecutorProcess(pid, executor_app, argv[argv.index("--executor-id") + 1]))
    return found


def is_alive(pid: int) -> bool:
    """True while ``pid`` runs: neither gone nor a zombie awaiting its parent's wait()."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def kill_executor(app: App, app_id: str, executor_id: str, timeout_s: float = 60.0) -> int:
    """SIGKILL executor ``executor_id`` of ``app_id`` (a JVM under ``app``) and wait until it
    is dead; returns its pid."""
    matches = [e for e in executor_processes(app.pid, app_id) if e.executor_id == executor_id]
    assert len(matches) == 1, f"executor {executor_id} of {app_id}: found {matches}"
    pid = matches[0].pid
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout_s
    while is_alive(pid):
        assert time.monotonic() < deadline, f"executor pid {pid} still alive {timeout_s:.0f}s after SIGKILL"
        time.sleep(0.05)
    return pid


def executors_by_id(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The report's executors (see tests/streaming_support/cluster.py) by id, driver excluded."""
    return {e["id"]: e for e in report["executors"] if e["id"] != "driver"}
