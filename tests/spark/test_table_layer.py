"""The Delta table layer end to end: Spark writes, delta-rs and our scan read back, commits land.

Why: everything above ``streaming_merge.table`` trusts that a row written through ``write_files`` +
``commit`` is the row every Delta reader sees, that the per-file stats are exact (data skipping
drops files on them), and that a conflicting commit never becomes visible. delta-rs'
``to_pyarrow_table`` is the independent reader throughout; ``scan_files`` must agree with it and
with the source DataFrame.

Findings pinned here (see also tests/unit/test_table_units.py):
- every type round-trips, arrays and maps included; NaN, +-inf and -0.0 survive in both readers;
- an empty string as a partition value reads back as NULL (Spark's and Delta's rule);
- the stats of timestamps before year 1000 used to be written as ``999-...`` and were lost;
- a session in LEGACY datetime rebase mode used to write shifted pre-1582 dates;
- an append racing the commit is still shown to ``concurrent_append_filter``, and a refused
  remove on an append-only table is a plain DeltaTableError, not a retryable conflict.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
from decimal import Decimal
from pathlib import Path
from typing import Any

import deltalake
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from streaming_merge.errors import ConcurrentModificationError, DeltaTableError
from streaming_merge.table.commit import CommitRequest, commit, history
from streaming_merge.table.create import create_table
from streaming_merge.table.files import HadoopFiles
from streaming_merge.table.scan import FILE_PATH_COL, ROW_INDEX_COL, scan_files, spark_file_paths
from streaming_merge.table.snapshot import DataFile, Snapshot, load_snapshot
from streaming_merge.table.write import write_files
from tests.job_count import jobs_of

UTC = dt.UTC

# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------


def _normalized(value: Any) -> Any:
    """NaN compares unequal to itself; make it a marker so whole rows can be compared."""
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    if isinstance(value, dict):
        return {k: _normalized(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_normalized(v) for v in value)
    return value


def _sorted_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted((_normalized(r) for r in rows), key=lambda r: r["id"])


def _source_rows(df: DataFrame) -> list[dict[str, Any]]:
    return _sorted_rows(df.toArrow().to_pylist())


def _delta_rs_rows(path: str) -> list[dict[str, Any]]:
    return _sorted_rows(deltalake.DeltaTable(path).to_pyarrow_table().to_pylist())


def _scan_rows(spark: SparkSession, path: str) -> list[dict[str, Any]]:
    snapshot = load_snapshot(path)
    return _sorted_rows(scan_files(spark, snapshot, snapshot.files).toArrow().to_pylist())


def _ids(path: str) -> list[int]:
    return [r["id"] for r in _delta_rs_rows(path)]


def _files_on_disk(path: str) -> set[str]:
    return {os.path.relpath(os.path.join(root, name), path)
            for root, _, names in os.walk(path) for name in names}


def _log_actions(path: str, version: int, kind: str) -> list[dict[str, Any]]:
    with open(os.path.join(path, "_delta_log", f"{version:020d}.json")) as log:
        actions = [json.loads(line) for line in log]
    return [action[kind] for action in actions if kind in action]


# ---------------------------------------------------------------------------------------------
# 1. round trip of every type, unpartitioned (one file, so its stats are checked exactly in 2.)
# ---------------------------------------------------------------------------------------------

_INNER = StructType([StructField("x", StringType()), StructField("y", DateType())])
TYPES_SCHEMA = StructType([
    StructField("id", LongType()),
    StructField("i", IntegerType()),
    StructField("s", ShortType()),
    StructField("b", ByteType()),
    StructField("str", StringType()),
    StructField("code", StringType()),
    StructField("flag", BooleanType()),
    StructField("d", DateType()),
    StructField("ts", TimestampType()),
    StructField("tsn", TimestampNTZType()),
    StructField("dec38", DecimalType(38, 18)),
    StructField("dec10", DecimalType(10, 2)),
    StructField("bin", BinaryType()),
    StructField("dbl", DoubleType()),
    StructField("flt", FloatType()),
    StructField("st", StructType([StructField("a", IntegerType()), StructField("inner", _INNER)])),
    StructField("arr", ArrayType(IntegerType())),
    StructField("m", MapType(StringType(), LongType())),
    StructField("arr_st", ArrayType(StructType([StructField("k", IntegerType())]))),
    StructField("with space", StringType()),
])
TYPES_ROWS: list[tuple[Any, ...]] = [
    (1, 2, 3, 4, "héllo ✓ 日本", "日本", True, dt.date(2024, 2, 29),
     dt.datetime(2024, 1, 1, 12, 0, 0, 123456, tzinfo=UTC), dt.datetime(2024, 1, 1, 12, 0, 0, 654321),
     Decimal("12345678901234567890.123456789012345678"), Decimal("12345678.90"), b"\x00\xff", 1.5, 2.5,
     (1, ("a", dt.date(1900, 1, 1))), [1, None, 3], {"k": 1}, [(1,), None], "x y"),
    (2, None, None, None, "", "", False, dt.date(1969, 12, 31),
     dt.datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=UTC), dt.datetime(1, 1, 1),
     Decimal("-0.000000000000000001"), Decimal("-99999999.99"), b"", float("nan"), float("-inf"),
     None, [], {}, [], ""),
    (3, None, None, None, None, None, None, None, None, None, None, None, None, None, None,
     (None, None), None, None, None, None),
    (4, -2**31, -2**15, -128, "z" * 40, "Ωmega", True, dt.date(1, 1, 1),
     dt.datetime(1, 1, 1, tzinfo=UTC), dt.datetime(9999, 12, 31, 23, 59, 59, 999999),
     Decimal(0), Decimal("0.01"), b"abc", -0.0, float("inf"),
     (None, (None, None)), None, {"a": None}, None, None),
    (2**63 - 1, 2**31 - 1, 2**15 - 1, 127, "z", "a" * 32, False, dt.date(9999, 12, 31),
     dt.datetime(999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC), dt.datetime(999, 6, 15, 12, 30),
     None, None, None, 1e308, None,
     (5, ("zz", dt.date(2000, 1, 1))), [None], None, None, "ünï"),
]


@pytest.fixture(scope="module")
def types_table(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, DataFrame]:
    df = spark.createDataFrame(TYPES_ROWS, TYPES_SCHEMA)
    path = str(tmp_path_factory.mktemp("types") / "table")
    create_table(spark, df.coalesce(1), path)
    return path, df


def test_every_type_round_trips(spark: SparkSession, types_table: tuple[str, DataFrame]) -> None:
    path, df = types_table
    expected = _source_rows(df)

    assert _delta_rs_rows(path) == expected
    assert _scan_rows(spark, path) == expected

    snapshot = load_snapshot(path)
    assert snapshot.schema == TYPES_SCHEMA  # every field nullable, as create_table records them
    arrow = deltalake.DeltaTable(path).to_pyarrow_table()
    source_arrow = df.toArrow()
    for name in TYPES_SCHEMA.fieldNames():
        assert arrow.schema.field(name).type == source_arrow.schema.field(name).type, name
    # values the row comparison cannot see: the sign of -0.0
    row4 = next(r for r in arrow.to_pylist() if r["id"] == 4)
    assert math.copysign(1.0, row4["dbl"]) == -1.0


def test_scan_row_ids_empty_scan_and_wider_schema(spark: SparkSession,
                                                 types_table: tuple[str, DataFrame]) -> None:
    path, _ = types_table
    snapshot = load_snapshot(path)

    with_ids = scan_files(spark, snapshot, snapshot.files, with_row_id=True).select(
        "id", FILE_PATH_COL, ROW_INDEX_COL).collect()
    assert {r[FILE_PATH_COL] for r in with_ids} == set(spark_file_paths(spark, path, snapshot.files))
    assert sorted(r[ROW_INDEX_COL] for r in with_ids) == list(range(len(TYPES_ROWS)))

    empty = scan_files(spark, snapshot, [], with_row_id=True)
    assert empty.count() == 0
    assert empty.columns == [*TYPES_SCHEMA.fieldNames(), FILE_PATH_COL, ROW_INDEX_COL]

    wider = StructType([*snapshot.schema.fields, StructField("added", StringType())])
    rows = scan_files(spark, snapshot, snapshot.files, schema=wider).select("id", "added").collect()
    assert len(rows) == len(TYPES_ROWS) and all(r["added"] is None for r in rows)


# ---------------------------------------------------------------------------------------------
# 2. footer stats as delta-rs reads them from the log
# ---------------------------------------------------------------------------------------------


def _leaf(row: dict[str, Any], dotted: str) -> Any:
    value: Any = row
    for part in dotted.split("."):
        if value is None:
            return None
        value = value[part]
    return value


def test_stats_of_the_one_file(types_table: tuple[str, DataFrame]) -> None:
    """min/max/nullCount for ints, strings <= 32 chars, booleans, dates, timestamps (years 1, 999
    and 9999 included) and nested fields equal what the data says; floats, decimals, binary and a
    string column whose max is longer than 32 characters get nullCount only."""
    path, df = types_table
    stats = load_snapshot(path).stats.to_pylist()
    assert len(stats) == 1
    file_stats = stats[0]
    source = df.toArrow().to_pylist()
    assert file_stats["num_records"] == len(source)

    with_min_max = ["id", "i", "s", "b", "code", "flag", "d", "ts", "tsn", "st.a", "st.inner.x",
                    "st.inner.y", "with space"]
    null_count_only = ["str", "dec38", "dec10", "bin", "dbl", "flt"]
    for column in with_min_max + null_count_only:
        values = [_leaf(r, column) for r in source]
        present = [v for v in values if v is not None]
        assert file_stats[f"null_count.{column}"] == len(values) - len(present), column
        bounds = (file_stats.get(f"min.{column}"), file_stats.get(f"max.{column}"))
        if column in with_min_max:
            assert bounds == (min(present), max(present)), column
        else:
            assert bounds == (None, None), column
    # the extremes are really there (not NULL because a stat failed to parse)
    assert file_stats["min.ts"] == dt.datetime(1, 1, 1, tzinfo=UTC)
    assert file_stats["min.tsn"] == dt.datetime(1, 1, 1)
    assert file_stats["max.tsn"] == dt.datetime(9999, 12, 31, 23, 59, 59, 999999)


# ---------------------------------------------------------------------------------------------
# 1b. partitioned round trips
# ---------------------------------------------------------------------------------------------

PARTITION_STRINGS = ["a b", "a/b", "a=b", "100%", "日本", "", None, "x%2Fy", "q?#*:[]{}^'\"\\", "tab\there",
                     "+plus", "a%20b", "-"]


def test_partitioned_by_string_int_date_boolean_with_nulls(spark: SparkSession, table_path: str) -> None:
    rows = [(i, p, i % 3 if i % 4 else None, dt.date(1960 + i, 1, 1 + i % 2) if i % 5 else None,
             (i % 2 == 0) if i % 6 else None, f"v{i}") for i, p in enumerate(PARTITION_STRINGS)]
    df = spark.createDataFrame(rows, "id long, p string, n int, d date, flag boolean, v string")
    create_table(spark, df, table_path, ["p", "n", "d", "flag"])

    # Spark (and Delta) store an empty-string partition value as NULL
    expected = [{**r, "p": None if r["p"] == "" else r["p"]} for r in _source_rows(df)]
    assert _delta_rs_rows(table_path) == expected

    snapshot = load_snapshot(table_path)
    assert snapshot.partition_columns == ["p", "n", "d", "flag"]
    scanned = scan_files(spark, snapshot, snapshot.files, with_row_id=True).toArrow().to_pylist()
    assert _sorted_rows([{k: v for k, v in r.items() if k not in (FILE_PATH_COL, ROW_INDEX_COL)}
                         for r in scanned]) == expected
    # every file's log partition values are those of the rows inside it
    spark_paths = dict(zip(spark_file_paths(spark, table_path, snapshot.files), snapshot.files, strict=True))
    rows_per_file = {f.path: 0 for f in snapshot.files}
    for row in scanned:
        file = spark_paths[row[FILE_PATH_COL]]
        assert {c: row[c] for c in snapshot.partition_columns} == file.partition_values
        rows_per_file[file.path] += 1
    assert rows_per_file == {f.path: f.num_records for f in snapshot.files}
    assert all(os.path.isfile(snapshot.absolute_path(f.path).removeprefix("file:")) for f in snapshot.files)


def test_spark_file_paths_are_the_paths_spark_reports_plain_or_quoted(spark: SparkSession, tmp_path: Path) -> None:
    """Plain relative paths are joined to the root encoded once, in Python; the rest (a space,
    a '%', a non-ASCII letter) go through Spark's own encoding. Both must be what Spark
    reports, under a root that needs quoting itself."""
    root = str(tmp_path / "root with space % é")
    df = spark.createDataFrame([(1, "plain"), (2, "a b"), (3, "c%d"), (4, "é"), (5, "x.y")], "id long, p string")
    create_table(spark, df, root, ["p"])
    snapshot = load_snapshot(root)
    folders = {part for f in snapshot.files for part in f.path.split("/") if part.startswith("p=")}
    assert {"p=plain", "p=x.y", "p=a b"} <= folders and len(folders) == 5
    reported = {r[FILE_PATH_COL]: r["id"] for r in
                scan_files(spark, snapshot, snapshot.files, with_row_id=True).select(FILE_PATH_COL, "id").collect()}
    assert sorted(spark_file_paths(spark, root, snapshot.files)) == sorted(reported)
    assert spark_file_paths(spark, root, snapshot.files) == spark_file_paths(spark, root, snapshot.files)


def test_a_scan_of_many_files_lists_them_without_a_spark_job(spark: SparkSession, tmp_path: Path) -> None:
    """Past 32 paths Spark lists a read's files in a job of one task per file (0.9 s for 400
    files here, for every scan of a MERGE); local files are listed on the driver instead, and
    the session's setting is as it was afterwards."""
    path = str(tmp_path / "many")
    for i in range(40):
        deltalake.write_deltalake(path, pa.table({"id": pa.array([i], pa.int64())}), mode="append")
    snapshot = load_snapshot(path)
    assert len(snapshot.files) == 40
    threshold = "spark.sql.sources.parallelPartitionDiscovery.threshold"
    before = spark.conf.get(threshold, None)
    jobs, scan = jobs_of(spark, lambda: scan_files(spark, snapshot, snapshot.files))
    assert jobs == 0
    assert spark.conf.get(threshold, None) == before
    assert sorted(r["id"] for r in scan.collect()) == list(range(40))


