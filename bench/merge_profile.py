"""Where a MERGE spends its time: wall ms, Spark jobs, Delta log loads and py4j calls per phase.

    python -m bench.merge_profile                       # 1k-row upsert into a 100k-row table
    python -m bench.merge_profile --kind insert          # insert-only MERGE
    python -m bench.merge_profile --target-rows 1000000 --source-rows 100000 --source parquet
    python -m bench.merge_profile --option broadcast_scan_min_bytes=0   # A/B: defaults vs these options

With ``--option NAME=VALUE`` (``MergeOptions`` fields, integer or text values) every run is made twice, with
the defaults and with the options, in alternating order, and a table is printed for each: an A/B
comparison on the same data in one process.

Jobs are counted by Spark's status tracker for a job group per phase (``streaming_merge.spark.profile``),
so broadcast and shuffle-stage jobs are included and nothing is inferred from reading code. Each run
merges into a fresh copy of the same target (``shutil.copytree``, untimed); two warm-up runs pay for
JVM class loading and JIT. Medians over ``--runs`` are printed; wall times on a 2-core machine
vary by ±20-30 %, job and load counts do not.

The driver JVM's CPU per MERGE is printed by thread group (``bench.jvm_cpu``, Linux): on 2 cores
the JIT's compiler threads compete with the MERGE for tens to hundreds of MERGEs after start
(their CPU per MERGE falls from ~2 s in the first ten to ~0.1-0.2 s after 150 here), so a wall
time far above the jobs' own durations is often the JIT, not the MERGE's driver work. A stream
is past that after a few minutes: ``--warmup 150`` measures that steady state (a 1k-row upsert
into 100k rows here, in windows of 20 MERGEs: 493 ms at MERGEs 21-40 with the JIT at 295 ms of
CPU each, 348-385 ms from MERGE 120 on with it at 30-80 ms).

Janino compilations per MERGE are counted too (Spark's ``CodegenMetrics``): a plan whose
generated code differs from MERGE to MERGE (a literal inlined into it) would pay for
compiling it each time; warm, it is 0.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from bench import jvm_cpu
from bench.merge_bench import make_batch, make_target, write_target

KINDS = ("upsert", "insert", "matched", "guarded")


class Py4jCounter:
    """Counts Python→JVM commands by wrapping the gateway client's ``send_command``."""

    def __init__(self, spark: Any) -> None:
        self.calls = 0
        client = spark.sparkContext._gateway._gateway_client
        original = client.send_command

        def counting(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            return original(*args, **kwargs)

        client.send_command = counting


def _option_value(text: str) -> int | str:
    """An option's value: an integer where it reads as one (sizes, counts, flags), else the
    text (e.g. ``materialize_source=none``)."""
    try:
        return int(text)
    except ValueError:
        return text


def _merge(spark: Any, table_path: Path, source: Any, kind: str, options: dict[str, int | str]) -> Any:
    from streaming_merge import DeltaTable

    builder = DeltaTable.forPath(spark, str(table_path)).alias("t").merge(source.alias("s"), "t.id = s.id")
    if options:
        builder = builder.withOptions(**options)
    if kind in ("upsert", "matched"):
        builder = builder.whenMatchedUpdateAll()
    if kind == "guarded":  # the sink's CDC preset: a matched row is replaced only by a newer event
        builder = builder.whenMatchedUpdateAll(condition="s.updated_at > t.updated_at")
    if kind in ("upsert", "insert", "guarded"):
        builder = builder.whenNotMatchedInsertAll()
    return builder.execute()


def _codegen_compilations(spark: Any) -> int:
    """Janino compilations so far in the driver: a warm MERGE whose generated code differs from run to
    run (a literal inlined into the code) pays for compiling it again each time."""
    metrics = spark.sparkContext._jvm.org.apache.spark.metrics.source.CodegenMetrics
    return int(metrics.METRIC_COMPILATION_TIME().getCount())


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target-rows", type=int, default=100_000)
    parser.add_argument("--target-files", type=int, default=20)
    parser.add_argument("--source-rows", type=int, default=1_000)
    parser.add_argument("--key-dist", default="uniform", choices=("uniform", "clustered"))
    parser.add_argument("--kind", default="upsert", choices=KINDS)
    parser.add_argument("--source", default="parquet", choices=("parquet", "local"),
                        help="parquet: a Parquet folder (materialized, like a micro-batch); local: Arrow data")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--deletion-vectors", action="store_true",
                        help="turn deletion vectors on in the target (merge-on-read: the MERGE marks replaced rows "
                             "in DVs and writes only the changed rows)")
    parser.add_argument("--change-data-feed", action="store_true",
                        help="turn the change data feed on in the target (the MERGE also writes its change rows)")
    parser.add_argument("--against-copy-on-write", action="store_true",
                        help="with --deletion-vectors: every run also merges into a copy-on-write twin of the "
                             "target (same rows, DVs off), alternating which goes first, and prints a table "
                             "for each and the ratio of their medians")
    parser.add_argument("--option", action="append", default=[], metavar="NAME=VALUE",
                        help="a MergeOptions field (an integer, or text such as materialize_source=none); "
                             "compared against the defaults")
    args = parser.parse_args(argv)
    if args.against_copy_on_write and (not args.deletion_vectors or args.option):
        parser.error("--against-copy-on-write compares a DV target with its copy-on-write twin: "
                     "give --deletion-vectors, and no --option")
    options = {name: _option_value(value) for name, value in (o.split("=", 1) for o in args.option)}
    # (name, MERGE options, the target's folder name under the scratch folder)
    variants: list[tuple[str, dict[str, int | str], str]] = [("defaults", {}, "master")]
    if options:
        variants.append((", ".join(args.option), options, "master"))
    if args.against_copy_on_write:
        variants = [("deletion vectors", {}, "master"), ("copy-on-write", {}, "copy-on-write")]

    from streaming_merge.session import local_session
    from streaming_merge.spark.profile import phase, profiling

    spark = local_session("merge_profile", "local[2]")
    counter = Py4jCounter(spark)
    pid = jvm_cpu.jvm_pid(spark)
    measure_cpu = jvm_cpu.available(pid)
    work = Path(tempfile.mkdtemp(prefix="merge_profile-"))
    try:
        master = work / "master"
        write_target(make_target(args.target_rows, 7), master, args.target_files)
        if args.against_copy_on_write:
            shutil.copytree(master, work / "copy-on-write")
        properties = {**({"delta.enableDeletionVectors": "true"} if args.deletion_vectors else {}),
                      **({"delta.enableChangeDataFeed": "true"} if args.change_data_feed else {})}
        if properties:
            from streaming_merge import DeltaTable

            DeltaTable.forPath(spark, str(master)).setProperties(properties)
            if args.against_copy_on_write and args.change_data_feed:  # the twin differs by its DVs only
                DeltaTable.forPath(spark, str(work / "copy-on-write")).setProperties(
                    {"delta.enableChangeDataFeed": "true"})
        batch = make_batch(args.target_rows, args.source_rows, args.key_dist, 7).table
        if args.kind == "insert":  # only new keys: nothing matches
            import pyarrow.compute as pc
            batch = batch.set_column(0, "id", pc.add(batch["id"], args.target_rows * 10))
        source_dir = work / "source"
        source_dir.mkdir()
        pq.write_table(batch, source_dir / "part-0.parquet")

        results: dict[str, list[dict[str, Any]]] = {name: [] for name, _, _ in variants}
        for run in range(args.warmup + args.runs):
            for name, chosen, target in (variants if run % 2 == 0 else variants[::-1]):
                run_dir = work / f"run-{run}"
                shutil.copytree(work / target, run_dir)
                source = (spark.read.parquet(str(source_dir)) if args.source == "parquet"
                          else spark.createDataFrame(batch))
                calls_before = counter.calls
                compiles_before = _codegen_compilations(spark)
                cpu_before = jvm_cpu.thread_cpu_seconds(pid) if measure_cpu else None
                with profiling() as profile, phase(spark, "(outside phases)"):
                    started = time.perf_counter()
                    metrics = _merge(spark, run_dir, source, args.kind, chosen)
                    total_ms = (time.perf_counter() - started) * 1000
                cpu = jvm_cpu.delta_ms(cpu_before, jvm_cpu.thread_cpu_seconds(pid)) if cpu_before else {}
                if run >= args.warmup:
                    results[name].append({"total": total_ms, "jobs": profile.jobs, "loads": profile.log_loads,
                                          "cpu": cpu,
                                          "updates": profile.log_updates, "py4j": counter.calls - calls_before,
                                          "compiles": _codegen_compilations(spark) - compiles_before,
                                          "phases": {p.name: p for p in profile.phases.values()},
                                          "metrics": metrics})
                shutil.rmtree(run_dir)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        spark.stop()

    for name, rows in results.items():
        if len(results) > 1:
            print(f"\n== {name}")
        _report(args, rows, with_dvs=name != "copy-on-write")
    if args.against_copy_on_write:
        dv, cow = (statistics.median(r["total"] for r in results[n]) for n in ("deletion vectors", "copy-on-write"))
        print(f"\ncopy-on-write / deletion vectors: {cow / dv:.2f}x ({cow:.1f} / {dv:.1f} ms, medians of "
              f"{args.runs} runs each, alternating)")
    return 0


