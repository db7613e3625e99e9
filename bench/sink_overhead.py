"""Per-batch overhead of ``MergeSink`` over a bare MERGE of the same micro-batches.

Run ``python -m bench.sink_overhead --help``. The sink does more than a MERGE per batch (the
idempotency check, its own materialization, the per-key dedupe window, NULL-key routing, the
tombstone lookup and upsert, the txn in the commit), and this says how much that costs, in
milliseconds per batch, on the same data in the same process:

* ``A`` (bare): ``DeltaTable.forPath(...).merge(...)`` with delete/update/insert clauses on ``op``,
  i.e. what a user would write in ``foreachBatch`` without the sink. The batches hold one event
  per id and increasing ``lsn``, so A is *correct* here without dedupe or an ordering guard;
* ``B`` (sink): ``MergeSink(keys, sequence_by, delete_when, app_id)`` called as ``foreachBatch``
  calls it, with tombstones (the default);
* ``C`` (sink, ``tombstones=False``): separates the tombstone table's cost from the rest;
* ``D`` (with ``--delta``): what users write today with Delta Lake itself, in ``foreachBatch``:
  ``spark.databricks.delta.write.txnAppId`` / ``txnVersion`` set for the batch (Delta's
  idempotent writes), the newest event per key kept (``row_number`` over a window), and
  delta-spark's ``DeltaTable.merge`` with the same clauses as A. The session then carries Delta
  Lake's jar, extension and catalog (and ``spark.databricks.delta.snapshotPartitions`` = 2, the
  cores), for every variant.

Fairness: every variant merges into its own ``shutil.copytree`` of one target folder, gets the
same batch objects (built from Arrow and ``localCheckpoint``-ed *before* any timing, so input
creation is excluded for all), is warmed up with the same first batches (untimed, but applied so
the tables stay equal), and the order A/B/C rotates from batch to batch so that neither JIT, GC
nor page cache systematically favours one. Only the call itself is timed (``perf_counter``);
``gc.collect()`` runs between calls, outside the timed region. The final tables are compared
row for row (read back with delta-rs) so a faster variant cannot be a wrong one.

A variant that raises is reported (✗, with the library frame it raised in) and dropped for the
rest of the run; the others go on, and the exit status is 1. ``--conf KEY=VALUE`` passes Spark
settings to the one session all variants share, e.g. to work around an engine failure:
``--conf spark.sql.adaptive.optimizer.excludedRules=org.apache.spark.sql.execution.adaptive.``
``AQEPropagateEmptyRelation`` (as one value) keeps AQE's empty-relation rewrite from dropping
the observed source-row count of a MERGE whose candidate files match no source row.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import deltalake
import numpy as np
import pyarrow as pa
import pyspark
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from bench import jvm_cpu
from streaming_merge import DeltaTable, MergeSink
from streaming_merge.session import local_session

VARIANTS = ("A", "B", "C")
DELTA_VARIANT = "D"
LABELS = {"A": "bare MERGE", "B": "MergeSink", "C": "MergeSink(tombstones=False)",
          "D": "Delta foreachBatch (txn, dedupe)"}
PHASES = ("materialize", "tombstones", "merge", "commit", "total")
UPDATE_FRACTION = 0.8
DELETE_FRACTION = 0.01  # carved out of the updates: "a few" deletes of live ids per batch
COMPARE_COLUMNS = ("id", "amount", "status")
STATUSES = np.array(["new", "paid", "shipped", "delivered", "cancelled", "refunded"])
APP_ID = "bench"

NOTES = [
    "ms = wall clock (time.perf_counter) of one call: A = forPath + merge(...).execute(), "
    "B/C = sink(batch, batch_id). Batch creation (createDataFrame from Arrow + localCheckpoint) is "
    "done before any timing and excluded for every variant.",
    "The first --warmup batches are applied to every table but not timed; the order of A/B/C "
    "rotates per batch.",
    "Sink phases come from sink.recentProgress durationMs: 'materialize' is the one pass over the "
    "batch (NULL-key flag, dedupe window, counts and key ranges observed, local checkpoint); "
    "'tombstones' = the tombstone lookup (driver-side file pruning; the anti join itself runs inside "
    "the MERGE's materialization) and the append of the batch's deletes; 'merge' = scanTimeMs + "
    "rewriteTimeMs; 'commit' = executionTimeMs - merge, and executionTimeMs is taken *before* the log "
    "commit, so 'commit' is snapshot checks + resolution + source materialization, not the commit. "
    "'unaccounted' = total - the four phases: the actual log commit, release of the materialized "
    "batch and the sink's up-front idempotency check.",
    "jobs = Spark jobs per call, counted by the status tracker for a job group around the call.",
]


# --------------------------------------------------------------------------- workload


@dataclass
class Workload:
    """The target rows and the change batches, all as Arrow, generated from one seed."""

    target: pa.Table
    batches: list[pa.Table]
    counts: list[dict[str, int]]


def make_workload(target_rows: int, n_batches: int, batch_rows: int, seed: int) -> Workload:
    """Target ids 0..N-1 (lsn 0, op 'c'); then per batch, on ids live at that point:
    80 % events on existing ids (a few of them deletes 'd', the rest updates 'u') and 20 % inserts
    'c' of new ids, one event per id, ``lsn`` strictly increasing across all batches.

    One event per id is deliberate: the bare MERGE has no dedupe, and a batch with two events
    for one id would fail it (or need a window the user writes), which is a different workload.
    Tracking the live ids keeps deletes real (they hit a row) and updates real (never of a row
    deleted earlier), so both variants do the same amount of work.
    """
    rng = np.random.default_rng(seed)
    n_updates_total = min(round(batch_rows * UPDATE_FRACTION), target_rows)
    n_deletes = max(1, round(batch_rows * DELETE_FRACTION)) if n_updates_total else 0
    n_inserts = batch_rows - n_updates_total
    alive = np.zeros(target_rows + n_batches * n_inserts, dtype=bool)
    alive[:target_rows] = True
    next_id = target_rows
    target = _rows(rng, np.arange(target_rows, dtype=np.int64), np.zeros(target_rows, np.int64),
                   np.full(target_rows, "c"))
    batches: list[pa.Table] = []
    counts: list[dict[str, int]] = []
    lsn = 1
    for _ in range(n_batches):
        live = np.flatnonzero(alive)
        existing = rng.choice(live, size=min(n_updates_total, len(live)), replace=False).astype(np.int64)
        deleted, updated = existing[:n_deletes], existing[n_deletes:]
        inserted = np.arange(next_id, next_id + n_inserts, dtype=np.int64)
        next_id += n_inserts
        alive[deleted] = False
        alive[inserted] = True
        ids = np.concatenate([updated, deleted, inserted])
        ops = np.concatenate([np.full(len(updated), "u"), np.full(len(deleted), "d"),
                              np.full(n_inserts, "c")])
        order = rng.permutation(len(ids))  # no variant gets a source sorted by key
        lsns = np.arange(lsn, lsn + len(ids), dtype=np.int64)  # increasing in arrival order
        lsn += len(ids)
        batches.append(_rows(rng, ids[order], lsns, ops[order]))
        counts.append({"updates": len(updated), "deletes": len(deleted), "inserts": n_inserts})
    return Workload(target, batches, counts)


def _rows(rng: np.random.Generator, ids: np.ndarray, lsns: np.ndarray, ops: np.ndarray) -> pa.Table:
    n = len(ids)
    return pa.table({
        "id": pa.array(ids, pa.int64()),
        "lsn": pa.array(lsns, pa.int64()),
        "op": pa.array(ops, pa.string()),
        "amount": pa.array(np.round(rng.random(n) * 1000.0, 2), pa.float64()),
        "status": pa.array(STATUSES[rng.integers(0, len(STATUSES), n)], pa.string()),
    })


def to_spark(spark: SparkSession, table: pa.Table) -> DataFrame:
    """Arrow -> Spark, checkpointed now so that no variant pays for (or re-runs) input creation."""
    return spark.createDataFrame(table).localCheckpoint(eager=True)


def create_target(spark: SparkSession, table: pa.Table, path: str, n_files: int) -> None:
    """The master target: ``n_files`` files with disjoint id ranges, like a table written in order."""
    frame = spark.createDataFrame(table).repartitionByRange(n_files, "id")
    DeltaTable.createFromDataFrame(frame, path)


# --------------------------------------------------------------------------- variants


class BareMerge:
    """Variant A: the MERGE a user would write in foreachBatch, with no sink around it.

    Keeps each batch's engine timings so the sink's 'merge' phase (scan + rewrite) can be set
    against the same phase of a bare MERGE: a difference there is not wrapper overhead but a
    costlier source handed to the engine.
    """

    def __init__(self, spark: SparkSession, path: str) -> None:
        self._spark = spark
        self._path = path
        self.timings: dict[int, dict[str, int]] = {}

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        metrics = (DeltaTable.forPath(self._spark, self._path).alias("t").merge(batch.alias("s"), "t.id = s.id")
                   .whenMatchedDelete("s.op = 'd'")
                   .whenMatchedUpdateAll("s.op != 'd'")
                   .whenNotMatchedInsertAll("s.op != 'd'")
                   .execute())
        self.timings[batch_id] = {k: int(metrics[k] or 0) for k in ("scanTimeMs", "rewriteTimeMs",
                                                                    "executionTimeMs")}


class DeltaForeachBatch:
    """Variant D: the ``foreachBatch`` function users write today with Delta Lake's own MERGE,
    exactly once through Delta's idempotent-write settings (a replayed batch id is skipped)."""

    def __init__(self, spark: SparkSession, path: str) -> None:
        self._spark = spark
        self._path = path

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        from delta.tables import DeltaTable as DeltaLakeTable

        newest = Window.partitionBy("id").orderBy(F.col("lsn").desc())
        deduped = batch.withColumn("_newest", F.row_number().over(newest)).filter("_newest = 1").drop("_newest")
        conf = self._spark.conf
        conf.set("spark.databricks.delta.write.txnAppId", APP_ID)
        conf.set("spark.databricks.delta.write.txnVersion", str(batch_id))
        try:
            (DeltaLakeTable.forPath(self._spark, self._path).alias("t").merge(deduped.alias("s"), "t.id = s.id")
             .whenMatchedDelete("s.op = 'd'")
             .whenMatchedUpdateAll("s.op != 'd'")
             .whenNotMatchedInsertAll("s.op != 'd'")
             .execute())
        finally:
            conf.unset("spark.databricks.delta.write.txnAppId")
            conf.unset("spark.databricks.delta.write.txnVersion")


