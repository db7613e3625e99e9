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
inserts are found in the same job (see _streamed_past_source).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from pyroaring import BitMap64
from pyspark.sql import Column, DataFrame, Observation, SparkSession, Window
from pyspark.sql import functions as F

from streaming_merge._profile import phase
from streaming_merge._slots import task_slots
from streaming_merge.errors import MultipleSourceRowMatchingTargetRowError
from streaming_merge.merge.resolve import SOURCE_PRESENT, TARGET_PRESENT, ResolvedMerge
from streaming_merge.merge.rewrite import (
    ACTION_COL,
    COPY,
    DROP,
    FileLayout,
    RowAggregate,
    action_count,
    codes_of,
    first_applicable,
    observed_output,
    observed_values,
    outputs,
    write_frame,
)
from streaming_merge.merge.touched import FILE_ID_COL, MAX_REPORTED_ROWS, MULTIPLE_MATCH_MESSAGE, scan_with_file_ids
from streaming_merge.table.dv_filter import deleted_positions
from streaming_merge.table.file_ids import FileIds
from streaming_merge.table.snapshot import DataFile, Snapshot
from streaming_merge.table.spark_paths import ROW_INDEX_COL
from streaming_merge.table.write import WrittenFile, delete_written

log = logging.getLogger(__name__)

SOURCE_ROW_ID = "__sm_source_row_id__"
_MATCHED = "matchedTargetRows"
_BRANCH = "__sm_joined_branch__"  # 1: a row of the join, 0: a source row (a possible insert)
_JOINED = "__sm_source_row_joined__"


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
    for position, rows in sorted(deleted.items()):
        file = files[position]
        bitmap = BitMap64(rows.tolist())
        if file.deletion_vector is not None:
            bitmap |= BitMap64(deleted_positions(snapshot, file).tolist())
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
) -> DvRewriteResult:
    """Join the candidates with the source, write the updated and inserted rows, and return the
    rows to mark deleted, in one Spark job (plus the broadcast's)."""
    ids = FileIds.of(spark, snapshot, candidates)
    target = scan_with_file_ids(spark, snapshot, candidates, resolved, ids, keep_row_index=True)
    src = (source.withColumn(SOURCE_ROW_ID, F.monotonically_increasing_id())
           .alias(resolved.source_alias).withColumn(SOURCE_PRESENT, F.lit(True)))
    tgt = target.alias(resolved.target_alias).withColumn(TARGET_PRESENT, F.lit(True))
    observation, inserted = Observation(), Observation()
    if broadcast_source:
        output = _streamed_past_source(spark, resolved, tgt, src, layout, observation, inserted)
    else:  # a source too large to broadcast: one shuffled join, source rows preserved for the inserts
        join = ("full_outer" if resolved.not_matched else "left_outer") if resolved.not_matched_by_source else (
            "right_outer" if resolved.not_matched else "inner")
        with_action = tgt.join(src, resolved.condition, join).withColumn(ACTION_COL, _action(resolved))
        output = observed_output(resolved, with_action, resolved.all, False,
                                 [DROP, COPY, *codes_of(resolved.all, delete=True)], observation,
                                 [*_target_counts(resolved), _inserted_count(resolved)], [_pairs(resolved)])
    with phase(spark, "dvJoinWrite"):
        written = write_frame(spark, snapshot, output, resolved, layout)
    try:
        values = {**observed_values(observation), **observed_values(inserted)}
        pairs_found = _matched_pairs(values.pop(_MATCHED, None))
        matches = pairs_found[pairs_found[:, 3] >= 0]  # the unmatched target rows a clause changed: -1
        counts_found = {k: int(v or 0) for k, v in values.items()}
        counts_found["numTargetRowsCopied"] = 0
        if not resolved.clauses.is_only_one_unconditional_delete:
            _check_single_matches(snapshot, candidates, ids, matches)
        else:  # a row matched twice is deleted once, and counted once (as Delta does)
            counts_found["numTargetRowsMatchedDeleted"] = len(np.unique(matches[:, :2], axis=0))
    except BaseException:
        delete_written(spark, snapshot.location, written)
        raise
    with phase(spark, "dvVectors"):
        return DvRewriteResult(written, counts_found,
                               _changes(spark, snapshot, candidates, ids, pairs_found, written))


