"""OPTIMIZE's knobs and where their defaults come from.

Delta sizes OPTIMIZE's output with ``spark.databricks.delta.optimize.maxFileSize`` and
picks its candidates with ``...optimize.minFileSize`` (both 1 GB in Delta Lake); a table
may set ``delta.targetFileSize``. Here the default target is the table's
``delta.targetFileSize`` when set, else 128 MB (the size a MERGE cuts its files to, so
compaction and MERGE agree on what a "full" file is), and a file is a candidate when it is
smaller than the target, as in Delta where both settings default to the same value.

A file whose deletion vector deletes more than ``max_deleted_rows_ratio`` of its rows is
compacted whatever its size; the default is the session's
``spark.databricks.delta.optimize.maxDeletedRowsRatio`` when set, else Delta's 0.05.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from streaming_merge.errors import DeltaTableError, InvalidArgumentError
from streaming_merge.optimize.binpack import DEFAULT_MAX_DELETED_ROWS_RATIO, DEFAULT_MIN_NUM_FILES

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

DEFAULT_TARGET_FILE_SIZE = 128 * 1024 * 1024
TARGET_FILE_SIZE_PROPERTY = "delta.targetFileSize"
MAX_DELETED_ROWS_RATIO_CONF = "spark.databricks.delta.optimize.maxDeletedRowsRatio"

_UNITS = {"": 1, "b": 1, "k": 1024, "kb": 1024, "m": 1024**2, "mb": 1024**2, "g": 1024**3, "gb": 1024**3,
          "t": 1024**4, "tb": 1024**4}
_SIZE = re.compile(r"^\s*(\d+)\s*([a-zA-Z]*)\s*$")


@dataclass(frozen=True)
class OptimizeOptions:
    """``target_file_size``: the largest a bin (and so a new file) may grow, in bytes;
    ``min_file_size``: only files smaller than this are compacted (default: the target);
    ``min_num_files``: a bin needs at least this many files to be rewritten (2), unless one
    of them has a deletion vector;
    ``max_deleted_rows_ratio``: a file whose deletion vector deletes more than this share of
    its rows is compacted whatever its size (default: the session's
    ``spark.databricks.delta.optimize.maxDeletedRowsRatio``, else 0.05)."""

    target_file_size: int | None = None
    min_file_size: int | None = None
    min_num_files: int = DEFAULT_MIN_NUM_FILES
    max_deleted_rows_ratio: float | None = None

    def __post_init__(self) -> None:
        for name in ("target_file_size", "min_file_size"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise InvalidArgumentError(f"{name} must be a positive number of bytes, got {value}")
        if self.min_num_files < 2:
            raise InvalidArgumentError(f"min_num_files must be at least 2, got {self.min_num_files}")
        if self.max_deleted_rows_ratio is not None:
            _check_ratio(self.max_deleted_rows_ratio, "max_deleted_rows_ratio")

    def deleted_rows_ratio(self, spark: SparkSession | None) -> float:
        """``max_deleted_rows_ratio``, else the session's Delta setting, else 0.05."""
        if self.max_deleted_rows_ratio is not None:
            return self.max_deleted_rows_ratio
        raw = spark.conf.get(MAX_DELETED_ROWS_RATIO_CONF, None) if spark is not None else None
        if raw is None or not str(raw).strip():
            return DEFAULT_MAX_DELETED_ROWS_RATIO
        try:
            value = float(raw)
        except ValueError:
            value = math.nan
        try:
            return _check_ratio(value, MAX_DELETED_ROWS_RATIO_CONF)
        except ValueError as exc:
            raise DeltaTableError(f"{MAX_DELETED_ROWS_RATIO_CONF}={raw!r}: {exc}") from exc

    def sizes(self, configuration: Mapping[str, str | None]) -> tuple[int, int]:
        """(target/max file size, min file size) for a table with this configuration."""
        target = self.target_file_size or table_target_file_size(configuration) or DEFAULT_TARGET_FILE_SIZE
        return target, self.min_file_size or target


def _check_ratio(value: float, name: str) -> float:
    if not 0 <= value <= 1:  # NaN too
        raise InvalidArgumentError(f"{name} must be a share of a file's rows between 0 and 1, got {value}")
    return float(value)


def table_target_file_size(configuration: Mapping[str, str | None]) -> int | None:
    """The table's ``delta.targetFileSize`` in bytes (``134217728``, ``128mb``), or None."""
    raw = configuration.get(TARGET_FILE_SIZE_PROPERTY)
    if raw is None or not raw.strip():
        return None
    return parse_size(raw, TARGET_FILE_SIZE_PROPERTY)


def parse_size(text: str, what: str) -> int:
    """Bytes of a size written as a number with an optional binary unit (b, kb, mb, gb, tb)."""
    found = _SIZE.match(text)
    unit = found.group(2).lower() if found else ""
    if not found or unit not in _UNITS or int(found.group(1)) < 1:
        raise DeltaTableError(f"{what}={text!r} is not a size: use a number of bytes such as 134217728 "
                              "or a number with a unit (b, kb, mb, gb, tb) such as 128mb.")
    return int(found.group(1)) * _UNITS[unit]
