"""MERGE benchmark: ``streaming_merge`` ("ours") against delta-rs, DuckDB and a pyarrow I/O floor.

Run ``python -m bench.merge_bench --help``. The point is a like-for-like number for a CDC upsert
(80 % updates of existing keys, 20 % inserts of new keys) into a Delta table whose files have
disjoint key ranges, so that both the cost of the join/rewrite and the benefit of file skipping
(``clustered`` key distribution) show up:

* every engine merges the *same* batch into its *own copy* of the *same* Delta table folder
  (``shutil.copytree`` of one master written once), so file layout, log and page cache are equal;
* only the merge is timed (wall clock). Spark start-up, JVM class loading and JIT are paid by a warm-up
  merge on a tiny separate table; turning the Arrow batch into a Spark DataFrame is timed separately
  (``prep_s``) because delta-rs and DuckDB receive the batch already in their own memory;
* the table open (``forPath`` / ``deltalake.DeltaTable(path)``) *is* inside the timed region for both
  Delta engines: reading the log is part of what a MERGE costs;
* each result is checked cheaply (row count, distinct ids, number and amount-sum of rows carrying
  the batch's ``updated_at``) and the files removed/added are observed from the Delta log rather than
  trusted from the engine's own metrics, which are kept raw in the JSON.

DuckDB merges into its own native storage (no Parquet files, no Delta log), so it is a *floor*
for a single-node columnar engine, not a like-for-like. The ``floor`` engine is an I/O floor:
read back exactly the files delta-rs rewrote and write the same rows again with pyarrow.parquet,
with no join and no commit.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar

import deltalake
import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

ALL_ENGINES = ("ours", "ours-dv", "ours-cdf", "ours-dv-cdf",
               "delta-rs", "delta-rs-streamed", "duckdb", "floor", "spark-naive", "spark-floor",
               "delta-spark", "delta-spark-dv")
# Delta Lake's own MergeIntoCommand (delta-spark) on the same session as ours.
DELTA_SPARK = ("delta-spark", "delta-spark-dv")
# Ours beside the Delta Lake engine of the same table kind: the issue's targets are these ratios.
DELTA_PEERS = {"ours": "delta-spark", "ours-dv": "delta-spark-dv"}
# Engines whose runs can follow each other on one table (--successive): every engine of a Delta
# table, not the floors (they read the files a delta-rs run removed) or DuckDB (its own storage).
SUCCESSIVE_ENGINES = ("ours", "ours-dv", "ours-cdf", "ours-dv-cdf", "delta-rs", "delta-rs-streamed",
                      "spark-naive", *DELTA_SPARK)
# Engines that re-read the files the preceding delta-rs run removed: they run right after it.
AFTER_DELTA_RS = ("floor", "spark-floor")
DEFAULT_ENGINES = ("ours", "delta-rs", "duckdb")
KEY_DISTS = ("uniform", "clustered")
UPDATE_FRACTION = 0.8

# All target rows get updated_at in [_TARGET_TS_US, _BATCH_TS_US); batch rows get >= _BATCH_TS_US,
# so "rows the merge wrote" can be counted in the result without keeping a copy of the batch.
_TARGET_TS_US = 1_700_000_000_000_000  # 2023-11-14
_BATCH_TS_US = 1_800_000_000_000_000  # 2027-01-15
_STATUSES = np.array(["new", "paid", "shipped", "delivered", "cancelled", "refunded"])
_REGIONS = np.array(["eu-west", "eu-central", "us-east", "us-west", "ap-south", "ap-east", "sa-east"])
SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64()),
        pa.field("amount", pa.float64()),
        pa.field("status", pa.string()),
        pa.field("updated_at", pa.timestamp("us", tz="UTC")),
        pa.field("region", pa.string()),
    ]
)

MERGE_SQL = (
    "MERGE INTO target USING batch ON target.id = batch.id "
    "WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *"
)

NOTES = [
    "seconds = wall clock of the merge call only (Delta engines: table open + merge + commit); "
    "Spark session start-up and a warm-up merge on a tiny table are excluded.",
    "ours: prep_s (spark.createDataFrame of the Arrow batch) is reported separately, not in seconds.",
    "delta-rs runs with streamed_exec=False: the batch is an in-memory Arrow table, and streamed "
    "execution is documented to disable the early pruning predicate derived from source stats. "
    "'delta-rs-streamed' is the library default (streamed_exec=True), for comparison.",
    "duckdb merges into its own native storage, not Delta/Parquet: a floor, not a like-for-like. "
    "seconds = the MERGE statement (committed to the WAL); checkpoint_s is the later CHECKPOINT.",
    "floor = pyarrow.parquet read + rewrite of exactly the files delta-rs removed, no join, no log: "
    "an I/O floor for the copy-on-write part of the merge.",
    "files removed/added are observed by diffing the Delta log before/after, not the engine's metrics.",
    "delta-spark(-dv) = Delta Lake's DeltaTable.merge (delta-spark) on the same session as ours, which then "
    "has Delta's jar, extension and catalog, a 4 GB driver and spark.databricks.delta.snapshotPartitions=2; "
    "-dv: deletion vectors turned on by Delta (ALTER TABLE, untimed). 'x delta-spark' = ours/delta-spark and "
    "ours-dv/delta-spark-dv, the issue's targets.",
    "jobs = Spark jobs per MERGE, counted by the status tracker for a job group set around the call.",
    "--successive: each engine merges the scenario's batches one after the other into one table (warm "
    "caches on every side, as in a stream) instead of each into a fresh copy.",
]


# --------------------------------------------------------------------------- workload


@dataclass(frozen=True)
class Batch:
    """One change batch; ``table`` rows are shuffled so that neither engine gets a pre-sorted source."""

    size: int
    key_dist: str
    n_updates: int
    n_inserts: int
    table: pa.Table
    amount_sum: float
    sequence: int = 0


def make_target(n_rows: int, seed: int) -> pa.Table:
    """The initial table: ids 0..n-1 in order, so slicing it yields files with disjoint id ranges."""
    rng = np.random.default_rng([seed, 0])
    return _rows(rng, np.arange(n_rows, dtype=np.int64), _TARGET_TS_US, _BATCH_TS_US - 1)


def make_batch(n_target: int, size: int, key_dist: str, seed: int, sequence: int = 0) -> Batch:
    """A CDC batch: 80 % updates of existing ids, 20 % inserts of ids >= n_target, no duplicate ids.

    ``clustered`` draws the updated ids from one contiguous window of ~2*size ids, which lands in one
    or two target files, so an engine that skips files by key range rewrites almost nothing.
    ``sequence``: the batch's place in a series into one table (--successive); its ``updated_at``
    values are above every earlier batch's, so its own rows can be counted in the result.
    """
    rng = np.random.default_rng([seed, size, KEY_DISTS.index(key_dist) + 1])
    n_updates = min(round(size * UPDATE_FRACTION), n_target)
    n_inserts = size - n_updates
    if key_dist == "uniform":
        updated = rng.choice(n_target, size=n_updates, replace=False)
    elif key_dist == "clustered":
        window = min(n_target, max(2 * size, n_updates))
        start = int(rng.integers(0, n_target - window + 1))
        updated = start + rng.choice(window, size=n_updates, replace=False)
    else:
        raise ValueError(f"unknown key distribution {key_dist!r}; expected one of {KEY_DISTS}")
    inserted = np.arange(n_target, n_target + n_inserts)
    ids = rng.permutation(np.concatenate([updated, inserted]).astype(np.int64))
    base = batch_ts(sequence)
    table = _rows(rng, ids, base, base + 3_600_000_000)
    amount_sum = float(pc.sum(table["amount"]).as_py() or 0.0)
    return Batch(size, key_dist, n_updates, n_inserts, table, amount_sum, sequence)


def batch_ts(sequence: int) -> int:
    """The lowest ``updated_at`` of the ``sequence``-th batch of a series (two hours apart)."""
    return _BATCH_TS_US + sequence * 7_200_000_000


def _rows(rng: np.random.Generator, ids: np.ndarray, ts_lo: int, ts_hi: int) -> pa.Table:
    n = len(ids)
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "amount": pa.array(np.round(rng.random(n) * 1000.0, 2), pa.float64()),
            "status": pa.array(_STATUSES[rng.integers(0, len(_STATUSES), n)], pa.string()),
            "updated_at": pa.array(rng.integers(ts_lo, ts_hi, n), pa.int64()).cast(SCHEMA.field(3).type),
            "region": pa.array(_REGIONS[rng.integers(0, len(_REGIONS), n)], pa.string()),
        },
        schema=SCHEMA,
    )


def write_target(table: pa.Table, path: Path, n_files: int) -> None:
    """Write ``table`` as ``n_files`` Parquet files with disjoint, increasing id ranges.

    One append per slice gives an exact file count (``target_file_size`` splits at Arrow batch
    boundaries, i.e. unpredictably); a checkpoint at the end makes log replay cheap and equal for
    every engine, as on a real table.
    """
    n_files = max(1, min(n_files, table.num_rows))
    bounds = np.linspace(0, table.num_rows, n_files + 1).astype(int)
    for i, (lo, hi) in enumerate(itertools.pairwise(bounds)):
        deltalake.write_deltalake(str(path), table.slice(lo, hi - lo), mode="error" if i == 0 else "append")
    deltalake.DeltaTable(str(path)).create_checkpoint()


# --------------------------------------------------------------------------- results


@dataclass
class Check:
    """What the merged table must look like: N + inserts rows, all distinct, batch rows all present."""

    rows: int
    distinct_ids: int
    fresh_rows: int
    fresh_amount_sum: float
    expected_rows: int
    expected_fresh: int
    expected_amount_sum: float

    @property
    def ok(self) -> bool:
        return (
            self.rows == self.expected_rows
            and self.distinct_ids == self.expected_rows
            and self.fresh_rows == self.expected_fresh
            and abs(self.fresh_amount_sum - self.expected_amount_sum) <= 1e-6 * max(1.0, self.expected_amount_sum)
        )


@dataclass
class RunResult:
    """One timed merge. ``files_*`` come from the log diff; ``metrics`` is what the engine reported."""

    engine: str
    seconds: float | None = None
    prep_s: float | None = None
    files_removed: int | None = None
    files_added: int | None = None
    bytes_removed: int | None = None
    rows_updated: int | None = None
    rows_inserted: int | None = None
    check: Check | None = None
    ok: bool | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    error: str | None = None


def _jsonable(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)


# --------------------------------------------------------------------------- Delta helpers


def _live_files(path: Path) -> dict[str, int]:
    """Relative path -> size of every live file, straight from the Delta log."""
    actions = pa.table(deltalake.DeltaTable(str(path)).get_add_actions(flatten=True))
    return dict(zip(actions["path"].to_pylist(), actions["size_bytes"].to_pylist(), strict=True))


def _check_delta(path: Path, n_target: int, batch: Batch) -> Check:
    """Read the merged table with delta-rs (an independent reader for ours) and count."""
    # DataFusion's scan applies deletion vectors (to_pyarrow_dataset refuses a DV table).
    table = pa.table(deltalake.DeltaTable(str(path)).scan(columns=["id", "amount", "updated_at"]))
    fresh = table.filter(pc.greater_equal(table["updated_at"].cast(pa.int64()), batch_ts(batch.sequence)))
    return Check(
        rows=table.num_rows,
        distinct_ids=int(pc.count_distinct(table["id"]).as_py()),
        fresh_rows=fresh.num_rows,
        fresh_amount_sum=float(pc.sum(fresh["amount"]).as_py() or 0.0),
        expected_rows=n_target + batch.n_inserts,
        expected_fresh=batch.size,
        expected_amount_sum=batch.amount_sum,
    )


def copy_table(master: Path, run_dir: Path) -> None:
    """The run's own copy of the master table; in a series (--successive) the table the previous
    batch of the series merged into, as it is."""
    if not run_dir.exists():
        shutil.copytree(master, run_dir)


def _fill_file_diff(result: RunResult, before: Mapping[str, int], path: Path) -> tuple[list[str], list[str]]:
    after = _live_files(path)
    removed = sorted(set(before) - set(after))
    added = sorted(set(after) - set(before))
    result.files_removed, result.files_added = len(removed), len(added)
    result.bytes_removed = sum(before[p] for p in removed)
    return removed, added


# --------------------------------------------------------------------------- engines


class Engine:
    """One engine. ``setup`` pays one-off costs (session, warm-up) outside every timed region."""

    name: str = ""

    def setup(self, workdir: Path) -> None:
        """Default: nothing to start."""

    def run(self, master: Path, run_dir: Path, n_target: int, batch: Batch) -> RunResult:
        raise NotImplementedError

    def close(self) -> None:
        """Default: nothing to stop."""

    def warm_up(self, workdir: Path) -> None:
        """Merge a tiny batch into a tiny table so first-call costs are not charged to the first scenario."""
        master = workdir / f"warmup_master_{self.name}"
        if not master.exists():
            write_target(make_target(2_000, seed=99), master, n_files=2)
        result = self.run(master, workdir / f"warmup_run_{self.name}", 2_000, make_batch(2_000, 200, "uniform", 99))
        shutil.rmtree(workdir / f"warmup_run_{self.name}", ignore_errors=True)
        if result.error or result.check is None or not result.check.ok:
            raise RuntimeError(f"warm-up merge failed for {self.name}: {result.error or result.check}")


class OursEngine(Engine):
    """streaming_merge through its delta-spark-shaped API on a local[2] SparkSession."""

    name = "ours"
    # Set by build_engines when a delta-spark engine runs: the one session then carries Delta
    # Lake's jar, extension and catalog for every Spark engine.
    with_delta_lake: ClassVar[bool] = False

    def __init__(self) -> None:
        self._spark: Any = None
        self._delta_table: Any = None

    def setup(self, workdir: Path) -> None:
        # Imported here so that the other engines run while streaming_merge is not importable.
        from streaming_merge import DeltaTable

        self._delta_table = DeltaTable
        self._start_session()
        self.warm_up(workdir)

    def _start_session(self) -> None:
        """The bench's one SparkSession (getOrCreate: every Spark engine shares it)."""
        from streaming_merge.session import local_session

        # No console progress bars: they interleave with the per-run lines on stderr.
        conf = {"spark.ui.showConsoleProgress": "false"}
        if self.with_delta_lake:
            from streaming_merge.spark.packages import package_conf

            # As the issue measured Delta Lake (4 GB driver), and as a careful user would tune it
            # on this machine: its log replay in one partition per core, not 50.
            conf |= package_conf(("delta",)) | {"spark.driver.memory": "4g",
                                                "spark.databricks.delta.snapshotPartitions": "2"}
        self._spark = local_session("bench", "local[2]", extra_conf=conf)

    def _timed(self, result: RunResult, call: Callable[[], Any]) -> Any:
        """Time ``call`` (wall clock, into ``result.seconds``) and count its Spark jobs
        (``result.extra["jobs"]``: the status tracker's jobs of a job group set around it)."""
        context = self._spark.sparkContext
        group = f"merge_bench-{self.name}-{time.monotonic_ns()}"
        gc.collect()
        context.setLocalProperty("spark.jobGroup.id", group)
        t0 = time.perf_counter()
        try:
            value = call()
        finally:
            result.seconds = time.perf_counter() - t0
            context.setLocalProperty("spark.jobGroup.id", None)
        result.extra["jobs"] = len(context.statusTracker().getJobIdsForGroup(group))
        return value

    def _source(self, batch: Batch, result: RunResult) -> Any:
        """The batch as a Spark DataFrame, its making timed apart (``prep_s``): the other
        engines get the batch already in their own memory."""
        t0 = time.perf_counter()
        source = self._spark.createDataFrame(batch.table)
        result.prep_s = time.perf_counter() - t0
        return source

    def _upsert(self, run_dir: Path, source: Any) -> Any:
        """The bench's MERGE through the engine's ``DeltaTable`` (ours, or delta-spark's)."""
        return (self._delta_table.forPath(self._spark, str(run_dir)).alias("t")
                .merge(source.alias("s"), "t.id = s.id")
                .whenMatchedUpdateAll()
                .whenNotMatchedInsertAll()
                .execute())

    def run(self, master: Path, run_dir: Path, n_target: int, batch: Batch) -> RunResult:
        result = RunResult(self.name)
        copy_table(master, run_dir)
        before = _live_files(run_dir)
        source = self._source(batch, result)
        metrics = self._timed(result, lambda: self._upsert(run_dir, source))
        result.metrics = _jsonable(dict(metrics or {}))
        result.rows_updated = result.metrics.get("numTargetRowsUpdated")
        result.rows_inserted = result.metrics.get("numTargetRowsInserted")
        _fill_file_diff(result, before, run_dir)
        result.check = _check_delta(run_dir, n_target, batch)
        return result

    def close(self) -> None:
        if self._spark is not None:
            self._spark.stop()


