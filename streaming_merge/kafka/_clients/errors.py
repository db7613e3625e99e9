"""The Kafka source's error, apart from the clients' code so that every client module can raise it."""

from __future__ import annotations

from streaming_merge.errors import StreamingMergeError


class KafkaSourceError(StreamingMergeError):
    """Raised when the Kafka source cannot continue: bad options, an unreachable broker,
    or (with failOnDataLoss) offsets that are no longer available."""
