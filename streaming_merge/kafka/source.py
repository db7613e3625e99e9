"""A Spark streaming source for Kafka on the Python Data Source API and kafka-python.

Spark's JVM Kafka connector is not on PyPI, so this source offers the same option
names and output columns (``kafka.bootstrap.servers``, ``subscribe``,
``subscribePattern``, ``startingOffsets``, ``maxOffsetsPerTrigger``,
``failOnDataLoss``; key, value, topic, partition, offset, timestamp, timestampType,
headers). Offsets are Spark's JSON form ``{"topic": {"0": 42}}`` and are checkpointed by
Spark. One Spark input partition per Kafka partition range, read on the executors;
records travel as Arrow batches, not row by row.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import re
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow
from pyspark.sql.types import StructType

from streaming_merge.errors import StreamingMergeError

log = logging.getLogger(__name__)

SHORT_NAME = "kafka_py"
SCHEMA = (
    "key binary, value binary, topic string, partition int, offset long, timestamp timestamp, "
    "timestampType int, headers array<struct<key: string, value: binary>>"
)
_ARROW_SCHEMA = pa.schema([
    ("key", pa.binary()), ("value", pa.binary()), ("topic", pa.string()), ("partition", pa.int32()),
    ("offset", pa.int64()), ("timestamp", pa.timestamp("us", tz="UTC")), ("timestampType", pa.int32()),
    ("headers", pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))),
])
_BATCH_ROWS = 5000
Offsets = dict[str, dict[str, int]]


class KafkaSourceError(StreamingMergeError):
    """Raised when the Kafka source cannot continue: bad options, an unreachable broker,
    or (with failOnDataLoss) offsets that are no longer available."""


@dataclass(frozen=True)
class KafkaOptions:
    bootstrap_servers: str
    topics: tuple[str, ...]
    pattern: str | None
    starting_offsets: str
    max_offsets_per_trigger: int | None
    fail_on_data_loss: bool
    poll_timeout_ms: int
    client_options: Mapping[str, str]

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> KafkaOptions:
        lowered = {k.lower(): v for k, v in options.items()}
        servers = lowered.get("kafka.bootstrap.servers")
        if not servers:
            raise KafkaSourceError("Option 'kafka.bootstrap.servers' is required (host:port[,host:port]).")
        subscribe, pattern = lowered.get("subscribe"), lowered.get("subscribepattern")
        if bool(subscribe) == bool(pattern):
            raise KafkaSourceError("Set exactly one of the options 'subscribe' (comma list) or 'subscribePattern'.")
        limit = lowered.get("maxoffsetspertrigger")
        if limit is not None and (not limit.isdigit() or int(limit) <= 0):
            raise KafkaSourceError(f"maxOffsetsPerTrigger must be a positive integer, got {limit!r}.")
        fail_on_data_loss = lowered.get("failondataloss", "true").strip().lower()
        if fail_on_data_loss not in ("true", "false"):
            raise KafkaSourceError(
                f"failOnDataLoss must be 'true' or 'false', got {lowered['failondataloss']!r}.")
        starting = _parse_starting_offsets(lowered.get("startingoffsets", "latest"))
        client = {k[len("kafka."):]: v for k, v in options.items()
                  if k.lower().startswith("kafka.") and k.lower() != "kafka.bootstrap.servers"}
        return cls(
            bootstrap_servers=servers,
            topics=tuple(t.strip() for t in (subscribe or "").split(",") if t.strip()),
            pattern=pattern,
            starting_offsets=starting,
            max_offsets_per_trigger=int(limit) if limit else None,
            fail_on_data_loss=fail_on_data_loss == "true",
            poll_timeout_ms=int(lowered.get("kafkaconsumer.polltimeoutms", "120000")),
            client_options=client,
        )


def _parse_starting_offsets(value: str) -> str:
    """'earliest', 'latest' (any case, as Spark accepts) or Spark's JSON form, checked up
    front so a typo fails the query at start with a message, not deep in offset planning."""
    how = value.strip()
    if how.lower() in ("earliest", "latest"):
        return how.lower()
    usage = (f"startingOffsets must be 'earliest', 'latest' or JSON like {{\"topic\":{{\"0\":23}}}}, got {how!r} "
             "(offsets are integers; -2 = earliest, -1 = latest)")
    try:
        given = json.loads(how)
    except json.JSONDecodeError as exc:
        raise KafkaSourceError(usage) from exc
    if not isinstance(given, dict) or not all(
            isinstance(parts, dict) and all(p.isdigit() and type(o) is int and o >= -2 for p, o in parts.items())
            for parts in given.values()):
        raise KafkaSourceError(usage)
    return how


def _consumer(options: KafkaOptions) -> Any:
    from kafka import KafkaConsumer
    from kafka.errors import KafkaError

    try:
        return KafkaConsumer(bootstrap_servers=options.bootstrap_servers.split(","), enable_auto_commit=False,
                             group_id=None, request_timeout_ms=30000)
    except KafkaError as exc:
        raise KafkaSourceError(f"Cannot reach Kafka at {options.bootstrap_servers}: {exc}") from exc


@dataclass(frozen=True)
class KafkaRange(InputPartition):
    """Offsets [start, end) of one topic partition: one Spark task."""

    topic: str
    partition: int
    start: int
    end: int


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Driver side: offsets and planning. ``read`` runs on the executors."""

    def __init__(self, options: KafkaOptions) -> None:
        self._options = options
        self._client: Any = None
        self._available_now_target: Offsets | None = None

    # -------------------------------------------------------------- driver: offsets

    def _kafka(self) -> Any:
        if self._client is None:
            self._client = _consumer(self._options)
        return self._client

    def _partitions(self) -> list[Any]:
        from kafka import TopicPartition

        client = self._kafka()
        available = client.topics()  # always a fresh metadata request: picks up new partitions
        if self._options.pattern:
            regex = re.compile(self._options.pattern)
            topics = sorted(t for t in available if regex.fullmatch(t))
        else:
            missing = [t for t in self._options.topics if t not in available]
            if missing:
                raise KafkaSourceError(
                    f"Subscribed topic(s) {missing} do not exist on {self._options.bootstrap_servers}.")
            topics = list(self._options.topics)
        return [TopicPartition(t, p) for t in topics for p in sorted(client.partitions_for_topic(t) or ())]

    def _ends(self, partitions: list[Any]) -> Offsets:
        ends = self._kafka().end_offsets(partitions) if partitions else {}
        return _nest({(tp.topic, tp.partition): off for tp, off in ends.items()})

    def _beginnings(self, partitions: list[Any]) -> Offsets:
        starts = self._kafka().beginning_offsets(partitions) if partitions else {}
        return _nest({(tp.topic, tp.partition): off for tp, off in starts.items()})

    def initialOffset(self) -> dict:
        partitions = self._partitions()
        how = self._options.starting_offsets.strip()
        if how == "earliest":
            return self._beginnings(partitions)
        if how == "latest":
            return self._ends(partitions)
        try:
            given = json.loads(how)
        except json.JSONDecodeError as exc:
            raise KafkaSourceError(
                f"startingOffsets must be 'earliest', 'latest' or JSON like {{\"topic\":{{\"0\":23}}}}, got {how!r}"
            ) from exc
        earliest, latest = self._beginnings(partitions), self._ends(partitions)
        result: Offsets = {}
        for topic, parts in latest.items():
            for part, end in parts.items():
                wanted = given.get(topic, {}).get(part, -2)
                result.setdefault(topic, {})[part] = {-2: earliest[topic][part], -1: end}.get(wanted, wanted)
        return result

    def prepareForTriggerAvailableNow(self) -> None:
        self._available_now_target = self._ends(self._partitions())

    def getDefaultReadLimit(self) -> ReadLimit:
        limit = self._options.max_offsets_per_trigger
        return ReadMaxRows(limit) if limit else ReadAllAvailable()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        partitions = self._partitions()
        latest = self._available_now_target or self._ends(partitions)
        earliest = self._beginnings(partitions)
        # New partitions (not in start) are read from their beginning, as Spark's source does.
        begin: Offsets = {t: {p: start.get(t, {}).get(p, earliest.get(t, {}).get(p, 0)) for p in parts}
                          for t, parts in latest.items()}
        if isinstance(limit, ReadMaxRows):
            return _rate_limit(begin, latest, limit.max_rows)
        return {t: dict(parts) for t, parts in latest.items()}

    def reportLatestOffset(self) -> dict | None:
        return self._ends(self._partitions())

    def partitions(self, start: dict, end: dict) -> list[KafkaRange]:
        earliest = self._beginnings(self._partitions())
        ranges = []
        for topic, parts in end.items():
            for part, until in parts.items():
                since = start.get(topic, {}).get(part, earliest.get(topic, {}).get(part, 0))
                first_available = earliest.get(topic, {}).get(part)
                if first_available is not None and since < first_available:
                    message = (f"Offsets {since}..{first_available - 1} of {topic}-{part} are no longer available "
                               "(retention or compaction removed them)")
                    if self._options.fail_on_data_loss:
                        raise KafkaSourceError(message + "; set failOnDataLoss=false to skip them.")
                    log.warning("%s; skipping them because failOnDataLoss=false", message)
                    since = first_available
                if until > since:
                    ranges.append(KafkaRange(topic, int(part), since, until))
        return ranges

    def commit(self, end: dict) -> None:
        pass  # Spark checkpoints the offsets; nothing to commit to Kafka

    def stop(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    # -------------------------------------------------------------- executors: records

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, KafkaRange)
        yield from read_range(self._options, partition)


