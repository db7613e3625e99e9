"""The Kafka clients behind the ``kafka_py`` source: confluent-kafka and kafka-python behind
one small interface, the translation of ``kafka.*`` options, the executors' consumer cache
and the Arrow batches built from records.

Why two clients: confluent-kafka (librdkafka, C) reads several times faster than
kafka-python (pure Python; ~45k records/s per partition here, ~3x more with the ``crc32c``
package), but it is a binary wheel that not every executor image has. confluent-kafka is
the default when it imports; ``kafka.client=kafka-python`` (or its absence) selects the
fallback. Both produce identical rows (DESIGN.md §5).

Why a consumer cache: a consumer costs a connection, a metadata round trip and (librdkafka)
a few threads; a read task is one Kafka partition range per micro-batch. A consumer is kept
per (client, servers, options, topic-partition) for as long as the Python worker lives
(Spark reuses workers), so the next micro-batch of that partition continues where the last
one stopped, usually from records librdkafka already prefetched. A consumer whose read
failed is closed, never reused.

Why columns: records are appended to per-column Python lists and each list becomes one
Arrow array per batch; timestamps stay integers (milliseconds, scaled to microseconds by
Arrow), no ``datetime`` object is ever created.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import re
import tempfile
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from operator import attrgetter, itemgetter, methodcaller
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from streaming_merge.errors import StreamingMergeError

log = logging.getLogger("streaming_merge.kafka.source")

CONFLUENT = "confluent"
KAFKA_PYTHON = "kafka-python"
CLIENT_KINDS = (CONFLUENT, KAFKA_PYTHON)

ARROW_SCHEMA = pa.schema([
    ("key", pa.binary()), ("value", pa.binary()), ("topic", pa.string()), ("partition", pa.int32()),
    ("offset", pa.int64()), ("timestamp", pa.timestamp("us", tz="UTC")), ("timestampType", pa.int32()),
    ("headers", pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))),
])
_HEADERS_TYPE = ARROW_SCHEMA.field("headers").type
_HEADER_FIELDS = list(_HEADERS_TYPE.value_type)

# Reading: records asked of the client per call, rows per Arrow batch handed to Spark, and how
# long one client call may block before the loop re-checks its deadline.
_FETCH_RECORDS = 10_000
_BATCH_ROWS = 20_000
_WAIT_SLICE_S = 0.5
_METADATA_TIMEOUT_S = 30.0
# How long the broker may hold a cached consumer's fetch when there is nothing new (librdkafka's
# fetch.wait.max.ms, default 500 ms). An idle cached consumer at the end of its partition always
# has such a fetch outstanding, and a read that must seek first (Spark gives a partition's
# next range to whichever Python worker is free, so about half the reads of a 2-worker
# executor find their consumer elsewhere) waits for it to come back: 100-360 ms per read at
# 500 ms, 10-25 ms at 50 ms. The price is one empty fetch per idle cached consumer every
# 50 ms. kafka-python fetches only while polled, so it keeps its default.
# ``kafka.fetch.max.wait.ms`` overrides it.
EXECUTOR_FETCH_WAIT_MS = 50

# The consumer cache, as Spark's own (spark.kafka.consumer.cache.capacity / .timeout).
CACHE_CAPACITY = 64
CACHE_IDLE_TIMEOUT_S = 300.0
STATS_DIR_ENV = "STREAMING_MERGE_KAFKA_CONSUMER_STATS_DIR"


class KafkaSourceError(StreamingMergeError):
    """Raised when the Kafka source cannot continue: bad options, an unreachable broker,
    or (with failOnDataLoss) offsets that are no longer available."""


# ----------------------------------------------------------------------------- client choice


def client_importable(kind: str) -> bool:
    """Whether the module of ``kind`` imports in this interpreter."""
    try:
        if kind == CONFLUENT:
            import confluent_kafka  # noqa: F401
        else:
            import kafka  # noqa: F401
    except ImportError:
        return False
    return True


def resolve_client_kind(value: str | None) -> str:
    """``kafka.client``: ``confluent`` or ``kafka-python``; unset means confluent-kafka when
    it imports (it is several times faster), else kafka-python."""
    if value is None or not value.strip():
        return CONFLUENT if client_importable(CONFLUENT) else KAFKA_PYTHON
    kind = value.strip().lower()
    if kind not in CLIENT_KINDS:
        raise KafkaSourceError(
            f"Option 'kafka.client' must be one of {', '.join(repr(k) for k in CLIENT_KINDS)}, got {value!r}.")
    return kind


def _import_client(kind: str) -> Any:
    try:
        if kind == CONFLUENT:
            import confluent_kafka

            return confluent_kafka
        import kafka

        return kafka
    except ImportError as exc:
        package = "confluent-kafka" if kind == CONFLUENT else "kafka-python"
        raise KafkaSourceError(
            f"kafka.client={kind!r} but {package} is not installed in this Python ({exc}); install the "
            "'kafka' extra (pip install 'streaming_merge[kafka]') or choose the other client with "
            "the option 'kafka.client'.") from exc


# ----------------------------------------------------------------------------- kafka.* options

# Spark's Kafka source refuses these, with these reasons (KafkaSourceProvider); so do we.
SPARK_MANAGED_OPTIONS: Mapping[str, str] = {
    "group.id": "user-specified consumer groups are not used to track offsets",
    "auto.offset.reset": "set the source option 'startingOffsets' to 'earliest' or 'latest' to specify where to "
                         "start. Structured Streaming manages which offsets are consumed internally, rather than "
                         "relying on the Kafka consumer to do it; 'startingOffsets' only applies when a new "
                         "streaming query is started, resuming always picks up from where the query left off",
    "key.deserializer": "keys are always read as bytes; use DataFrame operations to deserialize them",
    "value.deserializer": "values are always read as bytes; use DataFrame operations to deserialize them",
    "enable.auto.commit": "Spark checkpoints the offsets; committing them to Kafka would need a consumer group",
    "interceptor.classes": "interceptors can modify the payload, so they are not safe",
    "enable.partition.eof": "the source relies on end-of-partition events to finish a range",
}

# Java-only names that librdkafka spells differently.
_CONFLUENT_RENAMES = {
    "fetch.max.wait.ms": "fetch.wait.max.ms",
    "receive.buffer.bytes": "socket.receive.buffer.bytes",
    "send.buffer.bytes": "socket.send.buffer.bytes",
}


def _enum(*allowed: str, upper: bool = True) -> Callable[[str, str], str]:
    def convert(name: str, value: str) -> str:
        normal = value.strip().upper() if upper else value.strip().lower()
        if normal not in allowed:
            raise KafkaSourceError(
                f"Option 'kafka.{name}' must be one of {', '.join(allowed)} for kafka.client=kafka-python, "
                f"got {value!r}.")
        return normal
    return convert


def _int(name: str, value: str) -> int:
    try:
        return int(value.strip())
    except ValueError as exc:
        raise KafkaSourceError(f"Option 'kafka.{name}' must be an integer, got {value!r}.") from exc


def _bool(name: str, value: str) -> bool:
    normal = value.strip().lower()
    if normal not in ("true", "false"):
        raise KafkaSourceError(f"Option 'kafka.{name}' must be 'true' or 'false', got {value!r}.")
    return normal == "true"


def _text(name: str, value: str) -> str:
    return value


def _check_hostname(name: str, value: str) -> bool:
    normal = value.strip().lower()
    if normal not in ("https", "none", ""):
        raise KafkaSourceError(f"Option 'kafka.{name}' must be 'https' or 'none', got {value!r}.")
    return normal == "https"


# Kafka (Java) and librdkafka names → kafka-python keyword arguments. kafka-python does not
# validate enumerations itself (an unknown security_protocol silently means PLAINTEXT), so
# the converters do.
_KAFKA_PYTHON_OPTIONS: Mapping[str, tuple[str, Callable[[str, str], Any]]] = {
    "client.id": ("client_id", _text),
    "client.rack": ("client_rack", _text),
    "client.dns.lookup": ("client_dns_lookup", _text),
    "security.protocol": ("security_protocol", _enum("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")),
    "sasl.mechanism": ("sasl_mechanism",
                       _enum("PLAIN", "GSSAPI", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")),
    "sasl.mechanisms": ("sasl_mechanism",
                        _enum("PLAIN", "GSSAPI", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")),
    "sasl.username": ("sasl_plain_username", _text),
    "sasl.password": ("sasl_plain_password", _text),
    "sasl.kerberos.service.name": ("sasl_kerberos_service_name", _text),
    "ssl.ca.location": ("ssl_cafile", _text),
    "ssl.certificate.location": ("ssl_certfile", _text),
    "ssl.key.location": ("ssl_keyfile", _text),
    "ssl.key.password": ("ssl_password", _text),
    "ssl.crl.location": ("ssl_crlfile", _text),
    "ssl.cipher.suites": ("ssl_ciphers", _text),
    "ssl.endpoint.identification.algorithm": ("ssl_check_hostname", _check_hostname),
    "request.timeout.ms": ("request_timeout_ms", _int),
    "retry.backoff.ms": ("retry_backoff_ms", _int),
    "reconnect.backoff.ms": ("reconnect_backoff_ms", _int),
    "reconnect.backoff.max.ms": ("reconnect_backoff_max_ms", _int),
    "connections.max.idle.ms": ("connections_max_idle_ms", _int),
    "metadata.max.age.ms": ("metadata_max_age_ms", _int),
    "fetch.min.bytes": ("fetch_min_bytes", _int),
    "fetch.max.bytes": ("fetch_max_bytes", _int),
    "fetch.max.wait.ms": ("fetch_max_wait_ms", _int),
    "fetch.wait.max.ms": ("fetch_max_wait_ms", _int),
    "max.partition.fetch.bytes": ("max_partition_fetch_bytes", _int),
    "max.poll.records": ("max_poll_records", _int),
    "receive.buffer.bytes": ("receive_buffer_bytes", _int),
    "socket.receive.buffer.bytes": ("receive_buffer_bytes", _int),
    "send.buffer.bytes": ("send_buffer_bytes", _int),
    "socket.send.buffer.bytes": ("send_buffer_bytes", _int),
    "check.crcs": ("check_crcs", _bool),
    "isolation.level": ("isolation_level", _enum("read_uncommitted", "read_committed", upper=False)),
}

_JAAS_MODULES = ("org.apache.kafka.common.security.plain.PlainLoginModule",
                 "org.apache.kafka.common.security.scram.ScramLoginModule")


def _jaas_credentials(value: str) -> tuple[str, str]:
    """username and password of a PLAIN or SCRAM ``sasl.jaas.config`` (the Java way Spark
    users pass credentials); neither Python client reads JAAS, both take the pair."""
    module = value.strip().split(None, 1)[0] if value.strip() else ""
    fields = dict(re.findall(r'(\w+)\s*=\s*"((?:[^"\\]|\\.)*)"', value))
    if module not in _JAAS_MODULES or "username" not in fields or "password" not in fields:
        raise KafkaSourceError(
            "Option 'kafka.sasl.jaas.config' can only be translated for PlainLoginModule or ScramLoginModule "
            "with username=\"...\" and password=\"...\"; for other mechanisms set the client's own options "
            "(kafka.sasl.username, kafka.sasl.password, kafka.sasl.mechanism, ...).")
    return fields["username"], fields["password"]


def translate_options(kind: str, options: Mapping[str, str]) -> tuple[tuple[str, Any], ...]:
    """``kafka.*`` options (prefix removed) as settings of client ``kind``, sorted so that
    equal options give equal cache keys.

    confluent-kafka takes librdkafka names, which are Kafka's for everything common: they
    pass through (after renaming the few Java-only spellings) and librdkafka itself rejects
    unknown names and bad values when the consumer is created. kafka-python takes keyword
    arguments: the common names are mapped and anything else is refused here, never dropped.
    """
    settings: dict[str, Any] = {}
    for raw_name, value in options.items():
        name = raw_name.lower()
        if name in SPARK_MANAGED_OPTIONS:
            raise KafkaSourceError(f"Kafka option '{name}' is not supported: {SPARK_MANAGED_OPTIONS[name]}.")
        if name == "sasl.jaas.config":
            user, password = _jaas_credentials(value)
            pairs = ({"sasl.username": user, "sasl.password": password} if kind == CONFLUENT
                     else {"sasl_plain_username": user, "sasl_plain_password": password})
            settings.update(pairs)
            continue
        if kind == CONFLUENT:
            settings[_CONFLUENT_RENAMES.get(name, name)] = value
            continue
        mapped = _KAFKA_PYTHON_OPTIONS.get(name)
        if mapped is None:
            raise KafkaSourceError(
                f"Kafka option 'kafka.{name}' cannot be passed to kafka-python (kafka.client=kafka-python); "
                f"supported: {', '.join('kafka.' + n for n in sorted(_KAFKA_PYTHON_OPTIONS))}, "
                "kafka.sasl.jaas.config. Use kafka.client=confluent for any librdkafka property.")
        keyword, convert = mapped
        settings[keyword] = convert(name, value)
    return tuple(sorted(settings.items()))


@dataclass(frozen=True)
class ClientSpec:
    """Which client, where, and with which settings: everything a consumer is built from.
    Hashable (a cache key) and picklable (it travels to the executors with the reader)."""

    kind: str
    bootstrap_servers: str
    settings: tuple[tuple[str, Any], ...] = field(default=(), repr=False)  # may hold credentials
    group_id_prefix: str = "spark-kafka-source"

    def describe(self) -> str:
        return f"{self.kind} at {self.bootstrap_servers}"


def _confluent_config(spec: ClientSpec, role: str) -> dict[str, Any]:
    """librdkafka settings: ours first, the user's ``kafka.*`` over them. Offsets are never
    committed; the group id only names the client (assign() joins no group), as Spark's does."""
    config: dict[str, Any] = {
        "bootstrap.servers": spec.bootstrap_servers,
        "group.id": f"{spec.group_id_prefix}-{uuid.uuid4()}-{role}",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        # A range that starts below the log start reads from the earliest record; the offset
        # jump is then reported as data loss (or skipped) by the reader, as Spark does.
        "auto.offset.reset": "earliest",
        # librdkafka pauses a partition's fetching for this long when its local queue is over
        # its thresholds; the default (1 s) stalls a reader that drains the queue quickly.
        "fetch.queue.backoff.ms": 5,
        # What one consumer prefetches (librdkafka's default is 64 MB). A cached consumer keeps
        # its partition assigned, so it prefetches the next range while idle, up to this much:
        # 4 MB reads as fast as 64 MB here and bounds memory and wasted broker reads when the
        # next range of the partition goes to another worker. (Pausing idle consumers instead
        # purges the queue and costs ~0.5 s on resume.)
        "queued.max.messages.kbytes": 4_096,
        "logger": log,
    }
    if role == "executor":
        config["enable.partition.eof"] = True
        config["fetch.wait.max.ms"] = EXECUTOR_FETCH_WAIT_MS
    config.update(dict(spec.settings))
    return config


