"""MergeMetrics: every metric Delta's MERGE reports, under Delta's names.

A read-only mapping, so ``metrics["numTargetRowsUpdated"]`` reads like Delta's
``operationMetrics`` and ``dict(metrics)`` serialises it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

DELTA_METRICS: tuple[str, ...] = (
    "numSourceRows",
    "numSourceRowsInSecondScan",
    "numTargetRowsCopied",
    "numTargetRowsInserted",
    "numTargetRowsUpdated",
    "numTargetRowsDeleted",
    "numTargetRowsMatchedUpdated",
    "numTargetRowsMatchedDeleted",
    "numTargetRowsNotMatchedBySourceUpdated",
    "numTargetRowsNotMatchedBySourceDeleted",
    "numTargetFilesBeforeSkipping",
    "numTargetFilesAfterSkipping",
    "numTargetFilesRemoved",
    "numTargetFilesAdded",
    "numTargetChangeFilesAdded",
    "numTargetChangeFileBytes",
    "numTargetBytesBeforeSkipping",
    "numTargetBytesAfterSkipping",
    "numTargetBytesRemoved",
    "numTargetBytesAdded",
    "numTargetPartitionsAfterSkipping",
    "numTargetPartitionsRemovedFrom",
    "numTargetPartitionsAddedTo",
    "numTargetDeletionVectorsAdded",
    "numTargetDeletionVectorsRemoved",
    "numTargetDeletionVectorsUpdated",
    "executionTimeMs",
    "scanTimeMs",
    "rewriteTimeMs",
)


class MetricsMapping(Mapping[str, Any]):
    """A read-only mapping of an operation's metrics, so that it reads like Delta's
    ``operationMetrics``; ``_names`` are Delta's names, the ones a commit stores."""

    _names: tuple[str, ...]
    _data: dict[str, Any]

    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def delta_metrics(self) -> dict[str, int]:
        """Only Delta's metric names, as stored in the commit's operationMetrics."""
        return {name: int(self._data[name] or 0) for name in self._names}


class MergeMetrics(MetricsMapping):
    """Metrics of one MERGE: Delta's names, the SQL result columns (num_affected_rows,
    num_updated_rows, num_deleted_rows, num_inserted_rows), ``skipped`` (the app
    transaction had already been applied), ``attempts`` and ``tableVersion``."""

    def __init__(self, values: Mapping[str, int], *, skipped: bool = False, attempts: int = 1,
                 table_version: int | None = None) -> None:
        unknown = set(values) - set(DELTA_METRICS)
        if unknown:
            raise KeyError(f"Unknown MERGE metrics {sorted(unknown)}")
        data: dict[str, int | bool | None] = {name: int(values.get(name, 0)) for name in DELTA_METRICS}
        data["numTargetRowsUpdated"] = int(data["numTargetRowsMatchedUpdated"] or 0) + int(
            data["numTargetRowsNotMatchedBySourceUpdated"] or 0)
        data["numTargetRowsDeleted"] = int(data["numTargetRowsMatchedDeleted"] or 0) + int(
            data["numTargetRowsNotMatchedBySourceDeleted"] or 0)
        data["num_updated_rows"] = data["numTargetRowsUpdated"]
        data["num_deleted_rows"] = data["numTargetRowsDeleted"]
        data["num_inserted_rows"] = data["numTargetRowsInserted"]
        data["num_affected_rows"] = (int(data["num_updated_rows"] or 0) + int(data["num_deleted_rows"] or 0)
                                     + int(data["num_inserted_rows"] or 0))
        data["skipped"] = skipped
        data["attempts"] = attempts
        data["tableVersion"] = table_version
        self._names = DELTA_METRICS
        self._data = data

    def __repr__(self) -> str:
        nonzero = {k: v for k, v in self._data.items() if v}
        return f"MergeMetrics({nonzero})"
