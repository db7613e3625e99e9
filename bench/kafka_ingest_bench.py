"""Kafka ingestion benchmark: the Kafka clients alone, the ``kafka_py`` source alone, and
embedded broker → ``jobs.kafka_cdc_ingest`` → Delta, side by side in one run.

    python -m bench.kafka_ingest_bench [--parts clients,source,e2e] [--source-records 400000]
        [--clients confluent,kafka-python] [--events 20000] [--max-offsets-per-trigger 5000] [--partitions 2]

    # sustained end to end: events/s and per-batch latency p50/p95 over large batches
    python -m bench.kafka_ingest_bench --parts e2e --events 200000 --max-offsets-per-trigger 100000

    # into a pre-built 1M-row target, 5k-record batches: copy-on-write against deletion vectors
    python -m bench.kafka_ingest_bench --parts e2e --target-rows 1000000 --ab --events 100000 \
        --max-offsets-per-trigger 5000

**Clients and source** (``--parts clients,source``): a topic of ``--source-records`` records
(~200-byte Debezium-like JSON values, string keys, a header on every 50th record) over
``--partitions`` partitions, produced in batches (the last record of each partition alone in
its batch, so Tansu's end offset is exact, see below). Then, per client
(``--clients``, default both):

* **client alone**: one consumer of that client assigned to every partition from offset 0,
  reading until it holds every record (each record's key and value touched), nothing else:
  the ceiling for a Python reader on this broker;
* **source alone**: ``spark.readStream.format("kafka_py")`` with ``kafka.client`` set to that
  client, ``startingOffsets=earliest``, ``Trigger.AvailableNow`` into Spark's ``noop`` sink,
  once in one micro-batch and once with ``--source-max-offsets-per-trigger`` (several
  micro-batches: consumers reused across them). records/s is records over the query's
  wall time from ``start()`` to termination (the SparkSession is warm); Spark's own
  ``processedRowsPerSecond`` (rows over trigger time, planning included) is printed next to it.

**End to end** (``--parts e2e``): starts the embedded Kafka-compatible broker (Tansu,
DESIGN.md §5), produces a generated
Debezium stream of one table (``jobs.cdc_generator``: updates, deletes, duplicates, late
events, tombstones, five malformed records) partitioned by key, then runs the real ingestion
job once with ``availableNow`` and reports:

* **throughput**: Kafka records and change events per second over the whole ingestion
  run, from ``start()`` to the end of the last batch. The SparkSession (JVM start, executor
  start, class loading) is created and warmed up *before* the clock starts;
* **sustained**: records (and change events, at the stream's share of events per record) over
  Spark's ``triggerExecution`` of every batch after the first: the rate once the query runs.
  The first batch starts the Python workers of the source and compiles (JIT) the job's code,
  once per query; on a short run it weighs heavily on the whole-run figure;
* **batch latency**: p50, p95 and max of Spark's ``triggerExecution`` over the batches, and
  p50/p95 over the second half of them alone: the JVM's JIT compiles the job's code paths during
  the first tens of batches (measured: still 200-300 compilations, ~0.5 s of compiler CPU, per
  1k-row sink batch after 20 batches), so a short run's p50 is mostly warm-up, and the second
  half of a long run (``--events 400000`` at 5k a batch: 40 batches) is what a stream that has
  run for a few minutes sees;
* **per batch**: Spark's own phase durations (``latestOffset``, ``getBatch``,
  ``queryPlanning``, ``walCommit``, ``addBatch``, ``commitOffsets``) next to the MergeSink's
  (``materialize``, ``tombstones``, ``merge``, ``commit``, ``total``). The Kafka read is lazy: it
  happens inside ``addBatch``, when the job's batch function checkpoints the records, so
  ``addBatch − sink.total`` is reading Kafka + decoding + the dead-letter append, and
  ``latestOffset + getBatch`` is the driver's offset planning against the broker;
* **reading Kafka alone**: a second query over the same topic with the same
  ``maxOffsetsPerTrigger`` whose batch function only materializes the records (what the
  job does first), so the source's cost is measured without decode and sink;
* **age at commit**: for the last record of each batch, the time from its producer
  timestamp to the moment the batch's Delta commit returned. All records are produced
  before the run, so this is backlog age (queueing), not the latency of a live stream.

**Into an existing target, with or without deletion vectors** (``--target-rows N``): before the
clock starts, a target of N rows is built with the job's schema (keys 0..N-1, row images by the
generator's row maker, as if a Debezium snapshot had read them: op ``r``, position 0, below every
event's), in ``--target-files`` files with disjoint key ranges; ``--keys`` defaults to N, so the
change events update and delete rows all over it (an upsert batch touches most files).
``--deletion-vectors`` turns DVs on in that target (or, without ``--target-rows``, has the job
create its table with them: the job's ``--deletion-vectors``); ``--ab`` runs the job twice on the
same topic, copy-on-write and DVs, each into its own copy of the same target (``--rounds R``: R
rounds, alternating which goes first), prints each run and then the medians per mode and the
ratio DV / copy-on-write of events/s, whole run and sustained (the issue's target: >= 2x at 1M
rows with 5k-record batches: ``--parts e2e --target-rows 1000000 --ab --events 100000
--max-offsets-per-trigger 5000``). The table's files and files with a DV are printed after each
run's check. Without these flags the run and its output are as before.

The run is checked: the Delta table (read back with delta-rs ``scan()``, which applies deletion
vectors) must equal the state the generator computed independently (with a pre-built target: the
keys no event touched keep their pre-built rows, compared in Arrow), and the dead-letter table
must hold exactly the malformed records (✓/✗; exit status 1 on ✗). Results go to
``bench/results/`` as JSON.

Producing: Tansu reports a partition's end offset as the start of its last record batch
plus one (streaming_merge/kafka/broker.py). The e2e stream is produced in batches by default
(``--produce bulk``; key-partitioned, in order) followed by one tombstone per partition
alone in its batch, which makes the end offsets exact and which the job skips;
``--produce per-record`` uses the tests' helper (one record per acknowledged request,
~1k records/s). The produce rate printed is the harness's, not Kafka's.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import platform
import random
import shutil
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import deltalake
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyspark
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery
from pyspark.sql.types import StructType

from jobs import cdc_generator
from jobs.kafka_cdc_ingest import IngestConfig, start
from streaming_merge.kafka.broker import EmbeddedKafka, ProducedRecord
from streaming_merge.kafka.source import STATS_DIR_ENV, register
from streaming_merge.session import local_session
from streaming_merge.spark.packages import KAFKA_CONNECTOR, package_conf

TABLE = "orders"
SPARK_PHASES = ("latestOffset", "getBatch", "queryPlanning", "walCommit", "addBatch", "commitOffsets",
                "triggerExecution")
SINK_PHASES = ("materialize", "tombstones", "merge", "commit", "total")
QUERY_TIMEOUT_S = 3600.0


def _spark_progress(query: StreamingQuery) -> list[dict[str, Any]]:
    """Spark's progress records of this run of the query, as plain dicts."""
    return [json.loads(p.json) for p in query.recentProgress]


