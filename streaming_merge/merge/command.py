"""MergeIntoCommand: choose the path, time the phases, commit, return the metrics.

One ``run_merge`` call is one Delta transaction: snapshot at version V, data
skipping, findTouchedFiles (or the insert-only path), writeAllChanges, and a single
commit of removes + adds (+ the app transaction) against V. With a materialized
source a lost block reruns the whole transaction from the original source.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from pyroaring import BitMap64
from pyspark.sql import Column, DataFrame, SparkSession

from streaming_merge.errors import CommitOutcomeUnknownError, MaterializedSourceLostError, MergeAssignmentOverflowError
from streaming_merge.merge.change_data import records_change_data
from streaming_merge.merge.clauses import ClauseSet, MergeClause, expr_text
from streaming_merge.merge.dv_rewrite import write_changes_with_deletion_vectors
from streaming_merge.merge.key_presence import KeyPresenceProbe, key_presence_probe
from streaming_merge.merge.materialize import (
    carries_local_rows,
    is_lost_block_error,
    is_stable,
    level_for_attempt,
    lost_rdd_ids,
    materialize,
    next_rdd_id,
    release,
    should_materialize,
)
from streaming_merge.merge.metrics import MergeMetrics
from streaming_merge.merge.options import MergeOptions, PhaseHook
from streaming_merge.merge.paths import (
    layout,
    map_side_probe,
    map_side_single_pass,
    rewrite,
    rewrites_all_candidates,
    single_match,
    single_pass,
    single_pass_probe,
)
from streaming_merge.merge.resolve import (
    OVERFLOW_MARKER,
    ResolvedMerge,
    estimated_row_bytes,
    fits_broadcast,
    resolve_merge,
)
from streaming_merge.merge.rewrite import (
    RewriteResult,
)
from streaming_merge.merge.skipping import (
    ColumnScope,
    SkippingPlan,
    SkippingTemplate,
    SourceStats,
    compute_source_stats,
    key_pairs,
    matches_by_key,
    skipping_key_pairs,
    skipping_template,
    source_stats_columns,
    source_stats_of,
)
from streaming_merge.merge.touched import TouchedFiles, find_touched_files
from streaming_merge.spark.answers_at_once import ready_driver_thread
from streaming_merge.spark.conf import temporary_conf
from streaming_merge.spark.interpreted import interpreted_if_small, rows_of
from streaming_merge.spark.profile import phase
from streaming_merge.table.commit import CommitRequest, add_columns, commit_with_deletion_vectors
from streaming_merge.table.location import TableLocation
from streaming_merge.table.schema import check_partition_columns
from streaming_merge.table.snapshot import DataFile, Snapshot, check_writable, load_snapshot
from streaming_merge.table.write import WrittenFile, delete_written

log = logging.getLogger(__name__)



@dataclass(frozen=True)
class MergeRequest:
    """One MERGE: ``condition_text`` is the ON condition as the user wrote it when it was SQL
    text (None for a Column), which lets a repeated MERGE reuse its resolution."""

    table_path: TableLocation
    source: DataFrame
    source_alias: str
    target_alias: str
    condition: Column
    clauses: Sequence[MergeClause]
    schema_evolution: bool = False
    options: MergeOptions = field(default_factory=MergeOptions)
    app_id: str | None = None
    app_version: int | None = None
    condition_text: str | None = None


_MERGE_CONF = {
    # Adaptive execution submits every shuffle stage as a job of its own and its empty-relation
    # rule drops the plan nodes carrying our observed metrics; the MERGE sizes its joins
    # itself (it knows the source's row count), so it runs each query as one job without it.
    "spark.sql.adaptive.enabled": "false",
}


EXCLUDED_RULES = "spark.sql.optimizer.excludedRules"
# Folds a projection over rows held in the plan into new rows, evaluated on the driver, one row
# at a time and interpreted, in every plan that reads them (a 100k-row local source: 142 ms of
# the materialization's planning per MERGE); left out, the projection runs in the tasks.
LOCAL_ROWS_PROJECTION_RULE = "org.apache.spark.sql.catalyst.optimizer.ConvertToLocalRelation"


@contextlib.contextmanager
def merge_conf(spark: SparkSession, local_rows: bool = False) -> Iterator[None]:
    """Session settings for the duration of a MERGE (a streaming query's foreachBatch runs
    on the query's own session clone, so other queries are not affected). ``local_rows``: the
    source is rows held in the plan (``createDataFrame`` of local data)."""
    settings = dict(_MERGE_CONF)
    if local_rows:
        settings[EXCLUDED_RULES] = with_excluded_rule(spark.conf.get(EXCLUDED_RULES, None),
                                                      LOCAL_ROWS_PROJECTION_RULE)
    with temporary_conf(spark, settings):
        yield


def with_excluded_rule(excluded: str | None, rule: str) -> str:
    """The optimizer's excluded rules (a comma-separated setting) with ``rule`` among them;
    the caller's own exclusions stay."""
    rules = [r.strip() for r in (excluded or "").split(",") if r.strip()]
    return ",".join(rules if rule in rules else [*rules, rule])


def _millis_since(start: float) -> int:
    return int((time.monotonic() - start) * 1000)


def run_merge(spark: SparkSession, request: MergeRequest) -> MergeMetrics:
    """Run the MERGE, rerunning it when a materialized source or checkpoint lost blocks."""
    ready_driver_thread(spark)
    clauses = ClauseSet.of(request.clauses)
    clauses.validate()
    options = request.options
    local_rows = options.source_stats is None and carries_local_rows(request.source)
    materializing = should_materialize(options.materialize_source, request.source, clauses.is_insert_only) or (
        options.materialize_source == "auto" and not clauses.is_insert_only and local_rows)
    with merge_conf(spark, local_rows):
        for attempt in range(1, options.max_attempts + 1):
            level = level_for_attempt(options.storage_levels, attempt)
            own_rdds_from = next_rdd_id(spark)
            try:
                return _run_once(spark, request, clauses, attempt, level, materializing)
            except Exception as exc:
                if not is_lost_block_error(exc):
                    raise translate_overflow(exc) from exc
                lost = lost_rdd_ids(exc)
                if lost and max(lost) < own_rdds_from:
                    # The blocks were the caller's (e.g. MergeSink's materialized batch), not a copy this
                    # MERGE made: rerunning it would fail the same way. The caller reruns from its source.
                    log.warning("MERGE into %s: its source's checkpoint blocks (RDDs %s) were lost before this "
                                "MERGE copied them; leaving the rerun to the caller", request.table_path,
                                sorted(lost))
                    raise
                if attempt == options.max_attempts:
                    raise MaterializedSourceLostError(
                        f"The materialized MERGE source into `{request.table_path}` lost its blocks on all "
                        f"{attempt} attempts (storage levels {list(options.storage_levels)}); executors were "
                        "probably lost or blocks evicted. Raise max_attempts or use a more replicated storage "
                        "level.",
                        attempts=attempt,
                    ) from exc
                log.warning("MERGE into %s: materialized source lost blocks on attempt %d (%s); retrying at %s",
                            request.table_path, attempt, level,
                            level_for_attempt(options.storage_levels, attempt + 1))
    raise AssertionError("unreachable")


def translate_overflow(exc: Exception) -> Exception:
    text = str(exc)
    if OVERFLOW_MARKER in text:
        start = text.find(f"[{OVERFLOW_MARKER}]")
        message = text[start:].split("\n")[0] if start >= 0 else text
        return MergeAssignmentOverflowError(message.strip().strip('"'))
    return exc


def _run_once(spark: SparkSession, request: MergeRequest, clauses: ClauseSet, attempt: int, level: str,
              materializing: bool) -> MergeMetrics:
    started = time.monotonic()
    with phase(spark, "snapshot"):
        given = request.options.snapshot
        reuse = attempt == 1 and given is not None and given.location == request.table_path
        snapshot = given if reuse and given is not None else load_snapshot(request.table_path)
        check_writable(snapshot)
        check_partition_columns(snapshot.schema, snapshot.partition_columns)
        if request.app_id is not None and request.app_version is not None:
            applied = snapshot.transaction_version(request.app_id)
            if applied is not None and applied >= request.app_version:
                log.info("MERGE into %s skipped: txn %r already at version %d >= %d", request.table_path,
                         request.app_id, applied, request.app_version)
                return MergeMetrics({}, skipped=True, attempts=attempt, table_version=snapshot.version)

    options = request.options
    with phase(spark, "resolve"):
        resolution = _resolve(spark, request, clauses, snapshot)
        resolved, pairs, range_columns = resolution.resolved, resolution.pairs, resolution.range_columns
    hook = options.phase_hook or (lambda phase_name, frame: None)
    held: list[DataFrame] = []  # checkpoints of this attempt, released at the end
    try:
        probe = (key_presence_probe(snapshot, [(t, s) for t, s in pairs if s in range_columns],
                                    request.source.schema, options.key_presence_max_files)
                 if range_columns and not resolved.not_matched_by_source else None)
        source, stats = _prepare_source(spark, request, clauses, level if materializing else None, range_columns,
                                        held, probe)
        return _merge(spark, request, snapshot, resolution, source, stats, level, held, hook, attempt, started)
    finally:
        for frame in held:
            release(frame)


@dataclass(frozen=True)
class _Resolution:
    """Everything a MERGE takes from its schemas, aliases, condition and clauses alone."""

    resolved: ResolvedMerge
    pairs: list[tuple[str, str]]  # equi-join key pairs (target, source)
    range_columns: list[str]  # source columns whose ranges prune files
    skipping: SkippingTemplate
    by_key: bool  # skipping.matches_by_key of the ON condition


_RESOLVED_CACHE_SIZE = 32
_resolved_cache: OrderedDict[tuple[Any, ...], _Resolution] = OrderedDict()
_resolved_lock = threading.Lock()


def _resolve(spark: SparkSession, request: MergeRequest, clauses: ClauseSet, snapshot: Snapshot) -> _Resolution:
    """The resolved MERGE, its equi-join key pairs, the source columns whose ranges prune
    files and the skipping predicates of its conditions; remembered for the next MERGE of the
    same shape.

    A streaming sink runs the same MERGE every micro-batch and resolving it is one Spark
    analysis per output column per clause (tens to hundreds of milliseconds). Resolution
    depends only on the schemas, aliases, condition and clauses, so when all of those are
    SQL text (Columns cannot be compared reliably) the result is reused; the resolved
    expressions are unresolved Spark Columns, valid for any DataFrame of those schemas.
    """
    key = _resolution_key(spark, request, clauses, snapshot)
    if key is not None:
        with _resolved_lock:
            cached = _resolved_cache.get(key)
            if cached is not None:
                _resolved_cache.move_to_end(key)
                return cached
    resolved = resolve_merge(spark, request.source, request.source_alias, snapshot.schema,
                             request.target_alias, request.condition, clauses, request.schema_evolution)
    resolved = replace(resolved, change_data=records_change_data(snapshot))
    scope = ColumnScope(request.target_alias, request.source_alias, [f.name for f in snapshot.schema.fields],
                        request.source.columns)
    pairs = key_pairs(request.condition, scope)
    matched_conditions = ([c.condition for c in resolved.matched] if clauses.is_matched_only
                          and all(c.condition is not None for c in resolved.matched) else None)
    template = skipping_template(scope, snapshot.schema, request.condition, pairs,
                                 matched_conditions,  # type: ignore[arg-type]
                                 bool(resolved.not_matched_by_source))
    range_columns = ([s for _, s in skipping_key_pairs(pairs, snapshot.schema)]
                     if request.options.source_key_range_skipping else [])
    result = _Resolution(resolved, pairs, range_columns, template, matches_by_key(request.condition, scope))
    if key is not None:
        with _resolved_lock:
            _resolved_cache[key] = result
            while len(_resolved_cache) > _RESOLVED_CACHE_SIZE:
                _resolved_cache.popitem(last=False)
    return result


def _resolution_key(spark: SparkSession, request: MergeRequest, clauses: ClauseSet, snapshot: Snapshot
                    ) -> tuple[Any, ...] | None:
    texts: list[Any] = [request.condition_text]
    for clause in clauses.all:
        texts += [clause.kind, clause.action, clause.condition, *sorted(clause.assignments.items())]
    flat = [t for item in texts for t in (item if isinstance(item, tuple) else (item,))]
    if not all(t is None or isinstance(t, str) for t in flat):
        return None
    # The JVM session, not the Python object: foreachBatch hands every micro-batch a new Python
    # wrapper of the query's one session, and keying by it made every batch resolve afresh.
    return (spark._jsparkSession.sessionUUID(), request.source.schema.json(), request.source_alias,
            snapshot.schema.json(), tuple(snapshot.partition_columns), request.target_alias,
            request.schema_evolution, request.options.source_key_range_skipping, records_change_data(snapshot),
            tuple(flat))


def _prepare_source(spark: SparkSession, request: MergeRequest, clauses: ClauseSet, level: str | None,
                    range_columns: list[str], held: list[DataFrame], probe: KeyPresenceProbe | None
                    ) -> tuple[DataFrame, SourceStats | None]:
    """Materialize the source (observing its row count, key ranges and, with ``probe``, the
    target files its keys fall into, in the same job), or take those figures from the caller,
    or compute them in one job over a stable source.

    An insert-only MERGE over a source that is neither materialized nor stable gets no key
    ranges: they would come from a different read than the one that inserts."""
    supplied = request.options.source_stats

    def masked() -> tuple[DataFrame, list[Column]]:
        """The source with the probe's masks and their aggregates; built only where they are
        read (a DataFrame operation is an analysis, a Column a few py4j calls)."""
        if probe is None:
            return request.source, []
        return probe.with_masks(request.source), probe.aggregates

    if level is not None:
        with phase(spark, "materialize", "MERGE operation - materializing source"):
            frame, extra = masked()
            source, values = materialize(frame, level, [*source_stats_columns(range_columns), *extra],
                                         drop=probe.mask_columns if probe is not None else ())
            held.append(source)
            return source, _with_absent_files(source_stats_of(values, range_columns), probe, values)
    if supplied is not None and supplied.covers(range_columns):
        return request.source, supplied
    if clauses.is_insert_only and not (range_columns and is_stable(request.source)):
        return request.source, None
    with phase(spark, "sourceStats", "MERGE operation - counting source rows"):
        frame, extra = masked()
        stats, values = compute_source_stats(frame, range_columns, extra)
        return request.source, _with_absent_files(stats, probe, values)


def _with_absent_files(stats: SourceStats, probe: KeyPresenceProbe | None, values: dict[str, Any]) -> SourceStats:
    if probe is None:
        return stats
    return replace(stats, absent_files=probe.absent(values))


def _merge(spark: SparkSession, request: MergeRequest, snapshot: Snapshot, resolution: _Resolution,
           source: DataFrame, stats: SourceStats | None, level: str,
           held: list[DataFrame], hook: PhaseHook, attempt: int, started: float) -> MergeMetrics:
    resolved, pairs = resolution.resolved, resolution.pairs
    clauses, options = resolved.clauses, request.options
    metrics: dict[str, int] = {
        "numTargetFilesBeforeSkipping": len(snapshot.files),
        "numTargetBytesBeforeSkipping": snapshot.num_bytes,
    }
    scan_started = time.monotonic()
    with phase(spark, "skipping"):
        skipping = resolution.skipping.plan(stats)
        candidates = skipping.select(spark, snapshot, snapshot.files)
    metrics["numTargetFilesAfterSkipping"] = len(candidates)
    metrics["numTargetBytesAfterSkipping"] = sum(f.size for f in candidates)
    metrics["numTargetPartitionsAfterSkipping"] = _partitions(snapshot, candidates)
    source_bytes = stats.rows * estimated_row_bytes(source) if stats is not None else 0
    broadcast = stats is not None and fits_broadcast(source, stats.rows, options.broadcast_source_bytes)
    # Generated code or not: known before any of the MERGE's own jobs (see streaming_merge.spark.interpreted).
    rows_read = rows_of([stats.rows if stats is not None else None, *[f.num_records for f in candidates]])
    with interpreted_if_small(spark, rows_read, options.interpreted_max_rows):
        if not clauses.is_insert_only and snapshot.writes_deletion_vectors:
            assert stats is not None
            metrics["numSourceRows"] = stats.rows
            metrics["scanTimeMs"] = 0
            with phase(spark, "writeAllChanges", f"MERGE operation - writing the changes to {len(candidates)} "
                                                 "candidate files as deletion vectors and new rows"):
                changes = write_changes_with_deletion_vectors(
                    spark, snapshot, candidates, source, resolved, layout=layout(options, [], source_bytes),
                    broadcast_source=broadcast, from_source_side=options.dv_source_side_write)
            metrics["rewriteTimeMs"] = _millis_since(scan_started)
            metrics.update(changes.counts)
            metrics.update(changes.changes.metrics())
            hook("after_find_touched_files", source)
            hook("before_commit", source)
            return _commit_merge(spark, request, snapshot, resolved, skipping, candidates, metrics, changes.files,
                                 changes.changes.removed, changes.changes.vectors, started, attempt)
        to_rewrite: list[DataFile] = []
        touched: TouchedFiles | None = None
        one_pass_result: RewriteResult | None = None
        if clauses.is_insert_only:
            metrics["scanTimeMs"] = 0
        else:
            assert stats is not None
            metrics["numSourceRows"] = stats.rows
            decided: list[DataFile] | None = None
            if rewrites_all_candidates(options, resolved, snapshot, source, stats, pairs, candidates):
                decided = list(candidates)
            elif (probe := single_pass_probe(spark, snapshot, options, resolved, source, stats, pairs, candidates,
                                              broadcast, source_bytes)) is not None:
                one_pass_result, decided = single_pass(spark, snapshot, candidates, source, resolved, options, probe,
                                                        broadcast, layout(options, candidates, source_bytes))
            elif ((resolution.by_key or not resolved.not_matched)  # its inserts are found by key
                  and (probe := map_side_probe(spark, snapshot, options, resolved, source, stats, pairs, candidates,
                                               broadcast)) is not None):
                one_pass_result, decided = map_side_single_pass(spark, snapshot, candidates, source, resolved,
                                                                 options, probe, source_bytes)
            if decided is None:
                map_side = broadcast and bool(resolved.not_matched) and not resolved.not_matched_by_source
                broadcast_scan = (broadcast and not resolved.not_matched_by_source
                                  and metrics["numTargetBytesAfterSkipping"] >= options.broadcast_scan_min_bytes
                                  and (not map_side or resolution.by_key))
                with phase(spark, "findTouchedFiles", "MERGE operation - scanning files for matches"):
                    touched = find_touched_files(spark, snapshot, candidates, source, resolved, pairs,
                                                 keep_unmatched_source=level if map_side else None,
                                                 single_match=single_match(snapshot, source, stats, pairs),
                                                 broadcast_source=broadcast_scan)
                if touched.checkpoint is not None:
                    held.append(touched.checkpoint)
                decided = touched.files
            to_rewrite = decided
            metrics["scanTimeMs"] = 0 if one_pass_result is not None else _millis_since(scan_started)
        hook("after_find_touched_files", source)

        rewrite_started = time.monotonic()
        if one_pass_result is not None:
            result = one_pass_result
            metrics["rewriteTimeMs"] = _millis_since(scan_started)
        else:
            result = rewrite(spark, snapshot, candidates, to_rewrite, source, resolved, touched, pairs,
                              layout(options, to_rewrite, source_bytes),
                              options.optimize_matched_only, broadcast)
            metrics["rewriteTimeMs"] = _millis_since(rewrite_started)
        metrics.update(result.counts)
        if clauses.is_only_one_unconditional_delete and to_rewrite and touched is not None:
            metrics["numTargetRowsMatchedDeleted"] = touched.matched_target_rows  # once per row, not per match
        hook("before_commit", source)

        return _commit_merge(spark, request, snapshot, resolved, skipping, candidates, metrics, result.files,
                             to_rewrite, [], started, attempt)


def _commit_merge(spark: SparkSession, request: MergeRequest, snapshot: Snapshot, resolved: ResolvedMerge,
                  skipping: SkippingPlan, candidates: list[DataFile], metrics: dict[str, int],
                  written: list[WrittenFile], removed: Sequence[DataFile],
                  vectors: Sequence[tuple[DataFile, BitMap64]], started: float, attempt: int) -> MergeMetrics:
    """Count the files, write the new deletion vectors and commit; on any failure the files and
    the vectors this MERGE wrote are deleted again (commit_with_deletion_vectors), so nothing of
    it lingers."""
    options = request.options
    data = [w for w in written if not w.change_data]
    changes = [w for w in written if w.change_data]
    metrics.update({
        "numTargetFilesRemoved": len(removed),
        "numTargetBytesRemoved": sum(f.size for f in removed),
        "numTargetPartitionsRemovedFrom": _partitions(snapshot, [*removed, *(f for f, _ in vectors)]),
        "numTargetFilesAdded": len(data),
        "numTargetBytesAdded": sum(w.size for w in data),
        "numTargetPartitionsAddedTo": len({tuple(sorted(w.partition_values.items())) for w in data})
        if snapshot.partition_columns else 0,
        "numTargetChangeFilesAdded": len(changes),
        "numTargetChangeFileBytes": sum(w.size for w in changes),
    })
    # With change data on, every row a rewrite changes has a change row; a rewrite with none
    # changed no row (every row copied as it was), and readers must not take its files as
    # deleted and inserted rows: it is committed as a rewrite that changes no data, as OPTIMIZE's.
    unchanged = resolved.change_data and not changes and bool(removed or vectors)
    try:
        if options.before_commit is not None:
            options.before_commit()
        with phase(spark, "commit"):
            commit_snapshot = snapshot
            if resolved.output_schema != snapshot.schema:
                commit_snapshot = add_columns(snapshot, resolved.output_schema)
            metrics["executionTimeMs"] = _millis_since(started)
            final = MergeMetrics(metrics, attempts=attempt)
            version = commit_with_deletion_vectors(spark, CommitRequest(
                snapshot=commit_snapshot,
                adds=written,
                removes=list(removed),
                operation="MERGE",
                operation_parameters=_parameters(resolved),
                operation_metrics=final.delta_metrics(),
                app_id=request.app_id,
                app_version=request.app_version,
                read_files=candidates,
                concurrent_append_filter=_append_filter(spark, skipping),
                data_change=not unchanged,
                concurrent_check=options.commit_check,
            ), vectors)
    except CommitOutcomeUnknownError:
        raise  # a landed commit may reference the files: they stay
    except BaseException:
        delete_written(spark, snapshot.location, written)  # also when before_commit or add_columns failed
        raise
    return MergeMetrics(metrics, attempts=attempt, table_version=version)


def _partitions(snapshot: Snapshot, files: Sequence[DataFile]) -> int:
    if not snapshot.partition_columns:
        return 0
    return len({tuple(sorted(f.partition_values.items(), key=lambda kv: kv[0])) for f in files})


def _append_filter(spark: SparkSession, skipping: SkippingPlan) -> Callable[[Snapshot, list[DataFile]], list[DataFile]]:
    """Files added concurrently that this merge's read predicate could have matched."""
    return lambda latest, added: skipping.select(spark, latest, added)


def _parameters(resolved: ResolvedMerge) -> dict[str, object]:
    return {
        "predicate": expr_text(resolved.condition),
        "matchedPredicates": [c.clause.to_json() for c in resolved.matched],
        "notMatchedPredicates": [c.clause.to_json() for c in resolved.not_matched],
        "notMatchedBySourcePredicates": [c.clause.to_json() for c in resolved.not_matched_by_source],
    }
