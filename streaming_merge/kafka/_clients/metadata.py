"""The driver's metadata: topics and watermark offsets, through the backend of the spec."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from types import ModuleType

from streaming_merge.kafka._clients import confluent, kafka_python
from streaming_merge.kafka._clients.common import _METADATA_TIMEOUT_S, CONFLUENT, ClientSpec, KafkaSourceError


def _backend(spec: ClientSpec) -> ModuleType:
    return confluent if spec.kind == CONFLUENT else kafka_python


class MetadataClient:
    """Topic metadata and watermark offsets for the driver's planning (one consumer, kept
    by the stream reader for the life of the query)."""

    def __init__(self, spec: ClientSpec, timeout_s: float = _METADATA_TIMEOUT_S) -> None:
        self.spec = spec
        self._timeout_s = timeout_s
        self._consumer = _backend(spec).new_consumer(spec, "driver")

    def topics(self) -> dict[str, list[int]]:
        """Every topic with its partitions, from one fresh metadata request (new partitions
        and topics show up here)."""
        try:
            return _backend(self.spec).topics(self._consumer, self._timeout_s)
        except Exception as exc:
            raise KafkaSourceError(f"Cannot fetch topic metadata from {self.spec.describe()}: {exc}") from exc

    def watermarks(self, partitions: Sequence[tuple[str, int]]) -> dict[tuple[str, int], tuple[int, int]]:
        """(earliest, latest) offset of each partition."""
        if not partitions:
            return {}
        try:
            return _backend(self.spec).watermarks(self._consumer, partitions, self._timeout_s)
        except Exception as exc:
            raise KafkaSourceError(f"Cannot list offsets on {self.spec.describe()}: {exc}") from exc

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._consumer.close()