def _kafka_python_config(spec: ClientSpec) -> dict[str, Any]:
    config: dict[str, Any] = {
        "bootstrap_servers": spec.bootstrap_servers.split(","),
        "group_id": None,
        "enable_auto_commit": False,
        "auto_offset_reset": "earliest",
        "request_timeout_ms": 30_000,
        "max_poll_records": _FETCH_RECORDS,
        "max_partition_fetch_bytes": 8 << 20,
        "fetch_max_bytes": 64 << 20,
    }
    config.update(dict(spec.settings))
    return config


def _new_consumer(spec: ClientSpec, role: str) -> Any:
    """A consumer of ``spec``; any failure to build one (bad option, bad value, unreachable
    bootstrap servers for kafka-python) is a KafkaSourceError naming the client."""
    module = _import_client(spec.kind)
    try:
        if spec.kind == CONFLUENT:
            return module.Consumer(_confluent_config(spec, role))
        return module.KafkaConsumer(**_kafka_python_config(spec))
    except Exception as exc:  # the clients raise KafkaException, KafkaError, ValueError, TypeError...
        raise KafkaSourceError(f"Cannot create a {spec.kind} consumer for {spec.bootstrap_servers}: {exc}") from exc


# ----------------------------------------------------------------------------- driver: metadata