def _offsets(value: Any) -> dict[str, dict[str, int]]:
    if value is None:
        return {}
    return json.loads(value) if isinstance(value, str) else dict(value)


def _await(query: StreamingQuery) -> None:
    try:
        finished = query.awaitTermination(QUERY_TIMEOUT_S)
    finally:
        if query.isActive:
            query.stop()
    if not finished:
        raise SystemExit(f"query {query.name} did not finish within {QUERY_TIMEOUT_S:.0f}s")


# ------------------------------------------------------------------ clients alone and source alone

SOURCE_TOPIC = "bench.source"
WARMUP_TOPIC = "bench.warmup"
CLIENTS = ("confluent", "kafka-python")
_VALUE = json.dumps({"before": None, "after": {"order_id": 0, "customer_id": 42, "amount": 123.45,
                                               "status": "shipped", "note": "x" * 40},
                     "op": "u", "ts_ms": 1_700_000_000_000,
                     "source": {"connector": "postgresql", "lsn": 0, "table": "orders"}}).encode()


def client_available(client: str) -> bool:
    """Whether ``client`` (a ``kafka.client`` value) is importable in this interpreter."""
    module = {"confluent": "confluent_kafka", "kafka-python": "kafka"}[client]
    try:
        __import__(module)
    except ImportError:
        return False
    return True


def produce_bulk(bootstrap: str, topic: str, partitions: int, count: int) -> dict[int, int]:
    """``count`` records round-robin over ``partitions`` with a batching confluent-kafka
    producer (the one-record-per-request helper of the e2e part would take minutes), then
    one record per partition alone in its own batch: Tansu reports a partition's end as the
    start of its last batch plus one, so a final one-record batch makes the end exact.
    Returns the record count per partition."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.num.messages": 10_000,
                         "acks": "all"})
    per_partition = dict.fromkeys(range(partitions), 0)
    body = count - partitions
    for i in range(max(0, body)):
        part = i % partitions
        headers = [("trace", b"%016d" % i)] if i % 50 == 0 else None
        while True:
            try:
                producer.produce(topic, value=_VALUE, key=b"%d" % i, partition=part, headers=headers)
                break
            except BufferError:
                producer.poll(0.05)
        per_partition[part] += 1
    producer.flush(60)
    for part in range(partitions):
        producer.produce(topic, value=_VALUE, key=b"last", partition=part)
        producer.flush(60)
        per_partition[part] += 1
    return per_partition


def produce_keyed_bulk(bootstrap: str, topic: str, partitions: int,
                       items: list[tuple[bytes | None, bytes | None]]) -> list[ProducedRecord]:
    """The e2e stream in batches, partitioned by key as Java and kafka-python do (murmur2),
    in order per partition (one request in flight), with each record's acknowledgement.
    Then a tombstone per partition alone in its batch (the job skips tombstones), so Tansu's
    end offsets are exact; those are not in the returned list. Minutes faster than one
    record per request for 200k events."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.num.messages": 10_000,
                         "acks": "all", "partitioner": "murmur2_random",
                         "max.in.flight.requests.per.connection": 1})
    acks: list[ProducedRecord | None] = [None] * len(items)
    errors: list[str] = []

    def delivered(index: int, error: Any, message: Any) -> None:
        if error is not None:
            errors.append(str(error))
            return
        acks[index] = ProducedRecord(message.topic(), message.partition(), message.offset(), message.timestamp()[1])

    for index, (key, value) in enumerate(items):
        while True:
            try:
                producer.produce(topic, value=value, key=key,
                                 on_delivery=lambda e, m, i=index: delivered(i, e, m))
                break
            except BufferError:
                producer.poll(0.05)
    producer.flush(120)
    for part in range(partitions):
        producer.produce(topic, value=None, key=b"__bench_end__", partition=part)
        producer.flush(60)
    if errors or any(a is None for a in acks):
        raise SystemExit(f"producing to {topic} failed: {errors[:3] or 'records without acknowledgement'}")
    return [a for a in acks if a is not None]


def raw_confluent(bootstrap: str, topic: str, counts: dict[int, int]) -> float:
    """Seconds for one confluent-kafka consumer to hold every record, with the source's fetch
    settings (librdkafka's default fetch.queue.backoff.ms of 1 s stalls a fast reader).
    ``consume`` never asks for more records than remain: it blocks until it has
    ``num_messages`` or the timeout passes, so asking for more would time the timeout."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{time.time_ns()}",
                         "enable.auto.commit": False, "fetch.queue.backoff.ms": 5,
                         "queued.max.messages.kbytes": 4096})
    try:
        started = time.monotonic()
        consumer.assign([TopicPartition(topic, p, 0) for p in counts])
        remaining = sum(counts.values())
        deadline = started + 300
        while remaining > 0:
            if time.monotonic() > deadline:
                raise SystemExit(f"confluent-kafka: {remaining} records still missing after 300s")
            for message in consumer.consume(num_messages=min(10_000, remaining), timeout=1.0):
                if message.error() is not None:
                    raise SystemExit(f"confluent-kafka: {message.error()}")
                message.key(), message.value()
                remaining -= 1
        return time.monotonic() - started
    finally:
        consumer.close()


def raw_kafka_python(bootstrap: str, topic: str, counts: dict[int, int]) -> float:
    """Seconds for one kafka-python consumer (large poll and fetch sizes) to hold every record."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None,
                             max_poll_records=10_000, max_partition_fetch_bytes=8 << 20, fetch_max_bytes=64 << 20)
    try:
        started = time.monotonic()
        partitions = [TopicPartition(topic, p) for p in counts]
        consumer.assign(partitions)
        consumer.seek_to_beginning(*partitions)
        remaining = sum(counts.values())
        deadline = started + 300
        while remaining > 0:
            if time.monotonic() > deadline:
                raise SystemExit(f"kafka-python: {remaining} records still missing after 300s")
            for records in consumer.poll(timeout_ms=1000, max_records=10_000).values():
                for record in records:
                    record.key, record.value  # noqa: B018 - touch them as a reader would
                remaining -= len(records)
        return time.monotonic() - started
    finally:
        consumer.close()


def _worker_stats(folder: Path) -> dict[str, dict[str, float]]:
    """The executors' consumer-cache counters, one file per Python worker (see
    ``streaming_merge.kafka._clients.STATS_DIR_ENV``); cumulative per worker."""
    stats = {}
    for path in folder.glob("*.json"):
        try:
            stats[path.stem] = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
    return stats


