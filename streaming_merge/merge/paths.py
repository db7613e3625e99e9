"""Which rewrite path a MERGE takes, and the passes that decide it.

Delta's two passes (findTouchedFiles, then writeAllChanges over the touched files) are the
sound default. Where they are not needed a MERGE takes a shorter path: every candidate
rewritten without a scan (small candidates, unique source keys), a one-pass rewrite that
observes what findTouchedFiles would have found (shuffled, or map-side past a broadcast
source), or the insert-only path. The command (streaming_merge.merge.command) runs the
phases in order; this module holds the rules for choosing among them.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    DataType,
    DateType,
    DecimalType,
    IntegralType,
    StringType,
    TimestampNTZType,
    TimestampType,
)

from streaming_merge.merge.map_side_pass import write_map_side_one_pass
from streaming_merge.merge.options import MergeOptions
from streaming_merge.merge.resolve import ResolvedMerge
from streaming_merge.merge.rewrite import (
    FileLayout,
    RewriteResult,
    TouchProbe,
    write_all_changes,
    write_changes_map_side,
    write_inserts_only,
)
from streaming_merge.merge.skipping import SourceStats
from streaming_merge.merge.touched import TouchedFiles, join_partitions
from streaming_merge.spark.profile import phase
from streaming_merge.spark.slots import task_slots
from streaming_merge.table.file_ids import FileIds
from streaming_merge.table.snapshot import DataFile, Snapshot
from streaming_merge.table.write import delete_written

log = logging.getLogger("streaming_merge.merge.command")


def rewrites_all_candidates(options: MergeOptions, resolved: ResolvedMerge, snapshot: Snapshot, source: DataFrame,
                             stats: SourceStats, pairs: list[tuple[str, str]], candidates: Sequence[DataFile]) -> bool:
    """Whether ``options.rewrite_all_candidates_bytes`` applies: findTouchedFiles would only say which
    candidates to rewrite (no multiple match is possible, no clause acts on unmatched target rows,
    and no unconditional delete counts its rows from the scan)."""
    return (bool(candidates) and sum(f.size for f in candidates) <= options.rewrite_all_candidates_bytes
            and not resolved.not_matched_by_source and not resolved.clauses.is_only_one_unconditional_delete
            and single_match(snapshot, source, stats, pairs))


def single_pass_probe(spark: SparkSession, snapshot: Snapshot, options: MergeOptions, resolved: ResolvedMerge,
                       source: DataFrame, stats: SourceStats, pairs: list[tuple[str, str]],
                       candidates: Sequence[DataFile], broadcast: bool, source_bytes: int) -> TouchProbe | None:
    """What the one-pass rewrite observes (MergeOptions.single_pass), or None where Delta's two
    passes are the better or the only sound plan: clauses on unmatched target rows (every
    candidate is then touched anyway, but the scan decides which rows), an unconditional delete
    (its count comes from the scan), too few source rows to touch every candidate, no key
    equality or one across types (a cast could make distinct source keys equal one target
    value), and an upsert of a broadcast source into a target big enough that streaming it past
    the broadcast and rewriting map-side beats shuffling it for a full outer join."""
    if not _one_pass_applies(snapshot, options, resolved, source, stats, pairs, candidates):
        return None
    candidate_bytes = sum(f.size for f in candidates)
    matched_only = options.optimize_matched_only and resolved.clauses.is_matched_only
    if broadcast and not matched_only and candidate_bytes >= options.broadcast_scan_min_bytes:
        return None
    return TouchProbe(
        file_ids=FileIds.of(spark, snapshot, candidates),
        target_keys=tuple(t for t, _ in pairs),
        source_keys=tuple(s for _, s in pairs),
        count_keys=_count_keys(snapshot, source, stats, pairs, candidates),
        # Unpartitioned: as many join tasks as output files (coalescing 3 join partitions into 2
        # files left one core with twice the rows of the other).
        partitions=(join_partitions(spark, candidate_bytes) if snapshot.partition_columns
                    else layout(options, candidates, source_bytes).files(task_slots(spark))),
    )


def map_side_probe(spark: SparkSession, snapshot: Snapshot, options: MergeOptions, resolved: ResolvedMerge,
                    source: DataFrame, stats: SourceStats, pairs: list[tuple[str, str]],
                    candidates: Sequence[DataFile], broadcast: bool) -> TouchProbe | None:
    """What the map-side one pass (streaming_merge.merge.map_side_pass) observes, or None where
    it does not apply: only where the shuffled one pass declines a broadcast source for a large
    target (an unpartitioned one: the inserts get files of their own, which would add a file
    per partition value). A target row joined twice sends the MERGE to findTouchedFiles (see
    _count_keys)."""
    if (not broadcast or snapshot.partition_columns
            or (options.optimize_matched_only and resolved.clauses.is_matched_only)
            or not _one_pass_applies(snapshot, options, resolved, source, stats, pairs, candidates)
            or sum(f.size for f in candidates) < options.broadcast_scan_min_bytes):
        return None
    return TouchProbe(file_ids=FileIds.of(spark, snapshot, candidates), target_keys=tuple(t for t, _ in pairs),
                      source_keys=tuple(s for _, s in pairs),
                      count_keys=_count_keys(snapshot, source, stats, pairs, candidates), partitions=0)


def map_side_single_pass(spark: SparkSession, snapshot: Snapshot, candidates: list[DataFile], source: DataFrame,
                          resolved: ResolvedMerge, options: MergeOptions, probe: TouchProbe, source_bytes: int
                          ) -> tuple[RewriteResult | None, list[DataFile] | None]:
    """As :func:`single_pass`, map-side (the inserts are written only when the pass settles
    the MERGE; otherwise the pass has already deleted its files)."""
    with phase(spark, "writeAllChanges",
               f"MERGE operation - Rewriting {len(candidates)} candidate files map-side in one pass"):
        result = write_map_side_one_pass(spark, snapshot, candidates, source, resolved, probe,
                                         layout(options, candidates, 0), layout(options, [], source_bytes))
    return _settled(spark, snapshot, candidates, probe, result)


def layout(options: MergeOptions, files: Sequence[DataFile], source_bytes: int) -> FileLayout:
    """How the new files of a rewrite of ``files`` plus a source of ``source_bytes`` are cut."""
    return FileLayout(options.repartition_before_write, options.target_file_size,
                      sum(f.size for f in files) + source_bytes, options.min_parallel_file_size,
                      max((f.size for f in files), default=0))


def _one_pass_applies(snapshot: Snapshot, options: MergeOptions, resolved: ResolvedMerge, source: DataFrame,
                      stats: SourceStats, pairs: list[tuple[str, str]], candidates: Sequence[DataFile]) -> bool:
    """What both one passes need (see single_pass_probe for why): the option on, candidates,
    no clause on unmatched target rows, not a lone unconditional delete, enough source rows to
    touch every candidate, and key equalities whose columns group as they join."""
    return (options.single_pass and bool(candidates) and bool(pairs) and not resolved.not_matched_by_source
            and not resolved.clauses.is_only_one_unconditional_delete
            and stats.rows >= options.single_pass_min_rows_per_file * len(candidates)
            and _keys_group_as_they_join(snapshot, source, pairs))


def _keys_group_as_they_join(snapshot: Snapshot, source: DataFrame, pairs: list[tuple[str, str]]) -> bool:
    """Every key pair joins columns of one type whose grouping puts together exactly the values
    that join as equal (see _groups_as_it_joins): the one passes count and collect by key."""
    target_types = {f.name: f.dataType for f in snapshot.schema.fields}
    source_types = {f.name: f.dataType for f in source.schema.fields}
    return all(target_types.get(t) == source_types.get(s) and _groups_as_it_joins(source_types[s]) for t, s in pairs)


_EXACT_KEY_TYPES = (IntegralType, DecimalType, DateType, TimestampType, TimestampNTZType, BooleanType, BinaryType)


def _groups_as_it_joins(data_type: DataType) -> bool:
    """Whether grouping a key column puts together exactly the values that join as equal: not so
    for floating point (NaN and -0.0 are normalized by rules we do not want to depend on) or for
    strings under a collation other than binary."""
    if isinstance(data_type, StringType):
        return getattr(data_type, "collation", "UTF8_BINARY") == "UTF8_BINARY"
    return isinstance(data_type, _EXACT_KEY_TYPES)


def single_pass(spark: SparkSession, snapshot: Snapshot, candidates: list[DataFile], source: DataFrame,
                 resolved: ResolvedMerge, options: MergeOptions, probe: TouchProbe, broadcast: bool,
                 layout: FileLayout) -> tuple[RewriteResult | None, list[DataFile] | None]:
    """Rewrite every candidate in one job and settle what it found (see _settled)."""
    with phase(spark, "writeAllChanges", f"MERGE operation - Rewriting {len(candidates)} candidate files in one pass"):
        result = write_all_changes(spark, snapshot, candidates, source, resolved,
                                   optimize_matched_only=options.optimize_matched_only, layout=layout,
                                   broadcast_source=broadcast, probe=probe)
    return _settled(spark, snapshot, candidates, probe, result)


def _settled(spark: SparkSession, snapshot: Snapshot, candidates: list[DataFile], probe: TouchProbe,
             result: RewriteResult) -> tuple[RewriteResult | None, list[DataFile] | None]:
    """What a one pass found: the result when every candidate was touched and no target row can
    have matched twice; otherwise its files are deleted and the touched candidates are returned
    for the rewrite (None: a target row may have matched two source rows, which Delta's
    findTouchedFiles decides, and reports)."""
    assert result.touched is not None
    positions = [probe.file_ids.position(file_id) for file_id in result.touched]
    touched = sorted(p for p in positions if p is not None)
    if not result.matched_key_shared and len(touched) == len(result.touched) == len(candidates):
        return result, list(candidates)
    delete_written(spark, snapshot.location, result.files)
    if result.matched_key_shared or len(touched) != len(result.touched):
        # A key with two source rows may be a multiple match; a file identity we did not hand
        # out (a size the log does not give) means we cannot say which files were touched.
        log.info("MERGE into %s: one pass inconclusive (a matched key with two source rows: %s); finding the "
                 "touched files", snapshot.location, result.matched_key_shared)
        return None, None
    log.info("MERGE into %s: %d of %d candidate files touched; rewriting those", snapshot.location,
             len(touched), len(candidates))
    return None, [candidates[i] for i in touched]


def _count_keys(snapshot: Snapshot, source: DataFrame, stats: SourceStats, pairs: list[tuple[str, str]],
                candidates: Sequence[DataFile]) -> bool:
    """Whether a one pass counts the source's rows per key to tell a target row joined twice
    (TouchProbe.count_keys): only where the source's keys are not known unique and a candidate
    has no record count in the log, which the joined rows are otherwise compared with (a sort
    and a window over the source saved; map-side, a shuffle of it before the broadcast)."""
    return (any(f.num_records is None for f in candidates)
            and not single_match(snapshot, source, stats, pairs))


def single_match(snapshot: Snapshot, source: DataFrame, stats: SourceStats,
                  pairs: list[tuple[str, str]]) -> bool:
    """True when no target row can match two source rows: the source's unique key columns are
    all joined by equality to target columns of the very same type (with a cast between them,
    distinct source values could equal one target value)."""
    if not stats.unique_keys:
        return False
    target_types = {f.name: f.dataType for f in snapshot.schema.fields}
    source_types = {f.name: f.dataType for f in source.schema.fields}
    same_type = {s for t, s in pairs if target_types.get(t) == source_types.get(s)}
    return set(stats.unique_keys) <= same_type


def rewrite(spark: SparkSession, snapshot: Snapshot, candidates: list[DataFile], to_rewrite: list[DataFile],
             source: DataFrame, resolved: ResolvedMerge, touched: TouchedFiles | None,
             pairs: list[tuple[str, str]], layout: FileLayout, optimize_matched_only: bool, broadcast: bool
             ) -> RewriteResult:
    clauses = resolved.clauses
    unmatched = touched.unmatched_source if touched is not None else None
    if clauses.is_insert_only or (not to_rewrite and resolved.not_matched):
        with phase(spark, "writeAllChanges", "MERGE operation - writing new files for only inserts"):
            return write_inserts_only(
                spark, snapshot, candidates, source, resolved, layout=layout, key_pairs=pairs,
                unmatched_source=unmatched,
                source_count_metric="numSourceRows" if clauses.is_insert_only else "numSourceRowsInSecondScan",
            )
    if not to_rewrite:
        return RewriteResult([], {})
    with phase(spark, "writeAllChanges", f"MERGE operation - Rewriting {len(to_rewrite)} files"):
        if unmatched is not None:
            return write_changes_map_side(spark, snapshot, to_rewrite, source, unmatched, resolved, layout=layout)
        return write_all_changes(spark, snapshot, to_rewrite, source, resolved,
                                 optimize_matched_only=optimize_matched_only, layout=layout,
                                 broadcast_source=broadcast)
