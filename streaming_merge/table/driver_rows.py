"""Side rows the driver already holds (a batch's observed dead letters), written as one Parquet
file by the driver itself: no Spark job for a few rows.

Why: a Kafka batch's malformed records reach the driver in its copy's observation; writing
them back through Spark cost a job (planning, a task, the output committer, a footer read
through the JVM) beside the batch's MERGE, on the same cores. The file goes through the
table's object store as the commit files and deletion vectors do (``table.store``).
"""

from __future__ import annotations

import time
import uuid
import weakref
from typing import Any

import obstore
import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from streaming_merge.table.location import TableLocation
from streaming_merge.table.snapshot import Snapshot
from streaming_merge.table.store import table_store
from streaming_merge.table.write import WRITE_FOLDER_PREFIX, WrittenFile, footer_stats

# The rows behind each DataFrame made by driver_rows, for as long as that DataFrame lives.
_HELD: weakref.WeakKeyDictionary[DataFrame, pa.Table] = weakref.WeakKeyDictionary()


def driver_rows(spark: SparkSession, arrow: pa.Table) -> DataFrame:
    """A DataFrame of rows the driver holds as ``arrow``: an append (``table.append``) writes them
    from the driver when the table's schema is theirs, else through Spark as any DataFrame."""
    frame = spark.createDataFrame(arrow)
    _HELD[frame] = arrow
    return frame


def held_rows(df: DataFrame, snapshot: Snapshot) -> pa.Table | None:
    """``df``'s rows when the driver holds them (:func:`driver_rows`) and they fit ``snapshot`` as
    they are: same columns and types in the same order, every column nullable (no NOT NULL to
    enforce), no partitions. None otherwise."""
    arrow = _HELD.get(df)
    if arrow is None or snapshot.partition_columns:
        return None
    ours, theirs = df.schema, snapshot.schema
    fits = (all(f.nullable for f in theirs.fields) and len(ours.fields) == len(theirs.fields)
            and all(a.name == b.name and a.dataType == b.dataType
                    for a, b in zip(ours.fields, theirs.fields, strict=True)))
    return arrow if fits else None


def write_from_driver(location: TableLocation, rows: pa.Table, schema: StructType) -> tuple[WrittenFile, Any]:
    """``rows`` as one new Parquet file in the table's own write folder; (the file, its store)."""
    sink = pa.BufferOutputStream()
    pq.write_table(rows, sink, compression="snappy")
    data = sink.getvalue()
    name = uuid.uuid4().hex
    relative = f"{WRITE_FOLDER_PREFIX}{name}/part-00000-{name}-c000.snappy.parquet"
    store = table_store(location.log_uri, location.options)
    obstore.put(store, relative, data.to_pybytes())
    metadata = pq.read_metadata(pa.BufferReader(data))
    return WrittenFile(path=relative, size=data.size, partition_values={}, num_records=rows.num_rows,
                       stats=footer_stats(metadata, schema, []), modification_time=int(time.time() * 1000)), store


def delete_from_driver(store: Any, written: WrittenFile) -> None:
    """Remove a file :func:`write_from_driver` wrote (its commit failed)."""
    obstore.delete(store, written.path)
