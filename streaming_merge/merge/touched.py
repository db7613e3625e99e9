"""findTouchedFiles: which target files hold rows this MERGE changes, and multiple matches.

One Spark job joins the source with the data-skipped target files (each target row
carrying its file, as an int id, and its row index inside the file), counts the matches per target row,
and folds them per file. Only the per-file summary (one row per candidate file) comes
back to the driver; offending rows are fetched (at most ten) only when the
multiple-match check fails.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from streaming_merge.errors import InvalidArgumentError, MultipleSourceRowMatchingTargetRowError
from streaming_merge.merge.materialize import storage_level
from streaming_merge.merge.resolve import (
    SOURCE_PRESENT,
    TARGET_PRESENT,
    ResolvedClause,
    ResolvedMerge,
    qualified,
)
from streaming_merge.spark.slots import task_slots
from streaming_merge.table.file_ids import FileIds
from streaming_merge.table.scan import ROW_INDEX_COL, scan_files
from streaming_merge.table.snapshot import DataFile, Snapshot

MAX_REPORTED_ROWS = 10

MULTIPLE_MATCH_MESSAGE = (
    "Cannot perform Merge as multiple source rows matched and attempted to modify the same target row in "
    "the Delta table in possibly conflicting ways. By SQL semantics of Merge, when multiple source rows "
    "match on the same target row, the result may be ambiguous as it is unclear which source row should "
    "be used to update or delete the matching target row. You can preprocess the source table to "
    "eliminate the possibility of multiple matches."
)


@dataclass(frozen=True)
class TouchedFiles:
    files: list[DataFile]
    matched_target_rows: int
    # Source rows that matched no target row in the candidate files (the inserts), kept
    # from the join when the caller asked for them; ``checkpoint`` holds their blocks.
    unmatched_source: DataFrame | None = None
    checkpoint: DataFrame | None = None


TOUCH_COL = "__sm_touch__"
FILE_ID_COL = "__sm_file_id__"


def any_of(clauses: Sequence[ResolvedClause]) -> Column:
    """True when some clause of the list could apply (an unconditional one always can)."""
    result: Column | None = None
    for clause in clauses:
        if clause.condition is None:
            return F.lit(True)
        result = clause.condition if result is None else (result | clause.condition)
    return result if result is not None else F.lit(False)


def join_partitions(spark: SparkSession, num_bytes: int) -> int:
    """Shuffle partitions for a MERGE join over ``num_bytes`` of target files: enough to use
    every core on big inputs, one for small ones (each empty task costs milliseconds)."""
    parallelism = task_slots(spark)
    return max(1, min(parallelism, -(-num_bytes // _BYTES_PER_JOIN_PARTITION)))


_BYTES_PER_JOIN_PARTITION = 8 * 1024 * 1024


def find_touched_files(
    spark: SparkSession,
    snapshot: Snapshot,
    candidates: Sequence[DataFile],
    source: DataFrame,
    resolved: ResolvedMerge,
    key_pairs: Sequence[tuple[str, str]],
    *,
    keep_unmatched_source: str | None = None,
    single_match: bool = False,
    broadcast_source: bool = False,
) -> TouchedFiles:
    """Touched files among ``candidates``; raises on multiple matches (Delta's rule).

    One Spark job: source and target (key columns and row ids only) are hash-partitioned on
    the join keys and joined without a broadcast, then the matches are counted per target
    row and folded per file. With ``keep_unmatched_source`` (a storage level) the join is a
    left outer join from the source and is checkpointed as it is computed, so the source
    rows that matched nothing (the inserts) can be written later without joining again.
    ``single_match``: the caller proved that no target row can match twice (unique source
    keys joined by equality of the same types), so the per-row count and its shuffle go.

    ``broadcast_source``: the caller found the source small enough to broadcast and the
    target big enough that shuffling all its keys costs more than the broadcast's job; the
    target's keys are then streamed past the broadcast source (an inner join, nothing of the
    target shuffled). The unmatched source rows are then those whose key no match carried
    (``key_pairs`` must decide matching alone, ``matches_by_key``): a left anti join of two
    small sides, evaluated by whoever reads them.
    """
    source_alias, target_alias = resolved.source_alias, resolved.target_alias
    if not candidates:
        return TouchedFiles([], 0, source if keep_unmatched_source else None)
    partitions = join_partitions(spark, sum(f.size for f in candidates))
    file_ids = FileIds.of(spark, snapshot, candidates)
    src = source
    tgt = scan_with_file_ids(spark, snapshot, candidates, resolved, file_ids, keep_row_index=True)
    has_nmbs = bool(resolved.not_matched_by_source)
    source_columns = [c for c in source.columns if c not in (SOURCE_PRESENT, TARGET_PRESENT)]
    keep = bool(keep_unmatched_source)
    built = resolved.derive(
        ("touched", broadcast_source, keep, tuple(key_pairs), tuple(source_columns)),
        lambda: _expressions(resolved, key_pairs, source_columns, keep, broadcast_source))
    if broadcast_source:
        if has_nmbs or (keep_unmatched_source and not key_pairs):
            raise InvalidArgumentError(
                "a broadcast findTouchedFiles keeps no unmatched target rows and finds the unmatched "
                             "source rows by key")
        src = F.broadcast(src.alias(source_alias).withColumn(SOURCE_PRESENT, built.present))
        tgt = tgt.alias(target_alias).withColumn(TARGET_PRESENT, built.present)
        joined = tgt.join(src, resolved.condition, "inner")
    else:
        if key_pairs:
            src = src.repartition(partitions, *built.source_keys)
            tgt = tgt.repartition(partitions, *built.target_keys)
        src = src.alias(source_alias).withColumn(SOURCE_PRESENT, built.present).hint("shuffle_hash")
        tgt = tgt.alias(target_alias).withColumn(TARGET_PRESENT, built.present)
        join_type = "right_outer" if has_nmbs else "left_outer" if keep_unmatched_source else "inner"
        joined = src.join(tgt, resolved.condition, join_type)

    key_columns = [t for t, _ in key_pairs]
    rows = joined.select(*built.rows)
    checkpoint = None
    if keep_unmatched_source:
        rows = checkpoint = rows.localCheckpoint(eager=False, storageLevel=storage_level(keep_unmatched_source))
    per_row = rows.filter(built.in_candidate)
    if not single_match:  # count the matches of each target row: one more shuffle, of the matched rows
        per_row = (per_row.repartition(partitions, built.file_id)
                   .groupBy(FILE_ID_COL, ROW_INDEX_COL)
                   .agg(*built.per_row_counted))
    else:
        per_row = per_row.select(*built.per_row_single)
    per_file = per_row.groupBy(FILE_ID_COL).agg(*built.per_file)
    summary = per_file.collect()

    exempt = resolved.clauses.is_only_one_unconditional_delete
    if not exempt and any((row["max_matches"] or 0) > 1 for row in summary):
        offending = (per_row.filter(F.col("matches") > 1)
                     .orderBy(F.col("matches").desc()).limit(MAX_REPORTED_ROWS).collect())
        _raise_multiple_matches(offending, key_columns, snapshot, candidates, file_ids)

    touched = [candidates[_position(file_ids, row[FILE_ID_COL])] for row in summary if row["touch"]]
    matched_rows = sum(int(row["matched_rows"] or 0) for row in summary)
    unmatched = None
    if checkpoint is not None and broadcast_source:
        unmatched = _without_matched_keys(source, checkpoint, [s for _, s in key_pairs], partitions)
    elif checkpoint is not None:
        unmatched = checkpoint.filter(built.outside_candidates).select(*built.source_columns)
    return TouchedFiles(touched, matched_rows, unmatched, checkpoint)


def scan_with_file_ids(spark: SparkSession, snapshot: Snapshot, candidates: Sequence[DataFile],
                       resolved: ResolvedMerge, file_ids: FileIds, *, keep_row_index: bool,
                       present: bool = False) -> DataFrame:
    """The candidate files' rows, each with its file's id (FILE_ID_COL, see :class:`FileIds`),
    and with ``present`` the join's marker of a target row (TARGET_PRESENT, true).

    Every target row crosses a shuffle with its file's identity: a number instead of the path
    string, which at ~100 bytes a row was most of the shuffled bytes."""
    with_row_id = keep_row_index or file_ids.needs_paths
    scan = scan_files(spark, snapshot, candidates, with_row_id=with_row_id, schema=resolved.output_schema,
                      with_file_size=True, selected_after=True)
    # One projection, not a withColumn and a drop: each DataFrame operation analyses the plan again.
    kept = resolved.derive(("scan-with-file-ids", keep_row_index, present), lambda: [
        *[F.col(f"`{f.name}`") for f in resolved.output_schema.fields],
        *([F.col(ROW_INDEX_COL)] if keep_row_index else []),
        *([F.lit(True).alias(TARGET_PRESENT)] if present else [])])
    return scan.select(*kept, file_ids.column().alias(FILE_ID_COL))


@dataclass(frozen=True)
class _Expressions:
    """findTouchedFiles' expressions that depend on the resolved MERGE and the source's columns
    only: built once per resolution (``ResolvedMerge.derive``), not per micro-batch."""

    present: Column
    source_keys: list[Column]
    target_keys: list[Column]
    rows: list[Column]
    in_candidate: Column
    outside_candidates: Column
    file_id: Column
    per_row_counted: list[Column]
    per_row_single: list[Column]
    per_file: list[Column]
    source_columns: list[Column]


def _expressions(resolved: ResolvedMerge, key_pairs: Sequence[tuple[str, str]], source_columns: Sequence[str],
                 keep_unmatched_source: bool, broadcast_source: bool) -> _Expressions:
    source_alias, target_alias = resolved.source_alias, resolved.target_alias
    has_nmbs = bool(resolved.not_matched_by_source)
    matched_touch = any_of(resolved.matched) if resolved.clauses.is_matched_only else F.lit(True)
    unmatched_touch = any_of(resolved.not_matched_by_source) if has_nmbs else F.lit(False)
    touch = F.coalesce(
        F.when(F.col(SOURCE_PRESENT).isNotNull(), matched_touch).otherwise(unmatched_touch), F.lit(False)
    )
    key_columns = [t for t, _ in key_pairs]
    kept_source = ([] if not keep_unmatched_source
                   else [qualified(source_alias, s).alias(_source_key(i)) for i, (_, s) in enumerate(key_pairs)]
                   if broadcast_source else [qualified(source_alias, c).alias(c) for c in source_columns])
    return _Expressions(
        present=F.lit(True),
        source_keys=[F.col(f"`{s}`") for _, s in key_pairs],
        target_keys=[F.col(f"`{t}`") for t, _ in key_pairs],
        rows=[*kept_source,
              F.col(SOURCE_PRESENT), F.col(FILE_ID_COL), F.col(ROW_INDEX_COL), touch.cast("int").alias(TOUCH_COL),
              *[qualified(target_alias, k).alias(f"key_{i}") for i, k in enumerate(key_columns)]],
        in_candidate=F.col(FILE_ID_COL).isNotNull(),
        outside_candidates=F.col(FILE_ID_COL).isNull(),
        file_id=F.col(FILE_ID_COL),
        per_row_counted=[F.count(SOURCE_PRESENT).alias("matches"), F.max(TOUCH_COL).alias("touch"),
                         *[F.first(f"key_{i}").alias(f"key_{i}") for i in range(len(key_columns))]],
        per_row_single=[F.col(FILE_ID_COL), F.col(SOURCE_PRESENT).isNotNull().cast("int").alias("matches"),
                        F.col(TOUCH_COL).alias("touch")],
        per_file=[F.max("matches").alias("max_matches"), F.max("touch").alias("touch"),
                  F.sum(F.when(F.col("matches") > 0, 1).otherwise(0)).alias("matched_rows")],
        source_columns=[F.col(f"`{c}`") for c in source_columns],
    )


def _without_matched_keys(source: DataFrame, matches: DataFrame, source_keys: Sequence[str],
                          partitions: int) -> DataFrame:
    """The source rows whose key no match carried. Both sides are small (the source fits a
    broadcast; the matches are the matched target rows), so they are hash-partitioned inside
    the write's job rather than broadcast by a job of their own; no ``distinct``, which would
    add an aggregation's shuffle and changes nothing for an anti join."""
    keys = [_source_key(i) for i in range(len(source_keys))]
    matched = (matches.select(*[F.col(k) for k in keys])
               .repartition(partitions, *[F.col(k) for k in keys]).hint("shuffle_hash"))
    condition = None
    for name, key in zip(source_keys, keys, strict=True):
        equal = F.col(f"__sm_src.`{name}`") == F.col(key)
        condition = equal if condition is None else condition & equal
    side = source.repartition(partitions, *[F.col(f"`{k}`") for k in source_keys]).alias("__sm_src")
    return side.join(matched, condition, "left_anti")


