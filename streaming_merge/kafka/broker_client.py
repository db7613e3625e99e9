"""Admin and produce helpers for a Kafka-compatible broker (the embedded Tansu broker of
``broker`` or Apache Kafka), so tests need neither kafka-python's API nor its exceptions. The
Tansu defects they absorb or report are in the docstring of ``streaming_merge.kafka.broker``,
which re-exports every name here.

This is the only broker module that imports kafka-python (lazily); its exceptions are wrapped
into :class:`KafkaBrokerError` (``raise ... from exc``).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from streaming_merge.errors import InvalidArgumentError, StreamingMergeError

__all__ = [
    "BrokerFeatureUnsupportedError",
    "BrokerKind",
    "KafkaBrokerClient",
    "KafkaBrokerError",
    "ProducedRecord",
    "Record",
    "RecordInput",
]

BrokerKind = Literal["tansu", "kafka", "unknown"]

_CREATE_PARTITIONS_API_KEY = 37
_DEFAULT_TIMEOUT_S = 30.0
_POLL_INTERVAL_S = 0.05


class KafkaBrokerError(StreamingMergeError):
    """Raised when the embedded broker cannot be started or stopped, or an admin or produce
    call against a broker fails; the broker's log tail or the client error is in the message."""


class BrokerFeatureUnsupportedError(KafkaBrokerError):
    """Raised when the broker in use does not implement an operation a test asked for
    (the embedded Tansu broker has no CreatePartitions and no working DeleteRecords); tests
    skip on it and run the scenario against Apache Kafka when Docker is available."""


@dataclass(frozen=True)
class Record:
    """One record to produce. ``value=None`` is a tombstone. ``timestamp_ms=None`` lets the
    producer stamp the current time; ``partition=None`` defers to the call's ``partition``
    argument, then to the producer's partitioner (key hash)."""

    value: bytes | str | None
    key: bytes | str | None = None
    headers: tuple[tuple[str, bytes], ...] = ()
    timestamp_ms: int | None = None
    partition: int | None = None


RecordInput = Record | bytes | str | None | tuple[bytes | str | None, bytes | str | None]
"""What :meth:`KafkaBrokerClient.produce` accepts: a :class:`Record`, a bare value, or a
``(key, value)`` pair. Strings are encoded as UTF-8."""


