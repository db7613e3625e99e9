"""AUTO CDC FROM SNAPSHOT: apply full snapshots of a source to a Delta table (SCD 1 or 2),
each snapshot version exactly once. See ``flow.create_auto_cdc_from_snapshot_flow``."""

from streaming_merge.snapshots.errors import (
    SnapshotCdcError,
    SnapshotKeyError,
    SnapshotSchemaError,
    SnapshotVersionError,
)
from streaming_merge.snapshots.flow import create_auto_cdc_from_snapshot_flow
from streaming_merge.snapshots.result import AppliedSnapshot, SnapshotCdcResult
from streaming_merge.snapshots.source import NextSnapshot, SnapshotSource

__all__ = [
    "AppliedSnapshot",
    "NextSnapshot",
    "SnapshotCdcError",
    "SnapshotCdcResult",
    "SnapshotKeyError",
    "SnapshotSchemaError",
    "SnapshotSource",
    "SnapshotVersionError",
    "create_auto_cdc_from_snapshot_flow",
]
