"""Full scan of a deletion-vector table against a scan of the same rows compacted.

    python -m bench.dv_scan_bench                                   # 3M rows, 20 files, 10 % deleted
    python -m bench.dv_scan_bench --target-rows 100000 --runs 3 --warmup 1   # smoke run

The issue's target: a full scan of a table whose DVs delete 10 % of its rows costs at most 1.2x
the scan of the same live rows without DVs.

* **Tables**: the target of ``bench/merge_bench.py`` (``make_target``/``write_target``:
  ``--target-rows`` rows, ``--target-files`` files with disjoint id ranges, a checkpoint). DVs
  are turned on (``enableDeletionVectors``) and a MERGE with ``whenMatchedDelete()`` deletes
  ``--delete-fraction`` of the ids, drawn uniformly, so every file gets a DV and no data file is
  rewritten. The compacted twin holds the same live rows written as a new table without DVs in
  as many files (the target's rows minus the deleted ids, through the same ``write_target``).
  Both are checked before timing: same row count, same sum of ids and of amounts (delta-rs
  ``scan()``), every file of the DV table has a DV, the twin has none.
* **Timed**, in one process, interleaved (DV, compacted, DV, compacted, ...; which of the two
  goes first alternates from round to round) after ``--warmup`` untimed rounds: our full
  scan, ``DeltaTable.forPath(spark, p).toDF()`` (log read, DVs decoded and planned: ``plan``)
  then ``df.write.format("noop").mode("overwrite").save()`` (``action``: every row of every
  column is read and nothing shipped to the driver). Spark jobs per scan are counted by the
  status tracker for a job group (``streaming_merge.spark.profile``), Delta log loads too. For
  reference, delta-rs ``pa.table(deltalake.DeltaTable(p).scan())`` of both tables (every column
  into Arrow in this process: not the same work as Spark's noop write, so compare its two rows
  with each other, not with ours).
* **Output**: medians of ``--runs`` per engine and table, the ratio DV / compacted for each
  engine, JSON in ``--out`` (``bench/results/``, git-ignored). The decoded DVs are cached by
  their ids in the driver (``streaming_merge.table.dv_filter``), so the warm-up rounds pay for
  reading the DV files and the timed ones do not, as in a long-running job; the first (cold)
  DV scan is printed and kept in the JSON apart.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import deltalake
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from bench.merge_bench import make_target, write_target

TABLES = ("dv", "compacted")
ENGINES = ("ours", "delta-rs")
TARGET_RATIO = 1.2


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.dv_scan_bench",
                                     description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--target-rows", type=int, default=3_000_000)
    parser.add_argument("--target-files", type=int, default=20)
    parser.add_argument("--delete-fraction", type=float, default=0.10,
                        help="share of the rows the DVs delete, drawn uniformly (default 0.10)")
    parser.add_argument("--runs", type=int, default=7, help="timed scans per engine and table (median shown)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed rounds (every engine, both tables) first")
    parser.add_argument("--engines", default=",".join(ENGINES), help=f"comma list of {', '.join(ENGINES)}")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--out", default="bench/results/dv_scan.json")
    parser.add_argument("--workdir", default=None, help="scratch folder (default: a new temp dir, deleted after)")
    parser.add_argument("--keep", action="store_true", help="keep the scratch folder")
    parser.add_argument("--floor", action="store_true",
                        help="then time what any Spark scan applying row-level deletes pays, on the DV table's "
                             "files read as plain Parquet (see floor_variants), against the compacted scan")
    args = parser.parse_args(argv)
    args.engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    unknown = [e for e in args.engines if e not in ENGINES]
    if unknown or "ours" not in args.engines:
        parser.error(f"--engines: choose from {', '.join(ENGINES)} (ours is required), got {args.engines}")
    if args.runs < 1 or args.warmup < 0 or args.target_rows < 1 or not 0 < args.delete_fraction < 1:
        parser.error("--runs >= 1, --warmup >= 0, --target-rows >= 1 and 0 < --delete-fraction < 1")
    return args


# --------------------------------------------------------------------------- the two tables


def build_tables(spark: Any, args: argparse.Namespace, workdir: Path, log: Callable[[str], None]
                 ) -> dict[str, Any]:
    """The DV table and its compacted twin under ``workdir``; returns what was built and checked."""
    from streaming_merge import DeltaTable

    started = time.perf_counter()
    target = make_target(args.target_rows, args.seed)
    dv_path, compacted_path = workdir / "dv", workdir / "compacted"
    write_target(target, dv_path, args.target_files)
    DeltaTable.forPath(spark, str(dv_path)).enableDeletionVectors()

    rng = np.random.default_rng([args.seed, 1])
    deleted = np.sort(rng.choice(args.target_rows, size=round(args.target_rows * args.delete_fraction),
                                 replace=False)).astype(np.int64)
    source = spark.createDataFrame(pa.table({"id": pa.array(deleted, pa.int64())}))
    merge_started = time.perf_counter()
    metrics = (DeltaTable.forPath(spark, str(dv_path)).alias("t").merge(source.alias("s"), "t.id = s.id")
               .whenMatchedDelete().execute())
    merge_s = time.perf_counter() - merge_started

    live = target.filter(pc.invert(pc.is_in(target["id"], value_set=pa.array(deleted, pa.int64()))))
    write_target(live, compacted_path, args.target_files)
    del target
    info = {"deletedRows": len(deleted), "liveRows": live.num_rows, "mergeSeconds": round(merge_s, 3),
            "mergeMetrics": {k: v for k, v in dict(metrics or {}).items() if isinstance(v, int | float | str)},
            "buildSeconds": round(time.perf_counter() - started, 1),
            "tables": {"dv": describe(dv_path), "compacted": describe(compacted_path)}}
    expected = {"rows": live.num_rows, "idSum": int(pc.sum(live["id"]).as_py()),
                "amountSum": round(float(pc.sum(live["amount"]).as_py()), 2)}
    del live
    info["check"] = check_tables(dv_path, compacted_path, expected, info["tables"], args.target_files)
    log(f"tables built in {info['buildSeconds']:.1f}s (DV MERGE {merge_s:.1f}s): "
        f"{args.target_rows:,} rows, {len(deleted):,} deleted by DVs, {info['liveRows']:,} live; "
        f"dv: {info['tables']['dv']['files']} files ({info['tables']['dv']['filesWithDv']} with a DV), "
        f"{info['tables']['dv']['bytes'] / 1e6:.1f} MB; compacted: {info['tables']['compacted']['files']} files, "
        f"{info['tables']['compacted']['bytes'] / 1e6:.1f} MB; check {'✓' if info['check']['ok'] else '✗'}")
    return {"paths": {"dv": str(dv_path), "compacted": str(compacted_path)}, **info}


def describe(path: Path) -> dict[str, Any]:
    """Files, bytes, DVs and physical rows of the table's live files, from its log."""
    from streaming_merge.table.snapshot import load_snapshot

    snapshot = load_snapshot(str(path))
    return {"version": snapshot.version, "files": len(snapshot.files), "bytes": sum(f.size for f in snapshot.files),
            "physicalRows": sum(f.num_records or 0 for f in snapshot.files),
            "filesWithDv": sum(1 for f in snapshot.files if f.deletion_vector is not None),
            "rowsDeletedByDvs": sum(f.deleted_rows for f in snapshot.files),
            "deletionVectorsFeature": snapshot.has_deletion_vectors}


