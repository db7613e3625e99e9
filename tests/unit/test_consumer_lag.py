"""Consumer lag from a streaming progress record's sources (progress.consumer_lag)."""

from __future__ import annotations

import json

from streaming_merge.streaming.progress import consumer_lag


def test_lag_is_latest_minus_end_per_topic_partition_for_kafka_shaped_offsets() -> None:
    sources = [
        {"description": "KafkaV2[Subscribe[orders]]", "endOffset": {"orders": {"0": 40, "1": 7}},
         "latestOffset": {"orders": {"0": 52, "1": 7}}},
        # Offsets as JSON text (how some sources report them); a partition the batch never read is left out.
        {"description": "kafka_py", "endOffset": json.dumps({"items": {"0": 3}}),
         "latestOffset": json.dumps({"items": {"0": 5, "1": 9}})},
        # Not Kafka-shaped, or no latest offset: no lag to tell.
        {"description": "FileStreamSource", "endOffset": {"logOffset": 4}, "latestOffset": None},
        {"description": "delta", "endOffset": "not json", "latestOffset": "not json"},
    ]
    assert consumer_lag(sources) == {"orders": {"0": 12, "1": 0}, "items": {"0": 2}}


def test_no_sources_no_lag() -> None:
    assert consumer_lag([]) == {}