def _report(args: argparse.Namespace, rows: list[dict[str, Any]], with_dvs: bool = True) -> None:
    features = (" with DVs" if args.deletion_vectors and with_dvs else "") + (
        " with CDF" if args.change_data_feed else "")
    print(f"MERGE profile: {args.kind}, {args.source_rows:,} source rows ({args.source}) into "
          f"{args.target_rows:,} rows in {args.target_files} files{features}, "
          f"{args.key_dist} keys; "
          f"median of {args.runs} runs after {args.warmup} warm-ups")
    names: list[str] = []
    for row in rows:
        names += [n for n in row["phases"] if n not in names]
    print(f"{'phase':<18}{'ms':>9}{'jobs':>6}{'log loads':>11}")
    for name in names:
        ms = statistics.median(r["phases"][name].ms if name in r["phases"] else 0.0 for r in rows)
        jobs = max(r["phases"][name].jobs if name in r["phases"] else 0 for r in rows)
        loads = max(r["phases"][name].log_loads if name in r["phases"] else 0 for r in rows)
        print(f"{name:<18}{ms:>9.1f}{jobs:>6}{loads:>11}")
    last = rows[-1]
    print(f"{'total (wall)':<18}{statistics.median(r['total'] for r in rows):>9.1f}"
          f"{max(r['jobs'] for r in rows):>6}{max(r['loads'] for r in rows):>11}")
    totals = ", ".join(f"{r['total']:.0f}" for r in rows)
    print(f"py4j calls per MERGE: {statistics.median(r['py4j'] for r in rows):.0f}; "
          f"log updates (commits read after the snapshot): {max(r['updates'] for r in rows)}; "
          f"codegen compilations per MERGE: {statistics.median(r['compiles'] for r in rows):.0f}; "
          f"all runs' totals (ms): {totals}")
    if all(r["cpu"] for r in rows):
        groups = ", ".join(f"{g} {statistics.median(r['cpu'][g] for r in rows):.0f}" for g in jvm_cpu.GROUP_NAMES)
        print(f"driver JVM CPU per MERGE (ms): {groups}")
    m = last["metrics"]
    print(f"last run: files removed/added {m['numTargetFilesRemoved']}/{m['numTargetFilesAdded']}, "
          f"updated {m['numTargetRowsUpdated']}, inserted {m['numTargetRowsInserted']}, "
          f"copied {m['numTargetRowsCopied']}, files after skipping {m['numTargetFilesAfterSkipping']}")


if __name__ == "__main__":
    sys.exit(main())