class MetadataClient:
    """Topic metadata and watermark offsets for the driver's planning (one consumer, kept
    by the stream reader for the life of the query)."""

    def __init__(self, spec: ClientSpec, timeout_s: float = _METADATA_TIMEOUT_S) -> None:
        self.spec = spec
        self._timeout_s = timeout_s
        self._consumer = _new_consumer(spec, "driver")

    def topics(self) -> dict[str, list[int]]:
        """Every topic with its partitions, from one fresh metadata request (new partitions
        and topics show up here)."""
        try:
            if self.spec.kind == CONFLUENT:
                metadata = self._consumer.list_topics(timeout=self._timeout_s)
                return {name: sorted(topic.partitions) for name, topic in metadata.topics.items()
                        if not name.startswith("__")}
            names = self._consumer.topics()  # kafka-python: forces a metadata refresh
            return {name: sorted(self._consumer.partitions_for_topic(name) or ()) for name in names}
        except Exception as exc:
            raise KafkaSourceError(f"Cannot fetch topic metadata from {self.spec.describe()}: {exc}") from exc

    def watermarks(self, partitions: Sequence[tuple[str, int]]) -> dict[tuple[str, int], tuple[int, int]]:
        """(earliest, latest) offset of each partition."""
        if not partitions:
            return {}
        try:
            if self.spec.kind == CONFLUENT:
                from confluent_kafka import TopicPartition

                return {(t, p): tuple(self._consumer.get_watermark_offsets(  # type: ignore[misc]
                    TopicPartition(t, p), timeout=self._timeout_s, cached=False)) for t, p in partitions}
            from kafka import TopicPartition as KafkaTopicPartition

            tps = [KafkaTopicPartition(t, p) for t, p in partitions]
            starts = self._consumer.beginning_offsets(tps)
            ends = self._consumer.end_offsets(tps)
            return {(tp.topic, tp.partition): (int(starts[tp]), int(ends[tp])) for tp in tps}
        except Exception as exc:
            raise KafkaSourceError(f"Cannot list offsets on {self.spec.describe()}: {exc}") from exc

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._consumer.close()


