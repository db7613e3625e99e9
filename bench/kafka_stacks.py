"""Three Kafka → Delta stacks on Apache Kafka 4.4, in one run, on the same topics and targets.

    python -m bench.kafka_ingest_bench --parts stacks                 # 1M-row target, 5k and 50k batches
    python -m bench.kafka_ingest_bench --parts stacks --quick         # 100k rows, 2k and 10k batches

* **ours**: the job's path (``jobs.kafka_cdc_ingest.start``): our ``kafka_py`` source, the decode
  inside the MergeSink's copy of the batch, our MERGE.
* **spark-kafka**: the same job with ``source_format="kafka"``, Spark's own connector
  (``spark-sql-kafka-0-10``), whose batches the job decodes into a checkpoint first (its
  staged path), then our sink.
* **standard**: what a user writes with Spark and Delta Lake alone: Spark's connector →
  ``from_json`` (one typed parse of wrapped and bare envelopes) → ``row_number`` newest per key →
  Delta Lake's ``DeltaTable.merge`` in ``foreachBatch``, idempotent through the
  ``spark.databricks.delta.write.txnAppId``/``txnVersion`` confs. A delete is kept as a row with
  ``_cdc_op = 'd'`` (a soft delete: a late event older than the delete then loses against it,
  as our tombstones make it lose; a hard delete would let it bring the row back), and the check
  reads the rows without one.

Every stack ingests the same Debezium-shaped topic (``jobs.cdc_generator``: updates, deletes,
duplicates, late re-sends, tombstones; keys all over the target) into its own copy of one
pre-built target (``kafka_ingest_bench.build_target``), with ``availableNow`` and
``maxOffsetsPerTrigger`` set to the batch size. Per stack and batch size: Kafka records (the
Debezium events, duplicates and tombstones included) per second over Spark's
``triggerExecution`` of the full batches after the first, and the median of that latency. Then
ours on the same stream with 1 % of its records malformed (dead-lettered), against the clean
run. Every table is checked against the generator's state (and the dead letters against the
malformed records); the stacks' tables must be equal. ``uptime``'s load is printed with each
figure: other work on the machine moves them.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery
from pyspark.sql.types import LongType, StringType, StructField, StructType

from bench import kafka_ingest_bench as kib
from jobs import cdc_generator
from jobs.kafka_cdc_ingest import IngestConfig

STACKS = ("ours", "spark-kafka", "standard")
KEY = cdc_generator.TABLES[kib.TABLE]["key"]
ROW_SCHEMA = cdc_generator.TABLES[kib.TABLE]["schema"]
MALFORMED_SHARE = 0.01


def load() -> str:
    """The 1, 5 and 15 minute load averages, as ``uptime`` prints them."""
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())


# ------------------------------------------------------------------ the standard stack

def _envelope_schema() -> StructType:
    row = StructType.fromDDL(ROW_SCHEMA)
    envelope = [StructField("before", row), StructField("after", row), StructField("op", StringType()),
                StructField("ts_ms", LongType()),
                StructField("source", StructType([StructField("lsn", LongType()), StructField("ts_ms", LongType())]))]
    return StructType([StructField("payload", StructType(envelope)), *envelope])


def standard_batch(target: str, app_id: str) -> Any:
    """The standard stack's ``foreachBatch`` function: parse, newest event per key, Delta MERGE."""
    from delta.tables import DeltaTable

    schema = _envelope_schema()
    columns = [c.split()[0] for c in ROW_SCHEMA.split(",")]

    def run(records: DataFrame, batch_id: int) -> None:
        spark = records.sparkSession
        j = F.from_json(F.col("value").cast("string"), schema)
        parsed = records.select(j.alias("j"), "partition", "offset")

        def field(name: str) -> Any:
            return F.when(F.col("j.payload").isNotNull(), F.col(f"j.payload.{name}")).otherwise(F.col(f"j.{name}"))

        op = field("op")
        events = parsed.select(
            F.when(op == "d", field("before")).otherwise(field("after")).alias("image"), op.alias("_cdc_op"),
            F.coalesce(field("source.lsn"), field("source.ts_ms"), field("ts_ms")).alias("_cdc_position"),
            field("ts_ms").alias("_cdc_ts_ms"), F.col("partition").alias("_kafka_partition"),
            F.col("offset").alias("_kafka_offset"))
        events = events.filter(F.col("_cdc_op").isin("c", "r", "u", "d") & F.col(f"image.{KEY}").isNotNull()) \
            .select(*[F.col(f"image.{c}").alias(c) for c in columns], "_cdc_op", "_cdc_position", "_cdc_ts_ms",
                    "_kafka_partition", "_kafka_offset")
        newest = Window.partitionBy(KEY).orderBy(F.desc("_cdc_position"), F.desc("_kafka_partition"),
                                                 F.desc("_kafka_offset"))
        source = events.withColumn("_rn", F.row_number().over(newest)).filter("_rn = 1").drop("_rn")
        spark.conf.set("spark.databricks.delta.write.txnAppId", app_id)
        spark.conf.set("spark.databricks.delta.write.txnVersion", str(batch_id))
        try:
            (DeltaTable.forPath(spark, target).alias("t")
             .merge(source.alias("s"), f"t.{KEY} = s.{KEY}")
             .whenMatchedUpdateAll(condition="s._cdc_position > t._cdc_position")
             .whenNotMatchedInsertAll()
             .execute())
        finally:
            spark.conf.unset("spark.databricks.delta.write.txnAppId")
            spark.conf.unset("spark.databricks.delta.write.txnVersion")

    return run


