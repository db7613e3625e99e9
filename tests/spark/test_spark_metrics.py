"""The sink's metrics in Spark's metrics system (streaming_merge/streaming/spark_metrics.py).

The source is built through Spark's private metrics API (``PluginMetricsSource``,
``SparkEnv.metricsSystem``): the first test fails, naming it, when a Spark upgrade changes it.
The sink tests read the values back from the metrics system (``getSourcesByName``) and compare
them with the batches' MergeProgress; one driver in a subprocess, with the UI, Spark's
Prometheus servlet and its JmxSink on, shows what a Prometheus server and a JMX client read.
"""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from pyspark import SparkContext
from pyspark.sql import DataFrame, SparkSession

from streaming_merge import MergeSink
from streaming_merge.merge.metrics import DELTA_METRICS
from streaming_merge.streaming import spark_metrics
from streaming_merge.streaming.progress import MergeProgress
from tests.streaming_support import metrics_app

ROOT = Path(__file__).resolve().parents[2]

# The MERGE figures published as the last MERGE's values (gauges); every other one is a total.
TABLE_SIZE_METRICS = {"numTargetFilesBeforeSkipping", "numTargetFilesAfterSkipping", "numTargetBytesBeforeSkipping",
                      "numTargetBytesAfterSkipping", "numTargetPartitionsAfterSkipping"}
PHASES = ("total", "materialize", "tombstones", "merge", "commit")


def expected_values(progress: list[dict[str, Any]]) -> dict[str, int]:
    """What the source must hold after these batches (MergeSink.recentProgress), worked out
    from the progress records alone."""
    merged = [p for p in progress if p["metrics"] and not p["skipped"]]
    values = {
        "batches": len(progress),
        "skippedBatches": sum(p["skipped"] for p in progress),
        "durationMs": sum(p["durationMs"]["total"] for p in progress),
        **{name: sum(p[name] for p in progress)
           for name in ("conflictRetries", "numInputRows", "numRowsAfterDedupe", "numLateRowsDropped",
                        "numNullKeyRows", "deadLetterRows", "numTruncates")},
        **{name: sum(p["metrics"][name] for p in merged) for name in DELTA_METRICS if name not in TABLE_SIZE_METRICS},
        "tableVersion": [p["tableVersion"] for p in progress if p["tableVersion"] is not None][-1],
        **{f"lastBatch.durationMs.{phase}": progress[-1]["durationMs"].get(phase, 0) for phase in PHASES},
        **{f"lastMerge.{name}": merged[-1]["metrics"][name] for name in TABLE_SIZE_METRICS},
    }
    return values


