"""writeAllChanges with deletion vectors: a MERGE that writes only the rows it changes.

On a table with ``delta.enableDeletionVectors=true``, a target row that a clause updates or
deletes (WHEN MATCHED or WHEN NOT MATCHED BY SOURCE) is marked deleted in its file's deletion
vector, and only the updated and inserted rows are written, as new files. Untouched rows are
never copied, so the cost follows the batch, not the size of the files it touches.

One Spark job joins the candidates' rows with the source and writes the new rows; the same
job observes every matched pair as (file id, row index, whether a clause changed the row,
source row id), and every unmatched target row a NOT MATCHED BY SOURCE clause changed. Those
positions are bounded by the source's rows and the rows the MERGE changes, not by the table.
The driver then checks for a target row matched twice (Delta's error, exactly as
findTouchedFiles raises it), and builds each touched file's new deletion vector. Where the
source is broadcast, the target's rows stream past it (no target row crosses a shuffle) and the
inserts are found in the same job (see _streamed_past_source). When every written row is a
source row (streaming_merge.merge.dv_source_side), a job finds the matched pairs and writes
nothing, and a second one writes the source's rows (see _from_source_side).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from pyroaring import BitMap64
from pyspark.sql import Column, DataFrame, Observation, SparkSession, Window
from pyspark.sql import functions as F

from streaming_merge.errors import InvalidArgumentError, MultipleSourceRowMatchingTargetRowError
from streaming_merge.merge.change_data import (
    deduplicates_deletes,
    matched_delete_rows,
    preimage_columns,
    preimage_names,
    with_change_rows,
)
from streaming_merge.merge.dv_source_side import SourceSide, in_row_ids, source_side
from streaming_merge.merge.resolve import (
    ACTION_COL,
    COPY,
    DROP,
    SOURCE_PRESENT,
    TARGET_PRESENT,
    ResolvedClause,
    ResolvedMerge,
)
from streaming_merge.merge.rewrite import (
    TARGET_ROW_COUNTS,
    FileLayout,
    codes_of,
    first_applicable,
    outputs,
    target_row_counts,
    write_frame,
)
from streaming_merge.merge.touched import FILE_ID_COL, MAX_REPORTED_ROWS, MULTIPLE_MATCH_MESSAGE, scan_with_file_ids
from streaming_merge.spark.constant_lookup import lookup
from streaming_merge.spark.observed_longs import long_list, longs, observed_row
from streaming_merge.spark.profile import phase
from streaming_merge.spark.slots import task_slots
from streaming_merge.table.dv_positions import deleted_positions_of
from streaming_merge.table.file_ids import FileIds
from streaming_merge.table.snapshot import DataFile, Snapshot
from streaming_merge.table.spark_paths import ROW_INDEX_COL
from streaming_merge.table.write import WrittenFile, delete_written

SOURCE_ROW_ID = "__sm_source_row_id__"
_MATCHED = "matchedTargetRows"
_PACKED = "__sm_target_row_position__"
# A packed position: the candidate's (1-based) position above bit 42, the changed flag at 42,
# the row index below.
_ROW_BITS = 42
_POSITION_BITS = 63 - _ROW_BITS - 1
_BRANCH = "__sm_joined_branch__"  # 1: a row of the join, 0: a source row (a possible insert)
_JOINED = "__sm_source_row_joined__"
_JOINED_ROW_IDS = "joinedSourceRows"
_UPDATED_ROW_IDS = "updatedSourceRows"


@dataclass(frozen=True)
class DeletionVectorChanges:
    """What a MERGE (or UPDATE, DELETE) does to the files it touches: the files whose every row
    is now deleted, and for the others the full set of their deleted rows (old and new)."""

    removed: list[DataFile]
    vectors: list[tuple[DataFile, BitMap64]]

    def metrics(self) -> dict[str, int]:
        """Delta's deletion-vector metrics: a file that had no vector gets one (added), one that
        had one gets a new one (updated), and a removed file's vector goes with it (removed)."""
        return {
            "numTargetDeletionVectorsAdded": sum(1 for f, _ in self.vectors if f.deletion_vector is None),
            "numTargetDeletionVectorsUpdated": sum(1 for f, _ in self.vectors if f.deletion_vector is not None),
            "numTargetDeletionVectorsRemoved": sum(1 for f in self.removed if f.deletion_vector is not None),
        }


@dataclass(frozen=True)
class DvRewriteResult:
    files: list[WrittenFile]
    counts: dict[str, int]
    changes: DeletionVectorChanges