def start_standard(spark: SparkSession, bootstrap: str, topic: str, target: str, checkpoint: str,
                   limit: int) -> StreamingQuery:
    records = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap)
               .option("subscribe", topic).option("startingOffsets", "earliest")
               .option("maxOffsetsPerTrigger", str(limit)).load())
    return (records.writeStream.foreachBatch(standard_batch(target, f"standard:{topic}"))
            .option("checkpointLocation", checkpoint).trigger(availableNow=True)
            .queryName(f"standard:{topic}").start())


# ------------------------------------------------------------------ one run of one stack

def run_stack(spark: SparkSession, stack: str, bootstrap: str, topic: str, run_dir: Path, limit: int,
              deletion_vectors: bool) -> list[dict[str, Any]]:
    """One stack over the topic into ``run_dir / orders``; Spark's progress of its batches."""
    target = str(run_dir / kib.TABLE)
    if stack == "standard":
        query = start_standard(spark, bootstrap, topic, target, str(run_dir / "checkpoint"), limit)
        kib._await(query)
        return kib._spark_progress(query)
    config = IngestConfig(
        bootstrap_servers=bootstrap, topics=topic, target=target, keys=[KEY], checkpoint=str(run_dir / "checkpoint"),
        dead_letter=str(run_dir / "dead_letter"), row_schema=ROW_SCHEMA, available_now=True,
        max_offsets_per_trigger=limit, deletion_vectors=deletion_vectors,
        source_format="kafka_py" if stack == "ours" else "kafka")
    _, progress, _ = kib.ingest_run(spark, config)
    return progress


def figures(progress: list[dict[str, Any]], limit: int) -> dict[str, Any]:
    """Records/s over the full batches after the first, their median latency, and the batches."""
    batches = [(int(p["numInputRows"]), int(p["durationMs"]["triggerExecution"])) for p in progress
               if int(p.get("numInputRows", 0))]
    later = [b for b in batches[1:] if b[0] >= 0.9 * limit] or batches[1:] or batches
    records = sum(b[0] for b in later)
    spent = sum(b[1] for b in later)
    return {"batches": len(batches), "timedBatches": len(later), "batchMs": [b[1] for b in batches],
            "recordsPerSecond": records * 1000 / spent if spent else 0.0,
            "batchMsMedian": statistics.median(b[1] for b in later) if later else None}


def live_rows(path: str, stack: str) -> pa.Table:
    """The stack's rows (row columns, by key): without the standard stack's soft deletes."""
    arrow = kib._row_arrow_schema()
    read = kib._read(path, [*arrow.names, "_cdc_op"])  # string_view columns: cast before filtering
    table = pa.table([read[n].cast(arrow.field(n).type) for n in arrow.names], schema=arrow)
    if stack == "standard":
        table = table.filter(pc.not_equal(read["_cdc_op"].cast(pa.string()), "d"))
    return table.sort_by(KEY)


# ------------------------------------------------------------------ the streams

def with_malformed(records: list[cdc_generator.Record], share: float, seed: int) -> list[cdc_generator.Record]:
    """``records`` with one malformed record (key ``bad``, cdc_generator's kinds in turn) after
    every ``1 / share`` of them."""
    every = round(1 / share)
    out: list[cdc_generator.Record] = []
    kinds = cdc_generator.MALFORMED
    rng = random.Random(seed)
    for i, record in enumerate(records):
        out.append(record)
        if i % every == every - 1:
            out.append(cdc_generator.Record(b"bad", kinds[rng.randrange(len(kinds))]))
    return out


def produce(broker: Any, name: str, records: list[cdc_generator.Record], partitions: int) -> str:
    broker.client().create_topic(name, partitions)
    kib.produce_keyed_bulk(broker.bootstrap_servers, name, partitions, [(r.key, r.value) for r in records])
    return name


# ------------------------------------------------------------------ the run

