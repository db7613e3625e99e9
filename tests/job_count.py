"""Spark jobs a call runs, counted exactly: the status tracker's jobs for a job group set
around the call (broadcast and shuffle-stage jobs included)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from pyspark.sql import SparkSession


def jobs_of(spark: SparkSession, call: Callable[[], Any]) -> tuple[int, Any]:
    """(Spark jobs the call ran, its result)."""
    context = spark.sparkContext
    group = f"jobs-of-{uuid.uuid4().hex}"
    context.setLocalProperty("spark.jobGroup.id", group)
    try:
        result = call()
    finally:
        context.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
    return len(context.statusTracker().getJobIdsForGroup(group)), result


def stages_of(spark: SparkSession, call: Callable[[], Any]) -> tuple[int, Any]:
    """(Spark stages the call's jobs ran, its result)."""
    context = spark.sparkContext
    group = f"stages-of-{uuid.uuid4().hex}"
    context.setLocalProperty("spark.jobGroup.id", group)
    try:
        result = call()
    finally:
        context.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
    tracker = context.statusTracker()
    jobs = [tracker.getJobInfo(j) for j in tracker.getJobIdsForGroup(group)]
    return sum(len(job.stageIds) for job in jobs if job is not None), result