def _partitioned_local_table(path: str) -> None:
    """Three files in Hive-style folders (``p=a/...``): names Spark would infer a column from."""
    for p, ids in (("a", [1, 2, 3]), ("b", [4, 5]), ("a", [6])):
        deltalake.write_deltalake(path, pa.table({"id": pa.array(ids, pa.int64()), "p": [p] * len(ids)}),
                                  mode="append", partition_by=["p"])


def _file_index_of(scan: DataFrame) -> Any:
    leaves = scan._jdf.queryExecution().analyzed().collectLeaves()
    return leaves.apply(0).relation()


def test_a_local_scan_reads_exactly_the_logs_files_without_sparks_path_checks(
        spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Local files go straight into a file index of the log's files (no existence check,
    listing or partition inference per path: 20 files 22.6 -> 6.7 ms here): the same rows,
    file paths and row indexes as Spark's reader gives, partition folders not read as columns,
    the scan still marked as pinned to its version."""
    from streaming_merge.merge.materialize import is_stable
    from streaming_merge.table import file_relation

    path = str(tmp_path / "local")
    _partitioned_local_table(path)
    snapshot = load_snapshot(path)
    direct = scan_files(spark, snapshot, snapshot.files, with_row_id=True)
    relation = _file_index_of(direct)
    assert relation.location().getClass().getSimpleName() == "InMemoryFileIndex"
    assert str(relation.options().get("recursiveFileLookup")) == "Some(true)"
    assert is_stable(direct)

    monkeypatch.setattr(file_relation, "_unavailable_in", [spark.sparkContext])  # as on another Spark
    read = scan_files(spark, snapshot, snapshot.files, with_row_id=True)
    assert str(_file_index_of(read).options().get("recursiveFileLookup")) == "None"
    columns = ["id", "p", FILE_PATH_COL, ROW_INDEX_COL]
    assert direct.columns == read.columns == columns
    rows = sorted(tuple(r) for r in direct.collect())
    assert rows == sorted(tuple(r) for r in read.collect())
    assert sorted((r[0], r[1]) for r in rows) == [(1, "a"), (2, "a"), (3, "a"), (4, "b"), (5, "b"), (6, "a")]
    assert {r[2] for r in rows} == set(spark_file_paths(spark, path, snapshot.files))


def test_where_sparks_file_index_differs_scans_go_back_to_the_reader_for_good(
        spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The file index is built from Spark internals: where they do not fit (simulated by a
    missing package), the scan is read through ``spark.read`` and later scans skip the attempt."""
    from streaming_merge.table import file_relation

    path = str(tmp_path / "other_spark")
    _partitioned_local_table(path)
    snapshot = load_snapshot(path)
    monkeypatch.setattr(file_relation, "_DATASOURCES", "org.example.not.spark")
    monkeypatch.setattr(file_relation, "_unavailable_in", [])
    monkeypatch.setattr(file_relation, "_constants", file_relation.PerContext(limit=1))
    first = scan_files(spark, snapshot, snapshot.files)
    assert file_relation._unavailable_in == [spark.sparkContext]
    assert sorted(r["id"] for r in first.collect()) == [1, 2, 3, 4, 5, 6]
    assert file_relation.files_relation(spark, "file:/nowhere", None, snapshot.schema, {}) is None