def read_range(options: KafkaOptions, task: KafkaRange) -> Iterator[pa.RecordBatch]:
    """Records [start, end) of one partition as Arrow batches; gaps are data loss."""
    from kafka import TopicPartition

    consumer = _consumer(options)
    try:
        tp = TopicPartition(task.topic, task.partition)
        consumer.assign([tp])
        consumer.seek(tp, task.start)
        expected = task.start
        rows: list[tuple[Any, ...]] = []
        deadline = time.monotonic() + options.poll_timeout_ms / 1000
        while expected < task.end:
            batch = consumer.poll(timeout_ms=1000, max_records=_BATCH_ROWS).get(tp, [])
            if not batch:
                if time.monotonic() > deadline:
                    raise KafkaSourceError(
                        f"Timed out after {options.poll_timeout_ms} ms reading {task.topic}-{task.partition} at "
                        f"offset {expected} (wanted up to {task.end}).")
                continue
            deadline = time.monotonic() + options.poll_timeout_ms / 1000
            for record in batch:
                if record.offset >= task.end:
                    break
                if record.offset > expected and options.fail_on_data_loss:
                    raise KafkaSourceError(
                        f"Offsets {expected}..{record.offset - 1} of {task.topic}-{task.partition} were lost "
                        "(retention/compaction); set failOnDataLoss=false to skip them.")
                rows.append(_row(record))
                expected = record.offset + 1
            if len(rows) >= _BATCH_ROWS:
                yield _to_batch(rows)
                rows = []
            if batch and batch[-1].offset + 1 >= task.end:
                break
        if rows:
            yield _to_batch(rows)
    finally:
        consumer.close()