@dataclass(frozen=True)
class ProducedRecord:
    """Where the broker stored a record: the acknowledgement, without kafka-python types."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int


def _as_bytes(value: bytes | str | None) -> bytes | None:
    return value.encode("utf-8") if isinstance(value, str) else value


def _as_record(item: RecordInput) -> Record:
    if isinstance(item, Record):
        return item
    if isinstance(item, tuple):
        key, value = item
        return Record(value=value, key=key)
    return Record(value=item)


def _import_kafka():  # type: ignore[no-untyped-def]
    """Import kafka-python lazily so ``import streaming_merge.kafka.broker`` works without it
    (the ``kafka`` extra) and the error says how to get it."""
    try:
        import kafka
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise KafkaBrokerError(
            "kafka-python is not installed; install the 'kafka' extra: pip install 'streaming_merge[kafka]'"
        ) from exc
    return kafka


def _client_config(bootstrap_servers: str, timeout_s: float) -> dict[str, object]:
    """Common kafka-python client settings. ``bootstrap_timeout_ms`` exists only in
    kafka-python 3.x (2.x rejects unknown keys), so it is set only where supported; it bounds
    how long a client waits for an unreachable broker (30 s by default)."""
    kafka = _import_kafka()
    config: dict[str, object] = {
        "bootstrap_servers": bootstrap_servers,
        "client_id": "streaming_merge-broker-helper",
        "request_timeout_ms": max(1000, int(timeout_s * 1000)),
    }
    if "bootstrap_timeout_ms" in kafka.KafkaAdminClient.DEFAULT_CONFIG:
        config["bootstrap_timeout_ms"] = max(1000, int(timeout_s * 1000))
    return config


class KafkaBrokerClient:
    """Admin and produce helpers for a Kafka-compatible broker (embedded Tansu or Apache
    Kafka), so tests need neither kafka-python's API nor its exceptions.

    ``kind`` says which broker is behind ``bootstrap_servers``; it decides which known broker
    defects are refused up front instead of being sent (Tansu's DeleteRecords crashes a
    broker worker). Clients are created lazily and closed by :meth:`close`.
    """

    def __init__(self, bootstrap_servers: str, kind: BrokerKind = "unknown", timeout_s: float = _DEFAULT_TIMEOUT_S):
        self.bootstrap_servers = bootstrap_servers
        self.kind: BrokerKind = kind
        self.timeout_s = timeout_s
        self._admin: object | None = None

    # -- clients -----------------------------------------------------------------------

    def _admin_client(self):  # type: ignore[no-untyped-def]
        if self._admin is None:
            kafka = _import_kafka()
            try:
                self._admin = kafka.KafkaAdminClient(**_client_config(self.bootstrap_servers, self.timeout_s))
            except kafka.errors.KafkaError as exc:
                raise KafkaBrokerError(f"cannot connect an admin client to {self.bootstrap_servers}: {exc}") from exc
        return self._admin

    def _new_producer(self):  # type: ignore[no-untyped-def]
        """A producer for one :meth:`produce` call. Not kept between calls: an idle
        kafka-python 3 producer's network thread re-runs its metadata refresh in a loop that
        holds the GIL, which took a whole core from the process for as long as the producer
        lived, and slowed every py4j round trip of a PySpark driver sharing the process by up
        to a GIL switch interval (the test session went from ~12 to 68 minutes)."""
        kafka = _import_kafka()
        config = _client_config(self.bootstrap_servers, self.timeout_s)
        config.pop("bootstrap_timeout_ms", None)
        try:
            # One record per batch: linger 0 and a batch size smaller than any record; the
            # caller also waits for each acknowledgement before sending the next record.
            return kafka.KafkaProducer(**config, linger_ms=0, batch_size=1, acks="all", retries=3)
        except kafka.errors.KafkaError as exc:
            raise KafkaBrokerError(f"cannot connect a producer to {self.bootstrap_servers}: {exc}") from exc

    def _new_consumer(self):  # type: ignore[no-untyped-def]
        """A fresh, group-less consumer: its metadata is fetched on first use, so it sees
        partitions added since any cached client last refreshed."""
        kafka = _import_kafka()
        config = _client_config(self.bootstrap_servers, self.timeout_s)
        try:
            return kafka.KafkaConsumer(**config, enable_auto_commit=False)
        except kafka.errors.KafkaError as exc:
            raise KafkaBrokerError(f"cannot connect a consumer to {self.bootstrap_servers}: {exc}") from exc

    def close(self) -> None:
        """Close the cached admin client (idempotent)."""
        client, self._admin = self._admin, None
        if client is not None:
            with contextlib.suppress(Exception):
                client.close()  # type: ignore[attr-defined]

    def __enter__(self) -> KafkaBrokerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- admin -------------------------------------------------------------------------

    def topics(self) -> set[str]:
        """Names of the topics the broker reports right now (fresh metadata)."""
        kafka = _import_kafka()
        try:
            return set(self._admin_client().list_topics())  # type: ignore[attr-defined]
        except kafka.errors.KafkaError as exc:
            raise KafkaBrokerError(f"listing topics on {self.bootstrap_servers} failed: {exc}") from exc

    def partition_count(self, topic: str) -> int:
        """How many partitions ``topic`` has according to fresh metadata (0 if unknown)."""
        kafka = _import_kafka()
        try:
            described = self._admin_client().describe_topics([topic])  # type: ignore[attr-defined]
        except kafka.errors.UnknownTopicOrPartitionError:
            return 0
        except kafka.errors.KafkaError as exc:
            raise KafkaBrokerError(f"describing topic {topic!r} failed: {exc}") from exc
        for entry in described:
            if entry.get("name") == topic and entry.get("error_code", 0) == 0:
                return len(entry.get("partitions") or ())
        return 0

    def _wait_for_partitions(self, topic: str, total: int) -> None:
        """Poll metadata until ``topic`` shows ``total`` partitions: Apache Kafka creates
        partitions asynchronously after acknowledging the request."""
        deadline = time.monotonic() + self.timeout_s
        seen = 0
        while time.monotonic() < deadline:
            seen = self.partition_count(topic)
            if seen >= total:
                return
            time.sleep(_POLL_INTERVAL_S)
        raise KafkaBrokerError(
            f"topic {topic!r} shows {seen} partitions, expected {total}, after {self.timeout_s:.0f}s"
        )

    def create_topic(self, name: str, partitions: int = 1, configs: Mapping[str, str] | None = None) -> None:
        """Create ``name`` with ``partitions`` partitions (replication factor 1) and wait until
        every partition is in the metadata, so a produce right after cannot race creation."""
        if partitions < 1:
            raise InvalidArgumentError(f"partitions must be >= 1, got {partitions}")
        kafka = _import_kafka()
        from kafka.admin import NewTopic

        topic = NewTopic(name, partitions, 1, topic_configs=dict(configs or {}))
        try:
            self._admin_client().create_topics([topic])  # type: ignore[attr-defined]
        except kafka.errors.TopicAlreadyExistsError as exc:
            raise KafkaBrokerError(f"topic {name!r} already exists on {self.bootstrap_servers}") from exc
        except kafka.errors.KafkaError as exc:
            raise KafkaBrokerError(f"creating topic {name!r} with {partitions} partitions failed: {exc}") from exc
        self._wait_for_partitions(name, partitions)

    def delete_topic(self, name: str) -> None:
        """Delete ``name`` (test clean-up, so one session-wide broker does not accumulate topics)."""
        kafka = _import_kafka()
        try:
            self._admin_client().delete_topics([name])  # type: ignore[attr-defined]
        except kafka.errors.KafkaError as exc:
            raise KafkaBrokerError(f"deleting topic {name!r} failed: {exc}") from exc

    def supports_create_partitions(self) -> bool:
        """Whether the broker advertises CreatePartitions (API key 37) in ApiVersions."""
        kafka = _import_kafka()
        admin = self._admin_client()
        try:
            versions = admin.api_versions()  # type: ignore[attr-defined]
        except ValueError:
            # kafka-python 3.0 maps every advertised key onto its ApiKey enum and fails on keys
            # newer than it (Apache Kafka 4.4 advertises 93); the raw map is the same data.
            versions = admin._manager.broker_version_data.api_versions  # type: ignore[attr-defined]
        except kafka.errors.KafkaError as exc:
            raise KafkaBrokerError(f"ApiVersions against {self.bootstrap_servers} failed: {exc}") from exc
        return _CREATE_PARTITIONS_API_KEY in {int(key) for key in versions}

    def add_partitions(self, name: str, total: int) -> None:
        """Grow ``name`` to ``total`` partitions and wait until fresh metadata shows them.

        Raises :class:`BrokerFeatureUnsupportedError` on brokers without CreatePartitions
        (the embedded Tansu broker), checked before anything is sent.
        """
        if not self.supports_create_partitions():
            raise BrokerFeatureUnsupportedError(
                f"the broker at {self.bootstrap_servers} ({self.kind}) does not implement CreatePartitions "
                "(Kafka API key 37), so partitions cannot be added to an existing topic; run this scenario "
                "against Apache Kafka (the Kafka test tier's default broker)"
            )
        kafka = _import_kafka()
        from kafka.admin import NewPartitions

        try:
            self._admin_client().create_partitions({name: NewPartitions(total_count=total)})  # type: ignore[attr-defined]
        except kafka.errors.KafkaError as exc:
            raise KafkaBrokerError(f"growing topic {name!r} to {total} partitions failed: {exc}") from exc
        self._wait_for_partitions(name, total)

    def delete_records(self, topic: str, partition: int, before_offset: int) -> None:
        """Advance the partition's log start offset to ``before_offset`` (records below it are
        gone), as retention would; for testing offsets that fell out of retention.

        Refused on the embedded Tansu broker, whose DeleteRecords handler panics.
        """
        if self.kind == "tansu":
            raise BrokerFeatureUnsupportedError(
                "the embedded Tansu broker does not implement DeleteRecords (its handler panics with "
                "'not yet implemented') and ignores retention settings, so records cannot be made to fall "
                "out of retention; run this scenario against Apache Kafka"
            )
        kafka = _import_kafka()
        tp = kafka.TopicPartition(topic, partition)
        try:
            self._admin_client().delete_records({tp: before_offset})  # type: ignore[attr-defined]
        except kafka.errors.KafkaError as exc:
            raise KafkaBrokerError(
                f"deleting records of {topic}-{partition} below {before_offset} failed: {exc}"
            ) from exc

    def offsets(self, topic: str) -> dict[int, tuple[int, int]]:
        """``{partition: (earliest, latest)}`` for every partition of ``topic``, from fresh metadata."""
        kafka = _import_kafka()
        consumer = self._new_consumer()
        try:
            partitions = consumer.partitions_for_topic(topic) or set()
            tps = [kafka.TopicPartition(topic, p) for p in sorted(partitions)]
            earliest = consumer.beginning_offsets(tps)
            latest = consumer.end_offsets(tps)
        except kafka.errors.KafkaError as exc:
            raise KafkaBrokerError(f"listing offsets of {topic!r} failed: {exc}") from exc
        finally:
            consumer.close()
        return {tp.partition: (earliest[tp], latest[tp]) for tp in tps}

    # -- produce -----------------------------------------------------------------------

    def produce(self, topic: str, records: Iterable[RecordInput], partition: int | None = None) -> list[ProducedRecord]:
        """Send ``records`` to ``topic`` in order, one record per batch, waiting for each
        acknowledgement, and return where each landed.

        One record per batch is not a performance choice: Tansu reports a partition's latest
        offset as the start of its last batch (DESIGN.md §5), so batching would make the end
        offset lag behind the records actually stored.
        """
        kafka = _import_kafka()
        producer = self._new_producer()
        produced: list[ProducedRecord] = []
        try:
            for item in records:
                record = _as_record(item)
                target = record.partition if record.partition is not None else partition
                try:
                    future = producer.send(  # type: ignore[attr-defined]
                        topic,
                        value=_as_bytes(record.value),
                        key=_as_bytes(record.key),
                        headers=list(record.headers) or None,
                        partition=target,
                        timestamp_ms=record.timestamp_ms,
                    )
                    metadata = future.get(timeout=self.timeout_s)
                except kafka.errors.KafkaError as exc:
                    raise KafkaBrokerError(
                        f"producing to {topic!r} (partition {target}) failed after {len(produced)} records: {exc}"
                    ) from exc
                produced.append(ProducedRecord(metadata.topic, metadata.partition, metadata.offset,
                                               metadata.timestamp))
        finally:
            with contextlib.suppress(Exception):
                producer.close(timeout=self.timeout_s)  # type: ignore[attr-defined]
        return produced