# ----------------------------------------------------------------------------- Arrow columns

_KEY, _VALUE, _OFFSET = methodcaller("key"), methodcaller("value"), methodcaller("offset")
_TIMESTAMP, _HEADERS, _ERROR = methodcaller("timestamp"), methodcaller("headers"), methodcaller("error")
_R_KEY, _R_VALUE, _R_OFFSET = attrgetter("key"), attrgetter("value"), attrgetter("offset")
_R_TIMESTAMP, _R_TYPE, _R_HEADERS = attrgetter("timestamp"), attrgetter("timestamp_type"), attrgetter("headers")
_FIRST, _SECOND = itemgetter(0), itemgetter(1)


class _Columns:
    """One Arrow batch in the making: a Python list per column, filled a client batch at a
    time. confluent-kafka timestamp types are 0 (none), 1 (create), 2 (log append); Spark's
    are -1, 0, 1 (kafka-python's 0/1/None), so ``type_shift`` is 1 for confluent-kafka."""

    __slots__ = ("headers", "keys", "offsets", "stamps", "type_shift", "types", "values")

    def __init__(self, type_shift: int) -> None:
        self.type_shift = type_shift
        self.keys: list[bytes | None] = []
        self.values: list[bytes | None] = []
        self.offsets: list[int] = []
        self.stamps: list[int | None] = []
        self.types: list[int | None] = []
        self.headers: list[tuple[int, list[tuple[str, bytes | None]]]] = []  # (row, headers), only rows with some

    def __len__(self) -> int:
        return len(self.offsets)

    def add_messages(self, messages: list[Any], first: int | None = None) -> None:
        """confluent-kafka messages, all records (no error events). ``first`` given: their
        offsets are first, first + 1, ... (the caller checked), so no ``offset()`` calls."""
        base = len(self.offsets)
        self.keys.extend(map(_KEY, messages))
        self.values.extend(map(_VALUE, messages))
        if first is None:
            self.offsets.extend(map(_OFFSET, messages))
        else:
            self.offsets.extend(range(first, first + len(messages)))
        pairs = list(map(_TIMESTAMP, messages))  # (type, milliseconds)
        self.types.extend(map(_FIRST, pairs))
        self.stamps.extend(map(_SECOND, pairs))
        if any(map(_HEADERS, messages)):
            self.headers.extend((base + i, h) for i, h in enumerate(map(_HEADERS, messages)) if h)

    def add_records(self, records: list[Any], first: int | None = None) -> None:
        """kafka-python ConsumerRecords (``first``: as for :meth:`add_messages`)."""
        base = len(self.offsets)
        self.keys.extend(map(_R_KEY, records))
        self.values.extend(map(_R_VALUE, records))
        if first is None:
            self.offsets.extend(map(_R_OFFSET, records))
        else:
            self.offsets.extend(range(first, first + len(records)))
        self.stamps.extend(map(_R_TIMESTAMP, records))
        self.types.extend(map(_R_TYPE, records))
        headers = list(map(_R_HEADERS, records))
        if any(headers):
            self.headers.extend((base + i, list(h)) for i, h in enumerate(headers) if h)

    def to_batch(self, topic: str, partition: int) -> pa.RecordBatch:
        n = len(self.offsets)
        types = pa.array(self.types, pa.int32())
        if self.type_shift:
            types = pc.subtract(types, pa.scalar(self.type_shift, pa.int32()))
        stamps = pa.array(self.stamps, pa.int64())
        if types.null_count or stamps.null_count or (n and pc.min(types).as_py() < 0):
            # No timestamp (message format v0): null, and type -1 as Spark's NO_TIMESTAMP_TYPE.
            missing = pc.or_(pc.fill_null(pc.less(types, 0), True), pc.is_null(stamps))
            stamps = pc.if_else(missing, pa.scalar(None, pa.int64()), stamps)
            types = pc.if_else(missing, pa.scalar(-1, pa.int32()), types)
        micros = pc.multiply(stamps, pa.scalar(1000, pa.int64())).cast(ARROW_SCHEMA.field("timestamp").type)
        return pa.RecordBatch.from_arrays([
            pa.array(self.keys, pa.binary()),
            pa.array(self.values, pa.binary()),
            pa.repeat(pa.scalar(topic, pa.string()), n),
            pa.repeat(pa.scalar(partition, pa.int32()), n),
            pa.array(self.offsets, pa.int64()),
            micros,
            types,
            self._headers_array(n),
        ], schema=ARROW_SCHEMA)

    def _headers_array(self, n: int) -> pa.Array:
        """An empty list per record without headers (as before); a list of (key, value)
        structs for the few that have some."""
        if not self.headers:
            offsets = pa.array(np.zeros(n + 1, dtype=np.int32))
            empty = pa.StructArray.from_arrays([pa.array([], pa.string()), pa.array([], pa.binary())],
                                               fields=_HEADER_FIELDS)
            return pa.ListArray.from_arrays(offsets, empty, type=_HEADERS_TYPE)
        lengths = np.zeros(n, dtype=np.int32)
        names: list[str] = []
        values: list[bytes | None] = []
        for row, headers in self.headers:
            lengths[row] = len(headers)
            for name, value in headers:
                names.append(name)
                values.append(value)
        offsets = np.zeros(n + 1, dtype=np.int32)
        np.cumsum(lengths, out=offsets[1:])
        structs = pa.StructArray.from_arrays([pa.array(names, pa.string()), pa.array(values, pa.binary())],
                                             fields=_HEADER_FIELDS)
        return pa.ListArray.from_arrays(pa.array(offsets), structs, type=_HEADERS_TYPE)