class OursDvEngine(OursEngine):
    """Ours on the same table with table properties set (its protocol upgraded, untimed):
    ``ours-dv`` turns deletion vectors on (the MERGE marks the replaced rows in DVs and writes
    only the changed rows: merge-on-read), ``ours-cdf`` the change data feed (the MERGE also
    writes its change rows), ``ours-dv-cdf`` both."""

    PROPERTIES: ClassVar[dict[str, dict[str, str]]] = {
        "ours-dv": {"delta.enableDeletionVectors": "true"},
        "ours-cdf": {"delta.enableChangeDataFeed": "true"},
        "ours-dv-cdf": {"delta.enableDeletionVectors": "true", "delta.enableChangeDataFeed": "true"},
    }

    def __init__(self, name: str = "ours-dv") -> None:
        super().__init__()
        self.name = name
        self._properties = self.PROPERTIES[name]

    def run(self, master: Path, run_dir: Path, n_target: int, batch: Batch) -> RunResult:
        if run_dir.exists():  # a later batch of a series: the table has its properties
            return super().run(master, run_dir, n_target, batch)
        copy = run_dir.with_name(run_dir.name + "_master")
        if not copy.exists():
            shutil.copytree(master, copy)
            self._delta_table.forPath(self._spark, str(copy)).setProperties(self._properties)
        try:
            return super().run(copy, run_dir, n_target, batch)
        finally:
            shutil.rmtree(copy, ignore_errors=True)


