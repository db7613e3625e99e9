"""A Spark streaming source for Kafka on the Python Data Source API.

Spark's JVM Kafka connector is not on PyPI, so this source offers the same option
names and output columns (``kafka.bootstrap.servers``, ``subscribe``,
``subscribePattern``, ``startingOffsets``, ``maxOffsetsPerTrigger``,
``failOnDataLoss``, ``kafkaConsumer.pollTimeoutMs``, ``groupIdPrefix``, ``kafka.*`` client
options; key, value, topic, partition, offset, timestamp, timestampType, headers). Offsets
are Spark's JSON form ``{"topic": {"0": 42}}`` and are checkpointed by Spark. One Spark
input partition per Kafka partition range, read on the executors; records travel as Arrow
batches, not row by row.

The client is confluent-kafka when it imports, else kafka-python; ``kafka.client`` chooses
(see ``_clients``: option translation, the executors' consumer cache, the Arrow columns).
The driver fetches topic metadata and offsets once per trigger: ``latestOffset`` takes a
snapshot that ``reportLatestOffset`` and ``partitions`` of the same trigger reuse.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import re
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow
from pyspark.sql.types import StructType

from streaming_merge.kafka._clients import (
    ARROW_SCHEMA,
    CLIENT_KINDS,
    STATS_DIR_ENV,
    ClientSpec,
    KafkaSourceError,
    MetadataClient,
    ReadRequest,
    clear_consumer_cache,
    client_importable,
    consumer_cache_stats,
    read_partition,
    resolve_client_kind,
    translate_options,
)
from streaming_merge.kafka._clients.common import _METADATA_TIMEOUT_S
from streaming_merge.spark.python_sources import register_data_source
from streaming_merge.spark.startup_marks import mark

__all__ = [
    "CLIENT_KINDS",
    "SCHEMA",
    "SHORT_NAME",
    "STATS_DIR_ENV",
    "KafkaDataSource",
    "KafkaOptions",
    "KafkaRange",
    "KafkaSourceError",
    "KafkaStreamReader",
    "clear_consumer_cache",
    "consumer_cache_stats",
    "read_range",
    "read_ranges",
    "register",
]

log = logging.getLogger(__name__)

SHORT_NAME = "kafka_py"
SCHEMA = (
    "key binary, value binary, topic string, partition int, offset long, timestamp timestamp, "
    "timestampType int, headers array<struct<key: string, value: binary>>"
)
_ARROW_SCHEMA = ARROW_SCHEMA
# How long one trigger's metadata snapshot serves reportLatestOffset and partitions: the calls
# of one trigger are milliseconds apart; an older snapshot (a restart re-planning a batch from
# the offset log) is refreshed.
_SNAPSHOT_TTL_S = 10.0
Offsets = dict[str, dict[str, int]]


@dataclass(frozen=True)
class KafkaOptions:
    bootstrap_servers: str
    topics: tuple[str, ...]
    pattern: str | None
    starting_offsets: str
    max_offsets_per_trigger: int | None
    fail_on_data_loss: bool
    poll_timeout_ms: int
    client: ClientSpec

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
        poll_timeout = lowered.get("kafkaconsumer.polltimeoutms", "120000").strip()
        if not poll_timeout.isdigit() or int(poll_timeout) <= 0:
            raise KafkaSourceError(f"kafkaConsumer.pollTimeoutMs must be a positive integer, got {poll_timeout!r}.")
        starting = _parse_starting_offsets(lowered.get("startingoffsets", "latest"))
        kind = resolve_client_kind(lowered.get("kafka.client"))
        client_options = {k[len("kafka."):]: v for k, v in lowered.items()
                          if k.startswith("kafka.") and k not in ("kafka.bootstrap.servers", "kafka.client")}
        api_timeout = client_options.pop("default.api.timeout.ms", str(int(_METADATA_TIMEOUT_S * 1000))).strip()
        if not api_timeout.isdigit() or int(api_timeout) <= 0:
            raise KafkaSourceError(f"kafka.default.api.timeout.ms must be a positive integer, got {api_timeout!r}.")
        client = ClientSpec(kind=kind, bootstrap_servers=servers, settings=translate_options(kind, client_options),
                            group_id_prefix=lowered.get("groupidprefix", "spark-kafka-source"),
                            metadata_timeout_s=int(api_timeout) / 1000)
        return cls(
            bootstrap_servers=servers,
            topics=tuple(t.strip() for t in (subscribe or "").split(",") if t.strip()),
            pattern=pattern,
            starting_offsets=starting,
            max_offsets_per_trigger=int(limit) if limit else None,
            fail_on_data_loss=fail_on_data_loss == "true",
            poll_timeout_ms=int(poll_timeout),
            client=client,
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


@dataclass(frozen=True)
class KafkaRange(InputPartition):
    """Offsets [start, end) of one topic partition: one Spark task."""

    topic: str
    partition: int
    start: int
    end: int


@dataclass(frozen=True)
class _Snapshot:
    """Topic metadata and watermarks of the subscribed partitions at one moment."""

    earliest: Offsets
    latest: Offsets
    taken: float = field(default_factory=time.monotonic)
    # Taken at query start (initialOffset, prepareForTriggerAvailableNow) and not yet used by
    # a latestOffset: the first trigger's latestOffset, milliseconds later, uses it.
    for_first_trigger: bool = False


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Driver side: offsets and planning. ``read`` runs on the executors."""

    def __init__(self, options: KafkaOptions) -> None:
        self._options = options
        self._client: MetadataClient | None = None
        self._snapshot: _Snapshot | None = None
        self._available_now_target: Offsets | None = None

    def __getstate__(self) -> dict[str, Any]:
        # Executors get the options only: a driver client (sockets, threads) does not pickle.
        return {**self.__dict__, "_client": None, "_snapshot": None}

    # -------------------------------------------------------------- driver: offsets

    def _kafka(self) -> MetadataClient:
        if self._client is None:
            self._client = MetadataClient(self._options.client)
        return self._client

    def _subscribed(self, available: Mapping[str, list[int]]) -> list[tuple[str, int]]:
        if self._options.pattern:
            regex = re.compile(self._options.pattern)
            topics = sorted(t for t in available if regex.fullmatch(t))
        else:
            missing = [t for t in self._options.topics if t not in available]
            if missing:
                raise KafkaSourceError(
                    f"Subscribed topic(s) {missing} do not exist on {self._options.bootstrap_servers}.")
            topics = list(self._options.topics)
        return [(t, p) for t in topics for p in available[t]]

    def _fresh(self, for_first_trigger: bool = False) -> _Snapshot:
        """One metadata request (picks up new partitions and topics) and the watermarks of
        the subscribed partitions; kept for the rest of the trigger."""
        client = self._kafka()
        partitions = self._subscribed(client.topics())
        marks = client.watermarks(partitions)
        self._snapshot = _Snapshot(earliest=_nest({tp: low for tp, (low, _) in marks.items()}),
                                   latest=_nest({tp: high for tp, (_, high) in marks.items()}),
                                   for_first_trigger=for_first_trigger)
        return self._snapshot

    def _current(self) -> _Snapshot:
        """This trigger's snapshot, or a fresh one when there is none (or it is old)."""
        snapshot = self._snapshot
        if snapshot is None or time.monotonic() - snapshot.taken > _SNAPSHOT_TTL_S:
            return self._fresh()
        return snapshot

    def initialOffset(self) -> dict:
        mark("source_initial_offset", once=True)
        snapshot = self._fresh(for_first_trigger=True)
        how = self._options.starting_offsets.strip()
        if how == "earliest":
            return snapshot.earliest
        if how == "latest":
            return snapshot.latest
        try:
            given = json.loads(how)
        except json.JSONDecodeError as exc:
            raise KafkaSourceError(
                f"startingOffsets must be 'earliest', 'latest' or JSON like {{\"topic\":{{\"0\":23}}}}, got {how!r}"
            ) from exc
        result: Offsets = {}
        for topic, parts in snapshot.latest.items():
            for part, end in parts.items():
                wanted = given.get(topic, {}).get(part, -2)
                result.setdefault(topic, {})[part] = {-2: snapshot.earliest[topic][part], -1: end}.get(wanted, wanted)
        return result

    def prepareForTriggerAvailableNow(self) -> None:
        mark("source_prepare_available_now", once=True)
        self._available_now_target = self._fresh(for_first_trigger=True).latest

    def getDefaultReadLimit(self) -> ReadLimit:
        limit = self._options.max_offsets_per_trigger
        return ReadMaxRows(limit) if limit else ReadAllAvailable()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        mark("source_latest_offset", once=True)
        # The first call of every trigger: fresh metadata, unless the query just started.
        snapshot = self._snapshot
        if snapshot is None or not snapshot.for_first_trigger or time.monotonic() - snapshot.taken > _SNAPSHOT_TTL_S:
            snapshot = self._fresh()
        else:
            self._snapshot = dataclasses.replace(snapshot, for_first_trigger=False)
        latest = self._available_now_target or snapshot.latest
        earliest = snapshot.earliest
        # New partitions (not in start) are read from their beginning, as Spark's source does.
        begin: Offsets = {t: {p: start.get(t, {}).get(p, earliest.get(t, {}).get(p, 0)) for p in parts}
                          for t, parts in latest.items()}
        if isinstance(limit, ReadMaxRows):
            return _rate_limit(begin, latest, limit.max_rows)
        return {t: dict(parts) for t, parts in latest.items()}

    def reportLatestOffset(self) -> dict | None:
        return self._current().latest

    def partitions(self, start: dict, end: dict) -> list[KafkaRange]:
        mark("source_partitions", once=True)
        earliest = self._current().earliest
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
        self._snapshot = None

    # -------------------------------------------------------------- executors: records

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, KafkaRange)
        mark("source_read_start", once=True)
        yield from read_range(self._options, partition)
        mark("source_read_done", once=True)


