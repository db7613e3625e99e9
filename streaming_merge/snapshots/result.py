"""What a call of ``create_auto_cdc_from_snapshot_flow`` applied: one record per snapshot."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from streaming_merge.merge.metrics import MergeMetrics


@dataclass(frozen=True)
class AppliedSnapshot:
    """One snapshot version and what it did to the table.

    Key counts compare the snapshot with the table's current rows: ``inserted`` keys new in
    the snapshot, ``deleted`` keys it lacks, ``updated`` keys whose row changed (SCD 2:
    ``new_versions`` of them changed a tracked column and got a new version, the others only
    untracked ones and were updated in place), ``unchanged`` keys whose row is the same and was
    not rewritten. ``skipped``: the table already held this version (a concurrent run applied
    it); the counts are then 0 and ``metrics`` empty. ``metrics`` are the MERGE's, under
    Delta's names (``numTargetRowsUpdated`` counts changed rows only; SCD 2 counts a closed
    version as an updated row and a new version as an inserted one)."""

    version: int
    table_version: int | None
    skipped: bool
    snapshot_rows: int
    inserted: int
    updated: int
    deleted: int
    unchanged: int
    new_versions: int
    attempts: int
    duration_ms: int
    metrics: MergeMetrics = field(repr=False)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready, with the MERGE's metrics under ``metrics``."""
        return {
            "version": self.version, "tableVersion": self.table_version, "skipped": self.skipped,
            "snapshotRows": self.snapshot_rows, "inserted": self.inserted, "updated": self.updated,
            "deleted": self.deleted, "unchanged": self.unchanged, "newVersions": self.new_versions,
            "attempts": self.attempts, "durationMs": self.duration_ms, "metrics": dict(self.metrics),
        }


@dataclass(frozen=True)
class SnapshotCdcResult:
    """The snapshots one call applied, oldest first (none when the source had nothing new)."""

    name: str
    target: str
    scd_type: int
    applied: tuple[AppliedSnapshot, ...]

    @property
    def versions(self) -> list[int]:
        """The snapshot versions this call committed (skipped ones left out)."""
        return [a.version for a in self.applied if not a.skipped]

    @property
    def last_version(self) -> int | None:
        """The newest snapshot version this call saw applied, None when it saw none."""
        return self.applied[-1].version if self.applied else None

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "target": self.target, "scdType": self.scd_type,
                "applied": [a.as_dict() for a in self.applied]}
