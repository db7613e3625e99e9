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

from streaming_merge.kafka._clients.cache import clear_consumer_cache, consumer_cache_stats, read_partition
from streaming_merge.kafka._clients.common import (
    ARROW_SCHEMA,
    CLIENT_KINDS,
    EXECUTOR_FETCH_WAIT_MS,
    STATS_DIR_ENV,
    ClientSpec,
    KafkaSourceError,
    ReadRequest,
    client_importable,
    resolve_client_kind,
    translate_options,
)
from streaming_merge.kafka._clients.metadata import MetadataClient

__all__ = [
    "ARROW_SCHEMA",
    "CLIENT_KINDS",
    "EXECUTOR_FETCH_WAIT_MS",
    "STATS_DIR_ENV",
    "ClientSpec",
    "KafkaSourceError",
    "MetadataClient",
    "ReadRequest",
    "clear_consumer_cache",
    "client_importable",
    "consumer_cache_stats",
    "read_partition",
    "resolve_client_kind",
    "translate_options",
]