def make_sink(path: str, tombstones: bool) -> MergeSink:
    """Variants B and C: the sink as documented for a CDC stream."""
    return MergeSink(path, keys=["id"], sequence_by="lsn", apply_as_deletes="op = 'd'", app_id=APP_ID,
                     tombstones=tombstones)


def time_tombstones(sink: MergeSink) -> dict[str, list[float]]:
    """Split the sink's 'tombstones' phase: wrap the tombstone lookup and append of this sink instance.

    The sink reports both inside 'tombstones'; B - C says what they cost together, this says which
    of the two it is. It reaches into a private attribute, so it degrades to nothing (an empty
    split) if the sink's internals change, rather than breaking the benchmark.
    """
    spent: dict[str, list[float]] = {"without_late": [], "record": []}
    tombstones = getattr(sink, "_tombstones", None)
    if tombstones is None:
        return spent
    for method in spent:
        original = getattr(tombstones, method, None)
        if original is None:
            continue

        def timed(*args: Any, _original: Callable[..., Any] = original, _name: str = method,
                  **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return _original(*args, **kwargs)
            finally:
                spent[_name].append((time.perf_counter() - started) * 1000.0)

        setattr(tombstones, method, timed)
    return spent


# --------------------------------------------------------------------------- statistics


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default), so p90 of 20 values is not just the max."""
    return float(np.percentile(np.asarray(values, dtype=float), q))


def summarize(values: Sequence[float]) -> dict[str, float | None]:
    if not values:
        return {"median_ms": None, "p90_ms": None, "mean_ms": None, "min_ms": None, "max_ms": None}
    return {
        "median_ms": statistics.median(values),
        "p90_ms": percentile(values, 90),
        "mean_ms": statistics.fmean(values),
        "min_ms": min(values),
        "max_ms": max(values),
    }


def bare_phase_medians(timings: Sequence[dict[str, int]]) -> dict[str, float]:
    """A's engine timings in the sink's phase names: merge = scan + rewrite (as the sink counts
    it), commit = executionTimeMs - merge (snapshot load + resolution, as the sink counts it)."""
    if not timings:
        return {}
    merge = [t["scanTimeMs"] + t["rewriteTimeMs"] for t in timings]
    return {"merge": statistics.median(merge),
            "commit": statistics.median(t["executionTimeMs"] - m for t, m in zip(timings, merge, strict=True))}


def phase_medians(progress: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Median per sink phase, plus 'unaccounted' (total minus the four named phases)."""
    out: dict[str, float] = {}
    if not progress:
        return out
    for phase in PHASES:
        out[phase] = statistics.median(float(p["durationMs"].get(phase, 0)) for p in progress)
    out["unaccounted"] = statistics.median(
        float(p["durationMs"].get("total", 0) - sum(p["durationMs"].get(x, 0) for x in PHASES[:-1]))
        for p in progress)
    return out