class DeltaSparkEngine(OursEngine):
    """Delta Lake's own MERGE (delta-spark's ``DeltaTable.merge``, its MergeIntoCommand) on the
    same session and the same table copy as ours: ``delta-spark`` copy-on-write,
    ``delta-spark-dv`` with deletion vectors turned on by Delta itself (untimed)."""

    def __init__(self, name: str = "delta-spark") -> None:
        super().__init__()
        self.name = name
        self._deletion_vectors = name.endswith("-dv")

    def setup(self, workdir: Path) -> None:
        from delta.tables import DeltaTable

        self._delta_table = DeltaTable
        self._start_session()
        self.warm_up(workdir)

    def run(self, master: Path, run_dir: Path, n_target: int, batch: Batch) -> RunResult:
        result = RunResult(self.name)
        fresh = not run_dir.exists()
        copy_table(master, run_dir)
        if fresh and self._deletion_vectors:
            self._spark.sql(f"ALTER TABLE delta.`{run_dir}` SET TBLPROPERTIES ('delta.enableDeletionVectors' = true)")
        before = _live_files(run_dir)
        source = self._source(batch, result)
        self._timed(result, lambda: self._upsert(run_dir, source))
        last = self._delta_table.forPath(self._spark, str(run_dir)).history(1).collect()[0]
        result.metrics = _jsonable(dict(last["operationMetrics"] or {}))
        result.rows_updated = _int_or_none(result.metrics.get("numTargetRowsUpdated"))
        result.rows_inserted = _int_or_none(result.metrics.get("numTargetRowsInserted"))
        _fill_file_diff(result, before, run_dir)
        result.check = _check_delta(run_dir, n_target, batch)
        return result


