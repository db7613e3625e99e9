"""kafka-python (pure Python): its consumer settings and consumers, its partition reader and
the driver's metadata calls. ``kafka`` is imported inside the functions only: an executor
without it still reads with confluent-kafka."""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from typing import Any

from streaming_merge.kafka._clients.columns import _R_OFFSET, _Columns
from streaming_merge.kafka._clients.common import (
    _FETCH_RECORDS,
    ClientSpec,
    KafkaSourceError,
    ReadRequest,
    build_consumer,
)
from streaming_merge.kafka._clients.reader import PartitionReader
from streaming_merge.kafka._clients.truststore import resolved


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
        # How long the constructor tries to reach a broker (it connects at once)
        "bootstrap_timeout_ms": max(1, int(spec.metadata_timeout_s * 1000)),
    }
    config.update(resolved(dict(spec.settings)))
    return config


class _ConnectionFailures(logging.Handler):
    """What kafka-python logs about failed connections while a consumer is built: its
    constructor raises only "Unable to bootstrap", the log says why (authentication failed,
    connection refused, certificate not trusted...)."""

    _CAUSE = re.compile(r"(?:Connection lost|Bootstrap connection to \S+ failed|Connection failed): (.+?)"
                        r"(?: \(backoff [^)]*\))?$")

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.causes: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        match = self._CAUSE.search(record.getMessage())
        if match and match.group(1) not in self.causes:
            self.causes.append(match.group(1))


def new_consumer(spec: ClientSpec, role: str) -> Any:
    """A kafka-python consumer of ``spec`` (the same for the driver and the executors)."""
    failures = _ConnectionFailures()
    logger = logging.getLogger("kafka")
    logger.addHandler(failures)
    try:
        return build_consumer(spec, lambda module: module.KafkaConsumer(**_kafka_python_config(spec)))
    except KafkaSourceError as exc:
        if not failures.causes:
            raise
        raise KafkaSourceError(f"{exc} (cause: {'; '.join(failures.causes[:3])})") from exc.__cause__
    finally:
        logger.removeHandler(failures)


def topics(consumer: Any, timeout_s: float) -> dict[str, list[int]]:
    """Every topic with its partitions."""
    names = consumer.topics()  # kafka-python: forces a metadata refresh
    return {name: sorted(consumer.partitions_for_topic(name) or ()) for name in names}


def watermarks(consumer: Any, partitions: Sequence[tuple[str, int]], timeout_s: float
               ) -> dict[tuple[str, int], tuple[int, int]]:
    """(earliest, latest) offset of each partition."""
    from kafka import TopicPartition as KafkaTopicPartition

    tps = [KafkaTopicPartition(t, p) for t, p in partitions]
    starts = consumer.beginning_offsets(tps)
    ends = consumer.end_offsets(tps)
    return {(tp.topic, tp.partition): (int(starts[tp]), int(ends[tp])) for tp in tps}


class KafkaPythonReader(PartitionReader):
    def _new_consumer(self) -> Any:
        return new_consumer(self.spec, "executor")

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