def test_a_data_file_deleted_behind_the_logs_back_is_named_and_the_merge_changes_nothing(
        spark: SparkSession, tmp_path: Path) -> None:
    from streaming_merge import DeltaTable

    path = str(tmp_path / "damaged")
    _partitioned_local_table(path)
    snapshot = load_snapshot(path)
    victim = next(f.path for f in snapshot.files if f.path.startswith("p=b/"))
    os.remove(os.path.join(path, victim))
    with pytest.raises(DeltaTableError, match="A data file of the table is missing: .*" + victim.split("/")[-1]):
        scan_files(spark, snapshot, snapshot.files)
    source = spark.createDataFrame([(4, "b"), (9, "b")], "id long, p string")
    with pytest.raises(DeltaTableError, match="missing"):
        (DeltaTable.forPath(spark, path).alias("t").merge(source.alias("s"), "t.id = s.id")
         .whenMatchedUpdateAll().whenNotMatchedInsertAll().execute())
    assert deltalake.DeltaTable(path).version() == snapshot.version
    assert sorted(os.listdir(path)) == ["_delta_log", "p=a", "p=b"]


def test_a_remote_store_keeps_sparks_listing_job_with_a_task_per_slot(spark: SparkSession) -> None:
    """No remote store here to read from: what the scan asks Spark for, per location and count."""
    from types import SimpleNamespace

    from streaming_merge.spark.slots import task_slots
    from streaming_merge.table.scan import _listing_conf

    def at(uri: str) -> Any:
        return SimpleNamespace(location=SimpleNamespace(uri=uri))

    assert _listing_conf(spark, at("s3a://bucket/t"), 32) == {}
    assert _listing_conf(spark, at("s3a://bucket/t"), 400) == {
        "spark.sql.sources.parallelPartitionDiscovery.parallelism": str(task_slots(spark))}
    assert _listing_conf(spark, at("file:/data/t"), 400) == {
        "spark.sql.sources.parallelPartitionDiscovery.threshold": "400"}