def deletion_vector_changes(snapshot: Snapshot, files: Sequence[DataFile],
                            deleted: dict[int, np.ndarray]) -> DeletionVectorChanges:
    """Each file's new deleted rows (``deleted``: by position in ``files``) merged with those its
    current vector deletes; a file left with no row is removed instead."""
    removed: list[DataFile] = []
    vectors: list[tuple[DataFile, BitMap64]] = []
    with_vectors = [p for p in deleted if files[p].deletion_vector is not None]
    earlier = dict(zip(with_vectors, deleted_positions_of(snapshot, [files[p] for p in with_vectors]), strict=True))
    for position, rows in sorted(deleted.items()):
        file = files[position]
        bitmap = BitMap64(rows.tolist())
        if position in earlier:
            bitmap |= BitMap64(earlier[position].tolist())
        if file.num_records is not None and len(bitmap) >= file.num_records:
            removed.append(file)
        else:
            vectors.append((file, bitmap))
    return DeletionVectorChanges(removed, vectors)


def write_changes_with_deletion_vectors(
    spark: SparkSession,
    snapshot: Snapshot,
    candidates: Sequence[DataFile],
    source: DataFrame,
    resolved: ResolvedMerge,
    *,
    layout: FileLayout,
    broadcast_source: bool,
    from_source_side: bool = True,
) -> DvRewriteResult:
    """Join the candidates with the source, write the updated and inserted rows, and return the
    rows to mark deleted, in one Spark job (plus the broadcast's)."""
    if len(candidates) >= 1 << _POSITION_BITS or any((f.num_records or 0) >= 1 << _ROW_BITS for f in candidates):
        raise InvalidArgumentError(
            f"A MERGE with deletion vectors handles up to {1 << _POSITION_BITS} candidate files of up "
                         f"to {1 << _ROW_BITS} rows each; {snapshot.table_path} has more: compact it first.")
    ids = FileIds.of(spark, snapshot, candidates)
    # One projection and an alias a side: each DataFrame operation is an analysis.
    tgt = scan_with_file_ids(spark, snapshot, candidates, resolved, ids, keep_row_index=True,
                             present=True).alias(resolved.target_alias)
    src = source.select("*", *resolved.derive(("dv-source-columns",), lambda: [
        F.monotonically_increasing_id().alias(SOURCE_ROW_ID), F.lit(True).alias(SOURCE_PRESENT)])
    ).alias(resolved.source_alias)
    position = lookup(spark, ids.ids, list(range(1, len(ids.ids) + 1)), F.col(FILE_ID_COL))
    side = source_side(resolved, tgt, src) if broadcast_source and from_source_side else None
    if side is not None:
        written_from_source = _from_source_side(spark, snapshot, candidates, resolved, tgt, src, layout, position,
                                                side)
        if written_from_source is not None:
            return written_from_source
    observation = Observation()
    if broadcast_source:
        output = _streamed_past_source(spark, resolved, tgt, src, layout, observation, position)
    else:  # a source too large to broadcast: one shuffled join, source rows preserved for the inserts
        join = ("full_outer" if resolved.not_matched else "left_outer") if resolved.not_matched_by_source else (
            "right_outer" if resolved.not_matched else "inner")
        observed = _observed(resolved, tgt.join(src, resolved.condition, join), resolved.all, observation, position)
        output = _with_changes(resolved, observed.filter(_written(resolved, resolved.all)).select(*_names(resolved)))
    deletes = (matched_delete_rows(spark, snapshot, candidates, source, resolved)
               if deduplicates_deletes(resolved) else None)
    with phase(spark, "dvJoinWrite"):
        written = write_frame(spark, snapshot, output, resolved, layout, deletes)
    try:
        values = observed_row(spark, observation, _is_id_list)
        changed, matched = _positions(values.pop(_MATCHED, None))
        counts = _checked_counts(snapshot, candidates, resolved, values, matched)
    except BaseException:
        delete_written(spark, snapshot.location, written)
        raise
    with phase(spark, "dvVectors"):
        return DvRewriteResult(written, {**counts, **_inserted(counts, written)},
                               _changes(snapshot, candidates, changed))


