"""The MERGE clauses a MergeSink runs, and the option combinations they cannot honour.

The CDC preset (newest event per key wins, deletes delete, nothing older wins), its partial
update variant, and SCD 2's application of precomputed history rows: each a function of the
sink's CDC spec and the batch's columns, so the sink only decides which one a batch takes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from streaming_merge.errors import InvalidArgumentError
from streaming_merge.merge.builder import DeltaMergeBuilder
from streaming_merge.merge.skipping import SourceStats
from streaming_merge.streaming.cdc import DELETE_FLAG, PROVIDER_PREFIX, RESET_COL, CdcSpec
from streaming_merge.streaming.scd2 import (
    ACTION,
    END_AT,
    START_AT,
    TrackHistory,
    check_table_columns,
    current_rows,
    history_changes,
    truncate_spans,
)
from streaming_merge.streaming.sequence_layout import SequenceLayout, TableColumns
from streaming_merge.streaming.tombstones import Tombstones
from streaming_merge.table.snapshot import Snapshot

ClauseBuilder = Callable[[DeltaMergeBuilder], DeltaMergeBuilder]


def check_history_options(scd_type: int, keys: Sequence[str], sequence_by: Sequence[str],
                          clauses: ClauseBuilder | None, schema_evolution: bool,
                          track_list: Sequence[str] | None, track_except: Sequence[str] | None,
                          truncates: str | Column | None) -> None:
    """Refuse option combinations SCD 2 and truncates cannot honour, before anything is written."""
    if scd_type == 1 and (track_list is not None or track_except is not None):
        raise InvalidArgumentError(
            "track_history_column_list / track_history_except_column_list need stored_as_scd_type=2")
    if scd_type == 2:
        if not keys or not sequence_by:
            raise InvalidArgumentError(
                "stored_as_scd_type=2 needs keys=[...] and sequence_by=...: the history is ordered by "
                             "the sequence values of each key's events")
        for given, name in ((clauses, "clauses"), (schema_evolution, "schema_evolution")):
            if given:
                raise InvalidArgumentError(f"stored_as_scd_type=2 cannot be combined with {name} (not supported yet)")
    if truncates is not None:
        if not keys or not sequence_by:
            raise InvalidArgumentError(
                "apply_as_truncates needs keys=[...] and sequence_by=...: a truncate applies as of "
                             "its sequence value")
        if clauses is not None:
            raise InvalidArgumentError("apply_as_truncates cannot be combined with custom clauses")


def cdc_upsert(spec: CdcSpec | None, builder: DeltaMergeBuilder, source_columns: Sequence[str],
               layout: SequenceLayout, *, partial: bool = True) -> DeltaMergeBuilder:
    """The CDC preset: newest event per key wins, deletes delete, nothing older wins. The
    guard reads the sequence where the table keeps it (``layout``); the source has it there
    too (``TableColumns.frame``).

    With partial updates configured, a batch none of whose upserts leaves a column unchanged
    (``partial`` False: every event carries every value and a sequence) gets the whole-row
    clauses: each folded row's values then all come from its newest event, whose sequence is
    the row's, so wherever the guard lets the update through, every column's own test (its
    value's event newer than the table row) passes too, and the partial update writes the
    source's values, as ``UPDATE SET *`` does. Those clauses read no target value, so a
    deletion-vector MERGE can write its rows from the source side (merge.dv_source_side)
    instead of carrying every joined target row's columns through a shuffle."""
    assert spec is not None
    newer = spec.newer(in_metadata=layout.in_metadata)
    guard = f" AND {newer}" if newer else ""
    if spec.partial and partial:
        return partial_upsert(spec, builder, source_columns, guard, layout)
    return (builder
            .whenMatchedDelete(condition=f"s.`{DELETE_FLAG}`{guard}")
            .whenMatchedUpdateAll(condition=f"NOT s.`{DELETE_FLAG}`{guard}")
            .whenNotMatchedInsertAll(condition=f"NOT s.`{DELETE_FLAG}`"))

def partial_upsert(spec: CdcSpec, builder: DeltaMergeBuilder, source_columns: Sequence[str], guard: str,
                   layout: SequenceLayout) -> DeltaMergeBuilder:
    """Partial updates over the folded batch (``cdc._fold_partial``): a data column takes the
    batch's value when the event it came from is newer than the table row, or when the batch
    deleted the key after the row's sequence (the row then starts afresh); otherwise the row
    keeps its value. Inserts take the batch's values (NULL where no event carried one)."""
    data = spec.data_columns(source_columns)
    fixed = [c for c in source_columns if not c.startswith("__sm_") and c not in data]
    fresh = f"(s.`{RESET_COL}` IS NOT NULL AND {spec.later(f's.`{RESET_COL}`', in_metadata=layout.in_metadata)})"
    assignments = {f"`{c}`": f"s.`{c}`" for c in fixed}
    for column in data:
        provider = f"s.`{PROVIDER_PREFIX}{column}`"
        later = spec.later(f"{provider}.seq", in_metadata=layout.in_metadata)
        assignments[f"`{column}`"] = (f"CASE WHEN {fresh} OR ({provider} IS NOT NULL AND {later}) "
                                      f"THEN s.`{column}` ELSE t.`{column}` END")
    values = {f"`{c}`": f"s.`{c}`" for c in [*fixed, *data]}
    return (builder
            .whenMatchedDelete(condition=f"s.`{DELETE_FLAG}`{guard}")
            .whenMatchedUpdate(condition=f"NOT s.`{DELETE_FLAG}`{guard}", set=assignments)
            .whenNotMatchedInsert(condition=f"NOT s.`{DELETE_FLAG}`", values=values))

def history_condition(condition: str) -> str:
    """SCD 2 matches a key's rows by their opening sequence too."""
    return f"{condition} AND t.`{START_AT}` = s.`{START_AT}`"

def history_upsert(spec: CdcSpec | None, builder: DeltaMergeBuilder, source_columns: Sequence[str],
                   truncates: Sequence[Column]) -> DeltaMergeBuilder:
    """SCD 2: apply the history rows ``scd2.history_changes`` computed; with a truncate in the
    batch, also close the current row of every key the batch does not touch."""
    assert spec is not None
    columns = [c for c in source_columns if c != ACTION]
    changed = [c for c in columns if c not in {*spec.keys, START_AT}]
    builder = (builder
               .whenMatchedDelete(condition=f"s.`{ACTION}` = 'D'")
               .whenMatchedUpdate(condition=f"s.`{ACTION}` = 'U'", set={f"`{c}`": f"s.`{c}`" for c in changed})
               .whenNotMatchedInsert(condition=f"s.`{ACTION}` = 'I'",
                                     values={f"`{c}`": f"s.`{c}`" for c in columns}))
    if truncates:
        spans, new_end = truncate_spans(truncates)
        # A version opened at a truncate's own sequence value: the truncate wins the tie, so the
        # upsert that opened it is undone (the version before it already ends there).
        opened_at_a_truncate = F.col(f"t.`{START_AT}`").isin(*truncates)
        builder = (builder.whenNotMatchedBySourceDelete(condition=opened_at_a_truncate)
                   .whenNotMatchedBySourceUpdate(condition=spans, set={f"`{END_AT}`": new_end}))
    return builder


def history_source(spark: SparkSession, spec: CdcSpec | None, selection: TableColumns, track: TrackHistory,
                   tombstones: Tombstones | None, target: str, events: DataFrame, stats: SourceStats,
                   snapshot: Snapshot | None, truncates: Sequence[Column], batch_truncates: Sequence[Column],
                   tombstone_snapshot: Snapshot | None, layout: SequenceLayout) -> tuple[DataFrame, None]:
    """SCD 2: the MERGE source, the history rows to insert/update/delete for the batch's keys
    (materialized by the MERGE, which observes its statistics)."""
    assert spec is not None
    columns = [c for c in selection.columns(events.columns, layout) if not c.startswith("__sm_")]
    current = None
    if snapshot is not None:
        check_table_columns(snapshot.schema, columns, target)
        current = current_rows(spark, snapshot, stats.ranges, spec, events, batch_truncates)
    deletes = None  # of keys the batch does not touch too: the fold ignores those
    if tombstones is not None:
        deletes = tombstones.overlapping(spark, tombstone_snapshot, stats.ranges)
    tracked = track.tracked(spec, columns)
    return history_changes(spec, tracked, events, current, deletes, truncates, columns), None