def test_partitioned_by_decimal_and_timestamp_ntz_and_removed(spark: SparkSession, table_path: str) -> None:
    """Round trip, then a commit removing every file: the remove actions carry the same
    partition values as the adds (``0.000000000000000000``, not ``0E-18``; ``0999-...``)."""
    df = spark.createDataFrame(
        [(1, Decimal(0), dt.datetime(2024, 1, 1, 12, 0, 0, 123456)),
         (2, Decimal("12.5"), dt.datetime(999, 1, 1)),
         (3, None, None)],
        "id long, dec decimal(38,18), t timestamp_ntz")
    create_table(spark, df, table_path, ["dec", "t"])
    assert _delta_rs_rows(table_path) == _source_rows(df)
    assert _scan_rows(spark, table_path) == _source_rows(df)

    snapshot = load_snapshot(table_path)
    assert commit(CommitRequest(snapshot=snapshot, adds=[], removes=snapshot.files, operation="DELETE")) == 1
    assert _delta_rs_rows(table_path) == []
    added = {a["path"]: a["partitionValues"] for a in _log_actions(table_path, 0, "add")}
    removed = {r["path"]: r["partitionValues"] for r in _log_actions(table_path, 1, "remove")}
    assert added.keys() == removed.keys()
    for file_path, values in added.items():
        assert removed[file_path]["dec"] == values["dec"]
        add_t, remove_t = values["t"], removed[file_path]["t"]
        assert (add_t is None) == (remove_t is None)
        if add_t is not None:
            assert dt.datetime.fromisoformat(remove_t) == dt.datetime.fromisoformat(add_t)