def _from_source_side(spark: SparkSession, snapshot: Snapshot, candidates: Sequence[DataFile],
                      resolved: ResolvedMerge, tgt: DataFrame, src: DataFrame, layout: FileLayout,
                      position: Column, side: SourceSide) -> DvRewriteResult | None:
    """The MERGE as dv_source_side describes it: a job that writes nothing and observes the
    matched pairs, then the source's rows written by the clause each takes (in one job with the
    matching where the clause does not depend on it). None, with nothing written, when a source
    row matched two target rows (the caller then runs the general plan)."""
    observation = Observation()
    joined = tgt.join(F.broadcast(src), resolved.condition, "inner")
    if side.same_row_either_way:
        return _matched_beside_write(spark, snapshot, candidates, resolved, joined, src, layout, position,
                                     observation)
    updates = [c.code for c in resolved.matched if c.outputs is not None] if side.decided_in_match else []
    with phase(spark, "dvMatch"):
        (_observed(resolved, joined, resolved.matched, observation, position, narrow=True, also=[
            long_list(F.col(SOURCE_ROW_ID)).alias(_JOINED_ROW_IDS),
            *[long_list(F.when(F.col(ACTION_COL) == code, F.col(SOURCE_ROW_ID))).alias(f"{_UPDATED_ROW_IDS}{code}")
              for code in updates]])
         .write.format("noop").mode("overwrite").save())
    values = observed_row(spark, observation, _is_id_list)
    changed, matched = _positions(values.pop(_MATCHED, None))
    joined_ids = longs(values.pop(_JOINED_ROW_IDS, None))
    if _repeats(joined_ids):
        return None
    counts = _checked_counts(snapshot, candidates, resolved, values, matched)
    row_id = F.col(SOURCE_ROW_ID)
    if side.decided_in_match:  # the update each matched row took; any other matched row writes nothing
        matched_action: Column = F.lit(COPY)
        for code in reversed(updates):
            ids = longs(values.pop(f"{_UPDATED_ROW_IDS}{code}", None))
            matched_action = F.when(in_row_ids(spark, ids, row_id), F.lit(code)).otherwise(matched_action)
    else:
        matched_action = first_applicable(resolved, resolved.matched, COPY)
    action = F.when(in_row_ids(spark, joined_ids, row_id), matched_action).otherwise(
        first_applicable(resolved, resolved.not_matched, DROP))
    writers = [*resolved.matched, *resolved.not_matched]
    rows = src.withColumn(ACTION_COL, action).filter(_written(resolved, writers)).select(
        *outputs(resolved, writers, False))
    with phase(spark, "dvSourceWrite"):
        written = write_frame(spark, snapshot, rows, resolved, layout)
    with phase(spark, "dvVectors"):
        try:
            return DvRewriteResult(written, {**counts, **_inserted(counts, written)},
                                   _changes(snapshot, candidates, changed))
        except BaseException:
            delete_written(spark, snapshot.location, written)
            raise


def _matched_beside_write(spark: SparkSession, snapshot: Snapshot, candidates: Sequence[DataFile],
                          resolved: ResolvedMerge, joined: DataFrame, src: DataFrame, layout: FileLayout,
                          position: Column, observation: Observation) -> DvRewriteResult | None:
    """A MERGE whose every source row writes the same row matched or not
    (SourceSide.same_row_either_way): the source's rows are written in the job that streams the
    target's keys past the broadcast source, whose observed pairs then give the positions to
    mark and the counts; the join's own rows write nothing. The written files are deleted
    again when the pairs break the multiple-match rule, or when a source row matched two target
    rows (None: the general plan then writes one updated row per match)."""
    rows = (src.withColumn(ACTION_COL, first_applicable(resolved, resolved.not_matched, DROP))
            .filter(_written(resolved, resolved.not_matched)).select(*outputs(resolved, resolved.not_matched, False)))
    nothing = resolved.derive(("dv-no-rows",), lambda: [F.lit(None).cast(f.dataType).alias(f.name)
                                                       for f in resolved.output_schema.fields])
    matching = (_observed(resolved, joined, resolved.matched, observation, position, narrow=True,
                          also=[long_list(F.col(SOURCE_ROW_ID)).alias(_JOINED_ROW_IDS)])
                .filter(_written(resolved, [])).select(*nothing))  # no row, every row observed (see _written)
    with phase(spark, "dvMatchWrite"):
        written = write_frame(spark, snapshot, rows, resolved, layout, alongside=matching)
    try:
        values = observed_row(spark, observation, _is_id_list)
        changed, matched = _positions(values.pop(_MATCHED, None))
        joined_ids = longs(values.pop(_JOINED_ROW_IDS, None))
        if _repeats(joined_ids):
            delete_written(spark, snapshot.location, written)
            return None
        counts = _checked_counts(snapshot, candidates, resolved, values, matched)
        with phase(spark, "dvVectors"):
            return DvRewriteResult(written, {**counts, **_inserted(counts, written)},
                                   _changes(snapshot, candidates, changed))
    except BaseException:
        delete_written(spark, snapshot.location, written)
        raise


