"""The jobs' log: one line per micro-batch, as text or JSON (``--log-format json``).

A batch's line is written once Spark has finished the batch: its progress (durations, the
source's offsets, and from them the consumer lag per topic-partition) joined with what the
batch function recorded while it ran (the MERGE's metrics, the Kafka record counts). The
sink's own INFO line says less and is left out of the job's log, so a batch has one line.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery, StreamingQueryListener

from streaming_merge.streaming.progress import consumer_lag

LOG_FORMATS = ("text", "json")
BATCH_LOGGER = "streaming_merge.batches"
_QUIET_LOGGERS = {"py4j": logging.WARNING, "kafka": logging.WARNING,
                  "streaming_merge.streaming.sink": logging.WARNING}  # the sink's line: the batch line says more
log = logging.getLogger(BATCH_LOGGER)


class JsonFormatter(logging.Formatter):
    """One JSON object a line: time, level, logger, message, and a batch line's ``batch`` record."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {"time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}Z",
                                 "level": record.levelname, "logger": record.name, "message": record.getMessage()}
        for field in ("batch", "session"):
            if hasattr(record, field):
                entry[field] = getattr(record, field)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def configure_logging(log_format: str) -> None:
    """The root logger writes to stderr, as text or JSON lines, at INFO."""
    handler = logging.StreamHandler()
    if log_format == "json":
        formatter: logging.Formatter = JsonFormatter()
        formatter.converter = time.gmtime
    else:
        formatter = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)
    for name, level in _QUIET_LOGGERS.items():
        logging.getLogger(name).setLevel(level)


def log_session(spark: SparkSession, platform: bool) -> None:
    """One line with the session the job runs in, for whoever deploys it."""
    context = spark.sparkContext
    facts = {"master": context.master, "appId": context.applicationId, "sparkVersion": spark.version,
             "given": "platform" if platform else "created by the job",
             "shufflePartitions": spark.conf.get("spark.sql.shuffle.partitions"), "ui": context.uiWebUrl}
    logging.getLogger("jobs").info("Spark session: %s", " ".join(f"{k}={v}" for k, v in facts.items()),
                                   extra={"session": facts})


class BatchLog(StreamingQueryListener):
    """Logs one line per batch of the query named ``query_name`` once Spark reports its
    progress; :meth:`record` keeps what the batch function saw, by batch id, until then."""

    def __init__(self, query_name: str, describe: Callable[[dict[str, Any]], str]) -> None:
        self._query_name = query_name
        self._describe = describe
        self._recorded: dict[int, dict[str, Any]] = {}
        self._last_logged = -1
        self._changed = threading.Condition()

    def record(self, batch: dict[str, Any]) -> None:
        """The batch function's record of its batch (``batchId`` among its keys)."""
        with self._changed:
            self._recorded[int(batch["batchId"])] = batch

    def onQueryStarted(self, event: Any) -> None:
        pass

    def onQueryProgress(self, event: Any) -> None:
        progress = event.progress
        if progress.name != self._query_name:
            return
        try:
            spark_record = json.loads(progress.json)
            with self._changed:
                batch = self._recorded.pop(int(progress.batchId), None)
            if batch is not None:  # else a report of an idle trigger: no batch ran
                line = {**batch, "consumerLag": consumer_lag(spark_record.get("sources", [])),
                        "triggerMs": spark_record.get("durationMs", {}).get("triggerExecution")}
                log.info("%s", self._describe(line), extra={"batch": line})
        except Exception:  # a failing line must not stop Spark's listener bus
            logging.getLogger(__name__).exception("could not log batch %s", progress.batchId)
        finally:
            with self._changed:
                self._last_logged = max(self._last_logged, int(progress.batchId))
                self._changed.notify_all()

    def onQueryIdle(self, event: Any) -> None:
        pass

    def onQueryTerminated(self, event: Any) -> None:
        pass

    def drain(self, query: StreamingQuery, timeout_s: float = 10.0) -> None:
        """Wait until the line of the query's last batch is written (Spark's listener bus
        delivers progress after the batch), at most ``timeout_s``."""
        last = query.lastProgress
        if last is None:
            return
        with self._changed:
            self._changed.wait_for(lambda: self._last_logged >= int(last["batchId"]), timeout_s)


def total_lag(lag: dict[str, dict[str, int]]) -> int:
    return sum(sum(parts.values()) for parts in lag.values())