def test_legacy_rebase_session_still_writes_proleptic_dates(spark: SparkSession, table_path: str) -> None:
    key = "spark.sql.parquet.datetimeRebaseModeInWrite"
    previous = spark.conf.get(key)
    spark.conf.set(key, "LEGACY")
    try:
        df = spark.createDataFrame([(1, dt.date(1000, 1, 1), dt.datetime(1200, 3, 1, tzinfo=UTC))],
                                   "id long, d date, ts timestamp")
        create_table(spark, df, table_path)
        assert spark.conf.get(key) == "LEGACY"  # the session's setting is restored
    finally:
        spark.conf.set(key, previous)
    assert _delta_rs_rows(table_path) == _source_rows(df)


# ---------------------------------------------------------------------------------------------
# 3. commit
# ---------------------------------------------------------------------------------------------


def _small_table(spark: SparkSession, path: str, partitioned: bool = False) -> Snapshot:
    if partitioned:
        values = ["a/b", None, "100%", "a b"]
        rows = [(i, values[i % 4], f"v{i}") for i in range(12)]
        df = spark.createDataFrame(rows, "id long, p string, v string")
        create_table(spark, df, path, ["p"])
    else:
        create_table(spark, spark.range(0, 10, 1, 2).withColumn("v", F.concat(F.lit("v"), F.col("id"))), path)
    return load_snapshot(path)


def _new_files(spark: SparkSession, snapshot: Snapshot, rows: list[tuple[Any, ...]]) -> Any:
    df = spark.createDataFrame(rows, snapshot.schema)
    return write_files(spark, df, snapshot.table_path, snapshot.schema, snapshot.partition_columns)


def _ids_by_file(spark: SparkSession, snapshot: Snapshot) -> list[tuple[DataFile, list[int]]]:
    """The ids each live file holds, from one scan (every file must hold some)."""
    spark_paths = spark_file_paths(spark, snapshot.table_path, snapshot.files)
    ids: dict[str, list[int]] = {path: [] for path in spark_paths}
    scan = scan_files(spark, snapshot, snapshot.files, with_row_id=True).select("id", FILE_PATH_COL)
    for row in scan.collect():
        ids[row[FILE_PATH_COL]].append(row["id"])
    assert all(ids.values()), ids
    return [(file, ids[path]) for file, path in zip(snapshot.files, spark_paths, strict=True)]


def _file_with(snapshot: Snapshot, spark: SparkSession, row_id: int) -> tuple[DataFile, list[int]]:
    return next((f, ids) for f, ids in _ids_by_file(spark, snapshot) if row_id in ids)


def _scan_ids(spark: SparkSession, snapshot: Snapshot, file: DataFile) -> list[int]:
    return [r["id"] for r in scan_files(spark, snapshot, [file]).select("id").collect()]


def _append_with_delta_rs(path: str, ids: list[int]) -> None:
    data = pa.table({"id": pa.array(ids, pa.int64()), "v": [f"rs{i}" for i in ids]})
    deltalake.write_deltalake(path, data, mode="append")


def test_commit_replaces_files_records_txn_and_history(spark: SparkSession, table_path: str) -> None:
    snapshot = _small_table(spark, table_path, partitioned=True)
    removed = [f for f in snapshot.files if f.partition_values["p"] in ("a/b", None)]
    assert len(removed) >= 2
    written = _new_files(spark, snapshot, [(100, "a/b", "new"), (101, None, "new"), (102, "100%", "new")])

    version = commit(CommitRequest(
        snapshot=snapshot, adds=written, removes=removed, operation="MERGE",
        operation_parameters={"predicate": "t.id = s.id", "matchedPredicates": [{"actionType": "update"}]},
        operation_metrics={"numTargetRowsUpdated": 2, "numTargetFilesAdded": len(written)},
        app_id="app-1", app_version=3, read_files=snapshot.files))

    assert version == 1
    expected = sorted([i for i in range(12) if i % 4 in (2, 3)] + [100, 101, 102])
    assert _ids(table_path) == expected
    assert [r["id"] for r in _scan_rows(spark, table_path)] == expected
    assert {r["id"]: r["p"] for r in _delta_rs_rows(table_path)}[101] is None
    after = load_snapshot(table_path)
    assert after.version == 1
    assert after.transaction_version("app-1") == 3
    assert after.transaction_version("other") is None

    latest, created = history(table_path)
    assert (latest["version"], latest["operation"]) == (1, "MERGE")
    assert latest["operationParameters"]["predicate"] == "t.id = s.id"
    assert json.loads(latest["operationParameters"]["matchedPredicates"]) == [{"actionType": "update"}]
    assert latest["operationMetrics"] == {
        "numTargetRowsUpdated": "2", "numTargetFilesAdded": str(len(written))}
    assert "streamingMergeCommitId" not in latest and "userOperation" not in latest
    assert (created["version"], created["operation"]) == (0, "CREATE TABLE")