# --------------------------------------------------------------------------- check


@dataclass
class TableCheck:
    """How a variant's final table compares with the bare MERGE's."""

    rows: int
    columns: list[str]
    equal_to_a: bool
    expected_rows: int
    detail: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.equal_to_a and self.rows == self.expected_rows


def sorted_rows(path: str) -> tuple[pa.Table, list[str]]:
    """The compared columns sorted by id, read with delta-rs (an independent reader of the log)."""
    table = deltalake.DeltaTable(path).to_pyarrow_table()
    return table.select(list(COMPARE_COLUMNS)).sort_by("id"), table.column_names


def check_tables(paths: dict[str, str], expected_rows: int) -> dict[str, TableCheck]:
    reference, _ = sorted_rows(paths["A"])
    checks: dict[str, TableCheck] = {}
    for name, path in paths.items():
        rows, columns = sorted_rows(path)
        equal = rows.equals(reference)
        detail = "" if equal else _first_difference(reference, rows)
        checks[name] = TableCheck(rows.num_rows, columns, equal, expected_rows, detail)
    return checks


def _first_difference(expected: pa.Table, actual: pa.Table) -> str:
    if expected.num_rows != actual.num_rows:
        return f"{actual.num_rows} rows, A has {expected.num_rows}"
    for i, (e, a) in enumerate(zip(expected.to_pylist(), actual.to_pylist(), strict=True)):
        if e != a:
            return f"row {i}: {a} != A's {e}"
    return "equal values, different Arrow types"