def _checked_counts(snapshot: Snapshot, candidates: Sequence[DataFile], resolved: ResolvedMerge,
                    values: dict[str, Any], matched: np.ndarray) -> dict[str, int]:
    """The observed target row counts (see _row_counts), after Delta's multiple-match rule
    (``matched``: one number per matched pair, see _positions) and its exemption: under a lone
    unconditional DELETE a row matched twice is deleted once, and counted once. The inserted
    rows are counted from the written files (_inserted)."""
    counts = _row_counts(values)
    if not resolved.clauses.is_only_one_unconditional_delete:
        _check_single_matches(snapshot, candidates, matched)
    else:
        counts["numTargetRowsMatchedDeleted"] = len(np.unique(matched))
    return counts


def _row_counts(values: dict[str, Any]) -> dict[str, int]:
    """The target row counts from the observed ``values`` (none observed: Spark proved the
    joined rows empty, e.g. no candidate file, and all are zero): a DV MERGE copies no row."""
    counts = {name: int(values.get(name) or 0) for name in _TARGET_COUNTS}
    counts["numTargetRowsCopied"] = 0
    return counts


def _repeats(ids: np.ndarray) -> bool:
    """Whether an id occurs twice: a source row that matched two target rows."""
    return len(np.unique(ids)) < len(ids)


def _inserted(counts: dict[str, int], written: Sequence[WrittenFile]) -> dict[str, int]:
    """The inserted rows: a DV MERGE copies no row, so every written row that no update wrote."""
    return {"numTargetRowsInserted": (sum(w.num_records for w in written if not w.change_data)
                                      - counts["numTargetRowsMatchedUpdated"]
                                      - counts["numTargetRowsNotMatchedBySourceUpdated"])}


def _is_id_list(name: str) -> bool:
    """Whether an observed field is one of the id lists (observed_longs.long_list)."""
    return name in (_MATCHED, _JOINED_ROW_IDS) or name.startswith(_UPDATED_ROW_IDS)


def _observed(resolved: ResolvedMerge, joined: DataFrame, clauses: Sequence[ResolvedClause],
              observation: Observation, position: Column, *, narrow: bool = False,
              also: Sequence[Column] = ()) -> DataFrame:
    """The joined rows narrowed to the output columns of ``clauses`` (with ``narrow``, none),
    the action and the source row id, observed: the per-clause counts, the positions of the
    matched and changed target rows, and ``also``. Spark runs an observation outside generated
    code on a copy of each row, so it sits on this narrow row (see rewrite.observed_output)."""
    with_action = joined.withColumn(ACTION_COL, _action(resolved))
    rows = with_action.select(*([] if narrow else outputs(resolved, clauses, False)), F.col(ACTION_COL),
                              F.col(SOURCE_ROW_ID), _packed_position(resolved, position).alias(_PACKED),
                              *(preimage_columns(resolved) if resolved.change_data and not narrow else []))
    return rows.observe(observation, *_target_counts(resolved),
                        long_list(F.col(_PACKED)).alias(_MATCHED), *also)


def _packed_position(resolved: ResolvedMerge, position: Column) -> Column:
    """One long per matched target row and per unmatched target row a NOT MATCHED BY SOURCE
    clause changes (NULL for the others): the candidate's position, whether a clause changed the
    row, and its row index, packed, and negated (less one) for an unmatched row. Longs, gathered
    as one text, keep the observation cheap: arrays a row cost 0.4 s per 80k rows here."""
    target_present = F.col(TARGET_PRESENT).isNotNull()
    changing = [c.code for c in (*resolved.matched, *resolved.not_matched_by_source)]
    changed = F.when(F.col(ACTION_COL).isin(changing), F.lit(1 << _ROW_BITS)).otherwise(F.lit(0)).cast("long")
    packed = (F.shiftleft(position.cast("long"), _ROW_BITS + 1).bitwiseOR(changed)
              .bitwiseOR(F.col(ROW_INDEX_COL)))
    by_source = [c.code for c in resolved.not_matched_by_source]
    return F.when(F.col(SOURCE_PRESENT).isNotNull() & target_present, packed).when(
        target_present & F.col(ACTION_COL).isin(by_source), F.lit(-1) - packed)