# ----------------------------------------------------------------------------- executors: reading


@dataclass(frozen=True)
class ReadRequest:
    """Offsets [start, end) of one topic partition and how to treat trouble."""

    topic: str
    partition: int
    start: int
    end: int
    fail_on_data_loss: bool
    poll_timeout_s: float


class PartitionReader:
    """A consumer assigned to one topic partition, reading ranges of it. ``next_offset`` is
    where the consumer stands (None: unknown, seek before the next read)."""

    type_shift = 0

    def __init__(self, spec: ClientSpec, topic: str, partition: int) -> None:
        self.spec = spec
        self.topic = topic
        self.partition = partition
        self.next_offset: int | None = None
        self.consumer = _new_consumer(spec, "executor")
        self._assigned = False
        self._overshot = False  # the consumer returned records past the range: it stands past ``end``

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.consumer.close()

    def _name(self) -> str:
        return f"{self.topic}-{self.partition}"

    def read(self, request: ReadRequest) -> Iterator[pa.RecordBatch]:
        """Arrow batches of the records in [start, end): gaps are checked against the
        partition's earliest offset (lost records vs. compaction or transaction markers)."""
        if self.next_offset != request.start:
            self._position(request.start)
        self.next_offset = None  # unknown until this read completes
        expected, end = request.start, request.end
        columns = _Columns(self.type_shift)
        deadline = time.monotonic() + request.poll_timeout_s
        while expected < end:
            wait = max(0.0, min(_WAIT_SLICE_S, deadline - time.monotonic()))
            before = time.perf_counter()
            got, expected, done = self._fetch(columns, expected, end, min(_FETCH_RECORDS, end - expected), wait,
                                              request)
            _TIMES["clientSeconds"] += time.perf_counter() - before
            if done:
                break
            if got:
                deadline = time.monotonic() + request.poll_timeout_s
            elif time.monotonic() >= deadline:
                raise KafkaSourceError(
                    f"Timed out after {request.poll_timeout_s * 1000:.0f} ms reading {self._name()} at offset "
                    f"{expected} (wanted up to {end}) with {self.spec.describe()} "
                    "(option kafkaConsumer.pollTimeoutMs).")
            if len(columns) >= _BATCH_ROWS:
                yield columns.to_batch(self.topic, self.partition)
                columns = _Columns(self.type_shift)
        if len(columns):
            yield columns.to_batch(self.topic, self.partition)
        self.next_offset = end if expected == end and not self._overshot else None
        self._overshot = False

    def _fetch(self, columns: _Columns, expected: int, end: int, want: int, wait: float, request: ReadRequest
               ) -> tuple[bool, int, bool]:
        """Take up to ``want`` records from the client into ``columns``; returns (anything
        arrived, next expected offset, range finished)."""
        raise NotImplementedError

    def _position(self, offset: int) -> None:
        raise NotImplementedError

    def _earliest(self) -> int:
        raise NotImplementedError

    def _gap(self, start: int, stop: int, request: ReadRequest) -> None:
        """Offsets [start, stop) did not come back. Below the partition's earliest offset they
        were deleted (data loss); at or above it they are invisible (compacted away,
        transaction markers, aborted records), which is normal, as Spark decides."""
        earliest = self._earliest()
        if earliest <= start:
            log.debug("offsets %d..%d of %s are not visible (compaction or transaction markers)",
                      start, stop - 1, self._name())
            return
        message = (f"Offsets {start}..{min(stop, earliest) - 1} of {self._name()} were lost "
                   "(retention or compaction removed them before they were read)")
        if request.fail_on_data_loss:
            raise KafkaSourceError(message + "; set failOnDataLoss=false to skip them.")
        log.warning("%s; skipping them because failOnDataLoss=false", message)

    def _add_slow(self, columns: _Columns, items: list[Any], offset_of: Callable[[Any], int],
                  add: Callable[[list[Any]], None], expected: int, end: int, request: ReadRequest) -> tuple[int, bool]:
        """Records one by one: duplicates below ``expected`` skipped, gaps checked, records at
        or past ``end`` dropped (the consumer then stands past the range: seek next time)."""
        for item in items:
            offset = offset_of(item)
            if offset < expected:
                continue
            if offset >= end:
                if expected < end:
                    self._gap(expected, end, request)
                self._overshot = True
                return end, True
            if offset > expected:
                self._gap(expected, offset, request)
            add([item])
            expected = offset + 1
        return expected, expected >= end


