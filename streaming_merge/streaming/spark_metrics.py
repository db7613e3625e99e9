"""The sink's per-batch figures in Spark's metrics system: Prometheus, JMX, Graphite, ... see them.

Every stream a MergeSink writes (its target and app id) gets one metrics source in the driver,
``streaming_merge.<name>``: Dropwizard counters of totals (batches, rows, files, bytes, MERGE
times) and gauges of the last batch (its durations, the table version, the table's size before
data skipping). Any sink configured in Spark's metrics system reports them, e.g. the Prometheus
servlet (``spark.metrics.conf.*.sink.prometheusServlet.class``) or the JmxSink; see
docs/reference/metrics.md for the settings and the names.

``<name>`` is the streaming query's name when the query has one (as Spark names its own
streaming source ``spark.streaming.<queryName>``), else the target table's folder name; when
another stream of this SparkContext holds that name already, the app id is appended
(``<name>_<app id>``), then a number. The same stream keeps its source, and its totals, across
restarts of its query in one SparkContext.

How, without JVM code of ours. Spark takes metrics sources from a ``SparkPlugin``
(``registerMetrics``), which is a JVM class, and this package ships none (no jar: it runs
from PyPI alone). So the source is built through py4j: a Dropwizard ``MetricRegistry`` with
``Counter`` and ``DefaultSettableGauge`` metrics (metrics-core 4.2, Spark's own), wrapped in
the plugin framework's ``PluginContextImpl.PluginMetricsSource`` (the one concrete ``Source``
taking a name and a registry) and given to ``SparkEnv.get.metricsSystem.registerSource``.
(The one public route, ``LongAccumulatorSource.register``, names every such source
``AccumulatorSource`` and makes every metric a gauge.) Those are ``private[spark]`` in Scala,
public in the bytecode;
tests/spark/test_spark_metrics.py fails when a Spark upgrade changes them. Every metric is in
the registry before it is registered: the metrics system copies the registry's metrics then.

Cost: one py4j round trip per metric whose value changed (a counter that a batch leaves at zero
is not touched, nor a gauge that keeps its value), a few ms of a batch; the stream's first batch
builds the source (~45 round trips) and names it. bench/private_apis.md has the figures.

Publishing never fails a batch: a failure is logged once (WARNING) and that stream publishes
no more in this SparkContext. ``spark.streaming_merge.metrics.enabled=false`` (the session's
conf, read when a stream's first batch reports) turns it off; a Spark Connect session (no py4j
gateway) publishes nothing, without a word.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from py4j.java_gateway import JavaClass, JavaObject
from pyspark import SparkContext
from pyspark.sql import SparkSession

from streaming_merge.merge.metrics import DELTA_METRICS
from streaming_merge.streaming.progress import MergeProgress

log = logging.getLogger(__name__)

ENABLED_CONF = "spark.streaming_merge.metrics.enabled"
SOURCE_PREFIX = "streaming_merge."
_QUERY_ID_PROPERTY = "sql.streaming.queryId"
_PLUGIN_METRICS_SOURCE = "org.apache.spark.internal.plugin.PluginContextImpl$PluginMetricsSource"
_PLUGIN_CONTEXT = "org.apache.spark.internal.plugin.PluginContextImpl"

MetricKind = Literal["counter", "gauge"]


@dataclass(frozen=True)
class SinkMetric:
    """One metric of a stream's source: its name in the source, its kind, what it means, and
    its value from a batch's progress (a counter: what the batch adds; a gauge: its new value;
    None: the batch leaves it as it is)."""

    name: str
    kind: MetricKind
    meaning: str
    value: Callable[[MergeProgress], int | None]


def _counter(name: str, meaning: str, value: Callable[[MergeProgress], int | None]) -> SinkMetric:
    return SinkMetric(name, "counter", meaning, value)


def _gauge(name: str, meaning: str, value: Callable[[MergeProgress], int | None]) -> SinkMetric:
    return SinkMetric(name, "gauge", meaning, value)


# The MERGE's figures that describe the table the batch met, not work done: a sum over batches
# means nothing, so they are the last MERGE's values.
_TABLE_SIZE_METRICS = ("numTargetFilesBeforeSkipping", "numTargetFilesAfterSkipping",
                       "numTargetBytesBeforeSkipping", "numTargetBytesAfterSkipping",
                       "numTargetPartitionsAfterSkipping")

_MERGE_MEANINGS: Mapping[str, str] = {
    "numSourceRows": "rows the MERGE read from the prepared batch (after dedupe, without null keys and late events)",
    "numSourceRowsInSecondScan": "source rows read by the MERGE's second pass over the source",
    "numTargetRowsCopied": "unchanged target rows rewritten beside changed ones (copy-on-write)",
    "numTargetRowsInserted": "rows inserted",
    "numTargetRowsUpdated": "rows updated (matched and not matched by source)",
    "numTargetRowsDeleted": "rows deleted (matched and not matched by source)",
    "numTargetRowsMatchedUpdated": "rows updated by a WHEN MATCHED clause",
    "numTargetRowsMatchedDeleted": "rows deleted by a WHEN MATCHED clause",
    "numTargetRowsNotMatchedBySourceUpdated": "rows updated by a WHEN NOT MATCHED BY SOURCE clause",
    "numTargetRowsNotMatchedBySourceDeleted": "rows deleted by a WHEN NOT MATCHED BY SOURCE clause (truncates)",
    "numTargetFilesRemoved": "data files removed (rewritten or deleted)",
    "numTargetFilesAdded": "data files added",
    "numTargetChangeFilesAdded": "change data feed files added",
    "numTargetChangeFileBytes": "bytes of change data feed files added",
    "numTargetBytesRemoved": "bytes of data files removed",
    "numTargetBytesAdded": "bytes of data files added",
    "numTargetPartitionsRemovedFrom": "partitions that files were removed from",
    "numTargetPartitionsAddedTo": "partitions that files were added to",
    "numTargetDeletionVectorsAdded": "deletion vectors added",
    "numTargetDeletionVectorsRemoved": "deletion vectors removed",
    "numTargetDeletionVectorsUpdated": "deletion vectors updated",
    "executionTimeMs": "milliseconds the MERGE ran",
    "scanTimeMs": "milliseconds the MERGE spent finding the touched files",
    "rewriteTimeMs": "milliseconds the MERGE spent writing files",
    "numTargetFilesBeforeSkipping": "data files in the table before data skipping",
    "numTargetFilesAfterSkipping": "data files left to read after data skipping",
    "numTargetBytesBeforeSkipping": "bytes of the table's data files before data skipping",
    "numTargetBytesAfterSkipping": "bytes left to read after data skipping",
    "numTargetPartitionsAfterSkipping": "partitions left to read after data skipping",
}

_PHASES = ("total", "materialize", "tombstones", "merge", "commit")


def _merge_value(name: str) -> Callable[[MergeProgress], int | None]:
    return lambda progress: progress.metrics.get(name)


def _last_merge_value(name: str) -> Callable[[MergeProgress], int | None]:
    # A batch whose MERGE was skipped (its txn already in the table) reports zeros: not the table's size.
    return lambda progress: None if progress.skipped else progress.metrics.get(name)


def _phase_value(phase: str) -> Callable[[MergeProgress], int | None]:
    return lambda progress: progress.durationMs.get(phase, 0)  # a phase the batch did not reach took 0 ms


METRICS: tuple[SinkMetric, ...] = (
    _counter("batches", "batches reported: merged, skipped or empty", lambda p: 1),
    _counter("skippedBatches", "batches skipped because their txn was already in the table (a replay)",
             lambda p: int(p.skipped)),
    _counter("conflictRetries", "reruns of batches after a commit conflict with another writer",
             lambda p: p.conflictRetries),
    _counter("numInputRows", "rows the micro-batches brought", lambda p: p.numInputRows),
    _counter("numRowsAfterDedupe", "rows left after keeping the newest event per key", lambda p: p.numRowsAfterDedupe),
    _counter("numLateRowsDropped", "events dropped as older than a tombstone or a truncate",
             lambda p: p.numLateRowsDropped),
    _counter("numNullKeyRows", "rows with a null key, sent to the dead letter table",
             lambda p: p.numNullKeyRows),
    _counter("deadLetterRows", "rows written to the dead letter table", lambda p: p.deadLetterRows),
    _counter("numTruncates", "truncate events applied", lambda p: p.numTruncates),
    _counter("durationMs", "milliseconds the batches took, in all (durationMs.total summed)",
             lambda p: p.durationMs.get("total")),
    *(_counter(name, _MERGE_MEANINGS[name], _merge_value(name))
      for name in DELTA_METRICS if name not in _TABLE_SIZE_METRICS),
    _gauge("tableVersion", "the table's version after the last batch: the one it committed, or found (skipped)",
           lambda p: p.tableVersion),
    *(_gauge(f"lastBatch.durationMs.{phase}", f"milliseconds of the last batch's {phase} phase"
             if phase != "total" else "milliseconds the last batch took", _phase_value(phase))
      for phase in _PHASES),
    *(_gauge(f"lastMerge.{name}", f"{_MERGE_MEANINGS[name]}, in the last batch that ran a MERGE",
             _last_merge_value(name)) for name in _TABLE_SIZE_METRICS),
)


class SparkMetricsUnavailableError(RuntimeError):
    """Spark's metrics API is not where this module looks for it (a Spark upgrade moved it)."""