def _source_key(position: int) -> str:
    return f"__sm_source_key_{position}__"


def _position(file_ids: FileIds, file_id: int) -> int:
    position = file_ids.position(file_id)
    if position is None:
        raise AssertionError(f"findTouchedFiles found a file id that is no candidate's: {file_id}")
    return position


def _raise_multiple_matches(offending: list, key_columns: Sequence[str], snapshot: Snapshot,
                            candidates: Sequence[DataFile], file_ids: FileIds) -> None:
    rows: list[tuple[dict[str, object], int]] = []
    for row in offending:
        if key_columns:
            key = {name: row[f"key_{i}"] for i, name in enumerate(key_columns)}
        else:
            file = candidates[_position(file_ids, row[FILE_ID_COL])]
            key = {"file": snapshot.absolute_path(file.path), "row_index": row[ROW_INDEX_COL]}
        rows.append((key, int(row["matches"])))
    listing = "; ".join(
        ", ".join(f"{k}={v!r}" for k, v in key.items()) + f" (matched by {count} source rows)" for key, count in rows
    )
    raise MultipleSourceRowMatchingTargetRowError(
        f"{MULTIPLE_MATCH_MESSAGE} Offending target rows (up to {MAX_REPORTED_ROWS}): {listing}.", rows
    )