class ConfluentReader(PartitionReader):
    type_shift = 1


    def _position(self, offset: int) -> None:
        from confluent_kafka import TopicPartition

        # assign() (re)starts fetching at ``offset``; librdkafka drops whatever it had
        # prefetched for the previous position.
        self.consumer.assign([TopicPartition(self.topic, self.partition, offset)])
        self._assigned = True

    def _earliest(self) -> int:
        from confluent_kafka import TopicPartition

        try:
            low, _ = self.consumer.get_watermark_offsets(TopicPartition(self.topic, self.partition),
                                                         timeout=_METADATA_TIMEOUT_S, cached=False)
        except Exception as exc:
            raise KafkaSourceError(f"Cannot list the earliest offset of {self._name()}: {exc}") from exc
        return int(low)

    def _fetch(self, columns: _Columns, expected: int, end: int, want: int, wait: float, request: ReadRequest
               ) -> tuple[bool, int, bool]:
        from confluent_kafka import KafkaError, KafkaException

        # consume() returns once it holds ``want`` messages or ``wait`` passed: never ask for
        # more than the range still needs, or every range would end with a full wait.
        messages = self.consumer.consume(num_messages=want, timeout=wait)
        if not messages:
            return False, expected, False
        eof: int | None = None
        if any(map(_ERROR, messages)):
            records = []
            for message in messages:
                error = message.error()
                if error is None:
                    records.append(message)
                elif error.code() == KafkaError._PARTITION_EOF:
                    eof = max(eof or 0, message.offset())
                elif error.fatal() or not (error.retriable() or error.code() in _transient_codes()):
                    raise KafkaSourceError(
                        f"Reading {self._name()} at offset {expected} with {self.spec.describe()} failed: "
                        f"{error.str()}") from KafkaException(error)
                else:
                    log.info("transient error reading %s: %s", self._name(), error.str())
        else:
            records = messages
        done = False
        if records:
            first, last = records[0].offset(), records[-1].offset()
            if first == expected and last - first == len(records) - 1 and last < end:
                columns.add_messages(records, first)
                expected = last + 1
            else:
                expected, done = self._add_slow(columns, records, _OFFSET, columns.add_messages, expected, end,
                                                request)
        if not done and eof is not None and eof >= end and expected < end:
            # The partition ends at or after ``end`` and everything before it was delivered.
            self._gap(expected, end, request)
            expected, done = end, True
        return bool(records) or eof is not None, expected, done or expected >= end


