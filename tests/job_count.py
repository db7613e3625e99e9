"""Spark jobs a call runs, counted exactly: the status tracker's jobs for a job group set
around the call (broadcast and shuffle-stage jobs included)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from pyspark.sql import SparkSession


def jobs_of(spark: SparkSession, call: Callable[[], Any]) -> tuple[int, Any]:
    """(Spark jobs the call ran, its result)."""
    jobs, result = _in_group(spark, call)
    return len(jobs), result


def stages_of(spark: SparkSession, call: Callable[[], Any]) -> tuple[int, Any]:
    """(Spark stages the call's jobs ran, its result)."""
    jobs, result = _in_group(spark, call)
    tracker = spark.sparkContext.statusTracker()
    infos = [tracker.getJobInfo(j) for j in jobs]
    return sum(len(info.stageIds) for info in infos if info is not None), result


def _in_group(spark: SparkSession, call: Callable[[], Any]) -> tuple[list[int], Any]:
    """(The ids of the jobs the call ran, its result), through a job group of its own."""
    context = spark.sparkContext
    group = f"jobs-of-{uuid.uuid4().hex}"
    context.setLocalProperty("spark.jobGroup.id", group)
    try:
        result = call()
    finally:
        context.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
    return list(context.statusTracker().getJobIdsForGroup(group)), result


def shuffled_bytes_of(spark: SparkSession, call: Callable[[], Any]) -> tuple[int, Any]:
    """(Bytes the call's jobs wrote to shuffle files, its result), from Spark's status store."""
    _, shuffled, result = jobs_and_shuffled_bytes_of(spark, call)
    return shuffled, result


def jobs_and_shuffled_bytes_of(spark: SparkSession, call: Callable[[], Any]) -> tuple[int, int, Any]:
    """(Spark jobs the call ran, bytes they wrote to shuffle files, its result): one job group
    for both counts (the helpers above each set a group of their own, so they do not nest)."""
    jobs, result = _in_group(spark, call)
    tracker = spark.sparkContext.statusTracker()
    store = spark.sparkContext._jsc.sc().statusStore()
    stages = [s for j in jobs if (info := tracker.getJobInfo(j)) is not None for s in info.stageIds]
    return len(jobs), sum(int(store.lastStageAttempt(s).shuffleWriteBytes()) for s in stages), result