def _stats_delta(before: dict[str, dict[str, float]], after: dict[str, dict[str, float]]) -> dict[str, float]:
    """What the workers did between two snapshots, summed over workers."""
    total: dict[str, float] = {}
    for pid, counters in after.items():
        for key, value in counters.items():
            if key != "cached":
                total[key] = total.get(key, 0) + value - before.get(pid, {}).get(key, 0)
    return total


def source_run(spark: SparkSession, bootstrap: str, topic: str, client: str, limit: int | None,
               checkpoint: str, stats_dir: Path | None = None) -> dict[str, Any]:
    """The ``kafka_py`` source alone: AvailableNow into the ``noop`` sink. Returns wall
    seconds, rows, Spark's per-batch progress figures and, with ``stats_dir``, what the
    executors' readers did (consumers created and reused, time inside the readers)."""
    register(spark)
    reader = (spark.readStream.format("kafka_py").option("kafka.bootstrap.servers", bootstrap)
              .option("subscribe", topic).option("startingOffsets", "earliest").option("kafka.client", client))
    if limit:
        reader = reader.option("maxOffsetsPerTrigger", str(limit))
    before = _worker_stats(stats_dir) if stats_dir else {}
    started = time.monotonic()
    query = (reader.load().writeStream.format("noop").option("checkpointLocation", checkpoint)
             .trigger(availableNow=True).queryName(f"kafka_py_{client.replace('-', '_')}").start())
    _await(query)
    seconds = time.monotonic() - started
    progress = [p for p in _spark_progress(query) if int(p.get("numInputRows", 0))]
    rows = sum(int(p["numInputRows"]) for p in progress)
    trigger_ms = sum(int(p.get("durationMs", {}).get("triggerExecution", 0)) for p in progress)
    return {"client": client, "maxOffsetsPerTrigger": limit, "seconds": round(seconds, 3), "rows": rows,
            "recordsPerSecond": rows / seconds if seconds else 0.0, "batches": len(progress),
            "triggerMs": [int(p.get("durationMs", {}).get("triggerExecution", 0)) for p in progress],
            "planningMs": [int(p.get("durationMs", {}).get("latestOffset", 0))
                           + int(p.get("durationMs", {}).get("getBatch", 0)) for p in progress],
            "sparkRowsPerSecond": rows / (trigger_ms / 1000) if trigger_ms else 0.0,
            "readers": _stats_delta(before, _worker_stats(stats_dir)) if stats_dir else {}}