# --------------------------------------------------------------------------- run


def overhead(stats: dict[str, dict[str, float | None]]) -> dict[str, float | None]:
    """Differences of medians (not medians of per-batch differences: the calls are not paired
    closely enough, with rotation, for a per-batch difference to mean more)."""
    med = {name: stats[name]["median_ms"] for name in stats}

    def diff(x: str, y: str) -> float | None:
        mx, my = med[x], med[y]
        return None if mx is None or my is None else mx - my

    def ratio(x: str, y: str) -> float | None:
        mx, my = med[x], med[y]
        return None if mx is None or not my else mx / my

    result = {"B_minus_A_median_ms": diff("B", "A"), "C_minus_A_median_ms": diff("C", "A"),
              "B_minus_C_median_ms": diff("B", "C"), "B_over_A": ratio("B", "A"), "C_over_A": ratio("C", "A")}
    if DELTA_VARIANT in med:  # the issue's target: the sink's batch against Delta's foreachBatch
        result |= {"B_over_D": ratio("B", DELTA_VARIANT), "C_over_D": ratio("C", DELTA_VARIANT)}
    return result


def parse_conf(pairs: Sequence[str]) -> dict[str, str]:
    conf: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise SystemExit(f"--conf needs KEY=VALUE, got {pair!r}")
        conf[key.strip()] = value.strip()
    return conf


