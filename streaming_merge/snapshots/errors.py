"""Errors of AUTO CDC FROM SNAPSHOT, under the library's one base, ``StreamingMergeError``.

A leaf per thing the caller fixes differently: the snapshot versions its function hands out,
the keys of a snapshot's rows, or the columns of a snapshot against the table's.
"""

from __future__ import annotations

from streaming_merge.errors import StreamingMergeError

__all__ = ["SnapshotCdcError", "SnapshotKeyError", "SnapshotSchemaError", "SnapshotVersionError"]


class SnapshotCdcError(StreamingMergeError):
    """Raised when an AUTO CDC FROM SNAPSHOT flow cannot apply a snapshot; the base of the
    errors below. Nothing of the failing snapshot was committed; the versions applied before
    it stay applied, and a rerun resumes after them."""


class SnapshotVersionError(SnapshotCdcError):
    """Raised when a snapshot version is not an integer greater than the last version the
    flow applied (``next_snapshot_and_version`` must hand out increasing versions)."""


class SnapshotKeyError(SnapshotCdcError):
    """Raised when a snapshot holds two rows with one key, or a row with a NULL key: either
    makes "the row of this key" ambiguous. ``key`` is the offending key as JSON (``{}`` when
    every key column is NULL), ``rows`` how many rows carry it (None for a NULL key)."""

    def __init__(self, message: str, key: str, rows: int | None):
        super().__init__(message)
        self.key = key
        self.rows = rows


class SnapshotSchemaError(SnapshotCdcError):
    """Raised when a snapshot lacks a key column, or its columns differ from the target
    table's (SCD 2: the table's minus ``__START_AT`` / ``__END_AT``)."""