def _row(record: Any) -> tuple[Any, ...]:
    stamp = dt.datetime.fromtimestamp(record.timestamp / 1000, dt.UTC) if record.timestamp is not None else None
    headers = [{"key": k, "value": v} for k, v in (record.headers or [])]
    return (record.key, record.value, record.topic, record.partition, record.offset, stamp,
            int(record.timestamp_type or 0), headers)


def _to_batch(rows: list[tuple[Any, ...]]) -> pa.RecordBatch:
    columns = list(zip(*rows, strict=True))
    return pa.RecordBatch.from_arrays([pa.array(c, type=f.type) for c, f in zip(columns, _ARROW_SCHEMA, strict=True)],
                                      schema=_ARROW_SCHEMA)


def _nest(flat: Mapping[tuple[str, int], int]) -> Offsets:
    nested: Offsets = {}
    for (topic, part), offset in sorted(flat.items()):
        nested.setdefault(topic, {})[str(part)] = int(offset)
    return nested


def _rate_limit(start: Offsets, latest: Offsets, max_rows: int) -> Offsets:
    """Split ``max_rows`` over partitions in proportion to their backlog (Spark's rule)."""
    backlog = {(t, p): max(0, end - start[t][p]) for t, parts in latest.items() for p, end in parts.items()}
    total = sum(backlog.values())
    result: Offsets = {t: dict(parts) for t, parts in start.items()}
    if total <= max_rows:
        return {t: dict(parts) for t, parts in latest.items()}
    remaining = max_rows
    for (t, p), size in sorted(backlog.items()):
        share = min(size, remaining, max(1, int(max_rows * size / total))) if size else 0
        result[t][p] = start[t][p] + share
        remaining -= share
    return result


class KafkaDataSource(DataSource):
    """``spark.readStream.format("kafka_py")`` after ``register(spark)``."""

    @classmethod
    def name(cls) -> str:
        return SHORT_NAME

    def schema(self) -> str:
        return SCHEMA

    def streamReader(self, schema: StructType) -> KafkaStreamReader:
        return KafkaStreamReader(KafkaOptions.parse(self.options))


def register(spark: Any) -> str:
    """Register the source with ``spark``; returns its short name for ``format(...)``."""
    spark.dataSource.register(KafkaDataSource)
    return SHORT_NAME
