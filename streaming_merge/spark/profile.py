"""Phase profile of a MERGE: wall time, Spark jobs and Delta log loads per phase.

Spark jobs, log loads and Python↔JVM round trips are the fixed cost of a small MERGE, so
they are counted exactly rather than guessed from the code: while a profile is active
every phase runs under a Spark job group of its own and ``SparkStatusTracker`` reports
the jobs of that group (broadcast and shuffle-stage jobs included, since Spark hands the
job group on to the threads that submit them). Outside a profile a phase only names its
jobs in the Spark UI (Delta's ``recordMergeOperation`` descriptions) and never touches the
user's job group, which ``cancelJobGroup`` relies on.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field

from pyspark.sql import SparkSession

_JOB_GROUP = "spark.jobGroup.id"
_JOB_DESCRIPTION = "spark.job.description"


@dataclass
class PhaseStats:
    """One phase's share of a profiled run (summed when a phase runs several times); the
    time of a phase nested inside it counts for the inner phase only."""

    name: str
    ms: float = 0.0
    jobs: int = 0
    log_loads: int = 0
    log_updates: int = 0
    _nested_ms: float = 0.0


@dataclass
class Profile:
    """The phases of everything run while the profile was active, in first-seen order."""

    phases: dict[str, PhaseStats] = field(default_factory=dict)
    log_loads_outside_phases: int = 0
    log_updates_outside_phases: int = 0
    _open: list[PhaseStats] = field(default_factory=list)

    @property
    def jobs(self) -> int:
        return sum(p.jobs for p in self.phases.values())

    @property
    def log_loads(self) -> int:
        return self.log_loads_outside_phases + sum(p.log_loads for p in self.phases.values())

    @property
    def log_updates(self) -> int:
        return self.log_updates_outside_phases + sum(p.log_updates for p in self.phases.values())


_active: ContextVar[Profile | None] = ContextVar("streaming_merge_profile", default=None)


@contextlib.contextmanager
def profiling() -> Iterator[Profile]:
    """Collect a phase profile of everything the block runs (bench/merge_profile.py uses it)."""
    profile = Profile()
    token = _active.set(profile)
    try:
        yield profile
    finally:
        _active.reset(token)


def count_log_load(incremental: bool = False) -> None:
    """Called by the table layer for every Delta log load it makes; ``incremental`` for a
    handle brought up to date by reading only the commits it has not seen."""
    profile = _active.get()
    if profile is None:
        return
    if profile._open:
        if incremental:
            profile._open[-1].log_updates += 1
        else:
            profile._open[-1].log_loads += 1
    elif incremental:
        profile.log_updates_outside_phases += 1
    else:
        profile.log_loads_outside_phases += 1


@contextlib.contextmanager
def phase(spark: SparkSession, name: str, description: str | None = None) -> Iterator[None]:
    """Run a MERGE phase: its Spark jobs carry ``description`` in the UI, and under an
    active profile its wall time, jobs and log loads are added to the phase ``name``."""
    context = spark.sparkContext
    previous_description = context.getLocalProperty(_JOB_DESCRIPTION)
    if description is not None:
        context.setJobDescription(
            description if previous_description is None else f"{previous_description}: {description}")
    profile = _active.get()
    group = previous_group = None
    stats: PhaseStats | None = None
    if profile is not None:
        stats = profile.phases.setdefault(name, PhaseStats(name))
        profile._open.append(stats)
        previous_group = context.getLocalProperty(_JOB_GROUP)
        group = f"streaming_merge-profile-{uuid.uuid4().hex}"
        context.setLocalProperty(_JOB_GROUP, group)
    started = time.perf_counter()
    try:
        yield
    finally:
        if description is not None:
            context.setLocalProperty(_JOB_DESCRIPTION, previous_description)  # type: ignore[arg-type]
        if profile is not None and stats is not None:
            elapsed = (time.perf_counter() - started) * 1000
            context.setLocalProperty(_JOB_GROUP, previous_group)  # type: ignore[arg-type]
            stats.jobs += len(context.statusTracker().getJobIdsForGroup(group))
            profile._open.pop()
            stats.ms += elapsed - stats._nested_ms
            stats._nested_ms = 0.0
            if profile._open:
                profile._open[-1]._nested_ms += elapsed