class StreamSource:
    """One stream's metrics in the driver's JVM, registered with Spark's metrics system."""

    def __init__(self, context: SparkContext, name: str, metrics: tuple[SinkMetric, ...] = METRICS) -> None:
        """Build the registry, its metrics and the source ``name``, and register it (raises when
        Spark's private metrics API changed: see the module docstring)."""
        if context._gateway is None:
            raise SparkMetricsUnavailableError("the SparkContext has no py4j gateway")
        client = context._gateway._gateway_client
        self.name = name
        try:
            env = JavaClass("org.apache.spark.SparkEnv", client).get()
            metrics_system = env.metricsSystem()
            registry = JavaClass("com.codahale.metrics.MetricRegistry", client)()
            gauge_class = JavaClass("com.codahale.metrics.DefaultSettableGauge", client)
            self._updates: list[tuple[SinkMetric, Callable[[int], Any]]] = []
            for metric in metrics:
                if metric.kind == "counter":
                    self._updates.append((metric, registry.counter(metric.name).inc))
                else:
                    gauge = gauge_class(0)
                    registry.register(metric.name, gauge)
                    self._updates.append((metric, gauge.setValue))
            # PluginMetricsSource is an inner class: its constructor takes the outer instance
            # first, a plugin context the source never uses (Scala only checks it is not null).
            no_resources = JavaClass("java.util.HashMap", client)()
            plugin_context = JavaClass(_PLUGIN_CONTEXT, client)(
                "streaming_merge", env.rpcEnv(), metrics_system, env.conf(), "driver", no_resources)
            self._source: JavaObject = JavaClass(_PLUGIN_METRICS_SOURCE, client)(plugin_context, name, registry)
            metrics_system.registerSource(self._source)
        except Exception as exc:
            raise SparkMetricsUnavailableError(
                f"could not register the metrics source {name!r} with Spark's metrics system through "
                f"{_PLUGIN_METRICS_SOURCE} (a Spark upgrade may have changed it): {exc}") from exc
        self._gauge_values: dict[str, int] = {}

    def update(self, progress: MergeProgress) -> int:
        """Add the batch to the counters and set the gauges; returns the py4j calls made (one per
        metric whose value changed)."""
        calls = 0
        for metric, apply in self._updates:
            value = metric.value(progress)
            if value is None:
                continue
            value = int(value)
            if metric.kind == "counter":
                if value <= 0:  # counters only grow; a batch that adds nothing costs no round trip
                    continue
            elif self._gauge_values.get(metric.name, 0) == value:
                continue
            else:
                self._gauge_values[metric.name] = value
            apply(value)
            calls += 1
        return calls