def published(spark: SparkSession, source_name: str) -> dict[str, int]:
    """The source's counters and gauges, as Spark's metrics system holds them."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    sources = jvm.org.apache.spark.SparkEnv.get().metricsSystem().getSourcesByName(source_name)
    assert sources.size() == 1, f"{sources.size()} sources named {source_name}"
    registry = sources.head().metricRegistry()
    values = {name: int(counter.getCount()) for name, counter in registry.getCounters().items()}
    values.update({name: int(gauge.getValue()) for name, gauge in registry.getGauges().items()})
    return values


def events(spark: SparkSession, rows: list[tuple[int, int, str]]) -> DataFrame:
    return spark.createDataFrame(rows, "id long, lsn long, op string")


def source_name(sink: MergeSink, app_id: str) -> str:
    source = spark_metrics.source_for(sink.target, app_id)
    assert source is not None, f"no metrics source for {sink.target} ({app_id})"
    return source.name


def unique_folder(tmp_path: Path) -> Path:
    """A table folder whose name no other test's stream has (the source's name comes from it)."""
    return tmp_path / f"orders_{uuid.uuid4().hex[:8]}"


def test_spark_metrics_api_takes_a_source_built_through_py4j(spark: SparkSession) -> None:
    name = f"streaming_merge.api_check_{uuid.uuid4().hex[:8]}"
    # Raises SparkMetricsUnavailableError naming PluginMetricsSource when a Spark upgrade changed it.
    spark_metrics.StreamSource(spark.sparkContext, name)
    assert published(spark, name) == dict.fromkeys((m.name for m in spark_metrics.METRICS), 0)


def test_the_source_adds_up_the_batches_and_holds_the_last_ones_figures(spark: SparkSession, tmp_path: Path) -> None:
    folder = unique_folder(tmp_path)
    sink = MergeSink(str(folder), keys=["id"], sequence_by="lsn", apply_as_deletes="op = 'd'", app_id="metrics-app")
    sink(events(spark, [(i, 1, "c") for i in range(10)]), 0)
    sink(events(spark, [(i, 2, "d" if i < 7 else "u") for i in range(5, 15)] + [(20, 1, "c"), (20, 2, "u")]), 1)
    sink(events(spark, [(1, 3, "u")]), 1)  # a replay: skipped, its txn is in the table
    sink(events(spark, []), 2)
    progress = sink.recentProgress
    assert [(p["skipped"], p["numInputRows"]) for p in progress] == [(False, 10), (False, 12), (True, 0), (False, 0)]
    name = source_name(sink, "metrics-app")
    assert name == f"streaming_merge.{folder.name}"
    values = published(spark, name)
    assert values == expected_values(progress)
    assert (values["batches"], values["skippedBatches"], values["numTargetRowsInserted"],
            values["numTargetRowsUpdated"], values["numTargetRowsDeleted"]) == (4, 1, 16, 3, 2)


def test_each_stream_has_a_source_of_its_own_and_keeps_it_across_sinks(spark: SparkSession, tmp_path: Path) -> None:
    folder = unique_folder(tmp_path)
    first = MergeSink(str(folder), keys=["id"], sequence_by="lsn", app_id="flow-a")
    second = MergeSink(str(folder), keys=["id"], sequence_by="lsn", app_id="flow-b")  # another flow, same table
    first(events(spark, [(1, 1, "c"), (2, 1, "c")]), 0)
    second(events(spark, [(3, 1, "c")]), 0)
    assert (source_name(first, "flow-a"), source_name(second, "flow-b")) == (
        f"streaming_merge.{folder.name}", f"streaming_merge.{folder.name}_flow_b")
    restarted = MergeSink(str(folder), keys=["id"], sequence_by="lsn", app_id="flow-a")  # a new sink, same stream
    restarted(events(spark, [(4, 2, "c")]), 1)
    assert source_name(restarted, "flow-a") == f"streaming_merge.{folder.name}"
    assert published(spark, f"streaming_merge.{folder.name}")["numTargetRowsInserted"] == 3
    assert published(spark, f"streaming_merge.{folder.name}_flow_b")["numTargetRowsInserted"] == 1


def test_a_failing_update_is_logged_once_and_turns_the_stream_off(
        spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    calls: list[int] = []

    def failing_update(self: spark_metrics.StreamSource, progress: MergeProgress) -> int:
        calls.append(progress.batchId)
        raise RuntimeError("the gateway went away")

    monkeypatch.setattr(spark_metrics.StreamSource, "update", failing_update)
    sink = MergeSink(str(unique_folder(tmp_path)), keys=["id"], sequence_by="lsn", app_id="failing")
    with caplog.at_level(logging.WARNING, logger=spark_metrics.__name__):
        for batch_id in range(3):
            sink(events(spark, [(batch_id, 1, "c")]), batch_id)
    assert [p["numTargetRowsInserted"] for p in (r["metrics"] for r in sink.recentProgress)] == [1, 1, 1]
    assert calls == [0]
    warnings = [r for r in caplog.records if r.name == spark_metrics.__name__]
    assert [r.levelno for r in warnings] == [logging.WARNING]
    assert "the gateway went away" in warnings[0].getMessage()
    assert spark_metrics.source_for(sink.target, "failing") is None


def test_a_source_spark_refuses_is_logged_once_and_the_batches_run(
        spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(spark_metrics, "_PLUGIN_METRICS_SOURCE", "org.apache.spark.NoSuchMetricsSource")
    sink = MergeSink(str(unique_folder(tmp_path)), keys=["id"], sequence_by="lsn", app_id="refused")
    with caplog.at_level(logging.WARNING, logger=spark_metrics.__name__):
        sink(events(spark, [(1, 1, "c")]), 0)
        sink(events(spark, [(2, 1, "c")]), 1)
    assert [r["metrics"]["numTargetRowsInserted"] for r in sink.recentProgress] == [1, 1]
    warnings = [r.getMessage() for r in caplog.records if r.name == spark_metrics.__name__]
    assert len(warnings) == 1 and "NoSuchMetricsSource" in warnings[0], warnings


def test_the_conf_turns_publishing_off(spark: SparkSession, tmp_path: Path) -> None:
    folder = unique_folder(tmp_path)
    spark.conf.set(spark_metrics.ENABLED_CONF, "false")
    try:
        sink = MergeSink(str(folder), keys=["id"], sequence_by="lsn", app_id="off")
        sink(events(spark, [(1, 1, "c")]), 0)
    finally:
        spark.conf.unset(spark_metrics.ENABLED_CONF)
    assert spark_metrics.source_for(sink.target, "off") is None
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    metrics_system = jvm.org.apache.spark.SparkEnv.get().metricsSystem()
    assert metrics_system.getSourcesByName(f"streaming_merge.{folder.name}").isEmpty()


def test_without_a_py4j_gateway_nothing_is_published_and_nothing_said(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A Spark Connect client (or its foreachBatch worker) has no SparkContext in Python."""
    monkeypatch.setattr(SparkContext, "_active_spark_context", None)
    progress = MergeProgress(batchId=0, appId="connect", tableVersion=1, skipped=False, attempts=1, numInputRows=1,
                             numRowsAfterDedupe=1, numNullKeyRows=0, numLateRowsDropped=0, durationMs={"total": 5},
                             metrics={}, timestamp="2024-01-01T00:00:00.000Z", target="sc://nowhere/orders")
    with caplog.at_level(logging.DEBUG, logger=spark_metrics.__name__):
        spark_metrics.publish(progress)
    assert spark_metrics.source_for("sc://nowhere/orders", "connect") is None
    assert not [r for r in caplog.records if r.name == spark_metrics.__name__]


