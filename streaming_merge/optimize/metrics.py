"""OptimizeMetrics: what one compaction did, under Delta's names.

delta-spark's ``executeCompaction()`` returns a DataFrame with one row ``(path, metrics)``
whose ``metrics`` struct is Delta's ``OptimizeMetrics``; here the same fields come back as
a frozen dataclass (no Spark job to build or read a DataFrame). The commit's
``operationMetrics`` use the other set of names Delta writes for OPTIMIZE
(``numAddedFiles``, ``numRemovedFiles``, ``numAddedBytes``, ``numRemovedBytes`` and the
size distribution of the added files), so ``history()`` reads like Delta's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class FileSizeMetrics:
    """Delta's ``FileSizeMetrics``: sizes of the files added or removed, in bytes."""

    min: int | None
    max: int | None
    avg: float
    totalFiles: int
    totalSize: int

    @classmethod
    def of(cls, sizes: Sequence[int]) -> FileSizeMetrics:
        if not sizes:
            return cls(None, None, 0.0, 0, 0)
        return cls(min(sizes), max(sizes), sum(sizes) / len(sizes), len(sizes), sum(sizes))


@dataclass(frozen=True)
class OptimizeMetrics:
    """Metrics of one ``executeCompaction()``; ``tableVersion`` is the version it committed,
    None when there was nothing to compact (then nothing was written or committed)."""

    numFilesAdded: int
    numFilesRemoved: int
    filesAdded: FileSizeMetrics
    filesRemoved: FileSizeMetrics
    partitionsOptimized: int
    numBins: int
    numBatches: int
    totalConsideredFiles: int
    totalFilesSkipped: int
    startTimeMs: int
    endTimeMs: int
    tableVersion: int | None = None
    # The sizes of the added files, for the commit's percentiles; not part of Delta's struct.
    _added_sizes: tuple[int, ...] = field(default=(), repr=False, compare=False)

    @property
    def numBytesAdded(self) -> int:
        return self.filesAdded.totalSize

    @property
    def numBytesRemoved(self) -> int:
        return self.filesRemoved.totalSize

    @property
    def durationMs(self) -> int:
        return self.endTimeMs - self.startTimeMs

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("_added_sizes")
        return data

    def commit_metrics(self) -> dict[str, int]:
        """Delta's ``operationMetrics`` of an OPTIMIZE commit."""
        sizes = sorted(self._added_sizes)
        metrics = {
            "numAddedFiles": self.numFilesAdded,
            "numRemovedFiles": self.numFilesRemoved,
            "numAddedBytes": self.numBytesAdded,
            "numRemovedBytes": self.numBytesRemoved,
        }
        if sizes:
            metrics.update({
                "minFileSize": sizes[0],
                "p25FileSize": _percentile(sizes, 0.25),
                "p50FileSize": _percentile(sizes, 0.50),
                "p75FileSize": _percentile(sizes, 0.75),
                "maxFileSize": sizes[-1],
            })
        return metrics


def _percentile(sorted_sizes: Sequence[int], fraction: float) -> int:
    """Nearest-rank percentile (the value at that rank, never an interpolation)."""
    return sorted_sizes[max(0, math.ceil(fraction * len(sorted_sizes)) - 1)]
