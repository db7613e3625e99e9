"""Write a Spark DataFrame as Parquet files of a Delta table, with per-file stats.

Spark writes into a private staging folder inside the table (so concurrent writers
never share an output committer's temporary folder); the finished files are then
moved to their final place and their footers are read with pyarrow to build the
``add`` actions' statistics. Nothing is visible to readers until the commit.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import decimal
import json
import logging
import os
import re
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow.fs as pafs
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

log = logging.getLogger(__name__)

HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"
NOT_NULL_VIOLATION = "NOT NULL constraint violated for column:"  # Delta's text
STRING_STATS_PREFIX = 32  # as Delta: longer strings get no min/max rather than truncated ones
_STATS_TYPES = (BooleanType, ByteType, ShortType, IntegerType, LongType, DateType, StringType,
                TimestampType, TimestampNTZType)


# Passed to the Hadoop job of each write only (not the session): no _SUCCESS marker, and the
# v2 commit algorithm (tasks move their files into the output folder as they finish, the job
# commit has nothing left to rename): ~40-100 ms less per write here. Its weakness, partial
# output after a failed job, cannot hurt: the output is our private staging folder, deleted on
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


@contextlib.contextmanager
def _parquet_write_conf(spark: SparkSession) -> Iterator[None]:
    """Micro-precision timestamps (INT96 has no usable stats and is deprecated in Delta), and
    proleptic Gregorian dates: a session in LEGACY rebase mode would otherwise write dates
    before 1582 shifted into the Julian calendar, which every other Delta reader misreads."""
    wanted = {
        "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
        "spark.sql.parquet.compression.codec": "snappy",
        "spark.sql.parquet.datetimeRebaseModeInWrite": "CORRECTED",
    }
    previous = {key: spark.conf.get(key, None) for key in wanted}
    for key, value in wanted.items():
        spark.conf.set(key, value)
    try:
        yield
    finally:
        for key, value in previous.items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)


def write_files(
    spark: SparkSession,
    df: DataFrame,
    table_path: str,
    schema: StructType,
    partition_columns: list[str],
) -> list[WrittenFile]:
    """Write ``df`` (already in ``schema``'s column order) into the table folder.

    Returns the written files with their stats; empty files are deleted, not returned.
    On failure every file of this write is removed again.
    """
    staging_name = f".sm-staging-{uuid.uuid4().hex}"
    staging = os.path.join(table_path, staging_name)
    filesystem, root = pafs.FileSystem.from_uri(os.path.abspath(table_path))
    moved: list[str] = []
    try:
        with _parquet_write_conf(spark):
            writer = _enforce_not_null(df, schema).write.mode("errorifexists").options(**_COMMITTER_OPTIONS)
            if partition_columns:
                writer = writer.partitionBy(*partition_columns)
            try:
                writer.parquet(staging)
            except Exception as exc:
                if NOT_NULL_VIOLATION not in str(exc):
                    raise
                found = re.search(re.escape(NOT_NULL_VIOLATION) + r" (.+?)\.(?:\s|$)", str(exc))
                column = found.group(1) if found else "?"
                raise DeltaTableError(
                    f"{NOT_NULL_VIOLATION} {column}. The table declares `{column}` NOT NULL and the data "
                    "written has a NULL there; nothing was written."
                ) from exc
        written = []
        selector = pafs.FileSelector(os.path.join(root, staging_name), recursive=True)
        for info in filesystem.get_file_info(selector):
            if info.type != pafs.FileType.File or not info.base_name.endswith(".parquet"):
                continue
            relative_dir = os.path.relpath(os.path.dirname(info.path), os.path.join(root, staging_name))
            relative_dir = "" if relative_dir == "." else relative_dir
            final_rel = os.path.join(relative_dir, info.base_name)
            final_abs = os.path.join(root, final_rel)
            filesystem.create_dir(os.path.dirname(final_abs), recursive=True)
            filesystem.move(info.path, final_abs)
            moved.append(final_abs)
            metadata = pq.read_metadata(final_abs, filesystem=filesystem)
            if metadata.num_rows == 0:
                filesystem.delete_file(final_abs)
                moved.remove(final_abs)
                continue
            written.append(
                WrittenFile(
                    path=final_rel,
                    size=filesystem.get_file_info(final_abs).size,
                    partition_values=_partition_values(spark, relative_dir, partition_columns),
                    num_records=metadata.num_rows,
                    stats=footer_stats(metadata, schema, partition_columns),
                    modification_time=int(time.time() * 1000),
                )
            )
        return written
    except BaseException:
        for path in moved:
            with contextlib.suppress(OSError):
                filesystem.delete_file(path)
        raise
    finally:
        with contextlib.suppress(OSError):
            filesystem.delete_dir(os.path.join(root, staging_name))


def _enforce_not_null(df: DataFrame, schema: StructType) -> DataFrame:
    """Fail the write on a NULL in a NOT NULL column, as Delta's DeltaInvariantCheckerExec does.

    A non-nullable field nested in a struct is checked only where its parent struct is not
    NULL (Delta's rule). The check is a projection (``raise_error`` inside a CASE), so it
    runs in the write's own job and costs no extra scan.
    """
    guarded: dict[str, Column] = {}
    for field in schema.fields:
        if field.name not in df.columns:
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
    return df.select(*[guarded.get(name, F.col(f"`{name}`")) for name in df.columns])


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


def delete_written(table_path: str, files: list[WrittenFile]) -> None:
    """Remove files of a write whose commit failed, so nothing uncommitted lingers."""
    filesystem, root = pafs.FileSystem.from_uri(os.path.abspath(table_path))
    for written in files:
        with contextlib.suppress(OSError):
            filesystem.delete_file(os.path.join(root, written.path))


def _partition_values(
    spark: SparkSession, relative_dir: str, partition_columns: list[str]
) -> dict[str, str | None]:
    """Partition values of a Hive-style directory, unescaped with Spark's own rules."""
    if not partition_columns:
        return {}
    unescape = spark._jvm.org.apache.spark.sql.catalyst.catalog.ExternalCatalogUtils.unescapePathName
    values: dict[str, str | None] = {}
    for segment in relative_dir.split(os.sep):
        name, _, raw = segment.partition("=")
        key = unescape(name)
        values[key] = None if raw == HIVE_NULL else unescape(raw)
    missing = [c for c in partition_columns if c not in values]
    if missing:
        raise RuntimeError(f"Spark wrote `{relative_dir}` without partition columns {missing}")
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
