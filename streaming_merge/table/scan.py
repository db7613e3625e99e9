"""Spark DataFrames over a chosen set of a snapshot's files.

Partition values come from the log (a constant map from file path to value), never from
directory names, because Delta does not require Hive-style directories. Spark's
hidden ``_metadata`` column gives the file path and the row's index inside its file,
which together are a stable row id (Delta uses the file name the same way).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StructField, StructType

from streaming_merge.spark.conf import temporary_conf
from streaming_merge.spark.jvm import jvm_class
from streaming_merge.spark.per_context import PerContext
from streaming_merge.spark.slots import task_slots
from streaming_merge.table.dv_filter import live_row_column
from streaming_merge.table.file_relation import files_relation
from streaming_merge.table.schema import data_columns
from streaming_merge.table.snapshot import DataFile, Snapshot, check_readable
from streaming_merge.table.spark_paths import (
    FILE_PATH_COL,
    FILE_SIZE_COL,
    PINNED_SCAN_OPTION,
    ROW_INDEX_COL,
    ROW_INDEX_READ_COL,
    spark_file_paths,
)
from streaming_merge.table.write import partition_value_string


def scan_files(
    spark: SparkSession,
    snapshot: Snapshot,
    files: Sequence[DataFile],
    *,
    with_row_id: bool = False,
    schema: StructType | None = None,
    spark_paths: Sequence[str] | None = None,
    with_file_size: bool = False,
    selected_after: bool = False,
) -> DataFrame:
    """DataFrame of the given files with the table's columns in table order.

    ``schema`` may be wider than the snapshot's (schema evolution): missing columns read
    as NULL. With ``with_row_id`` two extra columns identify each row: the file path
    (as Spark reports it) and the row's index inside that file; with ``with_file_size`` a last
    column (FILE_SIZE_COL) holds the size of the row's file, a constant per file that costs no
    per-row work. ``spark_paths``: the files' :func:`spark_file_paths` when the caller already
    has them. ``selected_after``: the caller selects the columns it wants by name next, so a
    column the read added for the row index may stay (dropping it is an analysis of its own).
    """
    check_readable(snapshot)
    table_schema = schema or snapshot.schema
    partition_columns = snapshot.partition_columns
    if not files:
        return _empty(spark, table_schema, with_row_id, with_file_size)

    file_schema = data_columns(table_schema, partition_columns)
    has_vectors = any(f.deletion_vector is not None for f in files)
    row_index = _row_index_column(spark, file_schema) if with_row_id or has_vectors else None
    paths = [snapshot.absolute_path(f.path) for f in files]
    if row_index == ROW_INDEX_READ_COL:
        with_index = StructType([*file_schema.fields, StructField(ROW_INDEX_READ_COL, LongType())])
        data = _read_parquet(spark, snapshot, paths, with_index)
        if not _reader_fills_row_index(spark, data):
            row_index = "_metadata.row_index"
            data = _read_parquet(spark, snapshot, paths, file_schema)
    else:
        data = _read_parquet(spark, snapshot, paths, file_schema)
    live = live_row_column(spark, snapshot, files, "_metadata.file_size", "_metadata.file_path",
                           row_index) if has_vectors and row_index else None
    if live is not None:  # the files' deletion vectors, applied before anything reads a row
        data = data.filter(live)
    size = [F.col("_metadata.file_size").alias(FILE_SIZE_COL)] if with_file_size else []
    read_column_added = row_index == ROW_INDEX_READ_COL
    if not with_row_id and not partition_columns:  # no per-row file metadata to build
        # The read's columns are the table's, in its order, already: a select naming each one
        # cost a JVM round trip a column and an analysis (Kafka e2e, 5k-record batches: scan_files
        # 37 -> 26 ms a call, 513 -> 447 round trips a sink batch).
        if read_column_added:
            data = data.drop(ROW_INDEX_READ_COL)
        return data.select("*", *size) if size else data
    data = data.select(
        "*",  # the read's columns, as above
        F.col("_metadata.file_path").alias(FILE_PATH_COL),
        *([F.col(row_index).alias(ROW_INDEX_COL)] if with_row_id and row_index else []),
        *size,
    )
    if not partition_columns:  # already in table order, then path, row index and size
        # (the partitioned case's last projection below leaves the read's row index column out)
        return data.drop(ROW_INDEX_READ_COL) if read_column_added and not selected_after else data
    data = data.select("*", *_partition_value_columns(spark, snapshot, files, table_schema, spark_paths))
    ordered: list[Column] = [F.col(f"`{f.name}`") for f in table_schema.fields]
    if with_row_id:
        ordered += [F.col(FILE_PATH_COL), F.col(ROW_INDEX_COL)]
    if with_file_size:
        ordered.append(F.col(FILE_SIZE_COL))
    return data.select(*ordered)


def _row_index_column(spark: SparkSession, file_schema: StructType) -> str:
    """Where a scan reads each row's index inside its file. Spark's Parquet reader fills a
    column of the read schema named ROW_INDEX_READ_COL with it, as a plain long column;
    ``_metadata.row_index`` is the same number, but Spark builds the ``_metadata`` struct for
    every row to read it back (3M rows, 20 files: a trivial filter on the row index 24 ms over a
    plain scan this way, 56 ms through ``_metadata`` with the file size). A table with a column
    of that name (never one Delta writers make) reads it through ``_metadata``."""
    if any(f.name.lower() == ROW_INDEX_READ_COL for f in file_schema.fields) or _fills_row_index(spark) == [False]:
        return "_metadata.row_index"
    return ROW_INDEX_READ_COL


_answers: PerContext[list[bool]] = PerContext(limit=1)


def _fills_row_index(spark: SparkSession) -> list[bool]:
    """The SparkContext's answer of _reader_fills_row_index: empty until asked."""
    return _answers.get(spark.sparkContext, "fills", list)