def read_range(options: KafkaOptions, task: KafkaRange) -> Iterator[pa.RecordBatch]:
    """Records [start, end) of one partition as Arrow batches, through this worker's cached
    consumer of that partition; offsets that vanished are data loss (failOnDataLoss)."""
    request = ReadRequest(task.topic, task.partition, task.start, task.end, options.fail_on_data_loss,
                          options.poll_timeout_ms / 1000)
    yield from read_partition(options.client, request)


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
        mark("source_schema", once=True)
        return SCHEMA

    def streamReader(self, schema: StructType) -> KafkaStreamReader:
        mark("source_stream_reader", once=True)
        return KafkaStreamReader(KafkaOptions.parse(self.options))


def register(spark: Any) -> str:
    """Register the source with ``spark``; returns its short name for ``format(...)``."""
    register_data_source(spark, KafkaDataSource)
    return SHORT_NAME


def read_ranges(spark: Any, options: KafkaOptions, ranges: list[KafkaRange]) -> Any:
    """The records of these offset ranges (this source's columns), read by executor Python
    workers, one task a range, as a plain batch DataFrame: unlike a micro-batch's own records
    read a second time, it is not the stream's input, so Spark's ``numInputRows`` of the batch
    does not count it. For a job that must come back to a few records it has already read
    (a batch's malformed records, for the dead-letter table)."""
    rows = [(r.topic, r.partition, r.start, r.end) for r in ranges]
    tasks = spark.createDataFrame(rows, "topic string, partition int, start long, end long").repartition(
        max(1, len(rows)))
    return tasks.mapInArrow(functools.partial(_read_tasks, options), SCHEMA)


