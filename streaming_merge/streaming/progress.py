"""Per-batch progress of the MergeSink, and its bridge to Spark's own query progress.

Spark's ``StreamingQueryProgress`` cannot carry the MERGE metrics: ``observedMetrics``
only aggregates the rows *entering* the sink (``Dataset.observe`` on the streaming
DataFrame), while the MERGE runs inside ``foreachBatch`` after that plan has finished.
So the sink keeps its own ``MergeProgress`` per batch, shaped like Spark's progress
(camelCase keys, ``json()``), and ``MergeProgressListener`` joins the two by batchId.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from pyspark.sql.streaming import StreamingQueryListener

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MergeProgress:
    """What one micro-batch did to the target table."""

    batchId: int
    appId: str
    tableVersion: int | None
    skipped: bool
    attempts: int
    numInputRows: int
    numRowsAfterDedupe: int
    numNullKeyRows: int
    numLateRowsDropped: int
    durationMs: Mapping[str, int]
    metrics: Mapping[str, int]
    timestamp: str
    target: str
    deadLetterRows: int = 0
    extra: Mapping[str, Any] = field(default_factory=dict)
    # The auto compaction run after this batch's MERGE (MergeSink(auto_compact=...)), else None.
    compaction: Mapping[str, Any] | None = None
    # Truncate events applied by this batch (MergeSink(apply_as_truncates=...)).
    numTruncates: int = 0
    # Reruns of the batch after a commit that conflicted with another writer's (of ``attempts``).
    conflictRetries: int = 0
    # The streaming query whose batch this was (Spark's query id); None when called directly.
    queryId: str | None = None

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["durationMs"] = dict(self.durationMs)
        data["metrics"] = dict(self.metrics)
        return data

    def json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=False)

    def prettyJson(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def summary(self) -> str:
        """One log line with what matters per batch."""
        m = self.metrics
        if self.skipped:
            return f"batch {self.batchId} skipped: txn({self.appId}) already applied to {self.target}"
        return (
            f"batch {self.batchId} -> {self.target} v{self.tableVersion}: in={self.numInputRows} "
            f"dedup={self.numRowsAfterDedupe} ins={m.get('numTargetRowsInserted', 0)} "
            f"upd={m.get('numTargetRowsUpdated', 0)} del={m.get('numTargetRowsDeleted', 0)} "
            f"late={self.numLateRowsDropped} nullkeys={self.numNullKeyRows} "
            f"files -{m.get('numTargetFilesRemoved', 0)}/+{m.get('numTargetFilesAdded', 0)} "
            f"attempts={self.attempts}{f' conflicts={self.conflictRetries}' if self.conflictRetries else ''} "
            f"{self.durationMs.get('total', 0)}ms{self._compaction_summary()}"
        )

    def _compaction_summary(self) -> str:
        c = self.compaction
        if not c:
            return ""
        if c.get("error"):
            return f" compaction failed ({c['error']})"
        return f" compacted -{c.get('numFilesRemoved', 0)}/+{c.get('numFilesAdded', 0)} files"



class ProgressLog:
    """Bounded, thread-safe history of MergeProgress records, newest last; a replayed batch
    appears twice (run, then skipped), and lookups by batchId give its latest record."""

    def __init__(self, capacity: int) -> None:
        self._records: deque[MergeProgress] = deque(maxlen=capacity)
        self._lock = threading.Lock()
        self._query = threading.local()  # the streaming query whose batch the calling thread runs

    def running(self, query_id: str | None) -> None:
        """The calling thread now runs a batch of ``query_id`` (None: the sink called directly);
        its records are stamped with it."""
        self._query.id = query_id

    def add(self, progress: MergeProgress) -> None:
        """Record ``progress``, stamped with the query whose batch the calling thread runs."""
        progress = replace(progress, queryId=getattr(self._query, "id", None))
        with self._lock:
            self._records.append(progress)

    def get(self, batch_id: int, query_id: str | None = None) -> MergeProgress | None:
        """The latest record of ``batch_id``; of that query's batch when ``query_id`` is given."""
        with self._lock:
            return next((p for p in reversed(self._records)
                         if p.batchId == batch_id and (query_id is None or p.queryId == query_id)), None)

    def query_ids(self) -> set[str]:
        with self._lock:
            return {p.queryId for p in self._records if p.queryId is not None}

    def last(self) -> MergeProgress | None:
        with self._lock:
            return self._records[-1] if self._records else None

    def all(self) -> list[MergeProgress]:
        with self._lock:
            return list(self._records)


class MergeProgressListener(StreamingQueryListener):
    """Hands ``on_progress`` one record per batch of the queries ``sink`` serves: Spark's
    progress plus ``merge``, the sink's MergeProgress of the same query and batch, and
    ``consumerLag`` (:func:`consumer_lag`) for a Kafka source. A listener
    hears every query of the session, so another query's progress (whose batch ids repeat
    ours) is left out."""

    def __init__(self, sink: Any, on_progress: Callable[[dict[str, Any]], None]) -> None:
        self._sink = sink
        self._on_progress = on_progress

    def onQueryStarted(self, event: Any) -> None:
        pass

    def onQueryProgress(self, event: Any) -> None:
        progress = event.progress
        query_id = str(progress.id)
        if query_id not in self._sink.served_query_ids():
            return
        spark_record = json.loads(progress.json)
        merge = self._sink.progress_for(progress.batchId, query_id)
        spark_record["merge"] = merge.to_dict() if merge is not None else None
        spark_record["consumerLag"] = consumer_lag(spark_record.get("sources", []))
        try:
            self._on_progress(spark_record)
        except Exception:  # a failing callback must not kill Spark's listener bus
            log.exception("on_progress callback failed for batch %s", progress.batchId)

    def onQueryIdle(self, event: Any) -> None:
        pass

    def onQueryTerminated(self, event: Any) -> None:
        pass


def consumer_lag(sources: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """Records each topic-partition has past the batch's end, from a progress record's sources
    (``latestOffset`` minus ``endOffset``, as Spark's Kafka connector and the ``kafka_py`` source
    report them: ``{topic: {partition: offset}}``); sources of other shapes are left out."""
    lag: dict[str, dict[str, int]] = {}
    for source in sources:
        latest, end = _offsets(source.get("latestOffset")), _offsets(source.get("endOffset"))
        for topic, partitions in latest.items():
            for partition, offset in partitions.items():
                done = end.get(topic, {}).get(partition)
                if done is not None:
                    lag.setdefault(topic, {})[partition] = max(0, offset - done)
    return lag


def _offsets(value: Any) -> dict[str, dict[str, int]]:
    """``{topic: {partition: offset}}`` of a progress offset (JSON text or parsed), else empty."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return {}
    if not isinstance(value, dict):
        return {}
    return {str(topic): {str(p): int(o) for p, o in parts.items() if isinstance(o, int) and not isinstance(o, bool)}
            for topic, parts in value.items() if isinstance(parts, dict)}


def millis_since(since: float) -> int:
    """Milliseconds since ``since`` (a ``time.monotonic()`` reading), as progress reports them."""
    return int((time.monotonic() - since) * 1000)


def now_text() -> str:
    """Now in UTC, as Spark's streaming progress writes timestamps."""
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