def test_concurrent_remove_of_a_read_file_conflicts(spark: SparkSession, table_path: str) -> None:
    snapshot = _small_table(spark, table_path)
    written = _new_files(spark, snapshot, [(100, "new")])
    deltalake.DeltaTable(table_path).delete("id = 1")  # rewrites the file holding id 1: version 1

    with pytest.raises(ConcurrentModificationError):
        commit(CommitRequest(snapshot=snapshot, adds=written, removes=[], operation="MERGE",
                             read_files=snapshot.files))
    assert load_snapshot(table_path).version == 1
    assert _ids(table_path) == [0, 2, 3, 4, 5, 6, 7, 8, 9]

    # the same when the lost file is one we remove rather than read (delta-rs' own check)
    snapshot = load_snapshot(table_path)
    lost, _ = _file_with(snapshot, spark, 2)
    deltalake.DeltaTable(table_path).delete("id = 2")
    with pytest.raises(ConcurrentModificationError):
        commit(CommitRequest(snapshot=snapshot, adds=written, removes=[lost], operation="MERGE"))
    assert load_snapshot(table_path).version == 2
    assert _ids(table_path) == [0, 3, 4, 5, 6, 7, 8, 9]


def test_concurrent_append_commits_after_it_unless_the_filter_objects(spark: SparkSession,
                                                                      table_path: str) -> None:
    snapshot = _small_table(spark, table_path)
    touched, touched_ids = _file_with(snapshot, spark, 0)
    written = _new_files(spark, snapshot, [(100, "new")])
    _append_with_delta_rs(table_path, [50])  # version 1

    version = commit(CommitRequest(snapshot=snapshot, adds=written, removes=[touched], operation="MERGE",
                                   read_files=[touched]))
    assert version == 2
    untouched = [i for i in range(10) if i not in touched_ids]
    assert _ids(table_path) == sorted([*untouched, 50, 100])
    # our scan reads the file delta-rs wrote just as delta-rs does
    assert _scan_rows(spark, table_path) == _delta_rs_rows(table_path)

    # with a filter that finds the appended file relevant, the same situation is a conflict
    snapshot = load_snapshot(table_path)
    written = _new_files(spark, snapshot, [(200, "new")])
    _append_with_delta_rs(table_path, [60])  # version 3
    seen: list[list[str]] = []

    def relevant(latest: Snapshot, appended: list[DataFile]) -> list[DataFile]:
        seen.append([f.path for f in appended])
        return appended

    with pytest.raises(ConcurrentModificationError):
        commit(CommitRequest(snapshot=snapshot, adds=written, removes=[], operation="MERGE",
                             read_files=snapshot.files, concurrent_append_filter=relevant))
    new_files = {f.path for f in load_snapshot(table_path).files} - {f.path for f in snapshot.files}
    assert [sorted(paths) for paths in seen] == [sorted(new_files)]
    assert load_snapshot(table_path).version == 3
    assert 200 not in _ids(table_path)


def test_concurrent_txn_of_the_same_app_conflicts(spark: SparkSession, table_path: str) -> None:
    snapshot = _small_table(spark, table_path)
    assert commit(CommitRequest(snapshot=snapshot, adds=[], removes=[], operation="MERGE",
                                app_id="sink", app_version=5)) == 1
    written = _new_files(spark, snapshot, [(100, "new")])
    # same or older batch: would apply a batch twice; newer batch from a stale snapshot: Delta's
    # ConcurrentTransactionException (the txn we read changed), which delta-rs applies too
    for version in (5, 4, 6):
        with pytest.raises(ConcurrentModificationError):
            commit(CommitRequest(snapshot=snapshot, adds=written, removes=[], operation="MERGE",
                                 app_id="sink", app_version=version))
    after = load_snapshot(table_path)
    assert (after.version, after.transaction_version("sink")) == (1, 5)
    assert 100 not in _ids(table_path)


def test_append_racing_the_commit_is_seen_by_the_filter(spark: SparkSession, table_path: str) -> None:
    snapshot = _small_table(spark, table_path)
    written = _new_files(spark, snapshot, [(100, "new")])
    _append_with_delta_rs(table_path, [50])  # version 1: our filter looks at it ...
    calls: list[set[str]] = []

    def relevant_if_it_holds_60(latest: Snapshot, appended: list[DataFile]) -> list[DataFile]:
        calls.append({f.path for f in appended})
        if len(calls) == 1:
            _append_with_delta_rs(table_path, [60])  # ... and meanwhile another writer appends id 60
        return [f for f in appended if 60 in _scan_ids(spark, latest, f)]

    with pytest.raises(ConcurrentModificationError):
        commit(CommitRequest(snapshot=snapshot, adds=written, removes=[], operation="MERGE",
                             read_files=snapshot.files, concurrent_append_filter=relevant_if_it_holds_60))