class KafkaPythonReader(PartitionReader):
    def _tp(self) -> Any:
        from kafka import TopicPartition

        return TopicPartition(self.topic, self.partition)

    def _position(self, offset: int) -> None:
        tp = self._tp()
        if not self._assigned:
            self.consumer.assign([tp])
            self._assigned = True
        self.consumer.seek(tp, offset)

    def _earliest(self) -> int:
        tp = self._tp()
        try:
            return int(self.consumer.beginning_offsets([tp])[tp])
        except Exception as exc:
            raise KafkaSourceError(f"Cannot list the earliest offset of {self._name()}: {exc}") from exc

    def _fetch(self, columns: _Columns, expected: int, end: int, want: int, wait: float, request: ReadRequest
               ) -> tuple[bool, int, bool]:
        tp = self._tp()
        try:
            records = self.consumer.poll(timeout_ms=int(wait * 1000), max_records=want).get(tp, [])
            if not records:
                # Control batches and compacted tails move the position without returning records.
                position = self.consumer.position(tp)
                if position is not None and position >= end and expected < end:
                    self._gap(expected, end, request)
                    return True, end, True
                return False, expected, False
        except KafkaSourceError:
            raise
        except Exception as exc:
            raise KafkaSourceError(
                f"Reading {self._name()} at offset {expected} with {self.spec.describe()} failed: {exc}") from exc
        first, last = records[0].offset, records[-1].offset
        if first == expected and last - first == len(records) - 1 and last < end:
            columns.add_records(records, first)
            return True, last + 1, last + 1 >= end
        expected, done = self._add_slow(columns, records, _R_OFFSET, columns.add_records, expected, end, request)
        return True, expected, done


