"""confluent-kafka (librdkafka): its consumer settings and consumers, its partition reader,
the error codes a read survives, and the driver's metadata calls. ``confluent_kafka`` is
imported inside the functions only: an executor without it still reads with kafka-python."""

from __future__ import annotations

import contextlib
import functools
import uuid
from collections import deque
from collections.abc import Sequence
from typing import Any

from streaming_merge.kafka._clients.columns import _ERROR, _OFFSET, _Columns
from streaming_merge.kafka._clients.common import (
    _METADATA_TIMEOUT_S,
    EXECUTOR_FETCH_WAIT_MS,
    ClientSpec,
    KafkaSourceError,
    ReadRequest,
    build_consumer,
    log,
)
from streaming_merge.kafka._clients.reader import PartitionReader
from streaming_merge.kafka._clients.truststore import resolved


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
    config.update(resolved(dict(spec.settings)))
    return config


class ConnectionErrors:
    """librdkafka's error events of one consumer (its ``error_cb``): why a call failed. A
    failed metadata call says only "Broker transport failure"; the events name the broker and
    the cause (authentication failed, connection refused, certificate not trusted...)."""

    def __init__(self) -> None:
        self.events: deque[Any] = deque(maxlen=16)

    def __call__(self, error: Any) -> None:
        self.events.append(error)

    def cause(self, consumer: Any) -> str | None:
        """The first event that is not the summary "all brokers are down", after serving the
        consumer's pending events (error_cb runs only inside poll)."""
        with contextlib.suppress(Exception):
            consumer.poll(0)
        for error in self.events:
            if error.name() != "_ALL_BROKERS_DOWN":
                return str(error.str())
        return str(self.events[0].str()) if self.events else None


def new_consumer(spec: ClientSpec, role: str, errors: ConnectionErrors | None = None) -> Any:
    """A confluent-kafka consumer of ``spec`` for ``role`` (``driver`` or ``executor``);
    ``errors`` collects its error events."""
    def construct(module: Any) -> Any:
        config = _confluent_config(spec, role)
        if errors is not None:
            config["error_cb"] = errors
        return module.Consumer(config)

    return build_consumer(spec, construct)


def topics(consumer: Any, timeout_s: float) -> dict[str, list[int]]:
    """Every topic but the internal ones with its partitions, from one metadata request."""
    metadata = consumer.list_topics(timeout=timeout_s)
    return {name: sorted(topic.partitions) for name, topic in metadata.topics.items()
            if not name.startswith("__")}


def watermarks(consumer: Any, partitions: Sequence[tuple[str, int]], timeout_s: float
               ) -> dict[tuple[str, int], tuple[int, int]]:
    """(earliest, latest) offset of each partition."""
    from confluent_kafka import TopicPartition

    return {(t, p): tuple(consumer.get_watermark_offsets(  # type: ignore[misc]
        TopicPartition(t, p), timeout=timeout_s, cached=False)) for t, p in partitions}


class ConfluentReader(PartitionReader):
    type_shift = 1

    def _new_consumer(self) -> Any:
        return new_consumer(self.spec, "executor")

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


@functools.cache
def _transient_codes() -> frozenset[int]:
    """librdkafka error events that do not end a read (it reconnects and retries by itself;
    the read's deadline bounds the wait). Imported lazily: only executors need them."""
    from confluent_kafka import KafkaError

    return frozenset({KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN, KafkaError._RESOLVE,
                      KafkaError._TIMED_OUT})