def check_tables(dv_path: Path, compacted_path: Path, expected: dict[str, Any], tables: dict[str, Any],
                 files: int) -> dict[str, Any]:
    """Both tables hold the same live rows (read with delta-rs, which applies the DVs); every file
    of the DV table has a DV and none was rewritten; the twin has the same file count and no DV."""
    sums = {}
    for name, path in (("dv", dv_path), ("compacted", compacted_path)):
        data = pa.table(deltalake.DeltaTable(str(path)).scan(columns=["id", "amount"]))
        sums[name] = {"rows": data.num_rows, "idSum": int(pc.sum(data["id"]).as_py()),
                      "amountSum": round(float(pc.sum(data["amount"]).as_py()), 2)}
    dv, compacted = tables["dv"], tables["compacted"]
    expected_files = min(files, expected["rows"])
    problems = [f"{name} holds {got}, expected {expected}" for name, got in sums.items() if got != expected]
    if dv["filesWithDv"] != dv["files"] or dv["files"] != expected_files:
        problems.append(f"dv: {dv['filesWithDv']} of {dv['files']} files have a DV, expected all of {expected_files}")
    if dv["physicalRows"] - dv["rowsDeletedByDvs"] != expected["rows"]:
        problems.append(f"dv: {dv['physicalRows']} rows - {dv['rowsDeletedByDvs']} deleted != {expected['rows']}")
    if compacted["filesWithDv"] or compacted["files"] != expected_files or compacted["deletionVectorsFeature"]:
        problems.append(f"compacted: {compacted['files']} files, {compacted['filesWithDv']} with a DV")
    return {"ok": not problems, "problems": problems, "read": sums}


