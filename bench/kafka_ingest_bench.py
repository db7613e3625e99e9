"""Kafka ingestion benchmark: the Kafka clients alone, the ``kafka_py`` source alone, and
embedded broker → ``jobs.kafka_cdc_ingest`` → Delta, side by side in one run.

    python -m bench.kafka_ingest_bench [--parts clients,source,e2e] [--source-records 400000]
        [--clients confluent,kafka-python] [--events 20000] [--max-offsets-per-trigger 5000] [--partitions 2]

    # sustained end to end: events/s and per-batch latency p50/p95 over large batches
    python -m bench.kafka_ingest_bench --parts e2e --events 200000 --max-offsets-per-trigger 100000

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

The run is checked: the Delta table (read back with delta-rs) must equal the state the
generator computed independently, and the dead-letter table must hold exactly the
malformed records (✓/✗; exit status 1 on ✗). Results go to ``bench/results/`` as JSON.

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
import shutil
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import deltalake
import pyspark
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from jobs import cdc_generator
from jobs.kafka_cdc_ingest import IngestConfig, start
from streaming_merge.kafka.broker import EmbeddedKafka, ProducedRecord
from streaming_merge.kafka.source import STATS_DIR_ENV, register
from streaming_merge.session import local_session

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
    rows = deltalake.DeltaTable(target).to_pyarrow_table().to_pylist()
    actual = {r[spec["key"]]: {c: r[c] for c in columns} for r in rows}
    dead = len(deltalake.DeltaTable(dead_letter).to_pyarrow_table()) if os.path.exists(dead_letter) else 0
    table_ok = actual == expected and len(rows) == len(actual)
    return {"ok": table_ok and dead == malformed, "tableOk": table_ok, "rows": len(rows),
            "expectedRows": len(expected), "deadLetters": dead, "expectedDeadLetters": malformed}


def _fmt(value: Any) -> str:
    return "-" if value is None else str(value)


def print_report(result: dict[str, Any]) -> None:
    if "read" in result:
        print_clients_and_source(result["read"])
    if "summary" not in result:
        return
    config, summary, check = result["config"], result["summary"], result["check"]
    print(f"\nKafka CDC ingestion: {summary['records']} records ({summary['changeEvents']} change events) in "
          f"{config['partitions']} partition(s), maxOffsetsPerTrigger={config['maxOffsetsPerTrigger']}, "
          f"{result['environment']['master']}, load average before {result['environment']['loadavgBefore']}")
    header = ("batch", "rows", "trigger", "latestOff+getBatch", "addBatch", "sink.total", "sink.merge",
              "read+decode+DLQ", "age@commit")
    widths = [max(8, len(h)) for h in header]
    print(" | ".join(f"{h:>{w}}" for h, w in zip(header, widths, strict=True)))
    for row in result["batches"]:
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


def e2e_run(spark: SparkSession, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """The end-to-end part: produce a generated CDC stream, read-only pass, the real job."""
    keys = args.keys or max(10, args.events // 10)
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

        spec = cdc_generator.TABLES[TABLE]
        config = IngestConfig(
            bootstrap_servers=broker.bootstrap_servers, topics=topic, target=str(workdir / TABLE),
            keys=[spec["key"]], checkpoint=str(workdir / "checkpoint"), dead_letter=str(workdir / "dead_letter"),
            row_schema=spec["schema"], available_now=True, max_offsets_per_trigger=args.max_offsets_per_trigger)
        ingest_s, spark_progress, sink_progress = ingest_run(spark, config)
        print(f"Ingest: {ingest_s:.1f}s", flush=True)
        check = verify(config.target, str(config.dead_letter), cdc_generator.expected_rows(state), malformed)
    batches = batch_rows(spark_progress, sink_progress, produced_at, topic)
    add_batch = sum(b["spark"]["addBatch"] for b in batches)
    sink_total = sum(b["sink"].get("total", 0) for b in batches)
    summary = {
        "records": len(records), "changeEvents": events, "malformed": malformed, "keys": keys,
        "produceSeconds": round(produce_s, 2),
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
    return {"config": {"events": args.events, "keys": keys, "partitions": args.partitions, "seed": args.seed,
                       "maxOffsetsPerTrigger": args.max_offsets_per_trigger, "master": args.master,
                       "readBaseline": not args.skip_read_baseline},
            "summary": summary, "batches": batches, "check": check,
            "expectedBatches": math.ceil(len(records) / args.max_offsets_per_trigger)}


def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    load_before = os.getloadavg()
    parts = set(args.parts.split(","))
    unknown = parts - {"clients", "source", "e2e"}
    if unknown:
        raise SystemExit(f"--parts: unknown {sorted(unknown)}; choose from clients, source, e2e")
    spark = local_session("kafka_ingest_bench", args.master)
    spark.range(10_000).selectExpr("sum(id)").collect()  # JVM and executors up before any clock starts
    result: dict[str, Any] = {"benchmark": "kafka_ingest", "created": datetime.now(UTC).isoformat(timespec="seconds"),
                              "parts": sorted(parts)}
    try:
        if parts & {"clients", "source"}:
            result["read"] = clients_and_source(spark, args, workdir)
        if "e2e" in parts:
            result.update(e2e_run(spark, args, workdir))
    finally:
        spark.stop()
    result["environment"] = {
        "python": platform.python_version(), "pyspark": pyspark.__version__, "deltalake": deltalake.__version__,
        "cpus": os.cpu_count(), "platform": platform.platform(), "master": args.master,
        "loadavgBefore": [round(x, 2) for x in load_before],
        "loadavgAfter": [round(x, 2) for x in os.getloadavg()], "broker": "tansu (embedded)"}
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
    parser.add_argument("--out", default="bench/results/kafka_ingest.json")
    parser.add_argument("--workdir", default=None, help="where tables and checkpoints go (default: a temp folder)")
    parser.add_argument("--keep", action="store_true", help="keep the workdir")
    args = parser.parse_args(argv)
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
    return 0 if result.get("check", {"ok": True})["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