def _names(resolved: ResolvedMerge) -> list[str]:
    """The columns a written row carries up to the write: the output columns, and with change
    data the action and the target's values (see _with_changes)."""
    names = [f"`{f.name}`" for f in resolved.output_schema.fields]
    if resolved.change_data:
        names += [ACTION_COL, *preimage_names(resolved.output_schema)]
    return names


def _with_changes(resolved: ResolvedMerge, rows: DataFrame) -> DataFrame:
    """The rows to write: as they are, or with change data their data and change rows."""
    return with_change_rows(resolved, rows, resolved.all, keep_copies=False) if resolved.change_data else rows


def _written(resolved: ResolvedMerge, clauses: Sequence[ResolvedClause]) -> Column:
    """Whether a row of ``clauses``' actions is written: an update or an insert, and with change
    data a delete too (as its change row). With none of those nothing is written, but the job
    must still read every row for the observation: a filter Spark can prove false would make it
    drop the whole subtree."""
    codes = [c.code for c in clauses] if resolved.change_data else codes_of(clauses, delete=False)
    return F.col(ACTION_COL).isin(codes) if codes else F.spark_partition_id() < 0


@dataclass(frozen=True)
class _StreamedColumns:
    """The expressions of _streamed_past_source that depend on the resolved MERGE only: built
    once per resolution (``ResolvedMerge.derive``), not per micro-batch (a few JVM calls each)."""

    written: list[Column]  # the written row's columns (see _names)
    unmatched_target: Column  # a target row no source row joined, that a clause changes
    matched_written: Column  # a joined row a clause writes
    joined: Column  # a joined row (it has a source row)
    joined_rows: list[Column]
    source_action: Column  # the NOT MATCHED clause a source row takes (DROP: none)
    source_rows: list[Column]  # a source row as a possible insert, over its action
    row_id: Column
    source_row_joined: Column  # whether any joined row carries the row's source row id
    kept: Column  # an update of a joined row, or a source row no target row joined (an insert)

    @classmethod
    def of(cls, resolved: ResolvedMerge) -> _StreamedColumns:
        target_side = [*resolved.matched, *resolved.not_matched_by_source]
        written = [F.col(n) for n in _names(resolved)]
        updated = _written(resolved, target_side)
        row_id = F.col(SOURCE_ROW_ID)
        is_insert = (F.col(_BRANCH) == 0) & (F.col(_JOINED) == 0) & (F.col(ACTION_COL) != DROP)
        return cls(
            written=written,
            unmatched_target=row_id.isNull() & updated,
            matched_written=row_id.isNotNull() & updated,
            joined=row_id.isNotNull(),
            joined_rows=[*written, *([] if resolved.change_data else [F.col(ACTION_COL)]), row_id,
                         F.lit(1).alias(_BRANCH)],
            source_action=first_applicable(resolved, resolved.not_matched, DROP),
            source_rows=[*outputs(resolved, resolved.not_matched, False), F.col(ACTION_COL), row_id,
                         F.lit(0).alias(_BRANCH),
                         *(preimage_columns(resolved, present=False) if resolved.change_data else [])],
            row_id=row_id,
            source_row_joined=F.max(_BRANCH).over(Window.partitionBy(row_id)).alias(_JOINED),
            kept=((F.col(_BRANCH) == 1) & updated) | is_insert,
        )