def _streamed_past_source(spark: SparkSession, resolved: ResolvedMerge, tgt: DataFrame, src: DataFrame,
                          layout: FileLayout, observation: Observation, inserted: Observation) -> DataFrame:
    """The rows to write when the source is broadcast and the target's rows stream past it, so
    that no target row crosses a shuffle: the joined rows (matched, and with NOT MATCHED BY
    SOURCE clauses the unmatched target rows) give the updates; the inserts are the source rows
    that no target row joined, found in the same job by meeting the joined rows' source row ids
    with the source's own rows in a shuffle of the source's size, not the target's."""
    target_side = [*resolved.matched, *resolved.not_matched_by_source]
    joined = tgt.join(F.broadcast(src), resolved.condition,
                      "left_outer" if resolved.not_matched_by_source else "inner").withColumn(ACTION_COL,
                                                                                              _action(resolved))
    pairs = _pairs(resolved)
    narrow = joined.select(*outputs(resolved, target_side, False), F.col(ACTION_COL), F.col(SOURCE_ROW_ID),
                           pairs.value.alias(pairs.input_column))
    observed = narrow.observe(observation, *_target_counts(resolved),
                              pairs.aggregate(F.col(pairs.input_column)).alias(pairs.name))
    names = [f"`{f.name}`" for f in resolved.output_schema.fields]
    update_codes = codes_of(target_side, delete=False)
    # With no update clause nothing of the join is written, but the job must still read every row
    # for the observation: a filter Spark can prove false would make it drop the whole subtree.
    updated = F.col(ACTION_COL).isin(update_codes) if update_codes else F.spark_partition_id() < 0
    unmatched_target = observed.filter(F.col(SOURCE_ROW_ID).isNull() & updated).select(*names)
    if not resolved.not_matched:
        written = observed.filter(F.col(SOURCE_ROW_ID).isNotNull() & updated).select(*names)
        return written.unionByName(unmatched_target) if resolved.not_matched_by_source else written
    joined_rows = observed.filter(F.col(SOURCE_ROW_ID).isNotNull()).select(
        *names, F.col(ACTION_COL), F.col(SOURCE_ROW_ID), F.lit(1).alias(_BRANCH))
    source_rows = (src.withColumn(ACTION_COL, first_applicable(resolved, resolved.not_matched, DROP))
                   .select(*outputs(resolved, resolved.not_matched, False), F.col(ACTION_COL), F.col(SOURCE_ROW_ID),
                           F.lit(0).alias(_BRANCH)))
    row_id = F.col(SOURCE_ROW_ID)
    met = (joined_rows.unionByName(source_rows).repartition(max(1, layout.files(task_slots(spark))), row_id)
           .withColumn(_JOINED, F.max(_BRANCH).over(Window.partitionBy(row_id))))
    is_insert = (F.col(_BRANCH) == 0) & (F.col(_JOINED) == 0) & (F.col(ACTION_COL) != DROP)
    kept = met.filter(((F.col(_BRANCH) == 1) & updated) | is_insert).observe(
        inserted, F.sum(F.when(is_insert, 1).otherwise(0)).alias("numTargetRowsInserted")).select(*names)
    return kept.unionByName(unmatched_target) if resolved.not_matched_by_source else kept


def _action(resolved: ResolvedMerge) -> Column:
    source_present = F.col(SOURCE_PRESENT).isNotNull()
    target_present = F.col(TARGET_PRESENT).isNotNull()
    return (F.when(source_present & target_present, first_applicable(resolved, resolved.matched, COPY))
            .when(source_present, first_applicable(resolved, resolved.not_matched, DROP))
            .when(target_present, first_applicable(resolved, resolved.not_matched_by_source, COPY))
            .otherwise(F.lit(DROP)))


def _target_counts(resolved: ResolvedMerge) -> list[Column]:
    return [action_count(resolved, codes_of(resolved.matched, delete=False), "numTargetRowsMatchedUpdated"),
            action_count(resolved, codes_of(resolved.matched, delete=True), "numTargetRowsMatchedDeleted"),
            action_count(resolved, codes_of(resolved.not_matched_by_source, delete=False),
                         "numTargetRowsNotMatchedBySourceUpdated"),
            action_count(resolved, codes_of(resolved.not_matched_by_source, delete=True),
                         "numTargetRowsNotMatchedBySourceDeleted")]


def _inserted_count(resolved: ResolvedMerge) -> Column:
    return action_count(resolved, codes_of(resolved.not_matched, delete=False), "numTargetRowsInserted")