def _int_or_none(value: Any) -> int | None:
    return int(value) if value is not None else None


class NaiveSparkEngine(OursEngine):
    """The naive plan on the same Spark session and table layer: every target file FULL OUTER
    JOIN the batch, the merged rows written as new files, all old files removed, one commit.
    No skipping, no findTouchedFiles, no multiple-match check, Spark's default (AQE) plan:
    what the engine's two-pass design has to beat."""

    name = "spark-naive"

    def run(self, master: Path, run_dir: Path, n_target: int, batch: Batch) -> RunResult:
        from pyspark.sql import functions as F

        from streaming_merge.table.commit import CommitRequest, commit
        from streaming_merge.table.scan import scan_files
        from streaming_merge.table.snapshot import load_snapshot
        from streaming_merge.table.write import write_files

        result = RunResult(self.name)
        copy_table(master, run_dir)
        before = _live_files(run_dir)
        source = self._source(batch, result)
        gc.collect()
        t0 = time.perf_counter()
        snapshot = load_snapshot(str(run_dir))
        target = scan_files(self._spark, snapshot, snapshot.files).alias("t")
        merged = source.alias("s").join(target, F.col("s.id") == F.col("t.id"), "full_outer").select(
            *[F.coalesce(F.col(f"s.`{f.name}`"), F.col(f"t.`{f.name}`")).alias(f.name) for f in snapshot.schema.fields])
        written = write_files(self._spark, merged, snapshot.table_path, snapshot.schema, snapshot.partition_columns)
        commit(CommitRequest(snapshot=snapshot, adds=written, removes=snapshot.files, operation="MERGE"))
        result.seconds = time.perf_counter() - t0
        _fill_file_diff(result, before, run_dir)
        result.check = _check_delta(run_dir, n_target, batch)
        return result


class DeltaRsEngine(Engine):
    """deltalake (delta-rs) MERGE; keeps the removed-file list so the pyarrow floor can reuse it."""

    def __init__(self, streamed: bool = False) -> None:
        self.streamed = streamed
        self.name = "delta-rs-streamed" if streamed else "delta-rs"
        self.last_removed: list[Path] = []
        self.last_added = 0

    def setup(self, workdir: Path) -> None:
        self.warm_up(workdir)

    def run(self, master: Path, run_dir: Path, n_target: int, batch: Batch) -> RunResult:
        result = RunResult(self.name, prep_s=0.0)
        copy_table(master, run_dir)
        before = _live_files(run_dir)
        gc.collect()
        t0 = time.perf_counter()
        metrics = (
            deltalake.DeltaTable(str(run_dir))
            .merge(
                source=batch.table,
                predicate="t.id = s.id",
                source_alias="s",
                target_alias="t",
                streamed_exec=self.streamed,
            )
            .when_matched_update_all()
            .when_not_matched_insert_all()
            .execute()
        )
        result.seconds = time.perf_counter() - t0
        result.metrics = _jsonable(dict(metrics))
        result.rows_updated = result.metrics.get("num_target_rows_updated")
        result.rows_inserted = result.metrics.get("num_target_rows_inserted")
        removed, added = _fill_file_diff(result, before, run_dir)
        self.last_removed, self.last_added = [run_dir / p for p in removed], len(added)
        result.check = _check_delta(run_dir, n_target, batch)
        return result