def stream_label(text: str) -> str:
    """``text`` as one segment of a metrics source name: Prometheus's exposition turns every
    character outside [A-Za-z0-9_] into ``_`` anyway, and JMX object names take these as they are."""
    return re.sub(r"[^A-Za-z0-9_]", "_", text.strip()) or "stream"


def table_label(target: str) -> str:
    """The table's folder name (the last segment of its path or URI)."""
    return stream_label(target.rstrip("/").rsplit("/", 1)[-1])


_Stream = tuple[str, str]  # (target, app id)


class _Publisher:
    """The sources of the current SparkContext's streams; thread-safe (queries run their batches
    on threads of their own)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._context: SparkContext | None = None
        self._streams: dict[_Stream, StreamSource | None] = {}  # None: publishing is off for it
        self._next_number: dict[str, int] = {}  # per taken name: the suffix to try next
        self.broken = False  # an unforeseen failure outside any one stream: off for the process

    def publish(self, progress: MergeProgress) -> None:
        context = SparkContext._active_spark_context
        if context is None or context._gateway is None or _is_connect():
            return  # Spark Connect: no gateway into the driver's JVM
        stream = (progress.target, progress.appId)
        with self._lock:
            if context is not self._context:  # a new SparkContext: the old sources died with its JVM
                self._streams.clear()
                self._next_number.clear()
                self._context = context
            if stream not in self._streams:
                self._streams[stream] = self._register(context, progress)
            source = self._streams[stream]
            if source is None:
                return
            try:
                source.update(progress)
            except Exception as exc:
                self._streams[stream] = None
                log.warning("Not publishing the metrics of %s (app id %s) to Spark's metrics system any more: "
                            "updating source %s failed: %s", progress.target, progress.appId, source.name, exc)

    def source(self, target: str, app_id: str) -> StreamSource | None:
        with self._lock:
            return self._streams.get((target, app_id))

    def _register(self, context: SparkContext, progress: MergeProgress) -> StreamSource | None:
        try:
            session = SparkSession.getActiveSession()
            enabled = (session.conf.get(ENABLED_CONF, "true") if session is not None
                       else context.getConf().get(ENABLED_CONF, "true"))
            if str(enabled).strip().lower() in ("false", "0", "no", "off"):
                return None
            name = self._free_name(context, session, progress)
            return StreamSource(context, name)
        except Exception as exc:
            log.warning("Not publishing the metrics of %s (app id %s) to Spark's metrics system: %s",
                        progress.target, progress.appId, exc)
            return None

    def _free_name(self, context: SparkContext, session: SparkSession | None, progress: MergeProgress) -> str:
        """``streaming_merge.<query name or table folder>``, made unique among the sources of the
        SparkContext (ours, and any other holding the name)."""
        base = SOURCE_PREFIX + (_query_name(context, session) or table_label(progress.target))
        taken = {source.name for source in self._streams.values() if source is not None}
        metrics_system = _metrics_system(context)

        def free(name: str) -> bool:
            return name not in taken and metrics_system.getSourcesByName(name).isEmpty()

        for name in (base, f"{base}_{stream_label(progress.appId)}"):
            if free(name):
                return name
        while True:  # many streams into tables of one folder name (a test suite's): count on, not from 2
            number = self._next_number.get(name, 2)
            self._next_number[name] = number + 1
            if free(f"{name}_{number}"):
                return f"{name}_{number}"


def _metrics_system(context: SparkContext) -> JavaObject:
    assert context._gateway is not None
    return JavaClass("org.apache.spark.SparkEnv", context._gateway._gateway_client).get().metricsSystem()


def _query_name(context: SparkContext, session: SparkSession | None) -> str | None:
    """The name of the streaming query whose batch the calling thread runs, when it has one. The
    query is known to the session that started it: the batch's thread has the query's own clone
    of it as its active session, so the application's default session is asked too."""
    query_id = context.getLocalProperty(_QUERY_ID_PROPERTY)
    if not query_id:
        return None
    assert context._gateway is not None
    default = JavaClass("org.apache.spark.sql.SparkSession", context._gateway._gateway_client).getDefaultSession()
    managers = [session._jsparkSession.streams()] if session is not None else []
    if default.isDefined():
        managers.append(default.get().streams())
    for manager in managers:
        query = manager.get(query_id)
        if query is not None:
            name = query.name()
            return stream_label(name) if name else None
    return None


def _is_connect() -> bool:
    from pyspark.sql.utils import is_remote

    return is_remote()


_publisher = _Publisher()


def publish(progress: MergeProgress) -> None:
    """Report one batch's progress to Spark's metrics system (never raises)."""
    if _publisher.broken:
        return
    try:
        _publisher.publish(progress)
    except Exception:  # publishing must never fail a batch whose data is committed
        _publisher.broken = True
        log.warning("Publishing batch %s of %s to Spark's metrics system failed; publishing no more metrics",
                    progress.batchId, progress.target, exc_info=True)


def source_for(target: str, app_id: str) -> StreamSource | None:
    """The source publishing the stream (``target`` as the sink resolved it), if any."""
    return _publisher.source(target, app_id)