def _streamed_past_source(spark: SparkSession, resolved: ResolvedMerge, tgt: DataFrame, src: DataFrame,
                          layout: FileLayout, observation: Observation, position: Column) -> DataFrame:
    """The rows to write when the source is broadcast and the target's rows stream past it, so
    that no target row crosses a shuffle: the joined rows (matched, and with NOT MATCHED BY
    SOURCE clauses the unmatched target rows) give the updates; the inserts are the source rows
    that no target row joined, found in the same job by meeting the joined rows' source row ids
    with the source's own rows in a shuffle of the source's size, not the target's."""
    target_side = [*resolved.matched, *resolved.not_matched_by_source]
    columns = resolved.derive(("dv-streamed-columns",), lambda: _StreamedColumns.of(resolved))
    joined = tgt.join(F.broadcast(src), resolved.condition, "left_outer" if resolved.not_matched_by_source else "inner")
    observed = _observed(resolved, joined, target_side, observation, position)
    # Built only where used: each DataFrame operation is an analysis (~2-3 ms a batch).
    unmatched_target = (observed.filter(columns.unmatched_target).select(*columns.written)
                        if resolved.not_matched_by_source else None)
    if not resolved.not_matched:
        written = observed.filter(columns.matched_written).select(*columns.written)
        return _with_changes(resolved, written.unionByName(unmatched_target) if unmatched_target is not None
                             else written)
    joined_rows = observed.filter(columns.joined).select(*columns.joined_rows)
    source_rows = src.withColumn(ACTION_COL, columns.source_action).select(*columns.source_rows)
    met = (joined_rows.unionByName(source_rows).repartition(max(1, layout.files(task_slots(spark))), columns.row_id)
           .select("*", columns.source_row_joined))
    kept = met.filter(columns.kept).select(*columns.written)
    return _with_changes(resolved, kept.unionByName(unmatched_target) if unmatched_target is not None else kept)


def _action(resolved: ResolvedMerge) -> Column:
    source_present = F.col(SOURCE_PRESENT).isNotNull()
    target_present = F.col(TARGET_PRESENT).isNotNull()
    return (F.when(source_present & target_present, first_applicable(resolved, resolved.matched, COPY))
            .when(source_present, first_applicable(resolved, resolved.not_matched, DROP))
            .when(target_present, first_applicable(resolved, resolved.not_matched_by_source, COPY))
            .otherwise(F.lit(DROP)))


# What happened to target rows, but for the copied ones: a DV MERGE copies none.
_TARGET_COUNTS = TARGET_ROW_COUNTS[1:]


def _target_counts(resolved: ResolvedMerge) -> list[Column]:
    assert TARGET_ROW_COUNTS[0] == "numTargetRowsCopied"
    return target_row_counts(resolved)[1:]


def _positions(observed: object) -> tuple[np.ndarray, np.ndarray]:
    """From the observed text (see _packed_position): the changed target rows as (candidate
    position, row index) pairs, and the matched target rows as one number each (the same for the
    same row), for the multiple-match check."""
    values = longs(observed)
    unmatched = values < 0
    values = np.where(unmatched, -1 - values, values)
    changed = (values >> _ROW_BITS) & 1 == 1
    rows = values & ((1 << _ROW_BITS) - 1)
    positions = (values >> (_ROW_BITS + 1)) - 1  # array_position is 1-based
    row_of = (positions << _ROW_BITS) | rows
    return np.stack([positions[changed], rows[changed]], axis=1), row_of[~unmatched]


def _changes(snapshot: Snapshot, candidates: Sequence[DataFile], changed: np.ndarray) -> DeletionVectorChanges:
    """The changed rows grouped by candidate (one sort, not a scan of every pair per file)."""
    if not len(changed):
        return DeletionVectorChanges([], [])
    changed = changed[np.lexsort((changed[:, 1], changed[:, 0]))]
    positions, starts = np.unique(changed[:, 0], return_index=True)
    deleted = {int(p): np.unique(rows) for p, rows in zip(positions, np.split(changed[:, 1], starts[1:]), strict=True)}
    return deletion_vector_changes(snapshot, candidates, deleted)


def _check_single_matches(snapshot: Snapshot, candidates: Sequence[DataFile], matched: np.ndarray) -> None:
    """Delta's multiple-match rule: every ON match counts, whatever the clause conditions
    (``matched``: one number per matched pair, the same for the same target row)."""
    rows, counts = np.unique(matched, return_counts=True)
    twice = np.nonzero(counts > 1)[0]
    if not len(twice):
        return
    offending: list[tuple[dict[str, object], int]] = []
    for index in twice[np.argsort(-counts[twice], kind="stable")][:MAX_REPORTED_ROWS]:
        position, row = int(rows[index]) >> _ROW_BITS, int(rows[index]) & ((1 << _ROW_BITS) - 1)
        offending.append(({"file": snapshot.absolute_path(candidates[position].path), "row_index": row},
                          int(counts[index])))
    listing = "; ".join(", ".join(f"{k}={v!r}" for k, v in key.items()) + f" (matched by {count} source rows)"
                        for key, count in offending)
    raise MultipleSourceRowMatchingTargetRowError(
        f"{MULTIPLE_MATCH_MESSAGE} Offending target rows (up to {MAX_REPORTED_ROWS}): {listing}.", offending)
