"""Reading a table's change data feed: ``DeltaTable.changes()`` against delta-rs ``load_cdf``.

    python -m bench.cdf_read_bench                                  # 1M rows, 10 upserts of 100k rows
    python -m bench.cdf_read_bench --target-rows 100000 --batch-rows 10000 --runs 3 --warmup 1   # smoke run

The target: at least 1M change rows/s over 10 versions of 100k-row upserts.

* **Table**: ``--target-rows`` rows (bench/merge_bench.py's ``make_target``: id, amount, status,
  updated_at, region) written by delta-rs in ``--target-files`` appends with
  ``delta.enableChangeDataFeed=true``, then ``--versions`` upserts of ``--batch-rows`` rows each
  (``make_batch``: 80 % updates of existing ids drawn uniformly, 20 % new ids), written by
  ``--writer``: ``delta-rs`` (``merge ... when_matched_update_all().when_not_matched_insert_all()``,
  which writes ``_change_data`` files) or ``ours`` (``DeltaTable.merge``, once the MERGE writes
  change data). Each upsert yields 2 change rows per update (pre- and postimage) and 1 per insert.
* **Checked** before timing: both readers return the same number of rows per version and change
  type, and that number is what the upserts imply.
* **Timed**, in one process, interleaved after ``--warmup`` untimed rounds: ours,
  ``changes(starting_version=first upsert)`` (``plan``: log and commits read, scans planned) then
  ``.write.format("noop")`` (``action``: every column of every row read by Spark, nothing shipped
  to the driver); delta-rs, ``pa.table(DeltaTable(p).load_cdf(starting_version=...))`` (every
  column into Arrow in this process: not the same work as Spark's noop write, but what a caller
  of each API gets). With ``--stream``, also the ``delta_changes`` source from the same version
  under ``availableNow`` into a noop sink (pyarrow on the executors, one batch).
* **Output**: medians of ``--runs``, change rows per second, the ratio ours / delta-rs, JSON in
  ``--out`` (``bench/results/``, git-ignored).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import deltalake
import numpy as np
import pyarrow as pa

from bench.merge_bench import make_batch, make_target

WRITERS = ("delta-rs", "ours")
TARGET_ROWS_PER_S = 1_000_000
CDF_ON = {"delta.enableChangeDataFeed": "true"}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.cdf_read_bench",
                                     description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--target-rows", type=int, default=1_000_000)
    parser.add_argument("--target-files", type=int, default=10)
    parser.add_argument("--versions", type=int, default=10, help="upserts after the initial write")
    parser.add_argument("--batch-rows", type=int, default=100_000, help="rows per upsert")
    parser.add_argument("--writer", choices=WRITERS, default="delta-rs")
    parser.add_argument("--runs", type=int, default=5, help="timed reads per engine (median shown)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed rounds first")
    parser.add_argument("--stream", action="store_true", help="also time the delta_changes stream (availableNow)")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--out", default="bench/results/cdf_read.json")
    parser.add_argument("--workdir", default=None, help="scratch folder (default: a new temp dir, deleted after)")
    parser.add_argument("--keep", action="store_true", help="keep the scratch folder")
    args = parser.parse_args(argv)
    if args.runs < 1 or args.warmup < 0 or args.versions < 1 or args.batch_rows < 1 or args.target_rows < 1:
        parser.error("--runs, --versions, --batch-rows and --target-rows >= 1; --warmup >= 0")
    return args


# --------------------------------------------------------------------------- the table


def build_table(spark: Any, args: argparse.Namespace, path: Path, log: Callable[[str], None]) -> dict[str, Any]:
    """The CDF table and its upserts; returns the first upsert's version and what was written."""
    started = time.perf_counter()
    target = make_target(args.target_rows, args.seed)
    bounds = np.linspace(0, target.num_rows, min(args.target_files, target.num_rows) + 1).astype(int)
    for i, (lo, hi) in enumerate(itertools.pairwise(bounds)):
        deltalake.write_deltalake(str(path), target.slice(lo, hi - lo), mode="error" if i == 0 else "append",
                                  configuration=CDF_ON if i == 0 else None)
    first = deltalake.DeltaTable(str(path)).version() + 1
    rows = target.num_rows
    del target
    expected: Counter[tuple[int, str]] = Counter()
    merge_s = []
    for i in range(args.versions):
        batch = make_batch(rows, args.batch_rows, "uniform", args.seed + 1 + i)
        merge_started = time.perf_counter()
        upsert(spark, args.writer, path, batch.table)
        merge_s.append(time.perf_counter() - merge_started)
        version = first + i
        expected[(version, "update_preimage")] += batch.n_updates
        expected[(version, "update_postimage")] += batch.n_updates
        expected[(version, "insert")] += batch.n_inserts
        rows += batch.n_inserts
    info = {"firstVersion": first, "lastVersion": first + args.versions - 1, "expectedRows": sum(expected.values()),
            "upsertSeconds": [round(s, 2) for s in merge_s], "buildSeconds": round(time.perf_counter() - started, 1),
            "changeFiles": change_files(path, first)}
    log(f"table built in {info['buildSeconds']:.1f}s: {args.target_rows:,} rows, {args.versions} upserts of "
        f"{args.batch_rows:,} rows by {args.writer} (median {statistics.median(merge_s):.2f}s each), "
        f"{info['expectedRows']:,} change rows in {info['changeFiles']} change data files")
    return {**info, "expected": expected}