def clients_and_source(spark: SparkSession, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """Parts (a) and (b): the raw clients and the source alone over one bulk-produced topic."""
    clients = [c for c in args.clients.split(",") if c]
    unknown = [c for c in clients if c not in CLIENTS]
    if unknown:
        raise SystemExit(f"--clients: unknown {unknown}; choose from {list(CLIENTS)}")
    missing = [c for c in clients if not client_available(c)]
    clients = [c for c in clients if c not in missing]
    result: dict[str, Any] = {"records": args.source_records, "partitions": args.partitions, "clientsMissing": missing,
                              "raw": [], "source": []}
    parts = set(args.parts.split(","))
    stats_dir = workdir / "consumer_stats"
    # Executors inherit the environment the data source is registered with (register() wraps
    # it with sc.environment): they then publish their consumer-cache counters there.
    spark.sparkContext.environment[STATS_DIR_ENV] = str(stats_dir)
    try:
        with EmbeddedKafka() as broker:
            broker.create_topic(SOURCE_TOPIC, args.partitions)
            started = time.monotonic()
            counts = produce_bulk(broker.bootstrap_servers, SOURCE_TOPIC, args.partitions, args.source_records)
            result["produceSeconds"] = round(time.monotonic() - started, 2)
            print(f"Produced {args.source_records} records to {SOURCE_TOPIC} ({args.partitions} partitions) in "
                  f"{result['produceSeconds']:.1f}s", flush=True)
            total = sum(counts.values())
            if "clients" in parts:
                readers = {"confluent": raw_confluent, "kafka-python": raw_kafka_python}
                for client in clients:
                    seconds = readers[client](broker.bootstrap_servers, SOURCE_TOPIC, counts)
                    result["raw"].append({"client": client, "seconds": round(seconds, 3), "records": total,
                                          "recordsPerSecond": total / seconds})
                    print(f"client alone, {client}: {total / seconds:,.0f} records/s", flush=True)
            if "source" in parts:
                # Not timed: the first streaming query of a session pays for JIT, class loading and
                # the Python workers' imports (~10 s here), which would be charged to one client.
                broker.create_topic(WARMUP_TOPIC, args.partitions)
                produce_bulk(broker.bootstrap_servers, WARMUP_TOPIC, args.partitions, 2_000)
                for client in clients:
                    source_run(spark, broker.bootstrap_servers, WARMUP_TOPIC, client, None,
                               str(workdir / f"warmup_{client}"))
                limits = [None] + ([args.source_max_offsets_per_trigger] if args.source_max_offsets_per_trigger
                                   else [])
                for client in clients:
                    for limit in limits:
                        name = f"source_{client}_{limit or 'all'}"
                        run_result = source_run(spark, broker.bootstrap_servers, SOURCE_TOPIC, client, limit,
                                                str(workdir / name), stats_dir)
                        if run_result["rows"] != total:
                            raise SystemExit(f"{name}: the source read {run_result['rows']} rows, expected {total}")
                        result["source"].append(run_result)
                        print(f"source alone, {client}, maxOffsetsPerTrigger={limit}: "
                              f"{run_result['recordsPerSecond']:,.0f} records/s", flush=True)
    finally:
        spark.sparkContext.environment.pop(STATS_DIR_ENV, None)
    return result


def print_clients_and_source(result: dict[str, Any]) -> None:
    print(f"\nKafka read, {result['records']} records in {result['partitions']} partition(s): records/s "
          "(client alone: one consumer of all partitions; kafka_py: records over the query's wall time, "
          "and over Spark's trigger time)")
    if result["clientsMissing"]:
        print(f"  not installed: {', '.join(result['clientsMissing'])}")
    for row in result["raw"]:
        print(f"  client alone  {row['client']:<13} {row['recordsPerSecond']:>9,.0f} {'':>9}  ({row['seconds']:.2f}s)")
    for row in result["source"]:
        limit = row["maxOffsetsPerTrigger"] or "none"
        readers = row.get("readers") or {}
        reuse = (f"; consumers created {int(readers.get('created', 0))}, reused {int(readers.get('reused', 0))}; "
                 f"in the readers {readers.get('readSeconds', 0):.1f}s wall, "
                 f"{readers.get('readCpuSeconds', 0):.1f}s CPU") if readers else ""
        print(f"  kafka_py      {row['client']:<13} {row['recordsPerSecond']:>9,.0f} "
              f"{row['sparkRowsPerSecond']:>9,.0f}  "
              f"({row['seconds']:.2f}s, {row['batches']} batch(es), maxOffsetsPerTrigger={limit}, "
              f"planning ms {row['planningMs']}{reuse})")


# ------------------------------------------------------------------ end to end

def read_only_run(spark: SparkSession, bootstrap: str, topic: str, limit: int, checkpoint: str
                  ) -> tuple[float, list[dict[str, Any]]]:
    """The source alone: the same options as the job, a batch function that only
    materializes the records as the job's first step does. Returns (seconds, progress)."""
    register(spark)

    def materialize(records: DataFrame, _: int) -> None:
        records.localCheckpoint()

    reader = (spark.readStream.format("kafka_py").option("kafka.bootstrap.servers", bootstrap)
              .option("subscribe", topic).option("startingOffsets", "earliest")
              .option("maxOffsetsPerTrigger", str(limit)))
    started = time.monotonic()
    query = (reader.load().writeStream.foreachBatch(materialize).option("checkpointLocation", checkpoint)
             .trigger(availableNow=True).queryName("kafka_read_only").start())
    _await(query)
    return time.monotonic() - started, _spark_progress(query)


def ingest_run(spark: SparkSession, config: IngestConfig
               ) -> tuple[float, list[dict[str, Any]], dict[int, dict[str, Any]]]:
    """The job itself. Returns (seconds, Spark progress, sink progress by batchId with the
    wall-clock time at which ``on_progress`` saw the batch, i.e. right after its commit)."""
    sink_progress: dict[int, dict[str, Any]] = {}

    def on_progress(progress: dict[str, Any]) -> None:
        sink_progress[int(progress["batchId"])] = {**progress, "committedAtMs": time.time() * 1000}

    started = time.monotonic()
    query = start(spark, config, on_progress=on_progress)
    _await(query)
    return time.monotonic() - started, _spark_progress(query), sink_progress


def _last_produced(produced_at: dict[tuple[int, int], int], partition: int, start: int, end: int) -> int | None:
    """Producer timestamp of the batch's last record in ``partition``, skipping the
    end-marking tombstone of bulk producing (not in ``produced_at``)."""
    for offset in range(end - 1, max(start, end - 2) - 1, -1):
        if (partition, offset) in produced_at:
            return produced_at[(partition, offset)]
    return None


def batch_rows(spark_progress: list[dict[str, Any]], sink_progress: dict[int, dict[str, Any]],
               produced_at: dict[tuple[int, int], int], topic: str) -> list[dict[str, Any]]:
    """One row per batch joining Spark's and the sink's progress by batchId."""
    rows = []
    for spark_record in spark_progress:
        batch_id = int(spark_record["batchId"])
        durations = spark_record.get("durationMs", {})
        source = (spark_record.get("sources") or [{}])[0]
        start_offsets = _offsets(source.get("startOffset")).get(topic, {})
        end_offsets = _offsets(source.get("endOffset")).get(topic, {})
        sink = sink_progress.get(batch_id, {})
        sink_ms = sink.get("durationMs", {})
        last_produced = [_last_produced(produced_at, int(p), start_offsets.get(p, 0), end)
                         for p, end in end_offsets.items() if end > start_offsets.get(p, 0)]
        last_ts = max((t for t in last_produced if t is not None), default=None)
        committed = sink.get("committedAtMs")
        row: dict[str, Any] = {
            "batchId": batch_id,
            "numInputRows": int(spark_record.get("numInputRows", 0)),
            "spark": {phase: int(durations.get(phase, 0)) for phase in SPARK_PHASES},
            "sink": {phase: int(sink_ms.get(phase, 0)) for phase in sink_ms},
            "malformedRecords": int(sink.get("malformedRecords", 0)),
            "tableVersion": sink.get("tableVersion"),
            "ageAtCommitMs": round(committed - last_ts) if committed is not None and last_ts is not None else None,
        }
        row["readDecodeDeadLetterMs"] = max(0, row["spark"]["addBatch"] - row["sink"].get("total", 0))
        row["offsetPlanningMs"] = row["spark"]["latestOffset"] + row["spark"]["getBatch"]
        rows.append(row)
    return rows


def verify(target: str, dead_letter: str, expected: dict[int, dict[str, Any]], malformed: int
           ) -> dict[str, Any]:
    """Compare as jobs/kafka_cdc_demo.py does; the dead letters must be exactly the malformed records."""
    spec = cdc_generator.TABLES[TABLE]
    columns = [c.split()[0] for c in spec["schema"].split(",")]
    rows = _read(target).to_pylist()
    actual = {r[spec["key"]]: {c: r[c] for c in columns} for r in rows}
    dead = _read(dead_letter, ["offset"]).num_rows if os.path.exists(dead_letter) else 0
    table_ok = actual == expected and len(rows) == len(actual)
    return {"ok": table_ok and dead == malformed, "tableOk": table_ok, "rows": len(rows),
            "expectedRows": len(expected), "deadLetters": dead, "expectedDeadLetters": malformed}


def _fmt(value: Any) -> str:
    return "-" if value is None else str(value)


def print_report(result: dict[str, Any]) -> None:
    if "stacks" in result:
        from bench.kafka_stacks import print_stacks

        print_stacks(result["stacks"])
    if "read" in result:
        print_clients_and_source(result["read"])
    if "runs" in result:  # --ab: each run, then the comparison
        for run in result["runs"]:
            print_e2e(result["config"], run["summary"], run["batches"], run["check"], result["environment"],
                      run["mode"], run["round"])
        print_comparison(result["config"], result["comparison"])
        return
    if "summary" not in result:
        return
    print_e2e(result["config"], result["summary"], result["batches"], result["check"], result["environment"])


def _target_text(config: dict[str, Any], mode: str | None) -> str:
    """How the target was made, for a run with --target-rows, --deletion-vectors or --ab ('' otherwise)."""
    if "targetRows" not in config:
        return ""
    dv = mode == "deletion-vectors" if mode is not None else bool(config["deletionVectors"])
    where = (f"into a pre-built {config['targetRows']}-row target ({config['target']['files']} files)"
             if config["targetRows"] else "into a table the job creates")
    return f"; {where}, {'deletion vectors' if dv else 'copy-on-write'}"


def print_e2e(config: dict[str, Any], summary: dict[str, Any], batches: list[dict[str, Any]], check: dict[str, Any],
              environment: dict[str, Any], mode: str | None = None, round_no: int | None = None) -> None:
    """One ingestion run: per batch, then throughput, latency, time split and the check (``mode``
    and ``round_no``: a run of --ab)."""
    print(f"\n{f'== {mode}, round {round_no}' + chr(10) if mode else ''}"
          f"Kafka CDC ingestion: {summary['records']} records ({summary['changeEvents']} change events) in "
          f"{config['partitions']} partition(s), maxOffsetsPerTrigger={config['maxOffsetsPerTrigger']}, "
          f"{environment['master']}, load average before {environment['loadavgBefore']}"
          f"{_target_text(config, mode)}")
    header = ("batch", "rows", "trigger", "latestOff+getBatch", "addBatch", "sink.total", "sink.merge",
              "read+decode+DLQ", "age@commit")
    widths = [max(8, len(h)) for h in header]
    print(" | ".join(f"{h:>{w}}" for h, w in zip(header, widths, strict=True)))
    for row in batches:
        cells = (row["batchId"], row["numInputRows"], row["spark"]["triggerExecution"], row["offsetPlanningMs"],
                 row["spark"]["addBatch"], row["sink"].get("total"), row["sink"].get("merge"),
                 row["readDecodeDeadLetterMs"], row["ageAtCommitMs"])
        print(" | ".join(f"{_fmt(c):>{w}}" for c, w in zip(cells, widths, strict=True)))
    print("(milliseconds)")
    print(f"ingest:      {summary['ingestSeconds']:.1f}s → {summary['recordsPerSecond']:.0f} records/s "
          f"({summary['eventsPerSecond']:.0f} change events/s end to end)")
    if "sustainedRecordsPerSecond" in summary:
        print(f"sustained:   {summary['sustainedRecordsPerSecond']:.0f} records/s "
              f"(~{summary['sustainedEventsPerSecond']:.0f} change events/s) over the "
              f"{summary['sustainedBatches']} batches after the first (Spark triggerExecution)")
    if "batchMsP50" in summary:
        print(f"batch:       p50 {summary['batchMsP50']} ms, p95 {summary['batchMsP95']} ms, max "
              f"{summary['batchMsMax']} ms (Spark triggerExecution of the batches with records); second half "
              f"({summary['secondHalfBatches']} batches): p50 {summary['secondHalfBatchMsP50']} ms, "
              f"p95 {summary['secondHalfBatchMsP95']} ms")
    if summary.get("readOnlySeconds") is not None:
        print(f"read only:   {summary['readOnlySeconds']:.1f}s → {summary['readOnlyRecordsPerSecond']:.0f} records/s "
              "(the kafka_py source + materialize, no decode, no sink)")
    print(f"time split:  sink {summary['sinkShare']:.0%} of addBatch, read+decode+dead letters "
          f"{1 - summary['sinkShare']:.0%}; offset planning {summary['offsetPlanningMs']} ms in total; "
          f"median batch {summary['medianBatchMs']} ms")
    mark = "✓" if check["ok"] else "✗"
    print(f"check:       {mark} table {check['rows']} rows (expected {check['expectedRows']}, "
          f"{'equal' if check['tableOk'] else 'DIFFERENT'}); dead letters {check['deadLetters']} "
          f"(expected {check['expectedDeadLetters']})")
    if "filesWithDv" in check and "targetRows" in config:
        print(f"table:       {check['files']} files, {check['filesWithDv']} with a deletion vector, "
              f"{check['bytes'] / 1e6:.1f} MB; protocol {'has' if check['deletionVectors'] else 'has no'} "
              "deletionVectors")


def print_comparison(config: dict[str, Any], comparison: dict[str, Any]) -> None:
    """--ab: the medians per table mode and the ratios deletion vectors / copy-on-write."""
    where = (f"a pre-built {config['targetRows']}-row target" if config["targetRows"] else "a table the job creates")
    print(f"\nA/B into {where}, {config['events']} change events, maxOffsetsPerTrigger={config['maxOffsetsPerTrigger']}"
          f", median of {config['rounds']} round(s) (order alternating)")
    header = ("mode", "runs", "events/s", "sustained events/s", "batch p50 ms", "2nd half p50 ms", "sink.merge p50 ms")
    print("  ".join(f"{h:>18}" if i else f"{h:<18}" for i, h in enumerate(header)))
    for mode, row in comparison["modes"].items():
        cells = (row["runs"], row["eventsPerSecond"], row["sustainedEventsPerSecond"], row["batchMsP50"],
                 row["secondHalfBatchMsP50"], row["sinkMergeMsP50"])
        print("  ".join([f"{mode:<18}"] + [f"{'-' if c is None else f'{c:,.0f}':>18}" for c in cells]))

    def ratio(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f}x"

    met = comparison["eventsPerSecondRatio"] is not None and \
        comparison["eventsPerSecondRatio"] >= comparison["targetRatio"]
    print(f"deletion vectors / copy-on-write: {ratio(comparison['eventsPerSecondRatio'])} events/s "
          f"(target >= {comparison['targetRatio']:.0f}x: {'met' if met else 'NOT met'}), "
          f"{ratio(comparison['sustainedEventsPerSecondRatio'])} sustained events/s")


def _percentile(values: list[int], share: float) -> int:
    """Nearest-rank percentile (no interpolation: a batch that happened)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(share * len(ordered)) - 1)]


def _latency(batches: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-batch latency from Spark's progress (triggerExecution: planning, read, decode,
    sink, commit) over the batches that carried records."""
    durations = [b["spark"]["triggerExecution"] for b in batches if b["numInputRows"]]
    if not durations:
        return {}
    later = durations[len(durations) // 2:]
    return {"batchMsP50": _percentile(durations, 0.50), "batchMsP95": _percentile(durations, 0.95),
            "batchMsMax": max(durations), "secondHalfBatches": len(later),
            "secondHalfBatchMsP50": _percentile(later, 0.50), "secondHalfBatchMsP95": _percentile(later, 0.95)}


def _sustained(batches: list[dict[str, Any]], event_share: float) -> dict[str, Any]:
    """The rate once the query runs: records over Spark's triggerExecution of every batch after
    the first (which starts the Python workers and warms the JIT, paid once per query), and the
    change events among them at the stream's share of events per record."""
    later = [b for b in batches[1:] if b["numInputRows"]]
    spent_ms = sum(b["spark"]["triggerExecution"] for b in later)
    if not later or not spent_ms:
        return {}
    records = sum(b["numInputRows"] for b in later)
    return {"sustainedBatches": len(later), "sustainedRecordsPerSecond": records * 1000 / spent_ms,
            "sustainedEventsPerSecond": records * event_share * 1000 / spent_ms}


def _mode_name(deletion_vectors: bool) -> str:
    return "deletion-vectors" if deletion_vectors else "copy-on-write"


def e2e_run(spark: SparkSession, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """The end-to-end part: produce a generated CDC stream, read-only pass, the real job (with
    ``--ab``, once per table mode and round, each into its own copy of the pre-built target)."""
    keys = args.keys or (args.target_rows if args.target_rows else max(10, args.events // 10))
    with EmbeddedKafka() as broker:
        topic = f"bench.public.{TABLE}"
        broker.create_topic(topic, args.partitions)
        records, state = cdc_generator.generate(TABLE, args.events, keys, seed=args.seed)
        produce_started = time.monotonic()
        items = [(r.key, r.value) for r in records]
        if args.produce == "bulk":
            acks: list[ProducedRecord] = produce_keyed_bulk(broker.bootstrap_servers, topic, args.partitions, items)
            how = f"in batches, plus {args.partitions} end-marking tombstone(s)"
        else:
            acks = broker.produce(topic, items)
            how = "one record per request, see the module docstring"
        produce_s = time.monotonic() - produce_started
        print(f"Produced {len(records)} records to {topic} in {produce_s:.1f}s ({how})", flush=True)
        produced_at = {(a.partition, a.offset): a.timestamp_ms for a in acks}
        malformed = sum(1 for r in records if r.key == b"bad")
        events = sum(1 for r in records if r.value is not None and r.key != b"bad")

        read_s, read_progress = None, []
        if not args.skip_read_baseline:
            read_s, read_progress = read_only_run(spark, broker.bootstrap_servers, topic,
                                                  args.max_offsets_per_trigger, str(workdir / "read_checkpoint"))
            print(f"Read-only pass: {read_s:.1f}s", flush=True)

        master: Path | None = None
        prebuilt: pa.Table | None = None
        target_info: dict[str, Any] = {}
        if args.target_rows:
            master = workdir / "target_master"
            prebuilt, target_info = build_target(spark, master, args.target_rows, args.target_files,
                                                 args.partitions, args.seed)
            print(f"Pre-built target: {args.target_rows} rows in {target_info['files']} files "
                  f"({target_info['bytes'] / 1e6:.1f} MB, {target_info['seconds']:.1f}s, not timed)", flush=True)
        expected = cdc_generator.expected_rows(state)

        spec = cdc_generator.TABLES[TABLE]
        common = {"records": records, "events": events, "malformed": malformed, "keys": keys,
                  "produce_s": produce_s, "read_s": read_s, "read_progress": read_progress,
                  "produced_at": produced_at, "topic": topic}
        runs: list[dict[str, Any]] = []
        modes = [False, True] if args.ab else [args.deletion_vectors]
        for round_no in range(args.rounds if args.ab else 1):
            for deletion_vectors in (modes if round_no % 2 == 0 else modes[::-1]):
                # The single-mode run keeps the folders it always had (--workdir/--keep).
                run_dir = workdir / f"{_mode_name(deletion_vectors)}-{round_no + 1}" if args.ab else workdir
                config = IngestConfig(
                    bootstrap_servers=broker.bootstrap_servers, topics=topic, target=str(run_dir / TABLE),
                    keys=[spec["key"]], checkpoint=str(run_dir / "checkpoint"),
                    dead_letter=str(run_dir / "dead_letter"), row_schema=spec["schema"], available_now=True,
                    max_offsets_per_trigger=args.max_offsets_per_trigger, deletion_vectors=deletion_vectors)
                if master is not None:
                    copy_target(spark, master, Path(config.target), deletion_vectors)
                ingest_s, spark_progress, sink_progress = ingest_run(spark, config)
                if args.ab:
                    print(f"Ingest ({_mode_name(deletion_vectors)}, round {round_no + 1}): {ingest_s:.1f}s", flush=True)
                else:
                    print(f"Ingest: {ingest_s:.1f}s", flush=True)
                if prebuilt is not None:
                    check = verify_onto(config.target, str(config.dead_letter), prebuilt, records, expected,
                                        malformed)
                else:
                    check = verify(config.target, str(config.dead_letter), expected, malformed)
                if args.target_rows or args.deletion_vectors or args.ab:
                    check.update(table_layout(config.target))
                runs.append({"mode": _mode_name(deletion_vectors), "round": round_no + 1,
                             **_run_result(common, ingest_s, spark_progress, sink_progress, check)})
                if args.ab and not args.keep:
                    shutil.rmtree(run_dir, ignore_errors=True)
    config_out: dict[str, Any] = {
        "events": args.events, "keys": keys, "partitions": args.partitions, "seed": args.seed,
        "maxOffsetsPerTrigger": args.max_offsets_per_trigger, "master": args.master,
        "readBaseline": not args.skip_read_baseline}
    if args.target_rows or args.deletion_vectors or args.ab:  # the default run's JSON stays as it was
        config_out.update(targetRows=args.target_rows, targetFiles=args.target_files if args.target_rows else None,
                          deletionVectors="both" if args.ab else args.deletion_vectors, target=target_info or None)
    expected_batches = math.ceil(len(records) / args.max_offsets_per_trigger)
    if not args.ab:
        run = runs[0]
        return {"config": config_out, "summary": run["summary"], "batches": run["batches"], "check": run["check"],
                "expectedBatches": expected_batches}
    comparison = compare_modes(runs)
    return {"config": {**config_out, "rounds": args.rounds}, "runs": runs, "comparison": comparison,
            "check": {"ok": all(r["check"]["ok"] for r in runs)}, "expectedBatches": expected_batches}


def _run_result(common: dict[str, Any], ingest_s: float, spark_progress: list[dict[str, Any]],
                sink_progress: dict[int, dict[str, Any]], check: dict[str, Any]) -> dict[str, Any]:
    """One ingestion run's summary (throughput, sustained rate, latency, time split), batches and check."""
    records, events, read_s, read_progress = (common["records"], common["events"], common["read_s"],
                                              common["read_progress"])
    batches = batch_rows(spark_progress, sink_progress, common["produced_at"], common["topic"])
    add_batch = sum(b["spark"]["addBatch"] for b in batches)
    sink_total = sum(b["sink"].get("total", 0) for b in batches)
    summary = {
        "records": len(records), "changeEvents": events, "malformed": common["malformed"], "keys": common["keys"],
        "produceSeconds": round(common["produce_s"], 2),
        "ingestSeconds": round(ingest_s, 2), "batches": len(batches),
        "recordsPerSecond": len(records) / ingest_s, "eventsPerSecond": events / ingest_s,
        "readOnlySeconds": round(read_s, 2) if read_s is not None else None,
        "readOnlyRecordsPerSecond": len(records) / read_s if read_s else None,
        "readOnlyBatchMs": [int(p.get("durationMs", {}).get("triggerExecution", 0)) for p in read_progress],
        "sinkShare": sink_total / add_batch if add_batch else 0.0,
        "offsetPlanningMs": sum(b["offsetPlanningMs"] for b in batches),
        "medianBatchMs": int(statistics.median([b["spark"]["triggerExecution"] for b in batches])) if batches else 0,
        **_latency(batches),
        **_sustained(batches, events / len(records) if records else 0.0),
    }
    return {"summary": summary, "batches": batches, "check": check}


def compare_modes(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per table mode the median over rounds of events/s (whole run and sustained) and batch p50;
    the ratios deletion vectors / copy-on-write (the issue's target: >= 2x events/s)."""
    per_mode: dict[str, dict[str, Any]] = {}
    for mode in ("copy-on-write", "deletion-vectors"):
        summaries = [r["summary"] for r in runs if r["mode"] == mode]
        row: dict[str, Any] = {"runs": len(summaries)}
        for key in ("eventsPerSecond", "sustainedEventsPerSecond", "batchMsP50", "secondHalfBatchMsP50"):
            values = [s[key] for s in summaries if s.get(key) is not None]
            row[key] = statistics.median(values) if values else None
        row["sinkMergeMsP50"] = _median_phase([r for r in runs if r["mode"] == mode], "merge")
        per_mode[mode] = row
    cow, dv = per_mode["copy-on-write"], per_mode["deletion-vectors"]

    def ratio(key: str) -> float | None:
        return dv[key] / cow[key] if dv.get(key) and cow.get(key) else None

    return {"modes": per_mode, "eventsPerSecondRatio": ratio("eventsPerSecond"),
            "sustainedEventsPerSecondRatio": ratio("sustainedEventsPerSecond"), "targetRatio": 2.0}


def _median_phase(runs: list[dict[str, Any]], phase: str) -> float | None:
    values = [b["sink"][phase] for r in runs for b in r["batches"] if b["numInputRows"] and phase in b["sink"]]
    return statistics.median(values) if values else None


# ------------------------------------------------------------------ a pre-built target

PREBUILT_POSITION = 0  # below every generated event's source.lsn (seed * 1,000,000 + n): events win
PREBUILT_TS_MS = 1_600_000_000_000


def target_schema(spark: SparkSession) -> StructType:
    """The columns the job gives the table it creates: the row image, then the CDC metadata
    (the decoder's output without the sink's internal ``__sm_`` columns)."""
    from streaming_merge.kafka import debezium
    from streaming_merge.kafka.source import SCHEMA

    spec = cdc_generator.TABLES[TABLE]
    events, _ = debezium.decode(spark.createDataFrame([], SCHEMA), StructType.fromDDL(spec["schema"]),
                                keys=[spec["key"]])
    return StructType([f for f in events.schema.fields if not f.name.startswith("__sm_")])


def build_target(spark: SparkSession, path: Path, rows: int, files: int, partitions: int, seed: int
                 ) -> tuple[pa.Table, dict[str, Any]]:
    """A table of ``rows`` rows (keys 0..rows-1, made by cdc_generator's row maker) in ``files``
    files with disjoint key ranges, with the job's schema and without deletion vectors
    (``copy_target`` turns them on for a run). Its CDC columns are those of a Debezium snapshot
    read through ``partitions`` partitions: op 'r', the snapshot's one position (0, below every
    event's), a timestamp and a Kafka offset per row, so the table is as large as one the job
    wrote (constant columns would shrink it to a quarter and flatter copy-on-write). Returns the
    row columns (what the check compares) and the table's layout."""
    from pyspark.sql import functions as F

    from streaming_merge import DeltaTable
    from streaming_merge.kafka import debezium

    started = time.monotonic()
    spec = cdc_generator.TABLES[TABLE]
    schema = target_schema(spark)
    rng = random.Random(seed * 7919 + 1)
    row_arrow = _row_arrow_schema()
    table = pa.Table.from_pylist([spec["make"](rng, k, PREBUILT_POSITION) for k in range(rows)], schema=row_arrow)
    keys = np.arange(rows, dtype=np.int64)
    metadata = {debezium.OP: pa.array(np.full(rows, "r")),
                debezium.POSITION: pa.array(np.full(rows, PREBUILT_POSITION, dtype=np.int64)),
                debezium.TS_MS: pa.array(PREBUILT_TS_MS + keys),
                debezium.PARTITION: pa.array((keys % partitions).astype(np.int32)),
                debezium.OFFSET: pa.array(keys // partitions)}
    full = table
    for name in [f.name for f in schema.fields if f.name not in table.column_names]:
        full = full.append_column(name, metadata[name])
    frame = spark.createDataFrame(full).select(*[F.col(f"`{f.name}`").cast(f.dataType) for f in schema.fields])
    DeltaTable.createFromDataFrame(frame.repartitionByRange(max(1, files), spec["key"]), str(path))
    deltalake.DeltaTable(str(path)).create_checkpoint()
    return table, {**table_layout(str(path)), "seconds": round(time.monotonic() - started, 1)}


def _row_arrow_schema() -> pa.Schema:
    types = {"long": pa.int64(), "double": pa.float64(), "string": pa.string(), "int": pa.int32()}
    fields = [c.split() for c in cdc_generator.TABLES[TABLE]["schema"].split(",")]
    return pa.schema([pa.field(name, types[kind]) for name, kind in fields])


def copy_target(spark: SparkSession, master: Path, target: Path, deletion_vectors: bool) -> None:
    """A run's own copy of the pre-built target; with DVs turned on for a deletion-vector run."""
    from streaming_merge import DeltaTable

    shutil.copytree(master, target)
    if deletion_vectors:
        DeltaTable.forPath(spark, str(target)).enableDeletionVectors()


def table_layout(path: str) -> dict[str, Any]:
    """Live files, bytes, files with a DV and whether the protocol has deletion vectors, from the log."""
    from streaming_merge.table.snapshot import load_snapshot

    if not os.path.exists(path):
        return {}
    snapshot = load_snapshot(path)
    return {"files": len(snapshot.files), "bytes": sum(f.size for f in snapshot.files),
            "filesWithDv": sum(1 for f in snapshot.files if f.deletion_vector is not None),
            "deletionVectors": snapshot.has_deletion_vectors}


def _read(path: str, columns: list[str] | None = None) -> pa.Table:
    """The table's rows through delta-rs' DataFusion scan, which applies deletion vectors
    (``to_pyarrow_table()`` refuses a table that has them)."""
    return pa.table(deltalake.DeltaTable(path).scan(columns=columns))


def verify_onto(target: str, dead_letter: str, prebuilt: pa.Table, records: list[cdc_generator.Record],
                changed: dict[int, dict[str, Any]], malformed: int) -> dict[str, Any]:
    """The check for a pre-built target, in Arrow: the keys no event touched keep their pre-built
    row; a touched key holds the generator's final row, or is gone when its last event deletes it."""
    spec = cdc_generator.TABLES[TABLE]
    key = spec["key"]
    row_arrow = _row_arrow_schema()
    touched = pa.array(sorted({int(r.key) for r in records if r.value is not None and r.key != b"bad"}), pa.int64())
    kept = prebuilt.filter(pc.invert(pc.is_in(prebuilt[key], value_set=touched)))
    expected = pa.concat_tables([kept, pa.Table.from_pylist(list(changed.values()), schema=row_arrow)]).sort_by(key)
    actual = _read(target, row_arrow.names)  # delta-rs' scan gives string_view columns: cast, then sort
    actual = pa.table([actual[n].cast(row_arrow.field(n).type) for n in row_arrow.names], schema=row_arrow).sort_by(key)
    table_ok = actual.num_rows == expected.num_rows and all(
        actual[n].equals(expected[n]) for n in row_arrow.names)
    dead = _read(dead_letter, ["offset"]).num_rows if os.path.exists(dead_letter) else 0
    check: dict[str, Any] = {"ok": table_ok and dead == malformed, "tableOk": table_ok, "rows": actual.num_rows,
                             "expectedRows": expected.num_rows, "deadLetters": dead, "expectedDeadLetters": malformed}
    if not table_ok:
        got, want = set(actual[key].to_pylist()), set(expected[key].to_pylist())
        check.update(missingKeys=len(want - got), extraKeys=len(got - want),
                     duplicatedKeys=actual.num_rows - len(got))
    return check


def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    load_before = os.getloadavg()
    parts = set(args.parts.split(","))
    unknown = parts - {"clients", "source", "e2e", "stacks"}
    if unknown:
        raise SystemExit(f"--parts: unknown {sorted(unknown)}; choose from clients, source, e2e, stacks")
    # The stacks part runs Spark's Kafka connector and Delta Lake beside ours, in this session.
    extra = package_conf((KAFKA_CONNECTOR, "delta")) if "stacks" in parts else {}
    spark = local_session("kafka_ingest_bench", args.master, short_run=args.jit == "c1", late_c2=args.jit == "late-c2",
                          extra_conf=extra)
    spark.range(10_000).selectExpr("sum(id)").collect()  # JVM and executors up before any clock starts
    result: dict[str, Any] = {"benchmark": "kafka_ingest", "created": datetime.now(UTC).isoformat(timespec="seconds"),
                              "parts": sorted(parts)}
    try:
        if parts & {"clients", "source"}:
            result["read"] = clients_and_source(spark, args, workdir)
        if "e2e" in parts:
            result.update(e2e_run(spark, args, workdir))
        if "stacks" in parts:
            from bench.kafka_stacks import stacks_run

            result["stacks"] = stacks_run(spark, args, workdir)
    finally:
        spark.stop()
    result["environment"] = {
        "python": platform.python_version(), "pyspark": pyspark.__version__, "deltalake": deltalake.__version__,
        "cpus": os.cpu_count(), "platform": platform.platform(), "master": args.master, "jit": args.jit,
        "loadavgBefore": [round(x, 2) for x in load_before],
        "loadavgAfter": [round(x, 2) for x in os.getloadavg()],
        "broker": "tansu (embedded)" + (", Apache Kafka 4.4 (stacks)" if "stacks" in parts else "")}
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=20_000, help="generated change events (before duplicates, "
                        "tombstones and malformed records are added)")
    parser.add_argument("--keys", type=int, default=None, help="distinct keys (default: events / 10)")
    parser.add_argument("--max-offsets-per-trigger", type=int, default=5000)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--jit", choices=("tiered", "late-c2", "c1"), default="tiered",
                        help="the driver JVM's JIT, as the job's --jit: tiered (the JVM's default, the default here), "
                        "late-c2 (the job's default for a run that goes on), c1 (its default for --available-now)")
    parser.add_argument("--skip-read-baseline", action="store_true", help="skip the e2e read-only pass")
    parser.add_argument("--parts", default="clients,source,e2e",
                        help="comma list of: clients (the Kafka clients alone), source (the kafka_py source "
                             "alone), e2e (the ingestion job)")
    parser.add_argument("--source-records", type=int, default=400_000,
                        help="records in the topic read by the clients and source parts")
    parser.add_argument("--source-max-offsets-per-trigger", type=int, default=100_000,
                        help="the source part also runs with this limit (several micro-batches); 0 to skip")
    parser.add_argument("--clients", default=",".join(CLIENTS), help="kafka.client values to compare")
    parser.add_argument("--produce", choices=("bulk", "per-record"), default="bulk",
                        help="e2e: produce in key-partitioned batches (default; fast enough for 200k events) or one "
                             "record per request (the test helper; ~1k records/s)")
    parser.add_argument("--target-rows", type=int, default=0,
                        help="e2e: ingest into a target of this many rows, built before the clock starts (keys 0..N-1; "
                             "--keys defaults to N, so the change events update and delete its rows); default 0: the "
                             "job creates the table from its first batch")
    parser.add_argument("--target-files", type=int, default=20, help="files of the --target-rows target")
    parser.add_argument("--deletion-vectors", action="store_true",
                        help="e2e: the target has deletion vectors (the pre-built one is upgraded, a new one is "
                             "created with them: the job's --deletion-vectors)")
    parser.add_argument("--ab", action="store_true",
                        help="e2e: run the job twice on the same topic, copy-on-write and deletion vectors, each into "
                             "its own copy of the target; print both and the ratio of their events/s")
    parser.add_argument("--rounds", type=int, default=1,
                        help="with --ab: rounds of both runs, alternating which goes first (medians are compared)")
    parser.add_argument("--quick", action="store_true",
                        help="stacks: a 100k-row target, 2k- and 10k-record batches, no warm-up (a smoke run)")
    parser.add_argument("--stacks", default="ours,spark-kafka,standard",
                        help="stacks part: comma list of ours, spark-kafka, standard (bench/kafka_stacks.py)")
    parser.add_argument("--batch-sizes", default=None,
                        help="stacks part: records a batch (maxOffsetsPerTrigger), comma list (default 5000,50000)")
    parser.add_argument("--stack-batches", type=int, default=0,
                        help="stacks part: batches per run after the first (default 5, --quick 3)")
    parser.add_argument("--skip-malformed", action="store_true", help="stacks part: no 1 %% malformed run")
    parser.add_argument("--out", default="bench/results/kafka_ingest.json")
    parser.add_argument("--workdir", default=None, help="where tables and checkpoints go (default: a temp folder)")
    parser.add_argument("--keep", action="store_true", help="keep the workdir")
    args = parser.parse_args(argv)
    if args.target_rows < 0 or args.target_files < 1 or args.rounds < 1:
        parser.error("--target-rows >= 0, --target-files >= 1 and --rounds >= 1")
    if args.ab and args.deletion_vectors:
        parser.error("--ab runs both table modes; --deletion-vectors picks one")
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("kafka").setLevel(logging.ERROR)
    logging.getLogger("py4j").setLevel(logging.WARNING)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="kafka_ingest_bench_"))
    try:
        result = run(args, workdir)
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    print_report(result)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"wrote {out}")
    ok = result.get("check", {"ok": True})["ok"]
    if "stacks" in result:
        from bench.kafka_stacks import stacks_ok

        ok = ok and stacks_ok(result["stacks"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
