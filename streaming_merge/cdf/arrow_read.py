"""One change task read with pyarrow, as the streaming source's executors do.

The file comes through the table's obstore store (one GET: a local disk, S3, GCS or Azure
alike), its rows are selected with numpy from the task's deletion vectors, and the table's
columns (cast to the stream's types; NULL for a column the file predates), the partition
values and the three change columns are assembled into Arrow batches of exactly the schema
Spark expects (``to_arrow_schema(schema, timezone="UTC")``, checked by Spark's Python data
source runner). A data file's extra ``_change_type`` column (Delta on Spark writes one into the
data files of a CDF table) is never read: the change type of an add or remove is its kind.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from streaming_merge.cdf.columns import CHANGE_TYPE, COMMIT_TIMESTAMP, COMMIT_VERSION
from streaming_merge.cdf.errors import ChangeDataFeedError
from streaming_merge.cdf.plan import ChangeFile
from streaming_merge.cdf.rows import selected_positions
from streaming_merge.table.store import NOT_FOUND, first_line, get_bytes, table_store

__all__ = ["ReadLayout", "read_change_file"]

_BATCH_ROWS = 65_536


@dataclass(frozen=True)
class ReadLayout:
    """What every task of one stream shares: where the table is and the output's shape."""

    table_url: str  # the table root as a URL (TableLocation.log_uri)
    storage_options: tuple[tuple[str, str], ...]
    schema: pa.Schema  # the output batches' schema
    partition_columns: tuple[str, ...]

    @property
    def options(self) -> dict[str, str] | None:
        return dict(self.storage_options) or None


def read_change_file(layout: ReadLayout, file: ChangeFile) -> Iterator[pa.RecordBatch]:
    """The task's rows as batches of ``layout.schema``; nothing when its selection is empty."""
    selected = selected_positions(layout.table_url, layout.options, file)
    if selected is not None and selected.nothing:
        return
    parquet = _open(layout, file)
    rows = parquet.metadata.num_rows
    keep: np.ndarray | None = None
    if selected is not None:
        keep = np.zeros(rows, dtype=bool)
        keep[selected.positions[selected.positions < rows]] = True
        if not selected.keep:
            keep = ~keep
    in_file = set(parquet.schema_arrow.names)
    wanted = [f.name for f in layout.schema if f.name in in_file and f.name not in layout.partition_columns
              and (f.name != CHANGE_TYPE or file.kind == "cdc")]
    constants = _constants(layout, file)
    offset = 0
    for batch in parquet.iter_batches(batch_size=_BATCH_ROWS, columns=wanted, use_threads=False):
        count = batch.num_rows
        if keep is not None:
            batch = batch.filter(pa.array(keep[offset : offset + count]))
        offset += count
        if batch.num_rows:
            yield _assemble(layout, file, batch, constants)


def _open(layout: ReadLayout, file: ChangeFile) -> pq.ParquetFile:
    """The whole file in one GET (every column but a data file's ``_change_type`` is read)."""
    store: Any = table_store(layout.table_url, layout.options)
    what = "change data file" if file.kind == "cdc" else "data file"
    try:
        data = get_bytes(store, file.path)
    except NOT_FOUND as exc:
        raise ChangeDataFeedError(
            f"The {what} `{file.path}` of version {file.version} of table `{layout.table_url}` is missing: VACUUM "
            "deletes files no longer in the table once they are older than delta.deletedFileRetentionDuration; "
            "the stream cannot return that version's changes. Restart it from a later version with a new "
            "checkpoint.") from exc
    except Exception as exc:
        raise ChangeDataFeedError(f"Cannot read the {what} `{file.path}` of version {file.version} of table "
                                  f"`{layout.table_url}`: {first_line(exc)}") from exc
    return pq.ParquetFile(pa.BufferReader(data))


def _constants(layout: ReadLayout, file: ChangeFile) -> dict[str, pa.Scalar]:
    """The file's per-file values as typed scalars: partition values, change type, version,
    timestamp."""
    schema = layout.schema
    values = {name: _partition_scalar(file.partition_values.get(name), schema.field(name).type)
              for name in layout.partition_columns}
    if file.kind != "cdc":
        values[CHANGE_TYPE] = pa.scalar(file.kind, schema.field(CHANGE_TYPE).type)
    values[COMMIT_VERSION] = pa.scalar(file.version, schema.field(COMMIT_VERSION).type)
    values[COMMIT_TIMESTAMP] = pa.scalar(file.timestamp_ms * 1000, pa.int64()).cast(schema.field(COMMIT_TIMESTAMP).type)
    return values


def _partition_scalar(value: str | None, arrow_type: pa.DataType) -> pa.Scalar:
    """A partition value (Delta's string form) as a scalar of the column's type. A timestamp
    without an offset is UTC, as Delta writes them."""
    if value is None:
        return pa.scalar(None, arrow_type)
    text = pa.array([value], pa.string())
    try:
        return text.cast(arrow_type)[0]
    except pa.ArrowInvalid:
        if not pa.types.is_timestamp(arrow_type):
            raise
    naive = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    if naive.tzinfo is not None:
        naive = naive.astimezone(dt.UTC).replace(tzinfo=None)
    return pa.array([naive], pa.timestamp(arrow_type.unit)).cast(arrow_type)[0]


def _assemble(layout: ReadLayout, file: ChangeFile, batch: pa.RecordBatch,
              constants: dict[str, pa.Scalar]) -> pa.RecordBatch:
    count = batch.num_rows
    names = set(batch.schema.names)
    arrays = []
    for field in layout.schema:
        if field.name in constants:
            arrays.append(pa.repeat(constants[field.name], count))
        elif field.name in names:
            column = batch.column(field.name)
            arrays.append(column if column.type == field.type else column.cast(field.type))
        else:  # a column added to the table after this file was written
            arrays.append(pa.nulls(count, field.type))
    return pa.RecordBatch.from_arrays(arrays, schema=layout.schema)