class DuckDbEngine(Engine):
    """DuckDB MERGE INTO a native table in an on-disk database (its own format, not Delta)."""

    name = "duckdb"

    def __init__(self, threads: int) -> None:
        self.threads = threads
        self._targets: dict[Path, pa.Table] = {}

    def setup(self, workdir: Path) -> None:
        self.warm_up(workdir)

    def run(self, master: Path, run_dir: Path, n_target: int, batch: Batch) -> RunResult:
        result = RunResult(self.name, prep_s=0.0)
        if master not in self._targets:
            self._targets[master] = deltalake.DeltaTable(str(master)).to_pyarrow_table()
        target_rows = self._targets[master]
        run_dir.mkdir(parents=True)
        con = duckdb.connect(str(run_dir / "bench.duckdb"))
        try:
            con.execute(f"SET threads = {int(self.threads)}")
            # Load outside the timed region; both tables are native so MERGE does not scan Arrow.
            con.register("target_arrow", target_rows)
            con.register("batch_arrow", batch.table)
            con.execute("CREATE TABLE target AS SELECT * FROM target_arrow")
            con.execute("CREATE TABLE batch AS SELECT * FROM batch_arrow")
            con.unregister("target_arrow")
            con.unregister("batch_arrow")
            con.execute("CHECKPOINT")
            gc.collect()
            t0 = time.perf_counter()
            affected = con.execute(MERGE_SQL).fetchall()
            result.seconds = time.perf_counter() - t0
            t0 = time.perf_counter()
            con.execute("CHECKPOINT")
            result.extra["checkpoint_s"] = time.perf_counter() - t0
            result.metrics = {"rows_affected": int(affected[0][0]) if affected else None}
            rows, distinct, fresh, fresh_sum = con.execute(
                "SELECT count(*), count(DISTINCT id), count(*) FILTER (WHERE epoch_us(updated_at) >= ?), "
                "coalesce(sum(amount) FILTER (WHERE epoch_us(updated_at) >= ?), 0) FROM target",
                [_BATCH_TS_US, _BATCH_TS_US],
            ).fetchone() or (0, 0, 0, 0.0)
        finally:
            con.close()
        result.check = Check(
            rows=int(rows),
            distinct_ids=int(distinct),
            fresh_rows=int(fresh),
            fresh_amount_sum=float(fresh_sum),
            expected_rows=n_target + batch.n_inserts,
            expected_fresh=batch.size,
            expected_amount_sum=batch.amount_sum,
        )
        return result


class FloorEngine(Engine):
    """pyarrow read + rewrite of the files the preceding delta-rs run removed (an I/O floor).

    It writes the same rows into as many files as delta-rs added, so the file-count overhead is the
    same; what is missing on purpose is the join, the insert rows, the stats and the commit.
    """

    name = "floor"

    def __init__(self, source: DeltaRsEngine) -> None:
        self.source = source

    def run(self, master: Path, run_dir: Path, n_target: int, batch: Batch) -> RunResult:
        files = self.source.last_removed
        n_out = max(1, self.source.last_added)
        result = RunResult(self.name, prep_s=0.0)
        if not files or not all(f.exists() for f in files):
            result.error = f"skipped: needs the files removed by a {self.source.name} run of this scenario"
            return result
        run_dir.mkdir(parents=True)
        gc.collect()
        t0 = time.perf_counter()
        rows = pa.concat_tables([pq.read_table(path) for path in files])
        bounds = np.linspace(0, rows.num_rows, n_out + 1).astype(int)
        for i, (lo, hi) in enumerate(itertools.pairwise(bounds)):
            pq.write_table(rows.slice(lo, hi - lo), run_dir / f"part-{i:05d}.parquet", compression="snappy")
        result.seconds = time.perf_counter() - t0
        result.files_removed, result.files_added = len(files), n_out
        result.bytes_removed = sum(f.stat().st_size for f in files)
        result.extra["rows_rewritten"] = rows.num_rows
        return result


class SparkFloorEngine(OursEngine):
    """Spark's own floor for a copy-on-write MERGE on this session: the files the preceding
    delta-rs run removed, read and LEFT OUTER JOINed to the broadcast batch (a matched row takes
    the batch's values), written by Spark's Parquet writer into one file per task slot.

    What a Spark MERGE cannot avoid when it rewrites those rows, and nothing else: no inserts,
    no source materialization, no metrics, no multiple-match check, no file stats, no log. The
    batch is turned into a DataFrame outside the timed region (``prep``), as for ``ours``."""

    name = "spark-floor"

    def __init__(self, source: DeltaRsEngine) -> None:
        super().__init__()
        self.source = source

    def setup(self, workdir: Path) -> None:
        # Warmed by the scenario's warm-up rounds instead: it needs delta-rs' files of the scenario.
        self._start_session()

    def run(self, master: Path, run_dir: Path, n_target: int, batch: Batch) -> RunResult:
        from pyspark.sql import functions as F

        from streaming_merge.spark.slots import task_slots
        from streaming_merge.table.write import parquet_write_conf

        files = self.source.last_removed
        result = RunResult(self.name)
        if not files or not all(f.exists() for f in files):
            result.error = f"skipped: needs the files removed by a {self.source.name} run of this scenario"
            return result
        source = self._source(batch, result)
        gc.collect()
        t0 = time.perf_counter()
        target = self._spark.read.parquet(*[str(f) for f in files])
        columns = [f.name for f in SCHEMA]
        rewritten = target.alias("t").join(F.broadcast(source.alias("s")), F.col("t.id") == F.col("s.id"),
                                           "left_outer").select(
            *[F.when(F.col("s.id").isNotNull(), F.col(f"s.{c}")).otherwise(F.col(f"t.{c}")).alias(c)
              for c in columns])
        with parquet_write_conf(self._spark):
            rewritten.coalesce(task_slots(self._spark)).write.parquet(str(run_dir))
        result.seconds = time.perf_counter() - t0
        result.files_removed = len(files)
        result.files_added = len(list(run_dir.glob("*.parquet")))
        result.bytes_removed = sum(f.stat().st_size for f in files)
        result.extra["rows_rewritten"] = int(pq.ParquetDataset(run_dir).read(columns=["id"]).num_rows)
        return result


