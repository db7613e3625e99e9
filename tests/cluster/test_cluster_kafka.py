"""The Kafka CDC ingestion job deployed as a user deploys it: ``spark-submit --master
local-cluster[2,1,1024] jobs/kafka_cdc_ingest.py ...``, against the session's broker.

Why on a cluster: the ``kafka_py`` source is a Python Data Source whose partition readers run
in the executors' Python workers, each its own process with its own Kafka consumer (cached
per worker), and the planning side (offsets, partitions) in the driver. ``local[2]`` runs all
of that inside one JVM's children; here the readers are children of other JVMs, so anything
the reader needs must travel in the pickled reader (options, offsets), nothing can leak from
the driver's memory. Under spark-submit the job takes the platform's session as it is: the
master, the Python of the executors and a setting given to spark-submit are spark-submit's.
The result must still be exact: the table equals the state computed independently by
jobs/cdc_generator.py, every malformed record is in the dead-letter table once with its
coordinates, and each micro-batch was merged once (the job's JSON batch lines).
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
from tests.cluster.apps import MASTER, App, submit_job

ORDERS = cdc_generator.TABLES["orders"]
ORDER_KEY: str = ORDERS["key"]
ORDER_COLUMNS = [c.split()[0] for c in ORDERS["schema"].split(",")]


def test_ingestion_job_under_spark_submit_on_executors_is_exact(
        kafka_broker: KafkaBrokerClient, kafka_topic: Callable[..., str], tmp_path: Path) -> None:
    topic = kafka_topic(partitions=2)  # two partitions: each micro-batch has a reader task per partition
    records, state = cdc_generator.generate("orders", 60, 15, seed=41)
    acks = kafka_broker.produce(topic, [(r.key, r.value) for r in records])
    assert {a.partition for a in acks} == {0, 1}
    malformed = {(a.partition, a.offset): r.value for r, a in zip(records, acks, strict=True) if r.key == b"bad"}
    assert len(malformed) == len(cdc_generator.MALFORMED)
    limit = math.ceil(len(records) / 2)  # split over the partitions by their backlog: two or three batches

    target, dead_letter = tmp_path / "orders", tmp_path / "dead_letter"
    app = submit_job("jobs/kafka_cdc_ingest.py", [
        "--bootstrap-servers", kafka_broker.bootstrap_servers, "--topics", topic, "--target", str(target),
        "--checkpoint", str(tmp_path / "checkpoint"), "--dead-letter", str(dead_letter), "--keys", ORDER_KEY,
        "--row-schema", ORDERS["schema"], "--max-offsets-per-trigger", str(limit), "--available-now",
        "--log-format", "json"], tmp_path, {"spark.sql.shuffle.partitions": "3"})
    try:
        app.succeeds()
    finally:
        app.end()

    rows = deltalake.DeltaTable(str(target)).to_pyarrow_table().to_pylist()
    actual = {r[ORDER_KEY]: {c: r[c] for c in ORDER_COLUMNS} for r in rows}
    assert len(rows) == len(actual), "a key appears twice"
    assert actual == cdc_generator.expected_rows(state)

    lines = _json_lines(app)
    session = next(line["session"] for line in lines if "session" in line)
    assert session["master"] == MASTER and session["given"] == "platform", session
    assert session["shufflePartitions"] == "3", "spark-submit's --conf is the job's setting"
    merges: list[dict[str, Any]] = [line["batch"] for line in lines if "batch" in line]
    assert [m["batchId"] for m in merges] == list(range(len(merges))) and len(merges) >= 2, merges
    assert not any(m["skipped"] for m in merges) and all(m["attempts"] == 1 for m in merges)
    assert sum(m["kafkaRecords"] for m in merges) == len(records), "every record read once"
    assert sum(m["malformedRecords"] for m in merges) == len(malformed)
    assert merges[-1]["consumerLag"] == {topic: {"0": 0, "1": 0}}

    dead = deltalake.DeltaTable(str(dead_letter)).to_pyarrow_table().to_pylist()
    assert {(r["partition"], r["offset"]): r["value"] for r in dead} == malformed
    assert len(dead) == len(malformed) and {r["topic"] for r in dead} == {topic}


def _json_lines(app: App) -> list[dict[str, Any]]:
    """The job's log lines (spark-submit's Python runner merges the driver's stderr into its stdout)."""
    text = app.stdout.read_text() + app.stderr.read_text()
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]
