"""The Kafka CDC ingestion job (``jobs.kafka_cdc_ingest``) on a local-cluster, in a subprocess
(tests/streaming_support/kafka_ingest_app.py), against the session's broker.

Why on a cluster: the ``kafka_py`` source is a Python Data Source whose partition readers run
in the executors' Python workers, each its own process with its own Kafka consumer (cached
per worker), and the planning side (offsets, partitions) in the driver. ``local[2]`` runs all
of that inside one JVM's children; here the readers are children of other JVMs, so anything
the reader needs must travel in the pickled reader (options, offsets), nothing can leak from
the driver's memory. The result must still be exact: the table equals the state computed
independently by jobs/cdc_generator.py, every malformed record is in the dead-letter table
once with its coordinates, and each micro-batch was merged once.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import deltalake

from jobs import cdc_generator
from streaming_merge.kafka.broker import KafkaBrokerClient
from tests.cluster.apps import MASTER, App, executors_by_id

ORDERS = cdc_generator.TABLES["orders"]
ORDER_KEY: str = ORDERS["key"]
ORDER_COLUMNS = [c.split()[0] for c in ORDERS["schema"].split(",")]


def test_ingestion_job_on_executors_is_exact(launch: Callable[[str, list[str]], App],
                                             kafka_broker: KafkaBrokerClient,
                                             kafka_topic: Callable[..., str], tmp_path: Path) -> None:
    topic = kafka_topic(partitions=2)  # two partitions: each micro-batch has a reader task per partition
    records, state = cdc_generator.generate("orders", 60, 15, seed=41)
    acks = kafka_broker.produce(topic, [(r.key, r.value) for r in records])
    assert {a.partition for a in acks} == {0, 1}
    malformed = {(a.partition, a.offset): r.value for r, a in zip(records, acks, strict=True) if r.key == b"bad"}
    assert len(malformed) == len(cdc_generator.MALFORMED)
    limit = math.ceil(len(records) / 2)  # split over the partitions by their backlog: two or three batches

    target, dead_letter, events, report = (tmp_path / "orders", tmp_path / "dead_letter", tmp_path / "events.jsonl",
                                           tmp_path / "report.json")
    launch("tests.streaming_support.kafka_ingest_app", [
        "--bootstrap-servers", kafka_broker.bootstrap_servers, "--topic", topic, "--target", str(target),
        "--checkpoint", str(tmp_path / "checkpoint"), "--dead-letter", str(dead_letter), "--keys", ORDER_KEY,
        "--row-schema", ORDERS["schema"], "--max-offsets-per-trigger", str(limit), "--progress", str(events),
        "--master", MASTER, "--report", str(report)]).succeeds()

    rows = deltalake.DeltaTable(str(target)).to_pyarrow_table().to_pylist()
    actual = {r[ORDER_KEY]: {c: r[c] for c in ORDER_COLUMNS} for r in rows}
    assert len(rows) == len(actual), "a key appears twice"
    assert actual == cdc_generator.expected_rows(state)

    merges: list[dict[str, Any]] = [e for line in events.read_text().splitlines()
                                    if (e := json.loads(line))["event"] == "merge"]
    assert [m["batchId"] for m in merges] == list(range(len(merges))) and len(merges) >= 2, merges
    assert not any(m["skipped"] for m in merges) and all(m["attempts"] == 1 for m in merges)
    assert sum(m["kafkaRecords"] for m in merges) == len(records), "every record read once"
    assert sum(m["malformedRecords"] for m in merges) == len(malformed)

    dead = deltalake.DeltaTable(str(dead_letter)).to_pyarrow_table().to_pylist()
    assert {(r["partition"], r["offset"]): r["value"] for r in dead} == malformed
    assert len(dead) == len(malformed) and {r["topic"] for r in dead} == {topic}

    cluster = json.loads(report.read_text())
    assert cluster["master"] == MASTER and cluster["memoryStatusSize"] == 3
    executors = executors_by_id(cluster)
    assert set(executors) == {"0", "1"}, cluster["executors"]
    assert all(e["totalTasks"] > 0 for e in executors.values()), f"a task-less executor: {cluster['executors']}"
    assert next(e for e in cluster["executors"] if e["id"] == "driver")["totalTasks"] == 0