# --------------------------------------------------------------------------- timed scans


def scan_ours(spark: Any, path: str) -> dict[str, Any]:
    """``toDF()`` (plan) then a noop write (action) under a profile: wall ms, Spark jobs, log loads."""
    from streaming_merge import DeltaTable
    from streaming_merge.spark.profile import phase, profiling

    with profiling() as profile, phase(spark, "scan"):
        started = time.perf_counter()
        frame = DeltaTable.forPath(spark, path).toDF()
        planned = time.perf_counter()
        frame.write.format("noop").mode("overwrite").save()
        finished = time.perf_counter()
    return {"ms": (finished - started) * 1000, "planMs": (planned - started) * 1000,
            "actionMs": (finished - planned) * 1000, "jobs": profile.jobs, "logLoads": profile.log_loads}


def scan_delta_rs(path: str) -> dict[str, Any]:
    """delta-rs (DataFusion, DVs applied) reading every column into one Arrow table."""
    started = time.perf_counter()
    rows = pa.table(deltalake.DeltaTable(path).scan()).num_rows
    return {"ms": (time.perf_counter() - started) * 1000, "rows": rows}


def timed_rounds(spark: Any, args: argparse.Namespace, paths: dict[str, str], log: Callable[[str], None]
                 ) -> dict[str, Any]:
    """Warm-up rounds, then ``--runs`` rounds; each round scans both tables with each engine,
    alternating which table goes first."""
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {e: {t: [] for t in TABLES} for e in args.engines}
    warmups: dict[str, dict[str, list[dict[str, Any]]]] = {e: {t: [] for t in TABLES} for e in args.engines}
    for round_no in range(args.warmup + args.runs):
        order = TABLES if round_no % 2 == 0 else TABLES[::-1]
        timed = round_no >= args.warmup
        cells = []
        for engine in args.engines:
            for table in order:
                result = scan_ours(spark, paths[table]) if engine == "ours" else scan_delta_rs(paths[table])
                (runs if timed else warmups)[engine][table].append(result)
                cells.append(f"{engine}/{table} {result['ms']:.0f} ms"
                             + (f" ({result['jobs']} jobs)" if "jobs" in result else ""))
        label = f"run {round_no - args.warmup + 1}/{args.runs}" if timed else f"warm-up {round_no + 1}/{args.warmup}"
        log(f"  [{label}] " + ", ".join(cells))
    return {"runs": runs, "warmups": warmups}


