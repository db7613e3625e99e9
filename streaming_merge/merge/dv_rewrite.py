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
source is broadcast past a large target (no exchange of the target's rows), the inserts are
the source rows no pair names, written by a second job.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from pyroaring import BitMap64
from pyspark.sql import Column, DataFrame, Observation, SparkSession
from pyspark.sql import functions as F

from streaming_merge._profile import phase
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
    write_frame,
)
from streaming_merge.merge.touched import FILE_ID_COL, MAX_REPORTED_ROWS, MULTIPLE_MATCH_MESSAGE, scan_with_file_ids
from streaming_merge.table.dv_filter import bitset_membership, deleted_positions
from streaming_merge.table.file_ids import FileIds
from streaming_merge.table.snapshot import DataFile, Snapshot
from streaming_merge.table.spark_paths import ROW_INDEX_COL
from streaming_merge.table.write import WrittenFile, delete_written

log = logging.getLogger(__name__)

SOURCE_ROW_ID = "__sm_source_row_id__"
_MATCHED = "matchedTargetRows"


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
    broadcast_scan: bool,
) -> DvRewriteResult:
    """Join the candidates with the source, write the updated and inserted rows, and return the
    rows to mark deleted. ``broadcast_scan``: the source is broadcast and the candidates streamed
    past it (a large target), the inserts then come from a second job."""
    ids = FileIds.of(spark, snapshot, candidates)
    target = scan_with_file_ids(spark, snapshot, candidates, resolved, ids, keep_row_index=True)
    inserts_apart = bool(resolved.not_matched) and broadcast_source and broadcast_scan
    by_source = bool(resolved.not_matched_by_source)  # every candidate row joins, matched or not
    src = (source.withColumn(SOURCE_ROW_ID, F.monotonically_increasing_id())
           .alias(resolved.source_alias).withColumn(SOURCE_PRESENT, F.lit(True)))
    tgt = target.alias(resolved.target_alias).withColumn(TARGET_PRESENT, F.lit(True))
    if resolved.not_matched and not inserts_apart:
        joined = tgt.join(src, resolved.condition, "full_outer" if by_source else "right_outer")
    else:  # the target streams past the source, broadcast when it fits
        joined = tgt.join(F.broadcast(src) if broadcast_source else src, resolved.condition,
                          "left_outer" if by_source else "inner")

    source_present = F.col(SOURCE_PRESENT).isNotNull()
    target_present = F.col(TARGET_PRESENT).isNotNull()
    action = (F.when(source_present & target_present, first_applicable(resolved, resolved.matched, COPY))
              .when(source_present, first_applicable(resolved, resolved.not_matched, DROP))
              .when(target_present, first_applicable(resolved, resolved.not_matched_by_source, COPY))
              .otherwise(F.lit(DROP)))
    observation = Observation()
    counts = [action_count(resolved, codes_of(resolved.matched, delete=False), "numTargetRowsMatchedUpdated"),
              action_count(resolved, codes_of(resolved.matched, delete=True), "numTargetRowsMatchedDeleted"),
              action_count(resolved, codes_of(resolved.not_matched, delete=False), "numTargetRowsInserted"),
              action_count(resolved, codes_of(resolved.not_matched_by_source, delete=False),
                           "numTargetRowsNotMatchedBySourceUpdated"),
              action_count(resolved, codes_of(resolved.not_matched_by_source, delete=True),
                           "numTargetRowsNotMatchedBySourceDeleted")]
    pairs = resolved.derive(("dv-matched-pairs",), lambda: _matched_pairs_aggregate(resolved))
    output = observed_output(resolved, joined.withColumn(ACTION_COL, action), resolved.all, False,
                             [DROP, COPY, *codes_of(resolved.all, delete=True)], observation, counts, [pairs])
    with phase(spark, "dvJoinWrite"):
        written = write_frame(spark, snapshot, output, resolved, layout)
    try:
        values = observed_values(observation)
        pairs_found = _matched_pairs(values.pop(_MATCHED, None))
        matches = pairs_found[pairs_found[:, 3] >= 0]  # the unmatched target rows a clause changed: -1
        counts_found = {k: int(v or 0) for k, v in values.items()}
        counts_found["numTargetRowsCopied"] = 0
        if not resolved.clauses.is_only_one_unconditional_delete:
            _check_single_matches(snapshot, candidates, ids, matches)
        else:  # a row matched twice is deleted once, and counted once (as Delta does)
            counts_found["numTargetRowsMatchedDeleted"] = len(np.unique(matches[:, :2], axis=0))
        if inserts_apart:
            with phase(spark, "dvInserts", "MERGE operation - writing the source rows no target row matched"):
                written += _write_inserts(spark, snapshot, src, resolved, layout, matches[:, 3], counts_found)
    except BaseException:
        delete_written(spark, snapshot.location, written)
        raise
    with phase(spark, "dvVectors"):
        return DvRewriteResult(written, counts_found,
                               _changes(spark, snapshot, candidates, ids, pairs_found, written))


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
    index, 1, -1], gathered as one JSON text (one value across py4j, not a proxy per element)."""
    target_present = F.col(TARGET_PRESENT).isNotNull()
    matched = F.col(SOURCE_PRESENT).isNotNull() & target_present
    changing = [c.code for c in (*resolved.matched, *resolved.not_matched_by_source)]
    changed = F.when(F.col(ACTION_COL).isin(changing), F.lit(1)).otherwise(F.lit(0))
    by_source = [c.code for c in resolved.not_matched_by_source]
    pair = F.when(matched, F.array(F.col(FILE_ID_COL), F.col(ROW_INDEX_COL), changed.cast("long"),
                                   F.col(SOURCE_ROW_ID))).when(
        target_present & F.col(ACTION_COL).isin(by_source),
        F.array(F.col(FILE_ID_COL), F.col(ROW_INDEX_COL), F.lit(1).cast("long"), F.lit(-1).cast("long")))
    return RowAggregate(_MATCHED, pair, lambda column: F.to_json(F.collect_list(column)))


def _matched_pairs(observed: object) -> np.ndarray:
    """The observed pairs as an (n, 4) array of (file id, row index, changed, source row id)."""
    if not observed:
        return np.zeros((0, 4), dtype=np.int64)
    return np.asarray(json.loads(str(observed)), dtype=np.int64).reshape(-1, 4)


def _check_single_matches(snapshot: Snapshot, candidates: Sequence[DataFile], ids: FileIds,
                          matches: np.ndarray) -> None:
    """Delta's multiple-match rule: every ON match counts, whatever the clause conditions."""
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