def test_remove_from_an_append_only_table_is_not_a_conflict(spark: SparkSession, tmp_path: Path) -> None:
    path = str(tmp_path / "append_only")
    deltalake.write_deltalake(path, pa.table({"id": pa.array([1, 2], pa.int64()), "v": ["a", "b"]}),
                              configuration={"delta.appendOnly": "true"})
    snapshot = load_snapshot(path)
    with pytest.raises(DeltaTableError) as info:
        commit(CommitRequest(snapshot=snapshot, adds=[], removes=snapshot.files, operation="MERGE"))
    assert not isinstance(info.value, ConcurrentModificationError)


# ---------------------------------------------------------------------------------------------
# 4. create_table refusals (check_writable: tests/unit/test_table_units.py)
# ---------------------------------------------------------------------------------------------


def test_create_table_refuses_an_existing_table_and_timestamp_partitions(spark: SparkSession,
                                                                        table_path: str) -> None:
    df = spark.createDataFrame([(1, dt.datetime(2024, 1, 1, tzinfo=UTC))], "id long, ts timestamp")
    with pytest.raises(DeltaTableError, match="`ts`"):
        create_table(spark, df, table_path, ["ts"])
    assert not os.path.exists(table_path)

    create_table(spark, df, table_path)
    before = _files_on_disk(table_path)
    with pytest.raises(DeltaTableError, match="already exists") as info:
        create_table(spark, df, table_path)
    assert table_path in str(info.value)
    assert _files_on_disk(table_path) == before
    assert load_snapshot(table_path).version == 0


# ---------------------------------------------------------------------------------------------
# 5. write_files leaves nothing behind when it fails
# ---------------------------------------------------------------------------------------------


def _failing_frame(spark: SparkSession) -> DataFrame:
    return (spark.range(0, 8_000, 1, 4)
            .withColumn("p", (F.col("id") % 3).cast("int"))
            .withColumn("v", F.when(F.col("id") == 7_000, F.raise_error(F.lit("boom in the middle")))
                        .otherwise(F.col("id").cast("string"))))


def test_failed_write_leaves_no_files(spark: SparkSession, table_path: str) -> None:
    """A task failing mid-write (others may have finished their files) leaves neither data files
    nor its write folder in the table folder, partitioned or not; the table is untouched."""
    df = _failing_frame(spark)
    create_table(spark, df.where("id < 10"), table_path)
    before = _files_on_disk(table_path)
    folders_before = sorted(os.listdir(table_path))

    for partition_columns in ([], ["p"]):
        with pytest.raises(PySparkException, match="boom in the middle"):
            write_files(spark, df, table_path, df.schema, partition_columns)
        assert _files_on_disk(table_path) == before, partition_columns
        assert sorted(os.listdir(table_path)) == folders_before  # not even an empty write folder
    assert _ids(table_path) == list(range(10))


NOT_NULL_SCHEMA = StructType([
    StructField("id", LongType(), False),
    StructField("st", StructType([StructField("a", IntegerType(), False)]), True),
])


@pytest.mark.parametrize(
    ("rows", "violated"),
    [([(1, (1,)), (None, (2,))], "id"), ([(1, (1,)), (2, (None,))], "st.a"), ([(1, (1,)), (2, None)], None)],
)
def test_not_null_columns_are_enforced(spark: SparkSession, tmp_path: Path,
                                       rows: list[tuple[Any, ...]], violated: str | None) -> None:
    """As Delta: NULL in a NOT NULL column fails the write with Delta's message, a NOT NULL field
    of a NULL struct is fine."""
    path = str(tmp_path / "t")
    os.makedirs(path)
    df = spark.createDataFrame(rows, "id long, st struct<a:int>")
    if violated is None:
        assert sum(w.num_records for w in write_files(spark, df, path, NOT_NULL_SCHEMA, [])) == 2
        return
    with pytest.raises(DeltaTableError, match=f"NOT NULL constraint violated for column: {violated}\\."):
        write_files(spark, df, path, NOT_NULL_SCHEMA, [])
    assert _files_on_disk(path) == set()