def floor_variants(spark: Any, paths: dict[str, str]) -> dict[str, Callable[[], Any]]:
    """Scans to tell our DV test's cost apart from what Spark charges any row-level test: the DV
    table's data files read as plain Parquet (its 10 % deleted rows included) with no filter,
    with a filter over data columns (any Filter operator), and with a filter that reads only
    the columns a deletion test needs (the row's index in its file, as our scans read it, and
    its file's size from ``_metadata``) but tests nothing; beside our own DV scan and the
    compacted one, all as a noop write of every column."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import LongType, StructField, StructType

    from streaming_merge import DeltaTable
    from streaming_merge.table.file_relation import files_relation
    from streaming_merge.table.scan import _java_strings
    from streaming_merge.table.spark_paths import ROW_INDEX_READ_COL

    root = f"file:{Path(paths['dv']).resolve()}"
    files = [f"file:{Path(uri).resolve()}" for uri in deltalake.DeltaTable(paths["dv"]).file_uris()]
    schema = DeltaTable.forPath(spark, paths["dv"]).toDF().schema
    with_index = StructType([*schema.fields, StructField(ROW_INDEX_READ_COL, LongType())])
    anything = F.col(schema.fields[0].name).isNotNull() | F.col(schema.fields[1].name).isNotNull()
    reads_test_columns = (F.col(ROW_INDEX_READ_COL) >= 0) & (F.col("_metadata.file_size") > 0)

    def read(read_schema: StructType) -> Any:
        """The files as our scans read them (a file index from the list, no listing)."""
        return files_relation(spark, root, _java_strings(spark, files), read_schema, {})

    return {
        "compacted, ours": lambda: DeltaTable.forPath(spark, paths["compacted"]).toDF(),
        "DV files as Parquet, no filter": lambda: read(schema),
        "DV files, a filter on data columns": lambda: read(schema).filter(anything),
        "DV files, a filter reading row index and file size": lambda: (
            read(with_index).filter(reads_test_columns).drop(ROW_INDEX_READ_COL)),
        "DV table, ours (DVs applied)": lambda: DeltaTable.forPath(spark, paths["dv"]).toDF(),
    }


def floor_rounds(spark: Any, args: argparse.Namespace, paths: dict[str, str]) -> dict[str, float]:
    """Medians (ms, plan and noop write) of each floor variant over ``--runs`` rounds after
    ``--warmup``, interleaved, the order reversed every other round."""
    variants = floor_variants(spark, paths)
    times: dict[str, list[float]] = {name: [] for name in variants}
    names = list(variants)
    for round_no in range(args.warmup + args.runs):
        for name in names if round_no % 2 == 0 else names[::-1]:
            started = time.perf_counter()
            variants[name]().write.format("noop").mode("overwrite").save()
            if round_no >= args.warmup:
                times[name].append((time.perf_counter() - started) * 1000)
    return {name: round(statistics.median(values), 1) for name, values in times.items()}


def format_floor(floor: dict[str, float]) -> str:
    base = floor["compacted, ours"]
    lines = ["What a row-level test costs in Spark (same process, interleaved; x the compacted scan):"]
    lines += [f"  {ms:7.1f} ms  {ms / base:5.2f}x  {name}" for name, ms in floor.items()]
    return "\n".join(lines)


def summarize(timings: dict[str, Any]) -> dict[str, Any]:
    """Medians per engine and table, the DV / compacted ratio per engine, jobs per scan."""
    summary: dict[str, Any] = {}
    for engine, by_table in timings["runs"].items():
        row: dict[str, Any] = {}
        for table, results in by_table.items():
            row[table] = {key: round(statistics.median(r[key] for r in results), 1)
                          for key in ("ms", "planMs", "actionMs") if key in results[0]}
            if "jobs" in results[0]:
                row[table]["jobs"] = sorted({r["jobs"] for r in results})
                row[table]["logLoads"] = sorted({r["logLoads"] for r in results})
            row[table]["all"] = [round(r["ms"]) for r in results]
        row["ratio"] = row["dv"]["ms"] / row["compacted"]["ms"] if row["compacted"]["ms"] else None
        first = timings["warmups"][engine]["dv"]
        row["coldDvMs"] = round(first[0]["ms"], 1) if first else None
        summary[engine] = row
    return summary


def format_report(args: argparse.Namespace, built: dict[str, Any], summary: dict[str, Any]) -> str:
    lines = [f"Full scan, {args.target_rows:,} rows in {args.target_files} files, DVs deleting "
             f"{built['deletedRows']:,} ({args.delete_fraction:.0%}) vs the {built['liveRows']:,} live rows compacted; "
             f"median of {args.runs} after {args.warmup} warm-up round(s), interleaved"]
    header = ("engine", "table", "ms", "plan ms", "action ms", "jobs", "log loads", "runs (ms)")
    rows = [header]
    for engine, row in summary.items():
        for table in TABLES:
            cell = row[table]
            rows.append((engine, table, f"{cell['ms']:.0f}",
                         f"{cell['planMs']:.0f}" if "planMs" in cell else "-",
                         f"{cell['actionMs']:.0f}" if "actionMs" in cell else "-",
                         ",".join(map(str, cell.get("jobs", []))) or "-",
                         ",".join(map(str, cell.get("logLoads", []))) or "-",
                         " ".join(map(str, cell["all"]))))
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines += ["  ".join(c.rjust(w) if 1 < i < 7 else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
              for r in rows]
    lines.insert(2, "  ".join("-" * w for w in widths))
    for engine, row in summary.items():
        ratio = row["ratio"]
        verdict = ""
        if engine == "ours" and ratio is not None:
            verdict = f" (target <= {TARGET_RATIO}x: {'met' if ratio <= TARGET_RATIO else 'NOT met'})"
        lines.append(f"{engine}: DV / compacted = {ratio:.2f}x{verdict}; first (cold) DV scan "
                     f"{row['coldDvMs'] if row['coldDvMs'] is not None else '-'} ms")
    lines.append("ours = DeltaTable.forPath(spark, p).toDF() + noop write of every column (plan = forPath + toDF, "
                 "action = the noop write); delta-rs = pa.table(DeltaTable(p).scan()), every column into Arrow.")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)

    def log(message: str) -> None:
        print(message, flush=True)

    import pyspark

    from streaming_merge.session import local_session

    load_before = os.getloadavg()
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="dv_scan_bench_"))
    workdir.mkdir(parents=True, exist_ok=True)
    log(f"workdir: {workdir}")
    spark = local_session("dv_scan_bench", args.master)
    try:
        built = build_tables(spark, args, workdir, log)
        if not built["check"]["ok"]:
            log(f"✗ the tables are not what the bench needs: {built['check']['problems']}")
        timings = timed_rounds(spark, args, built["paths"], log)
        floor = floor_rounds(spark, args, built["paths"]) if args.floor else None
    finally:
        spark.stop()
        if not args.keep and not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    summary = summarize(timings)
    print()
    print(format_report(args, built, summary))
    if floor is not None:
        print(format_floor(floor))
    report = {
        "benchmark": "dv_scan", "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": " ".join(["python", "-m", "bench.dv_scan_bench", *(sys.argv[1:] if argv is None else argv)]),
        "config": {k: v for k, v in vars(args).items() if k not in ("workdir", "keep", "out")},
        "tables": {k: v for k, v in built.items() if k != "paths"},
        "summary": summary, "ratio": summary["ours"]["ratio"], "targetRatio": TARGET_RATIO, "floorMs": floor,
        "runs": timings["runs"], "warmups": timings["warmups"],
        "environment": {"python": platform.python_version(), "pyspark": pyspark.__version__,
                        "deltalake": deltalake.__version__, "pyarrow": pa.__version__, "cpus": os.cpu_count(),
                        "platform": platform.platform(), "master": args.master,
                        "loadavgBefore": [round(x, 2) for x in load_before],
                        "loadavgAfter": [round(x, 2) for x in os.getloadavg()]},
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    log(f"\nwrote {out}")
    return 0 if built["check"]["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
