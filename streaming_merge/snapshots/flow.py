"""AUTO CDC FROM SNAPSHOT: keep a Delta table equal to (SCD 1) or the history of (SCD 2) a
sequence of full snapshots of a source, each snapshot applied exactly once.

Per snapshot version V: read the table's txn for the flow's name (a version at or below it
is already applied: skipped); diff the snapshot against the table's current rows in one join
(``diff.changes``); MERGE the differences, committing ``txn(name, V)`` in the same commit. A
call killed anywhere therefore leaves each version either committed with its txn or not at
all, and the rerun asks the source again from the last committed version. A lost
materialized block or a concurrent commit reruns the whole version (bounded), diffing against
the table as it is then, never merging a diff computed against an older version of it.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Mapping, Sequence

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from streaming_merge.delta_table import DeltaTable
from streaming_merge.errors import (
    ConcurrentModificationError,
    DeltaTableError,
    InvalidArgumentError,
    MaterializedSourceLostError,
)
from streaming_merge.merge.builder import DeltaMergeBuilder
from streaming_merge.merge.command import MergeOptions, merge_conf
from streaming_merge.merge.materialize import (
    carries_local_rows,
    is_lost_block_error,
    level_for_attempt,
    materialize,
    release,
)
from streaming_merge.merge.metrics import MergeMetrics
from streaming_merge.merge.skipping import SourceStats, source_stats_columns, source_stats_of
from streaming_merge.snapshots.diff import (
    ACTION,
    CLOSE,
    DELETE,
    INSERT,
    UPDATE,
    SnapshotLayout,
    changes,
    checked_rows,
    key_error_of,
    layout_of,
    parse_counts,
    table_schema,
)
from streaming_merge.snapshots.result import AppliedSnapshot, SnapshotCdcResult
from streaming_merge.snapshots.source import SnapshotSource, VersionedSnapshot, snapshots
from streaming_merge.spark.profile import phase
from streaming_merge.streaming.arguments import ColumnArg, ScdType, column_names, name_list, scd_type_of
from streaming_merge.streaming.scd2 import END_AT, HISTORY_COLUMNS, START_AT, TrackHistory
from streaming_merge.table.location import TableLocation, resolve
from streaming_merge.table.scan import scan_files
from streaming_merge.table.snapshot import Snapshot, advance, load_snapshot, table_exists

log = logging.getLogger(__name__)

DEFAULT_MAX_ATTEMPTS = 4
# Candidate files adding up to at most this are rewritten whole, without findTouchedFiles, whose
# Spark job costs more than copying their untouched rows (as MergeSink does for small tables).
SMALL_CANDIDATES_BYTES = 1024 * 1024


def create_auto_cdc_from_snapshot_flow(
    spark: SparkSession,
    *,
    target: str,
    source: SnapshotSource,
    keys: ColumnArg | Sequence[ColumnArg],
    stored_as_scd_type: ScdType = 1,
    track_history_column_list: Sequence[ColumnArg] | None = None,
    track_history_except_column_list: Sequence[ColumnArg] | None = None,
    name: str | None = None,
    storage_options: Mapping[str, str] | None = None,
    table_properties: Mapping[str, str] | None = None,
    partition_cols: Sequence[str] | None = None,
    merge_options: MergeOptions | None = None,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
) -> SnapshotCdcResult:
    """Apply the source's snapshots to the Delta table at ``target``, Databricks' AUTO CDC
    FROM SNAPSHOT (``create_auto_cdc_from_snapshot_flow``, formerly
    ``apply_changes_from_snapshot``), and return what was applied.

    ``source``: a Delta table path, a table or view name, or a DataFrame, read once by this
    call and applied as the next version (the last applied one plus 1, or 1); or a function
    ``next_snapshot_and_version(latest_version) -> (DataFrame, version) | None``, called with
    the last applied version (None at first) until it returns None, whose versions must
    increase. Per snapshot: keys absent from it are deleted (SCD 2: their current version
    closes at the snapshot's version), new keys inserted, changed rows updated (SCD 2: a
    change of a tracked column closes the current version and opens one at the snapshot's
    version, a change of untracked columns only updates the current version in place), and an
    unchanged row is left as it is. ``keys`` identify a row; a snapshot must hold one row per
    key, none NULL. ``track_history_column_list`` / ``track_history_except_column_list``
    (SCD 2): which columns open a new version (default all but the keys). Column arguments
    are names or PySpark Columns, an empty list counts as not given, and the SCD type is 1, 2,
    "1" or "2", as for ``create_auto_cdc_flow``.

    Exactly once per version: ``name`` (default: the target's location) is the Delta txn's
    app id, the snapshot version its version, committed with the version's data. The table
    is created from the first snapshot when missing (``table_properties``,
    ``partition_cols``). ``merge_options``: ``MergeOptions`` for the MERGEs (the flow sets
    their source materialization and retries itself); ``max_attempts`` bounds the reruns of
    a version after a lost materialized block or a concurrent commit.
    """
    # AUTO CDC's argument forms, read as create_auto_cdc_flow (MergeSink) reads them.
    scd_type = scd_type_of(stored_as_scd_type)
    track_list = name_list(track_history_column_list, "track_history_column_list")
    track_except = name_list(track_history_except_column_list, "track_history_except_column_list")
    if scd_type == 1 and (track_list is not None or track_except is not None):
        raise InvalidArgumentError(
            "track_history_column_list / track_history_except_column_list need stored_as_scd_type=2")
    key_list = column_names(keys, "keys")
    if not key_list:
        raise InvalidArgumentError(f"keys must name at least one column, got {keys!r}")
    if max_attempts < 1:
        raise InvalidArgumentError(f"max_attempts must be at least 1, got {max_attempts}")
    location = resolve(target, spark, storage_options)
    flow = _Flow(spark, location, name or f"auto_cdc_from_snapshot:{location.uri}", key_list, scd_type,
                 TrackHistory(track_list, track_except),
                 merge_options or MergeOptions(), max_attempts, dict(table_properties or {}),
                 list(partition_cols or []))
    applied = [flow.apply(snapshot) for snapshot in snapshots(spark, source, flow.latest_version, storage_options)]
    return SnapshotCdcResult(flow.name, location.uri, scd_type, tuple(applied))


@dataclasses.dataclass
class _Flow:
    """One call's state: the table's location and the snapshot of its log last read, followed
    from commit to commit (only the new commits are read)."""

    spark: SparkSession
    location: TableLocation
    name: str
    keys: list[str]
    scd_type: int
    track: TrackHistory
    merge_options: MergeOptions
    max_attempts: int
    table_properties: dict[str, str]
    partition_cols: list[str]
    _known: Snapshot | None = None

    def _snapshot(self) -> Snapshot | None:
        """The table's latest snapshot (None while there is no table)."""
        if self._known is not None:
            self._known = advance(self._known)
        elif table_exists(self.location):
            self._known = load_snapshot(self.location)
        return self._known

    def latest_version(self) -> int | None:
        """The last snapshot version applied to the table by this flow (its txn), or None."""
        snapshot = self._snapshot()
        return snapshot.transaction_version(self.name) if snapshot is not None else None

    def apply(self, snapshot: VersionedSnapshot) -> AppliedSnapshot:
        started = time.monotonic()
        for attempt in range(1, self.max_attempts + 1):
            try:
                return self._apply_once(snapshot, attempt, started)
            except (ConcurrentModificationError, MaterializedSourceLostError) as exc:
                self._known = None  # read the log afresh: the rerun diffs against the table as it is now
                if attempt == self.max_attempts:
                    raise
                log.warning("AUTO CDC FROM SNAPSHOT %s: version %d into %s failed on attempt %d (%s); rerunning it",
                            self.name, snapshot.version, self.location, attempt, type(exc).__name__)
        raise AssertionError("unreachable")

    def _apply_once(self, versioned: VersionedSnapshot, attempt: int, started: float) -> AppliedSnapshot:
        version = versioned.version
        snapshot = self._snapshot()
        if snapshot is None:
            self._create(versioned)
            snapshot = self._snapshot()
            assert snapshot is not None
        applied = snapshot.transaction_version(self.name)
        if applied is not None and applied >= version:
            return _skipped(version, snapshot.version, attempt, started)
        layout = layout_of(snapshot.schema, versioned.frame.columns, self.keys, self.scd_type, self.track, version)
        level = level_for_attempt(self.merge_options.storage_levels, attempt)
        with merge_conf(self.spark, carries_local_rows(versioned.frame)):
            diff = self._diff(versioned, snapshot, layout, level)
            try:
                metrics = self._merge(diff, snapshot, layout, level, version)
            finally:
                release(diff.changes)
        if metrics["skipped"]:  # a concurrent run committed this version first
            return _skipped(version, metrics["tableVersion"], attempt, started, metrics)
        counts = diff.counts
        record = AppliedSnapshot(
            version=version, table_version=metrics["tableVersion"], skipped=False,
            snapshot_rows=counts["snapshotRows"], inserted=counts["inserted"], updated=counts["updated"],
            deleted=counts["deleted"], unchanged=counts["unchanged"], new_versions=counts["newVersions"],
            attempts=attempt, duration_ms=_ms(started), metrics=metrics)
        log.info("AUTO CDC FROM SNAPSHOT %s: version %d -> table version %s: %d rows, %d inserted, %d updated, "
                 "%d deleted, %d unchanged (%d ms)", self.name, version, record.table_version, record.snapshot_rows,
                 record.inserted, record.updated, record.deleted, record.unchanged, record.duration_ms)
        return record

    def _diff(self, versioned: VersionedSnapshot, snapshot: Snapshot, layout: SnapshotLayout, level: str) -> _Diff:
        """The differences, materialized in one job (the join) that also observes the counts and
        the MERGE's source statistics: the MERGE then reads a few rows, known to have unique
        keys, and needs no pass of its own to count them."""
        current = scan_files(self.spark, snapshot, snapshot.files)
        if self.scd_type == 2:
            current = current.filter(F.col(f"`{END_AT}`").isNull())
        source, observation = changes(checked_rows(versioned.frame, layout), current, layout, versioned.version)
        matched_on = [*layout.keys, *([START_AT] if self.scd_type == 2 else [])]
        try:
            with phase(self.spark, "snapshotDiff",
                       f"AUTO CDC FROM SNAPSHOT - diffing snapshot version {versioned.version} against the table"):
                materialized, values = materialize(source, level, source_stats_columns(matched_on))
        except Exception as exc:
            key_error = key_error_of(exc, layout.keys, versioned.version)
            if key_error is not None:
                raise key_error from exc
            raise
        stats = dataclasses.replace(source_stats_of(values, matched_on), unique_keys=tuple(matched_on))
        return _Diff(materialized, stats, parse_counts(dict(observation.get)))

    def _merge(self, diff: _Diff, snapshot: Snapshot, layout: SnapshotLayout, level: str, version: int
               ) -> MergeMetrics:
        """One MERGE of the differences, committing txn(name, version). The flow reruns a failed
        version itself, from a fresh read of the log (a MERGE rerun would merge a diff taken
        against this snapshot into a newer one)."""
        table = DeltaTable(self.spark, self.location, "t")
        builder = _clauses(table.merge(diff.changes.alias("s"), _condition(layout)), layout)
        options = {f.name: getattr(self.merge_options, f.name) for f in dataclasses.fields(MergeOptions)}
        options.update(materialize_source="none", source_stats=diff.stats, snapshot=snapshot, max_attempts=1,
                       storage_levels=(level,),
                       rewrite_all_candidates_bytes=max(self.merge_options.rewrite_all_candidates_bytes,
                                                        SMALL_CANDIDATES_BYTES))
        try:
            return builder.withOptions(**options).execute(app_id=self.name, version=version)
        except Exception as exc:
            if is_lost_block_error(exc) and not isinstance(exc, MaterializedSourceLostError):
                raise MaterializedSourceLostError(f"Snapshot version {version}: the materialized differences lost "
                                                  "their blocks", attempts=1) from exc
            raise

    def _create(self, versioned: VersionedSnapshot) -> None:
        """Create the table, empty, with the first snapshot's columns (SCD 2: plus the history
        columns); its rows come with the version's MERGE, which carries the txn. A table
        created meanwhile by a concurrent run is taken as it is."""
        schema = table_schema(versioned.frame.schema, self.scd_type)
        layout_of(schema, versioned.frame.columns, self.keys, self.scd_type, self.track, versioned.version)
        empty = self.spark.createDataFrame([], schema)
        try:
            DeltaTable.createFromDataFrame(empty, self.location, partitionBy=self.partition_cols or None,
                                           properties=self.table_properties or None)
        except DeltaTableError:
            if not table_exists(self.location):
                raise
        self._known = None


@dataclasses.dataclass(frozen=True)
class _Diff:
    """A snapshot's differences to the table, materialized, with what their job observed."""

    changes: DataFrame
    stats: SourceStats
    counts: dict[str, int]


def _condition(layout: SnapshotLayout) -> str:
    """Keys (SCD 2: and the version's start, on current rows only): each source row matches at
    most one table row."""
    on = " AND ".join(f"t.`{k}` = s.`{k}`" for k in layout.keys)
    if layout.scd_type == 2:
        on += f" AND t.`{START_AT}` = s.`{START_AT}` AND t.`{END_AT}` IS NULL"
    return on


def _clauses(builder: DeltaMergeBuilder, layout: SnapshotLayout) -> DeltaMergeBuilder:
    action = f"s.`{ACTION}`"
    if layout.scd_type == 1:
        return (builder
                .whenMatchedDelete(condition=f"{action} = '{DELETE}'")
                .whenMatchedUpdateAll(condition=f"{action} = '{UPDATE}'")
                .whenNotMatchedInsertAll(condition=f"{action} = '{INSERT}'"))
    columns = [*layout.keys, *layout.data, *HISTORY_COLUMNS]
    return (builder
            .whenMatchedUpdate(condition=f"{action} = '{CLOSE}'", set={f"`{END_AT}`": f"s.`{END_AT}`"})
            .whenMatchedUpdate(condition=f"{action} = '{UPDATE}'", set={f"`{c}`": f"s.`{c}`" for c in layout.data})
            .whenNotMatchedInsert(condition=f"{action} = '{INSERT}'", values={f"`{c}`": f"s.`{c}`" for c in columns}))


def _skipped(version: int, table_version: int | None, attempt: int, started: float,
             metrics: MergeMetrics | None = None) -> AppliedSnapshot:
    log.info("AUTO CDC FROM SNAPSHOT: version %d already applied (table version %s); skipped", version, table_version)
    return AppliedSnapshot(version=version, table_version=table_version, skipped=True, snapshot_rows=0, inserted=0,
                           updated=0, deleted=0, unchanged=0, new_versions=0, attempts=attempt,
                           duration_ms=_ms(started), metrics=metrics or MergeMetrics({}, skipped=True))


def _ms(since: float) -> int:
    return int((time.monotonic() - since) * 1000)
