"""CPU time of the driver JVM's threads per group, read from ``/proc`` (Linux).

Wall time alone hides that a small micro-batch keeps both cores of this machine busy: the JIT
compilers and the garbage collector run beside the thread serving Python and the executor
tasks. Sampling each thread's ``utime + stime`` before and after a call says which of them the
call's CPU went to, without a profiler attached (which would change what it measures).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

# /proc/<pid>/task/<tid>/comm holds the first 15 characters of the Java thread name.
GROUPS = (
    ("jit", ("C1 ", "C2 ")),
    ("gc", ("G1 ", "GC ", "VM Thread")),
    ("python-serving", ("Thread-",)),  # py4j's threads running the driver's calls
    ("executor-tasks", ("Executor task",)),
)
GROUP_NAMES = (*(name for name, _ in GROUPS), "other")
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def jvm_pid(spark: Any) -> int:
    return int(spark._jvm.java.lang.ProcessHandle.current().pid())


def available(pid: int) -> bool:
    return Path(f"/proc/{pid}/task").is_dir()


def thread_cpu_seconds(pid: int) -> dict[str, float]:
    """CPU seconds so far per group of the JVM's live threads."""
    totals = dict.fromkeys(GROUP_NAMES, 0.0)
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):  # the thread ended meanwhile
            continue
        group = next((g for g, prefixes in GROUPS if name.startswith(prefixes)), "other")
        totals[group] += (int(fields[11]) + int(fields[12])) / _TICK
    return totals


def delta_ms(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Per group, milliseconds of CPU between two samples (threads that ended are lost)."""
    return {g: max(0.0, after[g] - before[g]) * 1000.0 for g in GROUP_NAMES}
