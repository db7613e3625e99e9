"""What one attempt at a MergeSink batch hands from step to step, and the steps that need no
sink state.

``MergeSink._run_batch`` is a pipeline: txn check → copy → prepare → MERGE → report. Each
step takes and returns one of the frozen dataclasses below, so a step reads on its own (its
inputs are named fields, not positions in a tuple) and the data each one adds is in one place.
The steps that read or update the sink's state across batches (the tombstone heuristics, the
all-touched streak, the previous batch's size) stay methods of the sink; what is here is
plain: the progress records, the creation of a missing target, the truncates to apply and
the check against tombstones recorded meanwhile.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql.types import StructType

from streaming_merge.delta_table import DeltaTable
from streaming_merge.errors import ConcurrentModificationError, DeltaTableError
from streaming_merge.merge.metrics import DELTA_METRICS, MergeMetrics
from streaming_merge.merge.skipping import SourceStats
from streaming_merge.streaming.batch_copy import BatchCounts
from streaming_merge.streaming.cdc import CdcSpec
from streaming_merge.streaming.progress import MergeProgress, millis_since, now_text
from streaming_merge.streaming.sequence_layout import SequenceLayout
from streaming_merge.streaming.tombstones import Tombstones
from streaming_merge.table.location import TableLocation
from streaming_merge.table.snapshot import DataFile, Snapshot, table_exists


@dataclass(frozen=True)
class Attempt:
    """One attempt at a batch: what every step reads. ``number`` counts the batch's attempts
    (1 for the first), ``conflicts`` the reruns after a conflict that preceded this one;
    ``started`` is when the batch (not the attempt) started (``time.monotonic``)."""

    spark: SparkSession
    batch_df: DataFrame
    batch_id: int
    app_id: str
    number: int
    conflicts: int
    storage_level: str
    started: float
    rows_at_most: int | None
    location: TableLocation


@dataclass(frozen=True)
class TxnCheck:
    """The target as this attempt reads it (None: no table yet), and whether the table already
    holds this batch's txn (a replay: the batch is skipped)."""

    snapshot: Snapshot | None
    applied: bool


@dataclass(frozen=True)
class CopiedBatch:
    """The batch's one copy (batch_copy.copy_batch) and what its job observed. ``kept_rows``:
    the keyed rows the copy kept when it dropped late events (None when it did not filter).
    ``tombstones``: the tombstone table as read before the copy, ``tombstone_files`` its files
    that hold a row; ``partitions``: how many partitions the batch was folded into."""

    frame: DataFrame
    counts: BatchCounts
    stats: SourceStats
    kept_rows: int | None
    snapshot: Snapshot | None
    tombstones: Snapshot | None
    tombstone_files: list[DataFile]
    partitions: int
    materialize_ms: int


@dataclass(frozen=True)
class PreparedBatch:
    """The MERGE's source and what goes with it. ``events``: the batch's keyed events before
    any late event is dropped (the tombstones are recorded and checked from them). ``stats``:
    the source's statistics, None when the MERGE materializes the source and counts it.
    ``late_dropped``: events older than a tombstone or a truncate may have been dropped, so
    the MERGE's source row count tells how many were left. ``truncates``: the batch's own
    truncates as sequence literals, oldest first."""

    source: DataFrame
    events: DataFrame
    stats: SourceStats | None
    late_dropped: bool
    layout: SequenceLayout
    truncates: list[Column]
    dead_letter_rows: int
    tombstones_ms: int


@dataclass(frozen=True)
class MergeOutcome:
    """The MERGE's metrics, and how long it ran with its commit (ms)."""

    metrics: MergeMetrics
    execute_ms: int


def skipped_progress(attempt: Attempt, snapshot: Snapshot) -> MergeProgress:
    """A batch the table already holds (its txn is there): nothing was read or written. Its
    ``attempts`` leave this one out, which found there was nothing to do."""
    return MergeProgress(
        batchId=attempt.batch_id, appId=attempt.app_id, tableVersion=snapshot.version, skipped=True,
        attempts=attempt.number - 1, numInputRows=0, numRowsAfterDedupe=0, numNullKeyRows=0, numLateRowsDropped=0,
        durationMs={"total": millis_since(attempt.started)}, metrics={}, timestamp=now_text(),
        target=attempt.location.uri, conflictRetries=attempt.conflicts)


def empty_progress(attempt: Attempt, copied: CopiedBatch) -> MergeProgress:
    """A batch without a row: copied, and nothing to MERGE."""
    return MergeProgress(
        batchId=attempt.batch_id, appId=attempt.app_id, tableVersion=None, skipped=False, attempts=attempt.number,
        numInputRows=0, numRowsAfterDedupe=0, numNullKeyRows=0, numLateRowsDropped=0,
        durationMs={"materialize": copied.materialize_ms, "total": millis_since(attempt.started)}, metrics={},
        timestamp=now_text(), target=attempt.location.uri, conflictRetries=attempt.conflicts)