def _write_inserts(spark: SparkSession, snapshot: Snapshot, src: DataFrame, resolved: ResolvedMerge,
                   layout: FileLayout, matched_rows: np.ndarray, counts: dict[str, int]) -> list[WrittenFile]:
    """The source rows no target row matched, through the NOT MATCHED clauses, as new files.

    A source row's id is Spark's ``monotonically_increasing_id`` (its partition in the high bits,
    its position in the partition below), the same in both jobs over the materialized source;
    the matched ids are a constant bitset per partition (no broadcast, no join)."""
    unmatched = src
    if len(matched_rows):
        partitions = matched_rows >> _PARTITION_SHIFT
        rows = matched_rows & _ROW_MASK
        sets = {int(p): (rows[partitions == p], 0) for p in np.unique(partitions)}
        row_id = F.col(SOURCE_ROW_ID)
        matched = bitset_membership(F.shiftright(row_id, _PARTITION_SHIFT), row_id.bitwiseAND(F.lit(_ROW_MASK)), sets)
        unmatched = src.filter(~matched)
    observation = Observation()
    action: Column = first_applicable(resolved, resolved.not_matched, DROP)
    output = observed_output(resolved, unmatched.withColumn(ACTION_COL, action), resolved.not_matched, False,
                             [DROP], observation,
                             [action_count(resolved, codes_of(resolved.not_matched, delete=False),
                                           "numTargetRowsInserted")])
    written = write_frame(spark, snapshot, output, resolved, layout)
    counts["numTargetRowsInserted"] = int(observed_values(observation).get("numTargetRowsInserted") or 0)
    return written


# monotonically_increasing_id: the partition index above bit 33, the row's position below.
_PARTITION_SHIFT = 33
_ROW_MASK = (1 << _PARTITION_SHIFT) - 1
