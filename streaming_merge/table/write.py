"""Write a Spark DataFrame as Parquet files of a Delta table, with per-file stats.

Each write gets a folder of its own inside the table (``sm-write-<uuid>/``, then Spark's
partition folders), so concurrent writers never share an output committer's temporary
folder, and its files are committed where they were written: no move (a copy on object
stores). Their footers are read through Spark's Hadoop FileSystem to build the ``add``
actions' statistics. Nothing is visible to readers until the commit; a failed write deletes
its folder, and what a killed process leaves behind is never referenced by the log, so
``DeltaTable.vacuum()`` removes it (the folder name does not start with ``_`` or ``.``,
which vacuum would skip).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import decimal
import json
import logging
import re
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import pyarrow.parquet as pq
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    BooleanType,
    ByteType,
    DataType,
    DateType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from streaming_merge.errors import DeltaTableError
from streaming_merge.spark.conf import temporary_conf
from streaming_merge.spark.jvm import jvm_class
from streaming_merge.table.files import HadoopFiles
from streaming_merge.table.location import TableRef, resolve

log = logging.getLogger(__name__)

HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"
WRITE_FOLDER_PREFIX = "sm-write-"
# Change data (delta.enableChangeDataFeed): the column that names a change row's kind, and the
# folder level one write splits its change rows from its data rows by (as Delta's writer splits
# them by a partition column of its own). Not hidden (no leading ``_``): delta-rs' and Delta's
# VACUUM skip hidden folders, and data files must not sit where they would never be vacuumed.
# The change files are then moved where Delta keeps them, ``_change_data/`` (which both
# VACUUMs know: they delete its files once older than the retention).
CHANGE_TYPE_COL = "_change_type"
CHANGE_DATA_FOLDER = "_change_data"
_CHANGE_FOLDER_COL = "sm_change_data"
NOT_NULL_VIOLATION = "NOT NULL constraint violated for column:"  # Delta's text
STRING_STATS_PREFIX = 32  # as Delta: longer strings get no min/max rather than truncated ones
_STATS_TYPES = (BooleanType, ByteType, ShortType, IntegerType, LongType, DateType, StringType,
                TimestampType, TimestampNTZType)


# Passed to the Hadoop job of each write only (not the session): no _SUCCESS marker, and the
# v2 commit algorithm (tasks move their files into the output folder as they finish, the job
# commit has nothing left to rename): ~40-100 ms less per write here. Its weakness, partial
# output after a failed job, cannot hurt: the output is this write's own folder, deleted on
# failure, and nothing is visible before the Delta commit.
_COMMITTER_OPTIONS = {
    "mapreduce.fileoutputcommitter.marksuccessfuljobs": "false",
    "mapreduce.fileoutputcommitter.algorithm.version": "2",
}


@dataclass(frozen=True)
class WrittenFile:
    """A finished data file, ready to be committed as an ``add`` action."""

    path: str  # relative to the table root
    size: int
    partition_values: dict[str, str | None]  # Delta's string form
    num_records: int
    stats: str  # Delta stats JSON
    modification_time: int
    # A change data file (committed as a ``cdc`` action), not a data file.
    change_data: bool = False


@contextlib.contextmanager
def parquet_write_conf(spark: SparkSession) -> Iterator[None]:
    """Micro-precision timestamps (INT96 has no usable stats and is deprecated in Delta), and
    proleptic Gregorian dates: a session in LEGACY rebase mode would otherwise write dates
    before 1582 shifted into the Julian calendar, which every other Delta reader misreads.

    Session settings are shared by threads: two writes running at once keep their settings
    only when a caller holds these around both (each write's own set and restore are then
    no-ops), as the streaming sink does for its tombstone append beside its MERGE."""
    wanted = {
        "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
        "spark.sql.parquet.compression.codec": "snappy",
        "spark.sql.parquet.datetimeRebaseModeInWrite": "CORRECTED",
    }
    with temporary_conf(spark, wanted):
        yield


def write_files(
    spark: SparkSession,
    df: DataFrame,
    table_path: TableRef,
    schema: StructType,
    partition_columns: list[str],
    change_data: bool = False,
) -> list[WrittenFile]:
    """Write ``df`` (already in ``schema``'s column order) into a new folder of the table.

    Returns the written files with their stats; empty files are deleted, not returned.
    On failure every file of this write is removed again. With ``change_data`` ``df`` has a
    last column ``_change_type``: its rows with one go to change data files (``change_data``
    set), the others to data files, which keep the column, all NULL, as Delta's do.
    """
    location = resolve(table_path, spark)
    folder_name = f"{WRITE_FOLDER_PREFIX}{uuid.uuid4().hex}"
    folder = location.join(folder_name)
    files = HadoopFiles(spark, location.uri)
    moved: list[str] = []  # change files moved out of the write's folder
    try:
        with parquet_write_conf(spark), _job_group(spark) as group:
            checked = _enforce_not_null(df, schema)
            folders = list(partition_columns)
            if change_data:
                checked = checked.withColumn(_CHANGE_FOLDER_COL, F.col(CHANGE_TYPE_COL).isNotNull())
                folders.insert(0, _CHANGE_FOLDER_COL)
            writer = checked.write.mode("errorifexists").options(**_COMMITTER_OPTIONS)
            if folders:
                writer = writer.partitionBy(*folders)
            try:
                writer.parquet(folder)
            except Exception as exc:
                _await_failed_tasks(spark, group)
                if NOT_NULL_VIOLATION not in str(exc):
                    raise
                found = re.search(re.escape(NOT_NULL_VIOLATION) + r" (.+?)\.(?:\s|$)", str(exc))
                column = found.group(1) if found else "?"
                raise DeltaTableError(
                    f"{NOT_NULL_VIOLATION} {column}. The table declares `{column}` NOT NULL and the data "
                    "written has a NULL there; nothing was written."
                ) from exc
        written = []
        prefix = f"{location.uri}/"
        for status in files.list_files(folder):
            name = status.path.rsplit("/", 1)[-1]
            if not name.endswith(".parquet") or name.startswith((".", "_")):
                continue
            if not status.path.startswith(prefix):
                raise DeltaTableError(f"Spark wrote `{status.path}` outside the table `{location}`")
            relative = status.path[len(prefix):]
            metadata = files.read_footer(status.path, status.size)
            if metadata.num_rows == 0:
                files.delete(status.path)
                continue
            partition_dirs = relative.split("/")[1:-1]  # between the write folder and the file name
            is_change = False
            if change_data:
                is_change = partition_dirs.pop(0) == f"{_CHANGE_FOLDER_COL}=true"
            written.append(
                WrittenFile(
                    path=relative,
                    size=status.size,
                    partition_values=_partition_values(spark, partition_dirs, partition_columns),
                    num_records=metadata.num_rows,
                    stats="" if is_change else footer_stats(metadata, schema, partition_columns),
                    modification_time=status.modification_time,
                    change_data=is_change,
                )
            )
        if change_data and any(w.change_data for w in written):
            written = [_to_change_data_folder(files, location.join, w, moved) if w.change_data else w
                       for w in written]
            files.delete(location.join(f"{folder_name}/{_CHANGE_FOLDER_COL}=true"), recursive=True)
        if not any(not w.change_data for w in written):  # e.g. the empty file Spark writes for an empty DataFrame
            files.delete(folder, recursive=True)
        return written
    except BaseException:
        with contextlib.suppress(Exception):
            files.delete(folder, recursive=True)
        for path in moved:
            with contextlib.suppress(Exception):
                files.delete(path)
        raise


def _to_change_data_folder(files: HadoopFiles, absolute: Callable[[str], str], written: WrittenFile,
                           moved: list[str]) -> WrittenFile:
    """``written`` (a change file) moved from the write's folder to ``_change_data/`` (its
    partition folders kept), as Delta names change files: ``cdc-<uuid>.c000.snappy.parquet``."""
    partition_dirs = written.path.split("/")[2:-1]  # after the write folder and the change-data level
    relative = "/".join([CHANGE_DATA_FOLDER, *partition_dirs, f"cdc-{uuid.uuid4()}.c000.snappy.parquet"])
    files.rename(absolute(written.path), absolute(relative))
    moved.append(absolute(relative))
    return replace(written, path=relative)


_JOB_GROUP = "spark.jobGroup.id"
_WIND_DOWN_SECONDS = 30.0


@contextlib.contextmanager
def _job_group(spark: SparkSession) -> Iterator[str]:
    """The job group the write's job runs in: the caller's when one is set (a profile's or
    the user's, left untouched), else a fresh one, removed afterwards."""
    context = spark.sparkContext
    current = context.getLocalProperty(_JOB_GROUP)
    if current:
        yield current
        return
    group = f"streaming_merge-write-{uuid.uuid4().hex}"
    context.setLocalProperty(_JOB_GROUP, group)
    try:
        yield group
    finally:
        context.setLocalProperty(_JOB_GROUP, None)  # type: ignore[arg-type]


def _await_failed_tasks(spark: SparkSession, group: str) -> None:
    """Wait (bounded) until no task of the group's failed jobs is still running.

    When one task of a write fails, Spark fails the job at once but lets the stage's other
    running tasks finish; one of them may still commit its file into the write folder after
    the driver has deleted it. Waiting for them first makes the cleanup complete; past the
    bound, a straggler's file is an orphan no commit references, which vacuum removes."""
    tracker = spark.sparkContext.statusTracker()
    deadline = time.monotonic() + _WIND_DOWN_SECONDS
    stages = [stage for job in tracker.getJobIdsForGroup(group)
              if (info := tracker.getJobInfo(job)) is not None and info.status == "FAILED"
              for stage in info.stageIds]
    while time.monotonic() < deadline:
        running = sum(stage_info.numActiveTasks for stage in stages
                      if (stage_info := tracker.getStageInfo(stage)) is not None)
        if running == 0:
            return
        time.sleep(0.05)
    log.warning("Tasks of a failed write were still running after %.0f s; their files, if any, stay "
                "uncommitted until vacuum removes them", _WIND_DOWN_SECONDS)


def _enforce_not_null(df: DataFrame, schema: StructType) -> DataFrame:
    """Fail the write on a NULL in a NOT NULL column, as Delta's DeltaInvariantCheckerExec does.

    A non-nullable field nested in a struct is checked only where its parent struct is not
    NULL (Delta's rule). The check is a projection (``raise_error`` inside a CASE), so it
    runs in the write's own job and costs no extra scan.
    """
    guarded: dict[str, Column] = {}
    # Columns are only built for the fields with something to check: each costs round trips
    # to the JVM, and most tables declare nothing NOT NULL.
    checked_fields = [f for f in schema.fields if _declares_not_null(f)]
    columns = df.columns if checked_fields else []
    for field in checked_fields:
        if field.name not in columns:
            continue
        column = F.col(f"`{field.name}`")
        checked: Column | None = None
        for condition, path in _not_null_violations(column, field, field.name, None):
            error = F.raise_error(F.lit(f"{NOT_NULL_VIOLATION} {path}."))
            checked = F.when(condition, error) if checked is None else checked.when(condition, error)
        if checked is not None:
            guarded[field.name] = checked.otherwise(column).alias(field.name)
    if not guarded:
        return df
    return df.select(*[guarded.get(name, F.col(f"`{name}`")) for name in columns])


def _declares_not_null(field: StructField) -> bool:
    """True when ``field`` or a field nested in its structs is NOT NULL."""
    if not field.nullable:
        return True
    return isinstance(field.dataType, StructType) and any(_declares_not_null(c) for c in field.dataType.fields)


def _not_null_violations(
    column: Column, field: StructField, path: str, parent_present: Column | None
) -> list[tuple[Column, str]]:
    violations: list[tuple[Column, str]] = []
    if not field.nullable:
        missing = column.isNull()
        violations.append((missing if parent_present is None else parent_present & missing, path))
    if isinstance(field.dataType, StructType):
        present = column.isNotNull() if parent_present is None else parent_present & column.isNotNull()
        for child in field.dataType.fields:
            child_column = column.getField(child.name)
            violations += _not_null_violations(child_column, child, f"{path}.{child.name}", present)
    return violations


def delete_written(spark: SparkSession, table_path: TableRef, files: list[WrittenFile]) -> None:
    """Remove the files of a write whose commit failed (and their write folders, which hold
    nothing else), so nothing uncommitted lingers."""
    location = resolve(table_path, spark)
    hadoop = HadoopFiles(spark, location.uri)
    for folder in sorted({w.path.split("/", 1)[0] for w in files}):
        if folder.startswith(WRITE_FOLDER_PREFIX):
            with contextlib.suppress(Exception):
                hadoop.delete(location.join(folder), recursive=True)
    for written in files:
        if not written.path.startswith(WRITE_FOLDER_PREFIX):
            with contextlib.suppress(Exception):
                hadoop.delete(location.join(written.path))


def _partition_values(
    spark: SparkSession, partition_dirs: list[str], partition_columns: list[str]
) -> dict[str, str | None]:
    """Partition values of Hive-style directory names, unescaped with Spark's own rules."""
    if not partition_columns:
        return {}
    unescape = jvm_class(spark, "org.apache.spark.sql.catalyst.catalog.ExternalCatalogUtils").unescapePathName
    values: dict[str, str | None] = {}
    for segment in partition_dirs:
        name, _, raw = segment.partition("=")
        key = unescape(name)
        values[key] = None if raw == HIVE_NULL else unescape(raw)
    missing = [c for c in partition_columns if c not in values]
    if missing:
        raise RuntimeError(f"Spark wrote `{'/'.join(partition_dirs)}` without partition columns {missing}")
    return {c: values[c] for c in partition_columns}


def footer_stats(metadata: pq.FileMetaData, schema: StructType, partition_columns: list[str]) -> str:
    """Delta stats JSON (numRecords, minValues, maxValues, nullCount) from a Parquet footer.

    Min/max are recorded only for types whose Parquet order equals Spark's order and whose
    JSON form is exact (no floats: NaN; no decimals: float rounding; no binary).
    """
    leaves: dict[str, dict[str, Any]] = {}
    parquet_schema = metadata.schema
    for column_index in range(metadata.num_columns):
        path = parquet_schema.column(column_index).path
        acc = leaves.setdefault(path, {"min": None, "max": None, "nulls": 0, "complete": True})
        for rg in range(metadata.num_row_groups):
            stats = metadata.row_group(rg).column(column_index).statistics
            if stats is None or not stats.has_null_count:
                acc["complete"] = False
                continue
            acc["nulls"] += stats.null_count
            if stats.has_min_max:
                acc["min"] = stats.min if acc["min"] is None else min(acc["min"], stats.min)
                acc["max"] = stats.max if acc["max"] is None else max(acc["max"], stats.max)
            elif stats.null_count != metadata.row_group(rg).num_rows:
                acc["complete"] = False
    min_values: dict[str, Any] = {}
    max_values: dict[str, Any] = {}
    null_count: dict[str, Any] = {}
    for field in schema.fields:
        if field.name in partition_columns:
            continue
        _collect(field.name, field.dataType, field.name, leaves, min_values, max_values, null_count)
    return json.dumps(
        {
            "numRecords": metadata.num_rows,
            "minValues": min_values,
            "maxValues": max_values,
            "nullCount": null_count,
        },
        separators=(",", ":"),
    )


def _collect(
    name: str,
    data_type: DataType,
    path: str,
    leaves: dict[str, dict[str, Any]],
    min_values: dict[str, Any],
    max_values: dict[str, Any],
    null_count: dict[str, Any],
) -> None:
    if isinstance(data_type, StructType):
        mins: dict[str, Any] = {}
        maxs: dict[str, Any] = {}
        nulls: dict[str, Any] = {}
        for child in data_type.fields:
            _collect(child.name, child.dataType, f"{path}.{child.name}", leaves, mins, maxs, nulls)
        if mins:
            min_values[name] = mins
        if maxs:
            max_values[name] = maxs
        if nulls:
            null_count[name] = nulls
        return
    leaf = leaves.get(path)
    if leaf is None or not leaf["complete"]:
        return
    null_count[name] = leaf["nulls"]
    if not isinstance(data_type, _STATS_TYPES) or leaf["min"] is None:
        return
    low, high = _json_value(leaf["min"], data_type), _json_value(leaf["max"], data_type)
    too_long = max(len(low), len(high)) > STRING_STATS_PREFIX if isinstance(data_type, StringType) else False
    if too_long:
        return
    min_values[name] = low
    max_values[name] = high


def _iso_datetime(value: dt.datetime, sep: str) -> str:
    """ISO 8601 with a four-digit year and microseconds, in UTC when ``value`` is aware.

    Not ``strftime``: glibc's ``%Y`` does not zero-pad, so year 999 became ``999-...``, a
    string neither delta-rs nor Delta Lake parses (the stat was then silently lost).
    """
    if value.tzinfo is not None:
        value = value.astimezone(dt.UTC).replace(tzinfo=None)
    return value.isoformat(sep=sep, timespec="microseconds")


def _json_value(value: Any, data_type: DataType) -> Any:
    if isinstance(data_type, TimestampType):
        if value.tzinfo is None:
            value = value.replace(tzinfo=dt.UTC)
        return _iso_datetime(value, "T") + "Z"
    if isinstance(data_type, TimestampNTZType):
        return _iso_datetime(value, "T")
    if isinstance(data_type, DateType):
        return value.isoformat()
    if isinstance(data_type, StringType) and isinstance(value, bytes):
        return value.decode("utf-8")
    return value


def partition_value_string(value: Any) -> str | None:
    """Delta's string form of a typed partition value (as read back from delta-rs)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dt.datetime):
        return _iso_datetime(value, " ")
    if isinstance(value, dt.date):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return format(value, "f")  # str() gives "0E-18" for a zero of scale 18; Spark writes "0.000..."
    return str(value)