def _read_tasks(options: KafkaOptions, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """In an executor Python worker: the records of each range in ``batches``."""
    for batch in batches:
        for task in batch.to_pylist():
            yield from read_range(options, KafkaRange(task["topic"], task["partition"], task["start"], task["end"]))


_warmed_up: set[int] = set()  # SparkContexts whose executor Python worker has been readied


def warm_up_records(spark: Any, client: str | None = None) -> Any | None:
    """No Kafka records (a DataFrame of this source's columns), produced by an executor Python
    worker that imports this module and the Kafka client; None after the first call per SparkContext.

    For a job to run the first batch's plan on (in the background, while its query starts):
    the read task of the query's first batch would otherwise wait for that worker (Spark forks
    it on first use, then it imports pyspark's worker, this module, pyarrow and the client:
    0.3-1.2 s here), and the plan's first run loads its classes and compiles its code. Spark
    reuses its Python workers, so the first read gets this one. Produced by an Arrow map, as the
    source's reads are: Spark keeps SQL's Python workers apart from RDDs' (their environments
    differ), so an RDD's worker would not serve the read. On a cluster it readies a worker on
    whichever executor runs the task."""
    context = spark.sparkContext
    if id(context) in _warmed_up:
        return None
    _warmed_up.add(id(context))
    return spark.range(1, numPartitions=1).mapInArrow(functools.partial(_no_records, client), SCHEMA)


def _no_records(kind: str | None, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """In an executor Python worker: import the Kafka client the reads will use; no records."""
    client_importable(resolve_client_kind(kind))
    mark("source_reader_worker_ready", once=True)
    for _ in batches:
        pass
    yield pa.RecordBatch.from_pylist([], schema=_ARROW_SCHEMA)