def test_side_table_created_by_another_writer_meanwhile_is_appended_to(
        spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two queries sharing a dead-letter table both find it missing and both create it: the
    one that loses the creation appends to the winner's table instead of failing its batch."""
    from streaming_merge.table import append as append_module

    path = str(tmp_path / "dead_letter")
    rows = spark.createDataFrame([("a", 1)], "reason string, offset long")
    append_module.append_rows(spark, rows, path, "query-1", 0)  # the winner: creates, appends
    stale = [False]  # the loser's first check saw no table: the winner's commit landed just after
    real_exists = append_module.table_exists
    monkeypatch.setattr(append_module, "table_exists", lambda loc: stale.pop() if stale else real_exists(loc))
    version = append_module.append_rows(spark, spark.createDataFrame([("b", 2)], rows.schema), path, "query-2", 0)
    table = deltalake.DeltaTable(path)
    assert version == table.version() == 2
    assert sorted(table.to_pyarrow_table().to_pylist(), key=lambda r: r["offset"]) == [
        {"reason": "a", "offset": 1}, {"reason": "b", "offset": 2}]


def test_append_writes_the_tables_columns_in_its_order_whatever_the_frames_order(
        spark: SparkSession, tmp_path: Path) -> None:
    """Rows are written in the table's column order: a frame in that order as it is, a frame in
    another order (or with a column the table lacks) through a projection onto the table's."""
    from streaming_merge.table.append import append_rows

    path = str(tmp_path / "side")
    append_rows(spark, spark.createDataFrame([("a", 1)], "reason string, offset long"), path, "q", 0)
    append_rows(spark, spark.createDataFrame([(2, "b")], "offset long, reason string"), path, "q", 1)
    append_rows(spark, spark.createDataFrame([(3, "c", True)], "offset long, reason string, extra boolean"),
                path, "q", 2)
    table = deltalake.DeltaTable(path)
    assert table.version() == 3
    assert [f.name for f in table.schema().fields] == ["reason", "offset"]
    assert sorted(table.to_pyarrow_table().to_pylist(), key=lambda r: r["offset"]) == [
        {"reason": "a", "offset": 1}, {"reason": "b", "offset": 2}, {"reason": "c", "offset": 3}]


@pytest.mark.parametrize("columns", [3, 400])
def test_footer_read_through_hadoop_equals_pyarrows_own(spark: SparkSession, tmp_path: Path, columns: int) -> None:
    """The footer comes over py4j in small reads: a small one in the first read, a big one
    (400 columns, tens of KiB) in several; both must parse to what pyarrow reads locally."""
    path = tmp_path / "f.parquet"
    pq.write_table(pa.table({f"c{i}": pa.array(range(i, i + 1000)) for i in range(columns)}), path)
    local = pq.read_metadata(path)
    assert (local.serialized_size > 4096) == (columns > 3)
    read = HadoopFiles(spark, str(tmp_path)).read_footer(f"file:{path}", path.stat().st_size)
    assert read.num_rows == 1000 and read.num_columns == columns
    assert read.row_group(0).column(columns - 1).statistics.max == columns - 1 + 999
    assert read.to_dict() == local.to_dict()


def test_footer_read_rejects_a_file_that_is_not_parquet(spark: SparkSession, tmp_path: Path) -> None:
    path = tmp_path / "f.json"
    path.write_text('{"a": 1}\n' * 100)
    with pytest.raises(ValueError, match="is not a Parquet file"):
        HadoopFiles(spark, str(tmp_path)).read_footer(f"file:{path}", path.stat().st_size)


def test_recorded_now_is_the_time_given_and_leaves_the_generated_code_unchanged(spark: SparkSession) -> None:
    """Side rows (tombstones) carry the time they were recorded; a timestamp literal would be
    written into the generated Java code, so every append would compile a new class."""
    from streaming_merge.table.append import recorded_now

    earlier = dt.datetime(2026, 11, 25, 13, 40, 14, 565645, tzinfo=dt.UTC)
    later = dt.datetime(2026, 11, 25, 15, 1, 2, 3, tzinfo=dt.timezone(dt.timedelta(hours=1)))
    frames = [spark.range(3).select(F.col("id"), recorded_now(t).alias("at")) for t in (earlier, later)]
    micros = [{r["m"] for r in f.select(F.unix_micros("at").alias("m")).collect()} for f in frames]
    assert micros == [{int(t.timestamp()) * 1_000_000 + t.microsecond} for t in (earlier, later)]

    def generated(frame: DataFrame) -> list[str]:
        code = frame._jdf.queryExecution().debug().codegenToSeq()
        return [str(code.apply(i)._2()) for i in range(code.size())]

    assert generated(frames[0]) and generated(frames[0]) == generated(frames[1])
    literal = spark.range(3).select(F.col("id"), F.lit(earlier).alias("at"))
    assert generated(literal) != generated(spark.range(3).select(F.col("id"), F.lit(later).alias("at"))), \
        "the check cannot tell: a timestamp literal no longer changes the generated code"


def test_scans_read_the_row_index_column_only_where_spark_fills_it(spark: SparkSession, tmp_path: Path) -> None:
    """Scans read each row's index through the column Spark's Parquet reader fills, once this
    Spark confirmed (by refusing to plan it beside ``_metadata.row_index``) that the name is its
    own; a reader that did not fill it would leave every deletion test and DV position NULL."""
    from streaming_merge.table import scan

    pq.write_table(pa.table({"id": pa.array([5, 6, 7], pa.int64())}), tmp_path / "part-0.parquet")
    read = spark.read.schema(f"id bigint, {scan.ROW_INDEX_READ_COL} bigint").parquet(str(tmp_path))
    assert scan._reader_fills_row_index(spark, read)
    assert [r[0] for r in read.orderBy("id").select(scan.ROW_INDEX_READ_COL).collect()] == [0, 1, 2]
    unfilled = spark.read.schema("id bigint, some_other_column bigint").parquet(str(tmp_path))
    answers = scan._answers._values.get("fills")
    try:
        scan._answers._values["fills"] = []  # not asked yet in this context
        assert not scan._reader_fills_row_index(spark, unfilled.withColumnRenamed("some_other_column",
                                                                                    scan.ROW_INDEX_READ_COL))
        assert scan._row_index_column(spark, read.schema) == "_metadata.row_index"
    finally:
        if answers is not None:
            scan._answers._values["fills"] = answers
