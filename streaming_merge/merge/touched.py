"""findTouchedFiles: which target files hold rows this MERGE changes, and multiple matches.

One Spark job joins the source with the data-skipped target files (each target row
carrying its file path and row index as a row id), counts the matches per target row,
and folds them per file. Only the per-file summary (one row per candidate file) comes
back to the driver; offending rows are fetched (at most ten) only when the
multiple-match check fails.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from streaming_merge.errors import MultipleSourceRowMatchingTargetRowError
from streaming_merge.merge.resolve import (
    SOURCE_PRESENT,
    TARGET_PRESENT,
    ResolvedClause,
    ResolvedMerge,
    broadcast_if_small,
    qualified,
)
from streaming_merge.table.scan import FILE_PATH_COL, ROW_INDEX_COL, scan_files, spark_file_paths
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
    num_source_rows: int
    matched_target_rows: int


def any_of(clauses: Sequence[ResolvedClause]) -> Column:
    """True when some clause of the list could apply (an unconditional one always can)."""
    result: Column | None = None
    for clause in clauses:
        if clause.condition is None:
            return F.lit(True)
        result = clause.condition if result is None else (result | clause.condition)
    return result if result is not None else F.lit(False)


def find_touched_files(
    spark: SparkSession,
    snapshot: Snapshot,
    candidates: Sequence[DataFile],
    source: DataFrame,
    resolved: ResolvedMerge,
    key_columns: Sequence[str],
    source_rows: int,
) -> TouchedFiles:
    """Touched files among ``candidates``; raises on multiple matches (Delta's rule)."""
    source_alias, target_alias = resolved.source_alias, resolved.target_alias
    if not candidates:
        return TouchedFiles([], source_rows, 0)
    src = broadcast_if_small(source, source_rows).alias(source_alias).withColumn(SOURCE_PRESENT, F.lit(True))
    tgt = (scan_files(spark, snapshot, candidates, with_row_id=True, schema=resolved.output_schema)
           .alias(target_alias).withColumn(TARGET_PRESENT, F.lit(True)))
    clauses = resolved.clauses
    has_nmbs = bool(resolved.not_matched_by_source)
    joined = src.join(tgt, resolved.condition, "right_outer" if has_nmbs else "inner")

    matched_touch = any_of(resolved.matched) if clauses.is_matched_only else F.lit(True)
    unmatched_touch = any_of(resolved.not_matched_by_source) if has_nmbs else F.lit(False)
    touch = F.coalesce(
        F.when(F.col(SOURCE_PRESENT).isNotNull(), matched_touch).otherwise(unmatched_touch), F.lit(False)
    )
    key_values = [F.first(qualified(target_alias, k)).alias(f"key_{i}") for i, k in enumerate(key_columns)]
    per_row = joined.groupBy(FILE_PATH_COL, ROW_INDEX_COL).agg(
        F.count(SOURCE_PRESENT).alias("matches"), F.max(touch.cast("int")).alias("touch"), *key_values
    )
    per_file = per_row.groupBy(FILE_PATH_COL).agg(
        F.max("matches").alias("max_matches"),
        F.max("touch").alias("touch"),
        F.sum(F.when(F.col("matches") > 0, 1).otherwise(0)).alias("matched_rows"),
    )
    summary = per_file.collect()
    num_source_rows = source_rows  # counted with the key range; an observation here could be
    # optimized away with an empty join (AQE's empty-relation propagation drops CollectMetrics)

    exempt = clauses.is_only_one_unconditional_delete
    if not exempt and any((row["max_matches"] or 0) > 1 for row in summary):
        offending = (per_row.filter(F.col("matches") > 1)
                     .orderBy(F.col("matches").desc()).limit(MAX_REPORTED_ROWS).collect())
        _raise_multiple_matches(offending, key_columns)

    by_spark_path = dict(zip(spark_file_paths(spark, snapshot.table_path, candidates), candidates, strict=True))
    touched = [by_spark_path[row[FILE_PATH_COL]] for row in summary if row["touch"]]
    matched_rows = sum(int(row["matched_rows"] or 0) for row in summary)
    return TouchedFiles(touched, num_source_rows, matched_rows)


def _raise_multiple_matches(offending: list, key_columns: Sequence[str]) -> None:
    rows: list[tuple[dict[str, object], int]] = []
    for row in offending:
        if key_columns:
            key = {name: row[f"key_{i}"] for i, name in enumerate(key_columns)}
        else:
            key = {"file": row[FILE_PATH_COL], "row_index": row[ROW_INDEX_COL]}
        rows.append((key, int(row["matches"])))
    listing = "; ".join(
        ", ".join(f"{k}={v!r}" for k, v in key.items()) + f" (matched by {count} source rows)" for key, count in rows
    )
    raise MultipleSourceRowMatchingTargetRowError(
        f"{MULTIPLE_MATCH_MESSAGE} Offending target rows (up to {MAX_REPORTED_ROWS}): {listing}.", rows
    )