def prometheus_line(source: str, metric: spark_metrics.SinkMetric, value: int) -> str:
    """A metric's line in Spark's PrometheusServlet exposition (a gauge also has a ``_Number`` line)."""
    key = re.sub(r"[^a-zA-Z0-9]", "_", f"{metrics_app.NAMESPACE}.driver.{source}.{metric.name}")
    if metric.kind == "counter":
        return f'metrics_{key}_Count{{type="counters"}} {value}'
    return f'metrics_{key}_Value{{type="gauges"}} {value}'


def test_prometheus_servlet_and_jmx_serve_the_metrics(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "tests.streaming_support.metrics_app", "--workdir", str(tmp_path)],
                            cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-4000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    expected = expected_values(report["progress"])
    assert (expected["batches"], expected["numTargetRowsInserted"], expected["numTargetRowsDeleted"]) == (2, 15, 2)
    source = "streaming_merge." + metrics_app.QUERY_NAME.replace("-", "_")  # the query's name
    lines = set(report["prometheus"])
    for metric in spark_metrics.METRICS:
        assert prometheus_line(source, metric, expected[metric.name]) in lines, metric.name
    assert len(lines) == len(spark_metrics.METRICS) + sum(m.kind == "gauge" for m in spark_metrics.METRICS)
    prefix = f"{metrics_app.NAMESPACE}.driver.{source}."
    assert report["jmx"] == {prefix + name: value for name, value in expected.items()}
