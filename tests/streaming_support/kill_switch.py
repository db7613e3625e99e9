"""SIGKILL at a chosen point of a chosen batch, for the exactly-once test apps: the whole process
group (Python driver and JVM) dies as a machine would.

``--kill-at PHASE:BATCH`` names the point: ``before_merge`` (the batch materialized),
``mid_merge`` (files scanned, nothing committed), ``after_commit`` (the Delta commit landed,
Spark's offset commit not yet). The first two are reached through MergeSink's phase hook, the
last by the app's foreachBatch function after the sink returns."""

from __future__ import annotations

import os
import signal
import sys

# MergeSink phase names -> the kill points they stand for.
_SINK_PHASES = {"after_materialize": "before_merge", "after_find_touched_files": "mid_merge"}


class KillSwitch:
    """``batch`` is the batch being run (the app sets it before calling the sink)."""

    def __init__(self, kill_at: str | None) -> None:
        phase, batch = kill_at.split(":") if kill_at else (None, "-1")
        self.phase, self.kill_batch = phase, int(batch)
        self.batch = -1

    def die_if(self, point: str) -> None:
        if point == self.phase and self.batch == self.kill_batch:
            sys.stdout.flush()
            os.killpg(os.getpgid(0), signal.SIGKILL)

    def at_sink_phase(self, phase: str) -> None:
        """Call from the sink's phase hook."""
        self.die_if(_SINK_PHASES.get(phase, phase))