def _reader_fills_row_index(spark: SparkSession, data: DataFrame) -> bool:
    """Whether this Spark's Parquet reader fills ROW_INDEX_READ_COL, asked once per
    SparkContext of the first read that has the column: Spark refuses to plan a read of
    ``_metadata.row_index`` beside a column of that name exactly when the name is its own row
    index column (planning only, no job). On any other answer the scans read
    ``_metadata.row_index``: slower, never a column left NULL."""
    def probe() -> bool:
        try:
            data.select(F.col(ROW_INDEX_READ_COL), F.col("_metadata.row_index"))._jdf.queryExecution().sparkPlan()
        except Exception as exc:  # py4j's error of Spark's refusal
            return ROW_INDEX_READ_COL in str(exc) and "reserved" in str(exc)
        return False

    answer = _fills_row_index(spark)
    if not answer:
        answer.append(probe())
    return answer[0]


def _read_parquet(spark: SparkSession, snapshot: Snapshot, paths: list[str], file_schema: StructType) -> DataFrame:
    """The files read as Parquet with ``file_schema``. Local files go straight into a file
    index (streaming_merge.table.file_relation: no existence checks, listing or partition
    inference of paths the log names); files on other stores, or a Spark whose internals
    differ, through ``spark.read``, which lists them as the store needs (see _listing_conf).

    The marker option tells the MERGE that this read is pinned to immutable files of one
    version (streaming_merge.merge.materialize.is_stable), so it need not be materialized."""
    java_paths = _java_strings(spark, paths)
    if all(p.startswith("file:") for p in paths):
        data = files_relation(spark, snapshot.location.uri, java_paths, file_schema, {PINNED_SCAN_OPTION: "true"})
        if data is not None:
            return data
    with temporary_conf(spark, _listing_conf(spark, snapshot, len(paths))):
        reader = spark.read.schema(file_schema).option(PINNED_SCAN_OPTION, "true")
        return DataFrame(reader._jreader.parquet(java_paths), spark)


# Never in a path: POSIX forbids it in file names, Hadoop paths and object keys in practice.
_PATH_SEPARATOR = "\u0000"


def _java_strings(spark: SparkSession, values: Sequence[str]) -> object:
    """``values`` as a Java ``String[]`` in one round trip: py4j sends a Python list one
    element per round trip (20 files: 22 calls for one read), so the paths travel as one
    string that the JVM splits."""
    joined = _PATH_SEPARATOR.join(values)
    return jvm_class(spark, "org.apache.commons.lang3.StringUtils").splitPreserveAllTokens(joined, _PATH_SEPARATOR)


# Spark's default spark.sql.sources.parallelPartitionDiscovery.threshold: a read of more paths
# lists them in a Spark job, one task per path.
_PARALLEL_LISTING_PATHS = 32


def _listing_conf(spark: SparkSession, snapshot: Snapshot, paths: int) -> dict[str, str]:
    """How Spark should list the files of a scan of ``paths`` files. A path-based read lists
    every path it is given before planning (InMemoryFileIndex), although the log already holds
    each file's size; past 32 paths that is a job with a task per path, 0.9 s for 400 files on
    this 2-core machine, paid by each scan of a MERGE. Local files are listed on the driver
    instead (a stat per file, no job); a remote store keeps the job, one task per task slot."""
    if paths <= _PARALLEL_LISTING_PATHS:
        return {}
    if snapshot.location.uri.startswith("file:"):
        return {"spark.sql.sources.parallelPartitionDiscovery.threshold": str(paths)}
    return {"spark.sql.sources.parallelPartitionDiscovery.parallelism": str(task_slots(spark))}


def _partition_value_columns(
    spark: SparkSession, snapshot: Snapshot, files: Sequence[DataFile], table_schema: StructType,
    spark_paths: Sequence[str] | None,
) -> list[Column]:
    """Each partition column as a lookup of the row's file path in a literal map built from
    the log (Delta's string form, cast to the column type as Delta does). Spark folds the
    map into a constant, so this costs no join and no broadcast job, whatever the file count."""
    paths = spark_paths if spark_paths is not None else spark_file_paths(spark, snapshot.location, files)
    columns = []
    for name in snapshot.partition_columns:
        by_path = {path: partition_value_string(f.partition_values.get(name)) for path, f in zip(paths, files,
                                                                                                 strict=True)}
        lookup = F.try_element_at(F.from_json(F.lit(json.dumps(by_path)), "map<string,string>"), F.col(FILE_PATH_COL))
        columns.append(lookup.cast(table_schema[name].dataType).alias(name))
    return columns


def _empty(spark: SparkSession, schema: StructType, with_row_id: bool, with_file_size: bool = False) -> DataFrame:
    fields = list(schema.fields)
    frame = spark.createDataFrame([], StructType(fields))
    if with_row_id:
        frame = frame.select("*", F.lit(None).cast("string").alias(FILE_PATH_COL),
                             F.lit(None).cast("long").alias(ROW_INDEX_COL))
    if with_file_size:
        frame = frame.select("*", F.lit(None).cast("long").alias(FILE_SIZE_COL))
    return frame