def merged_progress(attempt: Attempt, copied: CopiedBatch, prepared: PreparedBatch, outcome: MergeOutcome,
                    compaction: Mapping[str, Any] | None) -> MergeProgress:
    """A batch that ran its MERGE (which its txn may still have skipped)."""
    metrics = outcome.metrics
    skipped = bool(metrics["skipped"])
    # Events dropped as older than a tombstone or a truncate: the MERGE counted what was left.
    late = copied.stats.rows - int(metrics["numSourceRows"] or 0) if prepared.late_dropped and not skipped else 0
    merge_ms = int(metrics["scanTimeMs"] or 0) + int(metrics["rewriteTimeMs"] or 0)
    return MergeProgress(
        batchId=attempt.batch_id, appId=attempt.app_id, tableVersion=metrics["tableVersion"],  # type: ignore[arg-type]
        skipped=skipped, attempts=attempt.number, numInputRows=copied.counts.rows,
        numRowsAfterDedupe=copied.stats.rows, numNullKeyRows=copied.counts.null_keys, numLateRowsDropped=late,
        durationMs={"materialize": copied.materialize_ms, "tombstones": prepared.tombstones_ms, "merge": merge_ms,
                    "commit": max(0, outcome.execute_ms - merge_ms), "total": millis_since(attempt.started)},
        metrics={name: int(metrics[name] or 0) for name in DELTA_METRICS},
        timestamp=now_text(), target=attempt.location.uri, deadLetterRows=prepared.dead_letter_rows,
        compaction=compaction, numTruncates=len(copied.counts.truncates), conflictRetries=attempt.conflicts)


def ensure_table(spark: SparkSession, location: TableLocation, source: DataFrame, snapshot: Snapshot | None, *,
                 create_if_missing: bool, partition_by: Sequence[str], properties: Mapping[str, str]) -> None:
    """Create the target from the batch when it is missing. When another writer (another
    flow's first batch) created it after this attempt read that it was missing, the
    attempt's layout and plan were made for no table: ConcurrentModificationError, and the
    batch reruns against the table that is there."""
    if table_exists(location):
        if snapshot is None:
            raise ConcurrentModificationError(
                f"`{location.uri}` was created by another writer while this batch ran; rerunning it against that "
                "table.")
        return
    if not create_if_missing:
        DeltaTable.forPath(spark, location)  # raises NotADeltaTableError naming the path
    columns = [c for c in source.columns if not c.startswith("__sm_")]
    try:
        DeltaTable.createFromDataFrame(source.select(*[f"`{c}`" for c in columns]).limit(0), location,
                                       partitionBy=list(partition_by) or None, properties=dict(properties) or None)
    except DeltaTableError as exc:
        if not table_exists(location):
            raise
        raise ConcurrentModificationError(
            f"`{location.uri}` was created by another writer at the same time as by this batch; rerunning it "
            "against that table.") from exc



def all_truncates(spark: SparkSession, spec: CdcSpec | None, tombstones: Tombstones | None, batch_values: Sequence[Any],
                  tombstone_snapshot: Snapshot | None, schema: StructType) -> list[Column]:
    """Every truncate to apply to this batch, oldest first, as literals: the batch's own and,
    with tombstones, those recorded by earlier batches (read once per sink, then kept)."""
    if spec is None or spec.truncate_when is None:
        return []
    values = set(batch_values)
    if tombstones is not None:  # every writer's, read once per tombstone file (Tombstones caches them)
        values |= set(tombstones.recorded_truncates(spark, tombstone_snapshot))
    return [spec.sequence_literal(v, schema) for v in sorted(values)]


def no_tombstones_missed(tombstones: Tombstones, spark: SparkSession, read_version: int | None,
                         tombstones_read: Snapshot | None, own_versions: Sequence[int], events: DataFrame,
                         key_ranges: Mapping[str, Any], latest: Snapshot) -> None:
    """The MERGE's last check before its commit (every commit attempt; ``latest``: the target
    as the commit checked it). Another flow records its deletes in the shared tombstone table
    before its MERGE commits; a delete of a key the table did not hold commits no target file,
    so nothing in the target's log tells this batch that its older event for that key must
    not be inserted. When the target gained commits since this batch read it, such a delete
    may be among them, and its tombstone is then already in the tombstone table: the batch
    fails with ConcurrentModificationError when another writer recorded a tombstone of one of
    its keys (or a truncate) after the batch read the tombstones, and reruns from a fresh
    snapshot. Without target commits since the read, every such delete committed before the
    batch read the tombstones (tombstones first, then the MERGE), and nothing is read here."""
    if read_version is not None and latest.version == read_version:
        return
    tombstones.check_none_recorded_since(spark, tombstones_read, own_versions, events, key_ranges)