def run(args: argparse.Namespace) -> dict[str, Any]:
    conf = parse_conf(args.conf)
    variants = (*VARIANTS, DELTA_VARIANT) if args.delta else VARIANTS
    session_conf = dict(conf)
    if args.delta:
        from streaming_merge.spark.packages import package_conf

        session_conf = package_conf(("delta",)) | {"spark.databricks.delta.snapshotPartitions": "2"} | conf
    spark = local_session("bench", "local[2]", extra_conf=session_conf)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="sink_overhead_"))
    workdir.mkdir(parents=True, exist_ok=True)
    total_batches = args.warmup + args.batches
    try:
        t0 = time.perf_counter()
        workload = make_workload(args.target_rows, total_batches, args.batch_rows, args.seed)
        master = str(workdir / "master")
        create_target(spark, workload.target, master, args.target_files)
        paths = {name: str(workdir / name) for name in variants}
        for path in paths.values():
            shutil.copytree(master, path)
        batches = [to_spark(spark, b) for b in workload.batches]
        print(f"setup: target {args.target_rows} rows in {_num_files(master)} files, {total_batches} "
              f"batches of {args.batch_rows} rows ({workload.counts[0]}) in {time.perf_counter() - t0:.1f}s; "
              f"workdir {workdir}", flush=True)

        sinks = {"B": make_sink(paths["B"], tombstones=True), "C": make_sink(paths["C"], tombstones=False)}
        tombstone_ms: dict[str, list[float]] = {"without_late": [], "record": []}
        pid = jvm_cpu.jvm_pid(spark)
        measure_cpu = jvm_cpu.available(pid)
        cpu_ms: dict[str, dict[str, float]] = {name: dict.fromkeys(jvm_cpu.GROUP_NAMES, 0.0) for name in variants}
        bare = BareMerge(spark, paths["A"])
        load_before = os.getloadavg()
        calls: dict[str, Callable[[DataFrame, int], None]] = {"A": bare, **sinks}
        if args.delta:
            calls[DELTA_VARIANT] = DeltaForeachBatch(spark, paths[DELTA_VARIANT])
        times: dict[str, list[float]] = {name: [] for name in variants}
        jobs: dict[str, list[int]] = {name: [] for name in variants}
        context = spark.sparkContext
        # A variant that raises is dropped for the rest of the run (its table no longer matches the
        # others, so timing it further would compare different work), and the run still reports.
        failures: dict[str, dict[str, Any]] = {}
        for batch_id, batch in enumerate(batches):
            shift = batch_id % len(variants)
            order = [name for name in variants[shift:] + variants[:shift] if name not in failures]
            this_batch: dict[str, str] = {name: "failed" for name in variants}
            for name in order:
                gc.collect()
                group = f"sink_overhead-{name}-{batch_id}"
                context.setLocalProperty("spark.jobGroup.id", group)
                cpu_before = jvm_cpu.thread_cpu_seconds(pid) if measure_cpu else None
                started = time.perf_counter()
                try:
                    calls[name](batch, batch_id)
                except Exception as exc:
                    context.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
                    failures[name] = {"batch_id": batch_id, "error": type(exc).__name__,
                                      "message": _first_line(exc), "where": _innermost_frame(exc)}
                    print(f"  ✗ {name} ({LABELS[name]}) raised on batch {batch_id}: {type(exc).__name__}: "
                          f"{_first_line(exc)} at {failures[name]['where']}", flush=True)
                    continue
                elapsed = (time.perf_counter() - started) * 1000.0
                context.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
                this_batch[name] = f"{elapsed:6.0f}ms"
                if name == "B" and batch_id == 0:  # the sink binds its tombstone table at its first batch
                    tombstone_ms = time_tombstones(sinks["B"])
                if batch_id >= args.warmup:
                    if cpu_before is not None:
                        spent = jvm_cpu.delta_ms(cpu_before, jvm_cpu.thread_cpu_seconds(pid))
                        for threads, ms in spent.items():
                            cpu_ms[name][threads] += ms / args.batches
                    times[name].append(elapsed)
                    jobs[name].append(len(context.statusTracker().getJobIdsForGroup(group)))
            kind = "warm-up" if batch_id < args.warmup else "timed"
            print(f"  batch {batch_id:3d} {kind:<7} order {''.join(order):<3}: "
                  + "  ".join(f"{name}={this_batch[name]:>8}" for name in variants), flush=True)

        load_after = os.getloadavg()
        stats = {name: summarize(times[name]) for name in variants}
        progress = {name: [p for p in sink.recentProgress if p["batchId"] >= args.warmup and not p["skipped"]]
                    for name, sink in sinks.items()}
        phases = {name: phase_medians(records) for name, records in progress.items()}
        phases["A"] = bare_phase_medians([t for b, t in bare.timings.items() if b >= args.warmup])
        expected_rows = args.target_rows + sum(c["inserts"] - c["deletes"] for c in workload.counts)
        checks = check_tables(paths, expected_rows)
        for name, failure in failures.items():
            checks[name].equal_to_a = False
            checks[name].detail = f"raised on batch {failure['batch_id']}: {failure['error']}"
        tombstone_path = f"{paths['B']}_tombstones"
        tombstone_rows = deltalake.DeltaTable(tombstone_path).to_pyarrow_table().num_rows \
            if os.path.isdir(tombstone_path) else None
        result = {
            "benchmark": "sink_overhead",
            "created": datetime.now(UTC).isoformat(timespec="seconds"),
            "config": {
                "target_rows": args.target_rows, "target_files": args.target_files, "batches": args.batches,
                "warmup": args.warmup, "batch_rows": args.batch_rows, "seed": args.seed,
                "batch_mix": workload.counts[0], "master": "local[2]", "spark_conf": session_conf,
            },
            "environment": {
                "python": platform.python_version(), "pyspark": pyspark.__version__,
                "deltalake": deltalake.__version__, "cpus": os.cpu_count(), "platform": platform.platform(),
                "loadavg_before": load_before, "loadavg_after": load_after,
            },
            "variants": {name: {"label": LABELS[name], **stats[name], "ms": times[name], "jobs": jobs[name]}
                         for name in variants},
            "overhead": overhead(stats),
            "failures": failures,
            "sink_phases_median_ms": phases,
            # one call per batch each, so the last --batches values are the timed batches
            "tombstone_split_median_ms": {k: statistics.median(v[-args.batches:]) if v else None
                                          for k, v in tombstone_ms.items()},
            "sink_progress": {name: [p["durationMs"] for p in records] for name, records in progress.items()},
            "check": {name: {"ok": c.ok, "rows": c.rows, "expected_rows": c.expected_rows,
                             "equal_to_A": c.equal_to_a, "columns": c.columns, "detail": c.detail}
                      for name, c in checks.items()},
            "jvm_cpu_ms_per_batch": cpu_ms if measure_cpu else None,
            "tombstone_rows": tombstone_rows,
            "final_files": {name: _num_files(path) for name, path in paths.items()},
            "notes": NOTES,
        }
        report(result)
        return result
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)  # the tombstone table is inside it too