# --------------------------------------------------------------------------- driver


@dataclass
class Scenario:
    """All runs of all engines on one (batch size, key distribution)."""

    batch_size: int
    key_dist: str
    n_updates: int
    n_inserts: int
    runs: dict[str, list[RunResult]] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"B={self.batch_size:,} {self.key_dist}"

    def median(self, engine: str) -> float | None:
        times = [r.seconds for r in self.runs.get(engine, []) if r.seconds is not None and not r.error]
        return statistics.median(times) if times else None

    def median_jobs(self, engine: str) -> float | None:
        """Spark jobs per MERGE (the status tracker's count for the run's job group), median."""
        jobs = [r.extra["jobs"] for r in self.runs.get(engine, []) if "jobs" in r.extra and not r.error]
        return statistics.median(jobs) if jobs else None


def _parse_list(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.merge_bench",
        description="Time a CDC-shaped Delta MERGE with streaming_merge, delta-rs and DuckDB.",
    )
    parser.add_argument("--target-rows", type=int, default=None, help="rows in the target (default 1000000)")
    parser.add_argument("--batches", default=None, help="comma-separated batch sizes (default 10000,100000)")
    parser.add_argument("--key-dist", default=None, help="comma-separated: uniform,clustered (default both)")
    parser.add_argument(
        "--engines",
        default=",".join(DEFAULT_ENGINES),
        help=f"comma-separated subset of {','.join(ALL_ENGINES)}",
    )
    parser.add_argument("--repeat", type=int, default=1, help="timed runs per engine and scenario (median shown)")
    parser.add_argument("--warmup", type=int, default=0,
                        help="untimed runs per engine of each scenario before its timed ones (default 0): with a "
                             "few, the JVM's JIT has compiled the scenario's code paths, as in a stream running for "
                             "a while; without, the timed runs include that compilation")
    parser.add_argument("--target-files", type=int, default=20, help="files in the target table (default 20)")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--threads", type=int, default=2, help="DuckDB threads (match Spark's local[2])")
    parser.add_argument("--out", default="bench/results/latest.json")
    parser.add_argument("--workdir", default=None, help="scratch folder (default: a new temp dir, deleted after)")
    parser.add_argument("--keep", action="store_true", help="keep the scratch folder and merged tables")
    parser.add_argument("--quick", action="store_true", help="smoke run: 100k target, batch 10k, uniform only")
    parser.add_argument("--successive", action="store_true",
                        help="each engine merges the --warmup and --repeat batches of a scenario one after the "
                             "other into one table (new keys each batch), as a stream does, instead of each "
                             f"into a fresh copy; engines: {', '.join(SUCCESSIVE_ENGINES)}")
    args = parser.parse_args(argv)
    quick = args.quick
    args.target_rows = args.target_rows or (100_000 if quick else 1_000_000)
    args.batches = [int(b) for b in _parse_list(args.batches or ("10000" if quick else "10000,100000"))]
    args.key_dist = _parse_list(args.key_dist or ("uniform" if quick else "uniform,clustered"))
    args.engines = _parse_list(args.engines)
    for name in args.engines:
        if name not in ALL_ENGINES:
            parser.error(f"unknown engine {name!r}; choose from {', '.join(ALL_ENGINES)}")
    for dist in args.key_dist:
        if dist not in KEY_DISTS:
            parser.error(f"unknown key distribution {dist!r}; choose from {', '.join(KEY_DISTS)}")
    if args.successive and (others := [n for n in args.engines if n not in SUCCESSIVE_ENGINES]):
        parser.error(f"--successive runs only {', '.join(SUCCESSIVE_ENGINES)}; not {', '.join(others)}")
    if args.repeat < 1 or args.target_rows < 1 or any(b < 1 for b in args.batches):
        parser.error("--repeat, --target-rows and batch sizes must be positive")
    for name in reversed(AFTER_DELTA_RS):  # each must run right after delta-rs, whose files it reads
        if name in args.engines:
            if "delta-rs" not in args.engines:
                parser.error(f"the {name} engine rewrites the files delta-rs removed; add delta-rs to --engines")
            args.engines.remove(name)
            args.engines.insert(args.engines.index("delta-rs") + 1, name)
    return args


def build_engines(names: Sequence[str], threads: int) -> dict[str, Engine]:
    engines: dict[str, Engine] = {}
    for name in names:
        if name == "ours":
            engines[name] = OursEngine()
        elif name in OursDvEngine.PROPERTIES:
            engines[name] = OursDvEngine(name)
        elif name == "spark-naive":
            engines[name] = NaiveSparkEngine()
        elif name in DELTA_SPARK:
            OursEngine.with_delta_lake = True
            engines[name] = DeltaSparkEngine(name)
        elif name == "delta-rs":
            engines[name] = DeltaRsEngine(streamed=False)
        elif name == "delta-rs-streamed":
            engines[name] = DeltaRsEngine(streamed=True)
        elif name == "duckdb":
            engines[name] = DuckDbEngine(threads)
        elif name in AFTER_DELTA_RS:
            delta_rs = engines["delta-rs"]
            assert isinstance(delta_rs, DeltaRsEngine)
            engines[name] = FloorEngine(delta_rs) if name == "floor" else SparkFloorEngine(delta_rs)
    return engines


def _timed_setup(engine: Engine, workdir: Path) -> tuple[float, str | None]:
    t0 = time.perf_counter()
    try:
        engine.setup(workdir)
    except Exception:
        return time.perf_counter() - t0, traceback.format_exc()
    return time.perf_counter() - t0, None


def run_benchmark(
    args: argparse.Namespace, workdir: Path, log: Callable[[str], None]
) -> tuple[dict[str, Any], list[Scenario]]:
    """Set up every engine, build the shared target once, then time each engine on each scenario."""
    engines = build_engines(args.engines, args.threads)
    setup: dict[str, dict[str, Any]] = {}
    for name, engine in list(engines.items()):
        log(f"setting up {name} (start-up + warm-up merge, not timed) ...")
        seconds, error = _timed_setup(engine, workdir)
        setup[name] = {"seconds": round(seconds, 3), "error": error}
        if error:
            log(f"✗ {name} unavailable, skipped:\n{error}")
            engines.pop(name)

    t0 = time.perf_counter()
    target = make_target(args.target_rows, args.seed)
    master = workdir / "target_master"
    write_target(target, master, args.target_files)
    master_files = _live_files(master)
    log(
        f"target: {args.target_rows:,} rows in {len(master_files)} files, "
        f"{sum(master_files.values()) / 1e6:.1f} MB ({time.perf_counter() - t0:.1f}s to build)"
    )
    del target

    scenarios: list[Scenario] = []
    run_no = 0
    for batch_size in args.batches:
        for key_dist in args.key_dist:
            batch = make_batch(args.target_rows, batch_size, key_dist, args.seed)
            scenario = Scenario(batch_size, key_dist, batch.n_updates, batch.n_inserts)
            scenarios.append(scenario)
            for name, info in setup.items():
                if info["error"]:  # keep the requested-but-unavailable engine visible in the table
                    last_line = info["error"].strip().splitlines()[-1]
                    scenario.runs[name] = [RunResult(name, error=f"not run, setup failed: {last_line}")]
            log(f"scenario {scenario.label}: {batch.n_updates:,} updates + {batch.n_inserts:,} inserts")
            if args.successive:
                run_series(args, engines, master, workdir, scenario, log)
                continue
            for rep in range(args.warmup):
                for name, engine in engines.items():
                    result = engine.run(master, workdir / f"warmup_{name}", args.target_rows, batch)
                    if result.check is not None:
                        result.ok = result.check.ok
                    log(f"  [warm-up {rep + 1}/{args.warmup}, not timed] {_describe(result)}")
                for stale in workdir.glob("warmup_*"):  # after the round: the floor reads delta-rs' files
                    if not stale.name.startswith("warmup_master"):
                        shutil.rmtree(stale, ignore_errors=True)
            for rep in range(args.repeat):
                for name, engine in engines.items():
                    run_no += 1
                    run_dir = workdir / f"run{run_no:03d}_{name}"
                    try:
                        result = engine.run(master, run_dir, args.target_rows, batch)
                    except Exception:
                        result = RunResult(name, error=traceback.format_exc())
                    if result.check is not None:
                        result.ok = result.check.ok
                    scenario.runs.setdefault(name, []).append(result)
                    log(f"  [{rep + 1}/{args.repeat}] {_describe(result)}")
                # The floor reads delta-rs' removed files, so delete run copies only after a full round.
                if not args.keep:
                    for stale in workdir.glob("run*_*"):
                        shutil.rmtree(stale, ignore_errors=True)
    for engine in engines.values():
        engine.close()
    report = {
        "meta": _meta(args, setup, master_files),
        "scenarios": [
            {
                "batch_size": s.batch_size,
                "key_dist": s.key_dist,
                "n_updates": s.n_updates,
                "n_inserts": s.n_inserts,
                "median_seconds": {name: s.median(name) for name in s.runs},
                "median_jobs": {name: s.median_jobs(name) for name in s.runs},
                "ratios": _ratios(s),
                "runs": {name: [_jsonable(asdict(r) | {"ok": r.ok}) for r in rs] for name, rs in s.runs.items()},
            }
            for s in scenarios
        ],
    }
    return report, scenarios


def run_series(args: argparse.Namespace, engines: Mapping[str, Engine], master: Path, workdir: Path,
               scenario: Scenario, log: Callable[[str], None]) -> None:
    """--successive: each engine merges ``warmup + repeat`` batches of the scenario one after the
    other into one copy of the master (warm caches on every side, as a stream's batches: Delta
    Lake keeps its snapshot of the table, ours follows the log). Each batch is new (other updated
    keys, new inserted ones); every engine gets the same series, batch by batch in turn, the
    engines' order rotating so that none always runs first."""
    n_current = args.target_rows
    names = list(engines)
    # A folder per scenario: a copy of the master at a path an earlier series used has the same
    # table id, and a process's deletion-vector log cache would answer it with that series' files.
    series = workdir / f"series-{scenario.batch_size}-{scenario.key_dist}"
    series.mkdir(parents=True, exist_ok=True)
    for number in range(args.warmup + args.repeat):
        batch = make_batch(n_current, scenario.batch_size, scenario.key_dist, args.seed + number, sequence=number)
        timed = number >= args.warmup
        shift = number % len(names)
        for name in names[shift:] + names[:shift]:
            try:
                result = engines[name].run(master, series / name, n_current, batch)
            except Exception:
                result = RunResult(name, error=traceback.format_exc())
            if result.check is not None:
                result.ok = result.check.ok
            if timed:
                scenario.runs.setdefault(name, []).append(result)
            label = (f"{number - args.warmup + 1}/{args.repeat}" if timed
                     else f"warm-up {number + 1}/{args.warmup}, not timed")
            log(f"  [{label}] {_describe(result)}")
        n_current += batch.n_inserts
    for name in names:
        shutil.rmtree(series / name, ignore_errors=True)


def _ratios(s: Scenario) -> dict[str, float | None]:
    """Ours against each peer, and each Spark floor or rewrite against delta-rs: how much of
    ours' distance to delta-rs any Spark plan on this session pays as well."""
    out: dict[str, float | None] = {}
    for numerator, denominator in (("ours", "delta-spark"), ("ours-dv", "delta-spark-dv"), ("ours-dv", "delta-spark"),
                                   ("delta-spark-dv", "delta-spark"),
                                   ("ours", "delta-rs"), ("ours-dv", "delta-rs"), ("ours-dv", "ours"),
                                   ("ours-cdf", "ours"), ("ours-dv-cdf", "ours-dv"),
                                   ("ours", "duckdb"), ("ours", "spark-naive"),
                                   ("ours", "spark-floor"), ("spark-floor", "delta-rs"),
                                   ("spark-naive", "delta-rs")):
        top, base = s.median(numerator), s.median(denominator)
        out[f"{numerator}/{denominator}"] = top / base if top is not None and base else None
    return out


def _describe(r: RunResult) -> str:
    if r.error:
        return f"✗ {r.engine}: {r.error.strip().splitlines()[-1]}"
    mark = "✓" if r.ok else ("·" if r.ok is None else "✗")
    text = f"{mark} {r.engine}: {r.seconds:.3f}s"
    if r.files_removed is not None:
        text += f", files -{r.files_removed}/+{r.files_added}"
    if r.check is not None and not r.ok:
        text += f" CHECK FAILED {r.check}"
    return text


def _meta(args: argparse.Namespace, setup: dict[str, Any], master_files: Mapping[str, int]) -> dict[str, Any]:
    import pyspark

    try:
        mem_gb = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError, AttributeError):
        mem_gb = None
    return {
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": " ".join(["python", "-m", "bench.merge_bench", *sys.argv[1:]]),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "mem_gb": mem_gb},
        "versions": {
            "python": platform.python_version(),
            "deltalake": deltalake.__version__,
            "duckdb": duckdb.__version__,
            "pyarrow": pa.__version__,
            "pyspark": pyspark.__version__,
            "delta-spark": _delta_spark_version(),
            "numpy": np.__version__,
        },
        "target_rows": args.target_rows,
        "target_files": len(master_files),
        "target_bytes": sum(master_files.values()),
        "batches": args.batches,
        "key_dists": args.key_dist,
        "engines": args.engines,
        "repeat": args.repeat,
        "warmup": args.warmup,
        "successive": args.successive,
        "seed": args.seed,
        "setup": setup,
        "notes": NOTES,
    }