def stacks_run(spark: SparkSession, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    from devtools.kafka_server import ApacheKafka

    quick = args.quick
    target_rows = args.target_rows or (100_000 if quick else 1_000_000)
    sizes = [int(s) for s in (args.batch_sizes or ("2000,10000" if quick else "5000,50000")).split(",")]
    stacks = [s for s in args.stacks.split(",") if s]
    unknown = set(stacks) - set(STACKS)
    if unknown:
        raise SystemExit(f"--stacks: unknown {sorted(unknown)}; choose from {', '.join(STACKS)}")
    batches = args.stack_batches or (3 if quick else 5)
    result: dict[str, Any] = {"targetRows": target_rows, "sizes": sizes, "stacks": stacks, "runs": [],
                              "loadBefore": load()}
    with ApacheKafka(workdir=workdir / "kafka") as broker:
        master = workdir / "target_master"
        prebuilt, layout = kib.build_target(spark, master, target_rows, args.target_files, args.partitions, args.seed)
        print(f"Apache Kafka at {broker.bootstrap_servers}; pre-built target {target_rows} rows in "
              f"{layout['files']} files ({layout['bytes'] / 1e6:.1f} MB, not timed); load {load()}", flush=True)
        if not quick:
            warm_up(spark, broker, workdir, stacks, args)
        clean: dict[int, dict[str, Any]] = {}
        for size in sizes:
            events = int(size * (batches + 1) / 1.12)  # ~1.12 records an event (duplicates, tombstones)
            records, state = cdc_generator.generate(kib.TABLE, events, target_rows, seed=args.seed + size,
                                                    malformed=False)
            topic = produce(broker, f"stacks.{size}", records, args.partitions)
            tables: dict[str, pa.Table] = {}
            for stack in stacks:
                run = one(spark, broker, stack, topic, workdir / f"{stack}-{size}", size, records, state,
                          prebuilt, master, args, 0)
                tables[stack] = run.pop("table")
                result["runs"].append(run)
                if stack == "ours":
                    clean[size] = run
            first = next(iter(tables.values()))
            result.setdefault("tablesEqual", {})[size] = all(t.equals(first) for t in tables.values())
        if "ours" in stacks and not args.skip_malformed:
            size = sizes[0]
            events = int(size * (batches + 1) / 1.12)
            records, state = cdc_generator.generate(kib.TABLE, events, target_rows, seed=args.seed + size,
                                                    malformed=False)
            bad = with_malformed(records, MALFORMED_SHARE, args.seed)
            topic = produce(broker, f"stacks.{size}.malformed", bad, args.partitions)
            run = one(spark, broker, "ours", topic, workdir / f"ours-{size}-malformed", size, bad, state, prebuilt,
                      master, args, len(bad) - len(records))
            run.pop("table")
            run["malformedShare"] = MALFORMED_SHARE
            result["runs"].append(run)
            if size in clean and clean[size]["batchMsMedian"] and run["batchMsMedian"]:
                result["malformedRatio"] = run["batchMsMedian"] / clean[size]["batchMsMedian"]
    result["loadAfter"] = load()
    return result


def one(spark: SparkSession, broker: Any, stack: str, topic: str, run_dir: Path, size: int,
        records: list[cdc_generator.Record], state: dict[int, dict[str, Any]], prebuilt: pa.Table, master: Path,
        args: argparse.Namespace, malformed: int) -> dict[str, Any]:
    """One stack's run on a fresh copy of the target, checked."""
    kib.copy_target(spark, master, run_dir / kib.TABLE, args.deletion_vectors)
    if stack == "standard" and args.deletion_vectors:
        spark.sql(f"ALTER TABLE delta.`{run_dir / kib.TABLE}` SET TBLPROPERTIES "
                  "('delta.enableDeletionVectors' = true)")
    load_at_start = load()
    started = time.monotonic()
    progress = run_stack(spark, stack, broker.bootstrap_servers, topic, run_dir, size, args.deletion_vectors)
    seconds = time.monotonic() - started
    figure = figures(progress, size)
    table = live_rows(str(run_dir / kib.TABLE), stack)
    expected = expected_rows(prebuilt, records, state)
    ok = table.equals(expected)
    dead = None
    if stack != "standard":
        dead_path = run_dir / "dead_letter"
        dead = kib._read(str(dead_path), ["offset"]).num_rows if dead_path.exists() else 0
        ok = ok and dead == malformed
    run = {"stack": stack, "batchSize": size, "records": len(records), "malformed": malformed, "seconds": seconds,
           **figure, "ok": ok, "rows": table.num_rows, "expectedRows": expected.num_rows, "deadLetters": dead,
           "load": load_at_start, "table": table}
    print(f"  {stack:<12} batch {size:>6}: {figure['recordsPerSecond']:>9,.0f} records/s, median batch "
          f"{figure['batchMsMedian']} ms over {figure['timedBatches']} of {figure['batches']} batches "
          f"{figure['batchMs']}; {'✓' if ok else '✗'} {table.num_rows} rows"
          f"{'' if dead is None else f', {dead} dead letters'}; load {load_at_start}", flush=True)
    if not args.keep:
        shutil.rmtree(run_dir, ignore_errors=True)
    return run


def expected_rows(prebuilt: pa.Table, records: list[cdc_generator.Record], state: dict[int, dict[str, Any]]
                  ) -> pa.Table:
    """The pre-built rows no event touched, and the generator's final row of every touched key."""
    arrow = kib._row_arrow_schema()
    touched = pa.array(sorted({int(r.key) for r in records if r.value is not None and r.key not in (b"bad", None)}),
                       pa.int64())
    kept = prebuilt.filter(pc.invert(pc.is_in(prebuilt[KEY], value_set=touched)))
    return pa.concat_tables([kept, pa.Table.from_pylist(list(state.values()), schema=arrow)]).sort_by(KEY)


def warm_up(spark: SparkSession, broker: Any, workdir: Path, stacks: list[str], args: argparse.Namespace) -> None:
    """Each stack once over a small topic into a small target, untimed: the session's first
    query of each kind pays class loading and the JIT, which would be charged to the first stack."""
    records, state = cdc_generator.generate(kib.TABLE, 3_000, 20_000, seed=args.seed, malformed=True)
    topic = produce(broker, "stacks.warmup", records, args.partitions)
    master = workdir / "warmup_master"
    prebuilt, _ = kib.build_target(spark, master, 20_000, 4, args.partitions, args.seed)
    for stack in stacks:
        one(spark, broker, stack, topic, workdir / f"warmup-{stack}", 1_000, records, state, prebuilt, master,
            args, sum(1 for r in records if r.key == b"bad"))
    print(f"warmed up ({load()})", flush=True)


def print_stacks(result: dict[str, Any]) -> None:
    runs = [r for r in result["runs"] if not r.get("malformedShare")]
    print(f"\nKafka → Delta on Apache Kafka 4.4 (PLAINTEXT), {result['targetRows']:,}-row target, full batches "
          f"after the first (records/s over Spark's triggerExecution; median batch ms); load before "
          f"{result['loadBefore']}, after {result['loadAfter']}")
    header = f"{'stack':<12}{'batch':>8}{'records/s':>12}{'median ms':>11}{'batches':>9}  {'check':<6}load"
    print(header)
    for r in runs:
        print(f"{r['stack']:<12}{r['batchSize']:>8}{r['recordsPerSecond']:>12,.0f}{_ms(r['batchMsMedian']):>11}"
              f"{r['timedBatches']:>5}/{r['batches']:<3}  {'✓' if r['ok'] else '✗':<6}{r['load']}")
    for size in result["sizes"]:
        by = {r["stack"]: r for r in runs if r["batchSize"] == size}
        if "ours" in by and "standard" in by and by["standard"]["recordsPerSecond"]:
            ratio = by["ours"]["recordsPerSecond"] / by["standard"]["recordsPerSecond"]
            standard = by["standard"]["recordsPerSecond"]
            spark_kafka = (f", spark-kafka / standard {by['spark-kafka']['recordsPerSecond'] / standard:.2f}x"
                           if "spark-kafka" in by else "")
            print(f"batch {size}: ours / standard {ratio:.2f}x (target >= 4x: {'met' if ratio >= 4 else 'NOT met'})"
                  f"{spark_kafka}; tables equal across stacks: {result['tablesEqual'].get(size)}")
    largest = max(result["sizes"])
    ours = next((r for r in runs if r["stack"] == "ours" and r["batchSize"] == largest), None)
    if ours is not None:
        print(f"ours at {largest}-record batches into {result['targetRows']:,} rows: {ours['recordsPerSecond']:,.0f} "
              f"records/s (target >= 50,000: {'met' if ours['recordsPerSecond'] >= 50_000 else 'NOT met'})")
    bad = next((r for r in result["runs"] if r.get("malformedShare")), None)
    if bad is not None and "malformedRatio" in result:
        print(f"ours, {bad['malformedShare']:.0%} malformed at {bad['batchSize']}: median batch "
              f"{_ms(bad['batchMsMedian'])} ms, {result['malformedRatio']:.2f}x the clean run's "
              f"(target <= 1.1x: {'met' if result['malformedRatio'] <= 1.1 else 'NOT met'}); "
              f"{bad['deadLetters']} dead letters of {bad['malformed']} {'✓' if bad['ok'] else '✗'}; "
              f"load {bad['load']}")


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def stacks_ok(result: dict[str, Any]) -> bool:
    return all(r["ok"] for r in result["runs"]) and all(result.get("tablesEqual", {}).values())