@functools.cache
def _transient_codes() -> frozenset[int]:
    """librdkafka error events that do not end a read (it reconnects and retries by itself;
    the read's deadline bounds the wait). Imported lazily: only executors need them."""
    from confluent_kafka import KafkaError

    return frozenset({KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN, KafkaError._RESOLVE,
                      KafkaError._TIMED_OUT})


# ----------------------------------------------------------------------------- executors: the cache


@dataclass
class _Entry:
    reader: PartitionReader
    last_used: float


_CACHE: OrderedDict[tuple[ClientSpec, str, int], _Entry] = OrderedDict()
_LOCK = threading.Lock()
_STATS = {"created": 0, "reused": 0, "released": 0, "closedAfterFailure": 0, "evicted": 0}
# Where a worker's read time goes: wall time of whole reads (including the time Spark takes
# to accept each batch), wall time inside the client calls and column building, and the
# reading thread's CPU time (wall much larger than CPU: the worker waited, for the broker,
# for Spark, or for a core).
_TIMES = {"reads": 0, "rows": 0, "readSeconds": 0.0, "clientSeconds": 0.0, "readCpuSeconds": 0.0}


def consumer_cache_stats() -> dict[str, int]:
    """Counters of this process's consumer cache: consumers ``created``, ``reused`` (a read
    served by a cached consumer), ``released`` back to the cache, ``closedAfterFailure``,
    ``evicted`` (idle or over capacity), and ``cached`` now."""
    with _LOCK:
        return {**_STATS, "cached": len(_CACHE), **_TIMES}


def clear_consumer_cache() -> None:
    """Close every cached consumer (tests, and a worker that wants its sockets back)."""
    with _LOCK:
        entries = list(_CACHE.values())
        _CACHE.clear()
    for entry in entries:
        entry.reader.close()


def _acquire(spec: ClientSpec, topic: str, partition: int) -> PartitionReader:
    """A cached reader of this partition, taken out of the cache while in use, or a new one."""
    now = time.monotonic()
    stale: list[_Entry] = []
    with _LOCK:
        for key in [k for k, e in _CACHE.items() if now - e.last_used > CACHE_IDLE_TIMEOUT_S]:
            stale.append(_CACHE.pop(key))
            _STATS["evicted"] += 1
        entry = _CACHE.pop((spec, topic, partition), None)
        if entry is not None:
            _STATS["reused"] += 1
    for old in stale:
        old.reader.close()
    if entry is not None:
        return entry.reader
    reader: PartitionReader = (ConfluentReader if spec.kind == CONFLUENT else KafkaPythonReader)(spec, topic, partition)
    with _LOCK:
        _STATS["created"] += 1
    return reader


def _release(reader: PartitionReader) -> None:
    evicted: list[_Entry] = []
    with _LOCK:
        _CACHE[(reader.spec, reader.topic, reader.partition)] = _Entry(reader, time.monotonic())
        _STATS["released"] += 1
        while len(_CACHE) > CACHE_CAPACITY:
            evicted.append(_CACHE.popitem(last=False)[1])
            _STATS["evicted"] += 1
    for entry in evicted:
        entry.reader.close()


def _publish_stats() -> None:
    """With $STREAMING_MERGE_KAFKA_CONSUMER_STATS_DIR set (tests, benchmarks), write this
    worker's counters to ``<dir>/<pid>.json``: executors are other processes, and this is how
    a test sees whether the second micro-batch reused a consumer."""
    folder = os.environ.get(STATS_DIR_ENV)
    if not folder:
        return
    with contextlib.suppress(OSError):
        os.makedirs(folder, exist_ok=True)
        fd, temp = tempfile.mkstemp(dir=folder, suffix=".tmp")
        with os.fdopen(fd, "w") as out:
            json.dump(consumer_cache_stats(), out)
        os.replace(temp, os.path.join(folder, f"{os.getpid()}.json"))


def read_partition(spec: ClientSpec, request: ReadRequest) -> Iterator[pa.RecordBatch]:
    """The records of ``request`` as Arrow batches, through the cached consumer of that
    partition. A consumer whose read raised is closed and dropped; one whose reader stopped
    early goes back to the cache at an unknown position (it seeks next time)."""
    reader = _acquire(spec, request.topic, request.partition)
    healthy = False
    started = time.perf_counter()
    cpu = time.thread_time()
    try:
        for batch in reader.read(request):
            _TIMES["rows"] += batch.num_rows
            yield batch
        healthy = True
    except GeneratorExit:
        reader.next_offset = None
        healthy = True
        raise
    finally:
        _TIMES["reads"] += 1
        _TIMES["readSeconds"] += time.perf_counter() - started
        _TIMES["readCpuSeconds"] += time.thread_time() - cpu
        if healthy:
            _release(reader)
        else:
            reader.close()
            with _LOCK:
                _STATS["closedAfterFailure"] += 1
        _publish_stats()
