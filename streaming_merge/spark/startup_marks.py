"""Timestamped start-up marks for ``bench/startup.py``: off unless the environment asks.

With ``STREAMING_MERGE_STARTUP_MARKS=<file>`` set, :func:`mark` appends one JSON line per call
(``{"mark": name, "t": epoch seconds, "pid": ...}``) to that file. The variable is inherited by
the driver's JVM and so by every Python process Spark starts (the data source planner, the
executors' workers), so one file collects the marks of all of them. Without the variable a
call costs one dictionary look-up. Nothing else in the package depends on it.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

MARKS_ENV = "STREAMING_MERGE_STARTUP_MARKS"
_seen: set[str] = set()


def enabled() -> bool:
    return bool(os.environ.get(MARKS_ENV))


def mark(name: str, *, once: bool = False, **extra: Any) -> None:
    """Record ``name`` now (``once``: only its first call in this process)."""
    path = os.environ.get(MARKS_ENV)
    if not path:
        return
    if once:
        if name in _seen:
            return
        _seen.add(name)
    line = json.dumps({"mark": name, "t": time.time(), "pid": os.getpid(), "process_started": _process_started(),
                       "process_cpu_s": process_cpu_seconds(os.getpid()), **extra}, default=str)
    # One write of a short line to a file opened for appending: lines of concurrent processes do not interleave.
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


_started: dict[int, float | None] = {}


def _process_started() -> float | None:
    """When this process started (epoch seconds), from ``/proc``; None elsewhere."""
    pid = os.getpid()
    if pid not in _started:  # a fork has a pid of its own
        try:
            ticks = int(open("/proc/self/stat").read().rsplit(")", 1)[1].split()[19])  # noqa: SIM115
            boot = time.time() - float(open("/proc/uptime").read().split()[0])  # noqa: SIM115 (btime: whole seconds)
            _started[pid] = boot + ticks / os.sysconf("SC_CLK_TCK")
        except (OSError, ValueError, IndexError):
            _started[pid] = None
    return _started[pid]


def process_cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of process ``pid`` so far (Linux ``/proc``), or None."""
    try:
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()  # noqa: SIM115
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# /proc/<pid>/task/<tid>/comm: the first 15 characters of a Java thread's name.
_THREAD_GROUPS = (("c2", ("C2 ",)), ("c1", ("C1 ",)), ("gc", ("G1 ", "GC ", "VM Thread", "VM Periodic")),
                  ("executor", ("Executor task",)), ("python-calls", ("Thread-",)))


def thread_cpu_seconds(pid: int) -> dict[str, float]:
    """CPU seconds so far of a JVM's live threads, by group (JIT compilers, GC, tasks, ...)."""
    totals: dict[str, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return totals
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as comm, open(f"/proc/{pid}/task/{tid}/stat") as stat:
                name, fields = comm.read().strip(), stat.read().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended meanwhile
            continue
        group = next((g for g, prefixes in _THREAD_GROUPS if name.startswith(prefixes)), "other")
        totals[group] = round(totals.get(group, 0.0) + (int(fields[11]) + int(fields[12])) / tick, 2)
    return totals


def jvm_state(spark: Any) -> dict[str, Any]:
    """The driver JVM's start time (epoch seconds), classes loaded, JIT milliseconds and CPU
    seconds so far; empty unless marks are on (each costs a few py4j calls)."""
    if not enabled():
        return {}
    factory = spark._jvm.java.lang.management.ManagementFactory
    pid = int(spark._jvm.java.lang.ProcessHandle.current().pid())
    return {"jvm_start": factory.getRuntimeMXBean().getStartTime() / 1000.0,
            "jvm_classes": int(factory.getClassLoadingMXBean().getTotalLoadedClassCount()),
            "jit_ms": int(factory.getCompilationMXBean().getTotalCompilationTime()),
            "jvm_cpu_s": process_cpu_seconds(pid), "jvm_threads_cpu_s": thread_cpu_seconds(pid),
            "python_cpu_s": process_cpu_seconds(os.getpid())}