def upsert(spark: Any, writer: str, path: Path, batch: pa.Table) -> None:
    if writer == "delta-rs":
        (deltalake.DeltaTable(str(path)).merge(batch, "t.id = s.id", source_alias="s", target_alias="t")
         .when_matched_update_all().when_not_matched_insert_all().execute())
        return
    from streaming_merge import DeltaTable

    source = spark.createDataFrame(batch)
    (DeltaTable.forPath(spark, str(path)).alias("t").merge(source.alias("s"), "t.id = s.id")
     .whenMatchedUpdateAll().whenNotMatchedInsertAll().execute())


def change_files(path: Path, first: int) -> int:
    """``cdc`` actions in the commits from ``first`` on."""
    count = 0
    for commit in sorted((path / "_delta_log").glob("*.json")):
        if int(commit.name[:20]) >= first:
            count += sum(1 for line in commit.read_text().splitlines() if line.startswith('{"cdc"'))
    return count


def check(spark: Any, path: str, first: int, expected: Counter[tuple[int, str]]) -> dict[str, Any]:
    """Rows per (version, change type) of both readers against the upserts'."""
    from streaming_merge import DeltaTable

    ours = Counter({(r[0], r[1]): r[2] for r in DeltaTable.forPath(spark, path).changes(starting_version=first)
                    .groupBy("_commit_version", "_change_type").count().collect()})
    data = pa.table(deltalake.DeltaTable(path).load_cdf(starting_version=first)
                    ).select(["_commit_version", "_change_type"])
    theirs = Counter(zip(data.column(0).to_pylist(), map(str, data.column(1).to_pylist()), strict=True))
    problems = [f"{name}: {dict(got - expected)} more, {dict(expected - got)} missing"
                for name, got in (("ours", ours), ("delta-rs", theirs)) if got != expected]
    return {"ok": not problems, "problems": problems}


# --------------------------------------------------------------------------- timed reads


def read_ours(spark: Any, path: str, first: int) -> dict[str, Any]:
    from streaming_merge import DeltaTable

    started = time.perf_counter()
    frame = DeltaTable.forPath(spark, path).changes(starting_version=first)
    planned = time.perf_counter()
    frame.write.format("noop").mode("overwrite").save()
    finished = time.perf_counter()
    return {"ms": (finished - started) * 1000, "planMs": (planned - started) * 1000,
            "actionMs": (finished - planned) * 1000}


def read_delta_rs(path: str, first: int) -> dict[str, Any]:
    started = time.perf_counter()
    rows = pa.table(deltalake.DeltaTable(path).load_cdf(starting_version=first)).num_rows
    return {"ms": (time.perf_counter() - started) * 1000, "rows": rows}


def read_stream(spark: Any, path: str, first: int, checkpoint: Path) -> dict[str, Any]:
    from streaming_merge.cdf import register

    shutil.rmtree(checkpoint, ignore_errors=True)
    register(spark)
    started = time.perf_counter()
    query = (spark.readStream.format("delta_changes").option("path", path).option("startingVersion", str(first))
             .option("maxFilesPerTrigger", "100000").load()
             .writeStream.format("noop").option("checkpointLocation", str(checkpoint))
             .trigger(availableNow=True).start())
    query.awaitTermination()
    return {"ms": (time.perf_counter() - started) * 1000}