def _num_files(path: str) -> int:
    return len(deltalake.DeltaTable(path).file_uris())


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else ""


def _innermost_frame(exc: BaseException) -> str:
    """file:line of the deepest streaming_merge frame, so a failure points at the library code."""
    tb, where = exc.__traceback__, ""
    while tb is not None:
        filename = tb.tb_frame.f_code.co_filename
        if "streaming_merge" in filename:
            where = f"{filename.split('streaming_merge/')[-1]}:{tb.tb_lineno} ({tb.tb_frame.f_code.co_name})"
        tb = tb.tb_next
    return where or "?"


def _fmt(value: float | None, spec: str = "9.0f") -> str:
    width = int(spec.split(".")[0].lstrip("+") or 0)
    return f"{value:{spec}}" if value is not None else f"{'n/a':>{width}}"


def report(result: dict[str, Any]) -> None:
    """The human-readable summary; the JSON holds the same numbers and every raw time."""
    cfg = result["config"]
    print(f"\n{cfg['batches']} timed batches of {cfg['batch_rows']} rows into {cfg['target_rows']} rows "
          f"({cfg['warmup']} warm-up), ms per batch" + (f", conf {cfg['spark_conf']}" if cfg["spark_conf"] else "")
          + ":")
    print(f"  {'variant':<34}{'n':>4}{'median':>9}{'p90':>9}{'mean':>9}{'min':>9}{'max':>9}{'jobs':>9}")
    for name, v in result["variants"].items():
        job_range = f"{min(v['jobs'])}-{max(v['jobs'])}" if v["jobs"] else "n/a"
        print(f"  {name} {v['label']:<32}{len(v['ms']):4d}" + "".join(
            _fmt(v[k]) for k in ("median_ms", "p90_ms", "mean_ms", "min_ms", "max_ms")) + f"{job_range:>9}")
    o = result["overhead"]
    print(f"  overhead (median): B-A = {_fmt(o['B_minus_A_median_ms'], '+.0f')} ms, "
          f"C-A = {_fmt(o['C_minus_A_median_ms'], '+.0f')} ms, "
          f"tombstones B-C = {_fmt(o['B_minus_C_median_ms'], '+.0f')} ms; "
          f"B/A = {_fmt(o['B_over_A'], '.2f')}, C/A = {_fmt(o['C_over_A'], '.2f')}")
    if "B_over_D" in o:
        print(f"  against Delta Lake's own foreachBatch (D): B/D = {_fmt(o['B_over_D'], '.2f')}, "
              f"C/D = {_fmt(o['C_over_D'], '.2f')}")
    print("  sink phases, median ms over timed batches (from recentProgress durationMs):")
    names = [*PHASES, "unaccounted"]
    print("    " + "".join(f"{n:>13}" for n in ("", *names)))
    for name, phases in result["sink_phases_median_ms"].items():
        print(f"    {name:>13}" + "".join(_fmt(phases.get(n), "13.0f") for n in names))
    split = result["tombstone_split_median_ms"]
    print(f"  B's 'tombstones' phase, median ms: lookup (without_late) {_fmt(split['without_late'], '.0f')}, "
          f"append (record) {_fmt(split['record'], '.0f')}")
    cpu = result.get("jvm_cpu_ms_per_batch")
    if cpu:
        print("  driver JVM CPU, mean ms per timed batch by thread group (/proc; 2 cores give 2 ms per ms of wall):")
        print("    " + "".join(f"{n:>15}" for n in ("", *jvm_cpu.GROUP_NAMES, "total")))
        for name, groups in cpu.items():
            print(f"    {name:>15}" + "".join(_fmt(groups[g], "15.0f") for g in jvm_cpu.GROUP_NAMES)
                  + _fmt(sum(groups.values()), "15.0f"))
    env = result["environment"]
    print(f"  load average (1/5/15 min) before {env['loadavg_before']}, after {env['loadavg_after']} "
          f"on {env['cpus']} CPUs")
    print("  check (sorted id, amount, status vs A; read with delta-rs):")
    for name, c in result["check"].items():
        mark = "✓" if c["ok"] else "✗"
        print(f"    {mark} {name}: {c['rows']} rows (expected {c['expected_rows']}), columns {c['columns']}"
              + (f" — {c['detail']}" if c["detail"] else ""))
    print(f"  tombstone table rows (B): {result['tombstone_rows']}; live files: {result['final_files']}")
    for name, f in result["failures"].items():
        print(f"  ✗ {name} failed on batch {f['batch_id']}: {f['error']}: {f['message']} at {f['where']}")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.sink_overhead", description=__doc__.split("\n")[0])
    parser.add_argument("--batches", type=int, default=20, help="timed batches (default 20)")
    parser.add_argument("--batch-rows", type=int, default=1000, help="events per batch (default 1000)")
    parser.add_argument("--target-rows", type=int, default=100_000, help="target rows (default 100000)")
    parser.add_argument("--target-files", type=int, default=8, help="initial target files (default 8)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed warm-up batches (default 2)")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--quick", action="store_true", help="5 batches into a 10k-row target")
    parser.add_argument("--out", default=None,
                        help="JSON output (default bench/results/sink_overhead[_quick].json)")
    parser.add_argument("--workdir", default=None, help="where the tables go (default: a temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep the tables afterwards")
    parser.add_argument("--delta", action="store_true",
                        help="add variant D, the foreachBatch users write with Delta Lake's own MERGE (delta-spark)")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                        help="extra Spark conf for the session, repeatable (applies to every variant)")
    args = parser.parse_args(argv)
    if args.quick:
        args.batches, args.target_rows = 5, 10_000
    if args.out is None:
        args.out = f"bench/results/sink_overhead{'_quick' if args.quick else ''}.json"
    if args.batches < 1 or args.batch_rows < 1 or args.target_rows < 1 or args.warmup < 0:
        parser.error("--batches, --batch-rows and --target-rows must be >= 1, --warmup >= 0")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    result = run(args)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")
    return 0 if all(c["ok"] for c in result["check"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