def _pairs(resolved: ResolvedMerge) -> RowAggregate:
    return resolved.derive(("dv-matched-pairs",), lambda: _matched_pairs_aggregate(resolved))


def _changes(spark: SparkSession, snapshot: Snapshot, candidates: Sequence[DataFile], ids: FileIds,
             pairs_found: np.ndarray, written: list[WrittenFile]) -> DeletionVectorChanges:
    """The changed rows grouped by file (one sort, not a scan of every pair per file)."""
    changed = pairs_found[pairs_found[:, 2] == 1]
    if not len(changed):
        return DeletionVectorChanges([], [])
    changed = changed[np.lexsort((changed[:, 1], changed[:, 0]))]
    file_ids, starts = np.unique(changed[:, 0], return_index=True)
    deleted: dict[int, np.ndarray] = {}
    for file_id, rows in zip(file_ids, np.split(changed[:, 1], starts[1:]), strict=True):
        position = ids.position(int(file_id))
        if position is None:
            delete_written(spark, snapshot.location, written)
            raise AssertionError(f"MERGE observed a file id that is no candidate's: {file_id}")
        deleted[position] = np.unique(rows)
    return deletion_vector_changes(snapshot, candidates, deleted)


def _matched_pairs_aggregate(resolved: ResolvedMerge) -> RowAggregate:
    """Every matched pair as [file id, row index, 1 if a clause changed the row, source row id],
    and every unmatched target row a NOT MATCHED BY SOURCE clause changed as [file id, row
    index, 1, -1], gathered as one text (see _as_text)."""
    target_present = F.col(TARGET_PRESENT).isNotNull()
    matched = F.col(SOURCE_PRESENT).isNotNull() & target_present
    changing = [c.code for c in (*resolved.matched, *resolved.not_matched_by_source)]
    changed = F.when(F.col(ACTION_COL).isin(changing), F.lit(1)).otherwise(F.lit(0))
    by_source = [c.code for c in resolved.not_matched_by_source]
    pair = F.when(matched, F.array(F.col(FILE_ID_COL), F.col(ROW_INDEX_COL), changed.cast("long"),
                                   F.col(SOURCE_ROW_ID))).when(
        target_present & F.col(ACTION_COL).isin(by_source),
        F.array(F.col(FILE_ID_COL), F.col(ROW_INDEX_COL), F.lit(1).cast("long"), F.lit(-1).cast("long")))
    return RowAggregate(_MATCHED, pair, _as_text)


def _as_text(pairs: Column) -> Column:
    """The pairs, flattened, as one comma-separated text: a single value across py4j, which numpy
    parses at C speed (a JSON list of lists took 0.2 s for 80k pairs, in Python objects)."""
    return F.concat_ws(",", F.flatten(F.collect_list(pairs)).cast("array<string>"))


def _matched_pairs(observed: object) -> np.ndarray:
    """The observed pairs as an (n, 4) array of (file id, row index, changed, source row id)."""
    if not observed:
        return np.zeros((0, 4), dtype=np.int64)
    return np.fromstring(str(observed), dtype=np.int64, sep=",").reshape(-1, 4)


def _check_single_matches(snapshot: Snapshot, candidates: Sequence[DataFile], ids: FileIds,
                          matches: np.ndarray) -> None:
    """Delta's multiple-match rule: every ON match counts, whatever the clause conditions."""
    ordered = matches[np.lexsort((matches[:, 1], matches[:, 0])), :2]
    if not ((ordered[1:] == ordered[:-1]).all(axis=1)).any():  # no pair twice: the usual case, one sort
        return
    rows, counts = np.unique(matches[:, :2], axis=0, return_counts=True)
    twice = np.nonzero(counts > 1)[0]
    if not len(twice):
        return
    offending: list[tuple[dict[str, object], int]] = []
    for index in twice[np.argsort(-counts[twice], kind="stable")][:MAX_REPORTED_ROWS]:
        position = ids.position(int(rows[index, 0]))
        path = snapshot.absolute_path(candidates[position].path) if position is not None else "?"
        offending.append(({"file": path, "row_index": int(rows[index, 1])}, int(counts[index])))
    listing = "; ".join(", ".join(f"{k}={v!r}" for k, v in key.items()) + f" (matched by {count} source rows)"
                        for key, count in offending)
    raise MultipleSourceRowMatchingTargetRowError(
        f"{MULTIPLE_MATCH_MESSAGE} Offending target rows (up to {MAX_REPORTED_ROWS}): {listing}.", offending)