def timed_rounds(spark: Any, args: argparse.Namespace, path: str, first: int, workdir: Path,
                 log: Callable[[str], None]) -> dict[str, list[dict[str, Any]]]:
    engines = ["ours", "delta-rs"] + (["stream"] if args.stream else [])
    runs: dict[str, list[dict[str, Any]]] = {e: [] for e in engines}
    for round_no in range(args.warmup + args.runs):
        order = engines if round_no % 2 == 0 else engines[::-1]
        cells = []
        for engine in order:
            if engine == "ours":
                result = read_ours(spark, path, first)
            elif engine == "delta-rs":
                result = read_delta_rs(path, first)
            else:
                result = read_stream(spark, path, first, workdir / "checkpoint")
            if round_no >= args.warmup:
                runs[engine].append(result)
            cells.append(f"{engine} {result['ms']:.0f} ms")
        log(f"{'run' if round_no >= args.warmup else 'warm-up'} {round_no + 1}: " + ", ".join(cells))
    return runs


def summarize(runs: dict[str, list[dict[str, Any]]], rows: int) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for engine, results in runs.items():
        ms = statistics.median(r["ms"] for r in results)
        summary[engine] = {"medianMs": round(ms, 1), "rowsPerSecond": round(rows / (ms / 1000)),
                           "runsMs": [round(r["ms"], 1) for r in results]}
        if engine == "ours":
            summary[engine]["medianPlanMs"] = round(statistics.median(r["planMs"] for r in results), 1)
            summary[engine]["medianActionMs"] = round(statistics.median(r["actionMs"] for r in results), 1)
    summary["ratioOursToDeltaRs"] = round(summary["ours"]["medianMs"] / summary["delta-rs"]["medianMs"], 3)
    return summary


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    from streaming_merge.session import local_session

    def log(message: str) -> None:
        print(message, flush=True)

    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="cdf_read_bench_"))
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "table"
    spark = local_session("cdf_read_bench", args.master)
    try:
        shutil.rmtree(path, ignore_errors=True)
        built = build_table(spark, args, path, log)
        expected = built.pop("expected")
        checked = check(spark, str(path), built["firstVersion"], expected)
        log(f"check {'✓' if checked['ok'] else '✗ ' + '; '.join(checked['problems'])}")
        runs = timed_rounds(spark, args, str(path), built["firstVersion"], workdir, log)
        summary = summarize(runs, built["expectedRows"])
        ours, theirs = summary["ours"], summary["delta-rs"]
        log(f"\n{built['expectedRows']:,} change rows over {args.versions} versions (median of {args.runs}):")
        log(f"  ours      {ours['medianMs']:8.0f} ms  {ours['rowsPerSecond']:>12,} rows/s  "
            f"(plan {ours['medianPlanMs']:.0f} ms, action {ours['medianActionMs']:.0f} ms)")
        log(f"  delta-rs  {theirs['medianMs']:8.0f} ms  {theirs['rowsPerSecond']:>12,} rows/s")
        if "stream" in summary:
            log(f"  stream    {summary['stream']['medianMs']:8.0f} ms  {summary['stream']['rowsPerSecond']:>12,} "
                "rows/s (delta_changes, availableNow, noop sink)")
        log(f"  ours / delta-rs time: {summary['ratioOursToDeltaRs']:.2f}x; target >= {TARGET_ROWS_PER_S:,} rows/s: "
            f"{'met' if ours['rowsPerSecond'] >= TARGET_ROWS_PER_S else 'NOT met'}")
        result = {"when": datetime.now(UTC).isoformat(timespec="seconds"), "args": vars(args),
                  "machine": {"python": sys.version.split()[0], "platform": platform.platform(),
                              "cpus": os.cpu_count(), "deltalake": deltalake.__version__},
                  "table": built, "check": checked, "summary": summary}
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2, default=str) + "\n")
        log(f"written {args.out}")
        return 0 if checked["ok"] else 1
    finally:
        spark.stop()
        if not args.keep and not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
