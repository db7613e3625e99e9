"""One exception hierarchy for everything streaming_merge raises.

Callers catch ``StreamingMergeError`` for "anything from this library" and the
leaf classes when they can react (retry a conflict, fix the source data).
Exceptions from delta-rs and Spark are wrapped (``raise ... from exc``) so the
original cause stays visible in the traceback.
"""

from __future__ import annotations

__all__ = [
    "ConcurrentModificationError",
    "DeltaTableError",
    "DmlAnalysisError",
    "MaterializedSourceLostError",
    "MergeAnalysisError",
    "MergeAssignmentOverflowError",
    "MergeError",
    "MultipleSourceRowMatchingTargetRowError",
    "NotADeltaTableError",
    "OptimizeAnalysisError",
    "StreamingMergeError",
    "UnsupportedTableFeatureError",
    "VacuumRetentionError",
]


class StreamingMergeError(Exception):
    """Raised for any failure this library detects; the base of every error here."""


class DeltaTableError(StreamingMergeError):
    """Raised when reading or committing the Delta log fails for a reason not covered below."""


class NotADeltaTableError(DeltaTableError):
    """Raised when a path holds no Delta table (no ``_delta_log``) but one was required."""


class UnsupportedTableFeatureError(DeltaTableError):
    """Raised when a table uses a feature we cannot keep correct (deletion vectors, column
    mapping, change data feed, a newer protocol); refused before anything is written."""


class StorageOptionError(DeltaTableError, ValueError):
    """Raised for a storage option no store, HTTP client or delta-rs knows (a misspelling would
    otherwise fall back to a default silently); the message names it and the known ones."""


class ConcurrentModificationError(DeltaTableError):
    """Raised when another writer committed, between our snapshot and our commit, a change
    that conflicts with what this operation read or wrote. Nothing of ours became visible;
    rerunning the operation is safe."""


class CommitOutcomeUnknownError(DeltaTableError):
    """Raised when a commit's put failed in a way that leaves open whether it landed (a
    timeout, a reset) and the log could not tell. The operation's data files are kept: a landed
    commit references them, and if none did they are orphans for vacuum. A rerun is safe: a
    streaming batch whose commit landed is skipped as already applied (its ``txn``)."""


class MergeError(StreamingMergeError):
    """Raised when a MERGE cannot be planned or executed."""


class MergeAnalysisError(MergeError):
    """Raised when a MERGE is invalid before it runs: an unresolvable column or condition,
    misplaced unconditional clauses, a type that cannot be stored in the target column, a
    source lacking a column that ``*`` needs. The table is untouched."""


class MergeAssignmentOverflowError(MergeError):
    """Raised when a value assigned to a target column does not fit its type (for example
    300 into a TINYINT). Values never wrap silently; the table is untouched."""


class MultipleSourceRowMatchingTargetRowError(MergeError):
    """Raised when two or more source rows match one target row and the MERGE would update
    or delete it ambiguously. ``offending_rows`` holds up to ten (join-key values, match
    count) pairs so the duplicates can be found in the source. ``error_class`` is Delta Lake's
    error condition for the same error, for code that handles both engines' errors."""

    error_class = "DELTA_MULTIPLE_SOURCE_ROW_MATCHING_TARGET_ROW_IN_MERGE"

    def __init__(self, message: str, offending_rows: list[tuple[dict[str, object], int]]):
        super().__init__(message)
        self.offending_rows = offending_rows


class MaterializedSourceLostError(MergeError):
    """Raised when the materialized MERGE source lost its blocks on every attempt (executors
    died or blocks were evicted) and ``max_attempts`` is exhausted."""

    def __init__(self, message: str, attempts: int):
        super().__init__(message)
        self.attempts = attempts


class OptimizeAnalysisError(StreamingMergeError):
    """Raised when an OPTIMIZE is invalid before it runs: a ``where`` predicate that
    references a column other than the table's partition columns, or one Spark cannot
    resolve. The table is untouched."""


class VacuumRetentionError(StreamingMergeError):
    """Raised when VACUUM is asked to keep less history than the table's
    ``delta.deletedFileRetentionDuration`` (7 days by default) without
    ``enforce_retention_duration=False``: readers and writers still working on an older
    version could lose the files they need. Nothing was deleted."""


class DmlAnalysisError(StreamingMergeError):
    """Raised when a DELETE or UPDATE is invalid before it runs: a condition that cannot be
    resolved or is not boolean, an assignment to a column the table does not have, a value
    that cannot be stored in its column. The table is untouched."""


class InvalidArgumentError(StreamingMergeError, ValueError):
    """Raised for a bad argument, option or configuration value: the message names it, says
    why it is refused and what is accepted. A ``ValueError`` too, as Python users expect."""


class InvalidArgumentTypeError(StreamingMergeError, TypeError):
    """Raised for an argument of the wrong type; a ``TypeError`` too."""
