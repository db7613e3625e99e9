"""Where a CDC batch's late events are dropped: in the MERGE's own pass, or while the sink materializes it.

    python -m bench.late_events_bench [--batches 12] [--batch-rows 5000] [--target-rows 100000]

A stream with late re-sends (an update of a key deleted earlier, carrying a sequence value
older than the delete) needs the tombstone lookup in every batch. Two ``MergeSink``s run the
same batches side by side, alternating which goes first:

* ``M`` (in the MERGE): the late-event filter is a lazy anti join the MERGE materializes in a
  job of its own (what every batch did before, and what a batch still does when the previous
  one needed no lookup or pruned most tombstone files by its key range);
* ``S`` (in the sink): the filter runs inside the job that materializes the prepared batch, so
  the MERGE takes that copy as it is (the default once a lookup read most tombstones).

Both tables must end equal (late events dropped, deletes applied). Prints the per-batch
median and p90 wall time, the Spark jobs per batch and the ratio S/M. Wall times on a 2-core
machine vary by ±20-30 % run to run; the job counts are exact.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import shutil
import statistics
import tempfile
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import deltalake
import numpy as np
import pyarrow as pa
import pyspark

from bench.sink_overhead import create_target, summarize, to_spark
from streaming_merge import MergeSink
from streaming_merge.session import local_session

VARIANTS = ("M", "S")
LABELS = {"M": "late events dropped in the MERGE's own pass", "S": "dropped while the sink materializes"}
DELETE_SHARE = 0.05
LATE_SHARE = 0.05
INSERT_SHARE = 0.2


def make_batches(target_rows: int, n_batches: int, batch_rows: int, seed: int) -> tuple[pa.Table, list[pa.Table], int]:
    """The target (ids 0..N-1 at lsn 0) and the batches: updates and deletes of live ids, inserts
    of new ids, and from the second batch on late updates of ids deleted earlier (lsn one below
    their delete's). One event per id per batch; lsn increases in arrival order otherwise.
    Returns the rows the table must end with too."""
    rng = np.random.default_rng(seed)
    alive = np.zeros(target_rows + n_batches * batch_rows, dtype=bool)
    alive[:target_rows] = True
    deleted_at: dict[int, int] = {}
    next_id, lsn = target_rows, 1
    batches: list[pa.Table] = []
    for index in range(n_batches):
        n_late = min(round(batch_rows * LATE_SHARE), len(deleted_at)) if index else 0
        n_inserts = round(batch_rows * INSERT_SHARE)
        n_deletes = round(batch_rows * DELETE_SHARE)
        live = np.flatnonzero(alive)
        existing = rng.choice(live, size=min(batch_rows - n_late - n_inserts, len(live)), replace=False)
        deleted, updated = existing[:n_deletes], existing[n_deletes:]
        inserted = np.arange(next_id, next_id + n_inserts)
        next_id += n_inserts
        late = rng.choice(np.fromiter(deleted_at, np.int64), size=n_late, replace=False) if n_late else \
            np.empty(0, np.int64)
        ids = np.concatenate([updated, deleted, inserted]).astype(np.int64)
        ops = np.concatenate([np.full(len(updated), "u"), np.full(len(deleted), "d"), np.full(n_inserts, "c")])
        lsns = np.arange(lsn, lsn + len(ids), dtype=np.int64)
        lsn += len(ids)
        for key, at in zip(deleted.tolist(), lsns[len(updated):len(updated) + len(deleted)].tolist(), strict=True):
            deleted_at[key] = at
        late_lsns = np.array([deleted_at[k] - 1 for k in late.tolist()], np.int64)
        alive[deleted] = False
        alive[inserted] = True
        all_ids = np.concatenate([ids, late.astype(np.int64)])
        order = rng.permutation(len(all_ids))
        batches.append(pa.table({
            "id": pa.array(all_ids[order], pa.int64()),
            "lsn": pa.array(np.concatenate([lsns, late_lsns])[order], pa.int64()),
            "op": pa.array(np.concatenate([ops, np.full(len(late), "u")])[order], pa.string()),
            "amount": pa.array(np.round(rng.random(len(all_ids)) * 1000.0, 2), pa.float64()),
            "status": pa.array(np.full(len(all_ids), "late-or-new"), pa.string()),
        }))
    target = pa.table({"id": pa.array(np.arange(target_rows), pa.int64()),
                       "lsn": pa.array(np.zeros(target_rows, np.int64)), "op": pa.array(["c"] * target_rows),
                       "amount": pa.array(np.zeros(target_rows), pa.float64()),
                       "status": pa.array(["initial"] * target_rows)})
    return target, batches, int(alive.sum())


def _in_the_merge(sink: MergeSink) -> None:
    """Variant M: never filter while materializing (the sink binds its tombstones at its first batch)."""
    tombstones = sink._tombstones  # a benchmark of one internal choice
    assert tombstones is not None
    tombstones.lookup_reads_most = lambda snapshot, files: False  # type: ignore[method-assign]


def run(args: argparse.Namespace) -> dict[str, Any]:
    spark = local_session("late_events_bench", "local[2]")
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="late_events_bench_"))
    load_before = os.getloadavg()
    try:
        target, raw_batches, expected_rows = make_batches(args.target_rows, args.warmup + args.batches,
                                                          args.batch_rows, args.seed)
        master = str(workdir / "master")
        create_target(spark, target, master, args.target_files)
        paths = {name: str(workdir / name) for name in VARIANTS}
        for path in paths.values():
            shutil.copytree(master, path)
        sinks = {name: MergeSink(paths[name], keys=["id"], sequence_by="lsn", apply_as_deletes="op = 'd'",
                                 app_id="late_events_bench") for name in VARIANTS}
        batches = [to_spark(spark, b) for b in raw_batches]
        context = spark.sparkContext
        times: dict[str, list[float]] = {name: [] for name in VARIANTS}
        jobs: dict[str, list[int]] = {name: [] for name in VARIANTS}
        late: dict[str, int] = dict.fromkeys(VARIANTS, 0)
        for batch_id, batch in enumerate(batches):
            order = VARIANTS if batch_id % 2 == 0 else VARIANTS[::-1]
            line = []
            for name in order:
                gc.collect()
                group = f"late_events_bench-{name}-{batch_id}"
                context.setLocalProperty("spark.jobGroup.id", group)
                started = time.perf_counter()
                sinks[name](batch, batch_id)
                elapsed = (time.perf_counter() - started) * 1000.0
                context.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
                if batch_id == 0 and name == "M":
                    _in_the_merge(sinks[name])
                progress = sinks[name].lastProgress or {}
                late[name] += int(progress.get("numLateRowsDropped") or 0)
                if batch_id >= args.warmup:
                    times[name].append(elapsed)
                    jobs[name].append(len(context.statusTracker().getJobIdsForGroup(group)))
                line.append(f"{name}={elapsed:6.0f}ms")
            kind = "warm-up" if batch_id < args.warmup else "timed"
            print(f"  batch {batch_id:3d} {kind:<7} order {''.join(order)}: {'  '.join(line)}", flush=True)
        tables = {name: deltalake.DeltaTable(path).to_pyarrow_table().sort_by("id") for name, path in paths.items()}
        equal = tables["M"].equals(tables["S"])
        rows = {name: t.num_rows for name, t in tables.items()}
    finally:
        spark.stop()
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    stats = {name: summarize(times[name]) for name in VARIANTS}
    medians = {name: stats[name]["median_ms"] for name in VARIANTS}
    return {
        "benchmark": "late_events", "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "config": {"batches": args.batches, "warmup": args.warmup, "batchRows": args.batch_rows,
                   "targetRows": args.target_rows, "targetFiles": args.target_files, "seed": args.seed,
                   "lateShare": LATE_SHARE, "deleteShare": DELETE_SHARE},
        "stats": stats, "jobsPerBatch": {name: statistics.median(j) if j else None for name, j in jobs.items()},
        "ratioSoverM": (medians["S"] / medians["M"]) if medians["S"] and medians["M"] else None,
        "lateRowsDropped": late, "check": {"equal": equal, "rows": rows, "expectedRows": expected_rows},
        "environment": {"python": platform.python_version(), "pyspark": pyspark.__version__,
                        "deltalake": deltalake.__version__, "cpus": os.cpu_count(),
                        "loadavgBefore": [round(x, 2) for x in load_before],
                        "loadavgAfter": [round(x, 2) for x in os.getloadavg()]},
    }


def report(result: dict[str, Any]) -> None:
    config = result["config"]
    print(f"\nLate events: {config['batches']} timed batches of {config['batchRows']} events "
          f"({config['lateShare']:.0%} late re-sends, {config['deleteShare']:.0%} deletes) into "
          f"{config['targetRows']} rows, local[2]")
    for name in VARIANTS:
        s = result["stats"][name]
        print(f"  {name} ({LABELS[name]}): median {s['median_ms']:.0f} ms, p90 {s['p90_ms']:.0f} ms, "
              f"{result['jobsPerBatch'][name]} Spark jobs per batch, "
              f"{result['lateRowsDropped'][name]} late rows dropped")
    ratio = result["ratioSoverM"]
    print(f"  S/M median: {ratio:.2f}" if ratio is not None else "  S/M median: n/a")
    check = result["check"]
    verdict = "✓" if check["equal"] and check["rows"]["S"] == check["expectedRows"] else "✗"
    print(f"  check: {verdict} tables equal: {check['equal']}, rows {check['rows']} (expected {check['expectedRows']})")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=12, help="timed batches (default 12)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed warm-up batches (default 2)")
    parser.add_argument("--batch-rows", type=int, default=5000, help="events per batch (default 5000)")
    parser.add_argument("--target-rows", type=int, default=100_000, help="target rows (default 100000)")
    parser.add_argument("--target-files", type=int, default=8)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", default="bench/results/late_events.json")
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--keep", action="store_true")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    result = run(args)
    report(result)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0 if result["check"]["equal"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
