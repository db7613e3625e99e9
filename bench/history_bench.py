"""What SCD type 2 and truncate handling cost per micro-batch, next to the SCD 1 sink.

Run ``python -m bench.history_bench --help``. Same workload as ``bench.sink_overhead`` (one
event per id per batch: 80 % updates, 1 % of them deletes, 20 % inserts; ``lsn`` increasing),
applied by three sinks to their own tables, in one process, the order rotating per batch:

* ``scd1``: ``MergeSink(keys, sequence_by, delete_when)``, the CDC upsert;
* ``scd1+truncates``: the same with ``apply_as_truncates`` configured (no truncate occurs):
  what the option costs a stream that never truncates;
* ``scd2``: ``MergeSink(..., stored_as_scd_type=2)``: each batch rebuilds the touched keys' history
  (reads their current rows, folds, writes the difference).

The target is loaded by each sink from its first (untimed) batch of ``--target-rows`` inserts,
so every table starts with the same rows in its own layout. Per timed batch: wall ms of the
call, Spark jobs (status tracker, one job group per call). The SCD 1 tables are compared row for
row at the end, and the SCD 2 table's current rows (``__END_AT IS NULL``) must equal them.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import deltalake
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import SparkSession

from bench.sink_overhead import make_workload, to_spark
from streaming_merge import MergeSink
from streaming_merge.session import local_session

VARIANTS = ("scd1", "scd1+truncates", "scd2")


def make_sink(variant: str, path: str) -> MergeSink:
    options: dict[str, Any] = {}
    if variant == "scd1+truncates":
        options["apply_as_truncates"] = "op = 't'"
    if variant == "scd2":
        options.update(stored_as_scd_type=2, track_history_except_column_list=["op"])
    return MergeSink(path, keys=["id"], sequence_by="lsn", apply_as_deletes="op = 'd'", app_id="bench", **options)


def jobs_and_ms(spark: SparkSession, call: Any) -> tuple[int, float]:
    context = spark.sparkContext
    group = f"bench-{uuid.uuid4().hex}"
    context.setLocalProperty("spark.jobGroup.id", group)
    started = time.perf_counter()
    try:
        call()
    finally:
        elapsed = (time.perf_counter() - started) * 1000
        context.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
    return len(context.statusTracker().getJobIdsForGroup(group)), elapsed


def current_rows(path: str, history: bool) -> pa.Table:
    table = deltalake.DeltaTable(path).to_pyarrow_table()
    if history:
        table = table.filter(pc.is_null(table["__END_AT"])).drop(["__START_AT", "__END_AT"])
    return table.select(["id", "lsn", "op", "amount", "status"]).sort_by("id")


def run(args: argparse.Namespace) -> dict[str, Any]:
    spark = local_session("history_bench", "local[2]", shuffle_partitions=2)
    spark.sparkContext.setLogLevel("ERROR")
    workload = make_workload(args.target_rows, args.warmup + args.batches, args.batch_rows, args.seed)
    load = workload.target
    batches = [to_spark(spark, b) for b in [load, *workload.batches]]
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="history_bench_"))
    sinks = {v: make_sink(v, str(workdir / v.replace("+", "_"))) for v in VARIANTS}
    timings: dict[str, list[tuple[int, float]]] = {v: [] for v in VARIANTS}
    for batch_id, batch in enumerate(batches):
        order = VARIANTS[batch_id % 3:] + VARIANTS[:batch_id % 3]
        for variant in order:
            gc.collect()
            jobs, ms = jobs_and_ms(spark, lambda v=variant, b=batch, i=batch_id: sinks[v](b, i))
            if batch_id > args.warmup:  # batch 0 loads the target, then the warm-up batches
                timings[variant].append((jobs, ms))
    expected = current_rows(str(workdir / "scd1"), history=False)
    checks = {v: current_rows(str(workdir / v.replace("+", "_")), history=v == "scd2").equals(expected)
              for v in VARIANTS}
    history_rows = deltalake.DeltaTable(str(workdir / "scd2")).to_pyarrow_table().num_rows
    result: dict[str, Any] = {
        "config": {"targetRows": args.target_rows, "batchRows": args.batch_rows, "batches": args.batches,
                   "warmup": args.warmup, "seed": args.seed, "master": "local[2]"},
        "variants": {}, "checks": checks, "scd2HistoryRows": history_rows,
    }
    base = statistics.median(ms for _, ms in timings["scd1"])
    for variant in VARIANTS:
        values = [ms for _, ms in timings[variant]]
        jobs = sorted({j for j, _ in timings[variant]})
        result["variants"][variant] = {"medianMs": round(statistics.median(values)),
                                       "p90Ms": round(sorted(values)[int(0.9 * (len(values) - 1))]),
                                       "ratioToScd1": round(statistics.median(values) / base, 2),
                                       "jobsPerBatch": jobs}
    spark.stop()
    return result


def report(result: dict[str, Any]) -> None:
    config = result["config"]
    print(f"target {config['targetRows']} rows, {config['batches']} timed batches of {config['batchRows']} events "
          f"({config['warmup']} warm-up), {config['master']}")
    print(f"{'variant':<16}{'median ms':>10}{'p90 ms':>9}{'x scd1':>8}  jobs/batch  check")
    for name, v in result["variants"].items():
        mark = "✓" if result["checks"][name] else "✗"
        jobs = ",".join(str(j) for j in v["jobsPerBatch"])
        print(f"{name:<16}{v['medianMs']:>10}{v['p90Ms']:>9}{v['ratioToScd1']:>8}  {jobs:<10}  {mark}")
    print(f"scd2 history rows at the end: {result['scd2HistoryRows']}")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.history_bench", description=__doc__.split("\n")[0])
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument("--batch-rows", type=int, default=1000)
    parser.add_argument("--target-rows", type=int, default=100_000)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--out", default=None, help="JSON result file")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    result = run(args)
    report(result)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2))
    return 0 if all(result["checks"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