def _delta_spark_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("delta-spark")
    except PackageNotFoundError:
        return None


def format_table(scenarios: Sequence[Scenario]) -> str:
    header = (
        "scenario",
        "engine",
        "seconds",
        "x delta-rs",
        "ours/this",
        "x delta-spark",
        "jobs",
        "files -rm/+add",
        "upd/ins",
        "ok",
        "aside",
    )
    rows: list[tuple[str, ...]] = [header]
    for s in scenarios:
        ratios = _ratios(s)
        for name, runs in s.runs.items():
            good = [r for r in runs if not r.error]
            last = good[-1] if good else runs[-1]
            median = s.median(name)
            files = f"-{last.files_removed}/+{last.files_added}" if last.files_removed is not None else "n/a"
            upd_ins = f"{last.rows_updated}/{last.rows_inserted}" if last.rows_updated is not None else "n/a"
            if any(r.error for r in runs):
                ok = "✗ error"
            elif any(r.ok is False for r in runs):
                ok = "✗"
            else:
                ok = "✓" if any(r.ok for r in runs) else "-"
            versus_delta_rs = ratios.get(f"{name}/delta-rs")
            versus_delta_spark = ratios.get(f"{name}/{DELTA_PEERS[name]}") if name in DELTA_PEERS else None
            jobs = s.median_jobs(name)
            ours_versus = ratios.get(f"ours/{name}")
            rows.append(
                (
                    s.label,
                    name,
                    f"{median:.3f}" if median is not None else "-",
                    _fmt_ratio(versus_delta_rs) if versus_delta_rs is not None else "",
                    _fmt_ratio(ours_versus) if ours_versus is not None else "",
                    _fmt_ratio(versus_delta_spark) if versus_delta_spark is not None else "",
                    f"{jobs:g}" if jobs is not None else "",
                    files,
                    upd_ins,
                    ok,
                    _aside(last),
                )
            )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _aside(r: RunResult) -> str:
    """The untimed side costs worth seeing next to the time (source prep, DuckDB checkpoint)."""
    parts = []
    if r.prep_s:
        parts.append(f"prep {r.prep_s:.3f}s")
    if "checkpoint_s" in r.extra:
        parts.append(f"checkpoint {r.extra['checkpoint_s']:.3f}s")
    if "rows_rewritten" in r.extra:
        parts.append(f"{r.extra['rows_rewritten']:,} rows")
    if r.bytes_removed:
        parts.append(f"{r.bytes_removed / 1e6:.1f} MB removed")
    return ", ".join(parts)


def _fmt_ratio(value: float | None) -> str:
    return f"{value:.2f}x" if value is not None else "-"


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)

    def log(message: str) -> None:
        print(message, flush=True)

    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="merge_bench_"))
    workdir.mkdir(parents=True, exist_ok=True)
    log(f"workdir: {workdir}")
    try:
        report, scenarios = run_benchmark(args, workdir, log)
    finally:
        if not args.keep and not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    print()
    print(format_table(scenarios))
    print()
    for note in NOTES:
        print(f"note: {note}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    log(f"\nwrote {out}")
    failed = any(setup["error"] for setup in report["meta"]["setup"].values()) or any(
        r.error or r.ok is False for s in scenarios for runs in s.runs.values() for r in runs
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
