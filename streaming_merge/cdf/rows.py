"""The row positions a change task selects, from its deletion vectors; shared by the Spark
reader on the driver and the pyarrow reader on the executors (no Spark import here).

A task either drops the positions of one vector (an add's or a remove's) or keeps only the
positions one vector holds and another does not (a deletion-vector update). Vectors are read
and checked by streaming_merge.table.deletion_vectors; the subtraction is CRoaring's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyroaring

from streaming_merge.cdf.plan import ChangeFile
from streaming_merge.table.deletion_vectors import DeletionVector, read_deleted_rows
from streaming_merge.table.dv_log import _open_parquet
from streaming_merge.table.store import table_store

__all__ = ["Selected", "physical_rows", "selected_positions"]


@dataclass(frozen=True)
class Selected:
    """``positions`` (ascending int64) are the only rows to return when ``keep``, else the rows
    to leave out."""

    positions: np.ndarray
    keep: bool

    @property
    def nothing(self) -> bool:
        """Whether the task returns no row at all (nothing to read)."""
        return self.keep and len(self.positions) == 0


def selected_positions(table_url: str, options: Mapping[str, str] | None, file: ChangeFile,
                       cache: dict[tuple[str, str], pyroaring.BitMap64] | None = None) -> Selected | None:
    """The task's row selection as positions; None when it reads every row of its file."""
    selection = file.selection
    if selection is None or selection.vector is None:
        return None
    cache = {} if cache is None else cache

    def bitmap(vector: DeletionVector) -> pyroaring.BitMap64:
        key = (file.path, vector.unique_id)
        if key not in cache:
            cache[key] = read_deleted_rows(table_url, options, file.path, vector)
        return cache[key]

    rows = bitmap(selection.vector)
    if selection.minus is not None:
        rows = rows - bitmap(selection.minus)
    return Selected(np.asarray(rows.to_array(), dtype=np.int64), selection.keep)


def physical_rows(table_url: str, options: Mapping[str, str] | None, file: ChangeFile) -> int:
    """The rows the file holds: the log's ``numRecords``, else its Parquet footer's count
    (a ranged read of the footer only)."""
    if file.num_records is not None:
        return file.num_records
    store: Any = table_store(table_url, options)
    return int(_open_parquet(store, file.path, file.size).metadata.num_rows)
