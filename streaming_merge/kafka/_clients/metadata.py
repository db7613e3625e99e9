"""The driver's metadata: topics and watermark offsets, through the backend of the spec."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from types import ModuleType

from streaming_merge.kafka._clients import confluent, kafka_python
from streaming_merge.kafka._clients.common import CONFLUENT, ClientSpec, KafkaSourceError


def _backend(spec: ClientSpec) -> ModuleType:
    return confluent if spec.kind == CONFLUENT else kafka_python


class MetadataClient:
    """Topic metadata and watermark offsets for the driver's planning (one consumer, kept
    by the stream reader for the life of the query)."""

    def __init__(self, spec: ClientSpec, timeout_s: float | None = None) -> None:
        self.spec = spec
        self._timeout_s = spec.metadata_timeout_s if timeout_s is None else timeout_s
        self._errors = confluent.ConnectionErrors() if spec.kind == CONFLUENT else None
        self._consumer = (confluent.new_consumer(spec, "driver", self._errors) if self._errors is not None
                          else kafka_python.new_consumer(spec, "driver"))

    def _failure(self, what: str, exc: Exception) -> KafkaSourceError:
        """``what`` failed: the error names the brokers and, for librdkafka, the cause its error
        events gave (the exception itself says only "transport failure" or "timed out")."""
        cause = self._errors.cause(self._consumer) if self._errors is not None else None
        return KafkaSourceError(f"Cannot {what} {self.spec.describe()}: {exc}"
                                + (f" (cause: {cause})" if cause else ""))

    def topics(self) -> dict[str, list[int]]:
        """Every topic with its partitions, from one fresh metadata request (new partitions
        and topics show up here)."""
        try:
            return _backend(self.spec).topics(self._consumer, self._timeout_s)
        except Exception as exc:
            raise self._failure("fetch topic metadata from", exc) from exc

    def watermarks(self, partitions: Sequence[tuple[str, int]]) -> dict[tuple[str, int], tuple[int, int]]:
        """(earliest, latest) offset of each partition."""
        if not partitions:
            return {}
        try:
            return _backend(self.spec).watermarks(self._consumer, partitions, self._timeout_s)
        except Exception as exc:
            raise self._failure("list offsets on", exc) from exc

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._consumer.close()
