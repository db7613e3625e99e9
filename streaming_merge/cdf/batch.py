"""The change data of a range of versions as one Spark DataFrame, read by Spark alone.

The planned files are read by a handful of Spark-native Parquet scans, not one per version:
one over the change data files (their ``_change_type`` column read from the files) and one
per "layer" of data files (inserts and deletes), a layer holding each path at most once; a
path comes back in another layer only when a version range touches the same data file twice
(added in one version, its deletion vector updated in a later one). Within a scan, what differs
per file (version, timestamp, change type, partition values) is a constant array indexed by
the file's position among the scan's files; the position comes from the file's id
(streaming_merge.table.file_ids: its size, or a hash of its path where sizes repeat), which
Spark reads per file for free. Rows a deletion vector drops (or a vector update keeps) are
filtered with streaming_merge.table.dv_filter's constant bitsets: no join, no Python UDF, no
Spark job before the caller's own action.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import numpy as np
import pyroaring
from pyspark.errors import AnalysisException
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType

from streaming_merge.cdf.columns import CHANGE_TYPE, COMMIT_TIMESTAMP, COMMIT_VERSION, output_schema
from streaming_merge.cdf.errors import ChangeDataFeedError
from streaming_merge.cdf.plan import ChangeFile, ChangePlan
from streaming_merge.cdf.rows import physical_rows, selected_positions
from streaming_merge.errors import DeltaTableError
from streaming_merge.spark.constant_lookup import long_array, lookup
from streaming_merge.table.deletion_vectors import DeletionVector, read_deleted_rows_of
from streaming_merge.table.dv_filter import bitset_membership
from streaming_merge.table.file_ids import FileIds
from streaming_merge.table.scan import _read_parquet
from streaming_merge.table.schema import data_columns
from streaming_merge.table.snapshot import DataFile, Snapshot

__all__ = ["changes_frame"]

_POSITION = "__sm_cdf_file_position"


def changes_frame(spark: SparkSession, plan: ChangePlan) -> DataFrame:
    """The rows of ``plan`` with the schema of :func:`output_schema` (the ending version's)."""
    snapshot: Snapshot = plan.snapshot
    cache = _vectors_read(snapshot, plan.files)
    frames = []
    for kind in ("cdc", "data"):
        files = [f for f in plan.files if (f.kind == "cdc") == (kind == "cdc")]
        for layer in _layers(files):
            frame = _scan(spark, snapshot, layer, cache, plan)
            if frame is not None:
                frames.append(frame)
    if not frames:
        return spark.createDataFrame([], output_schema(snapshot.schema))
    result = frames[0]
    for frame in frames[1:]:
        result = result.union(frame)
    return result


def _vectors_read(snapshot: Snapshot, files: Sequence[ChangeFile]) -> dict[tuple[str, str], pyroaring.BitMap64]:
    """The deleted rows of every vector the files' selections name, by (path, vector id), read
    in one call: a request per DV file rather than per vector (see read_deleted_rows_of)."""
    wanted: dict[tuple[str, str], tuple[str, DeletionVector]] = {}
    for file in files:
        selection = file.selection
        for vector in (selection.vector, selection.minus) if selection is not None else ():
            if vector is not None:
                wanted.setdefault((file.path, vector.unique_id), (file.path, vector))
    location = snapshot.location
    bitmaps = read_deleted_rows_of(location.log_uri, location.options, list(wanted.values())) if wanted else []
    return dict(zip(wanted, bitmaps, strict=True))


def _layers(files: Sequence[ChangeFile]) -> list[list[ChangeFile]]:
    """``files`` split so that no list holds a path twice (each scan tells its files apart by
    their path), in as few lists as the most repeated path needs."""
    layers: list[list[ChangeFile]] = []
    seen: list[set[str]] = []
    for file in files:
        for paths, layer in zip(seen, layers, strict=True):
            if file.path not in paths:
                paths.add(file.path)
                layer.append(file)
                break
        else:
            seen.append({file.path})
            layers.append([file])
    return layers


def _scan(spark: SparkSession, snapshot: Snapshot, files: list[ChangeFile],
          cache: dict[tuple[str, str], pyroaring.BitMap64], plan: ChangePlan) -> DataFrame | None:
    """One Parquet scan of ``files`` (distinct paths, all change data files or all data files)
    with the change columns added; None when every file's selection is empty."""
    location = snapshot.location
    drops: dict[int, tuple[np.ndarray, int]] = {}  # position in ``files`` -> (rows to drop, rows in the file)
    kept: list[ChangeFile] = []
    for file in files:
        selected = selected_positions(location.log_uri, location.options, file, cache)
        if selected is not None and selected.nothing:
            continue
        if selected is not None:
            rows = physical_rows(location.log_uri, location.options, file)
            drop = np.setdiff1d(np.arange(rows, dtype=np.int64), selected.positions) if selected.keep \
                else selected.positions
            if selected.keep or len(drop):
                drops[len(kept)] = (drop, rows)
        kept.append(file)
    if not kept:
        return None
    cdc = kept[0].kind == "cdc"
    read_schema = data_columns(snapshot.schema, snapshot.partition_columns)
    if cdc:
        read_schema = StructType([*read_schema.fields, StructField(CHANGE_TYPE, StringType())])
    frame = _read(spark, snapshot, kept, read_schema, plan)
    as_data_files = [DataFile(path=f.path, size=f.size, num_records=f.num_records, partition_values={})
                     for f in kept]
    ids = FileIds.of(spark, snapshot, as_data_files)
    file_id = ids.column("_metadata.file_size", "_metadata.file_path")
    if drops:
        sets = {ids.ids[i]: drop for i, drop in drops.items()}
        frame = frame.filter(~bitset_membership(spark, file_id, F.col("_metadata.row_index"), sets))
    position = lookup(spark, list(ids.ids), list(range(1, len(ids.ids) + 1)), file_id).cast("int")
    per_file = _PerFile(spark, position)
    columns: list[Column] = []
    for column in snapshot.schema.fields:
        name = column.name
        if name in snapshot.partition_columns:
            values = [f.partition_values.get(name) for f in kept]
            columns.append(per_file.strings(values).cast(column.dataType).alias(name))
        else:
            columns.append(F.col(f"`{name}`"))
    change_type = F.col(CHANGE_TYPE) if cdc else per_file.strings([f.kind for f in kept])
    columns += [
        change_type.alias(CHANGE_TYPE),
        per_file.longs([f.version for f in kept]).alias(COMMIT_VERSION),
        F.timestamp_millis(per_file.longs([f.timestamp_ms for f in kept])).alias(COMMIT_TIMESTAMP),
    ]
    if per_file.used:
        frame = frame.select("*", position.alias(_POSITION))
    return frame.select(*columns)


class _PerFile:
    """A value per file of the scan: a literal when all files share it, else a constant
    array read at the row's file position (which the scan then computes once per row)."""

    def __init__(self, spark: SparkSession, position: Column) -> None:
        self._spark = spark
        self._position = position
        self.used = False

    def _at(self, array: Column) -> Column:
        self.used = True
        return F.element_at(array, F.col(_POSITION))

    def longs(self, values: list[int]) -> Column:
        if len(set(values)) == 1:
            return F.lit(values[0]).cast("long")
        return self._at(long_array(self._spark, values))

    def strings(self, values: list[str | None]) -> Column:
        if len(set(values)) == 1:
            return F.lit(values[0]).cast("string")
        return self._at(F.from_json(F.lit(json.dumps(values)), "array<string>"))


def _read(spark: SparkSession, snapshot: Snapshot, files: list[ChangeFile], schema: StructType,
          plan: ChangePlan) -> DataFrame:
    """The files read as Parquet; a file the log names but the store lacks fails here,
    before any job, naming the file, its version and what removed it."""
    paths = [snapshot.absolute_path(f.path) for f in files]
    try:
        return _read_parquet(spark, snapshot, paths, schema)
    except (DeltaTableError, AnalysisException) as exc:
        text = str(exc)
        missing = next((f for f in files if f.path in text or snapshot.absolute_path(f.path) in text), None)
        what = (f"the {'change data' if missing.kind == 'cdc' else 'data'} file `{missing.path}` of version "
                f"{missing.version} is missing" if missing is not None else first_line(text))
        raise ChangeDataFeedError(
            f"Cannot read the change data of table `{plan.location.uri}` for versions [{plan.start}, {plan.end}]: "
            f"{what}. VACUUM deletes files no longer in the table once they are older than "
            "delta.deletedFileRetentionDuration (7 days by default), change data files with them; read a more "
            "recent range.") from exc


def first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else "a file cannot be read"
