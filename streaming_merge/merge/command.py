"""MergeIntoCommand: choose the path, time the phases, commit, return the metrics.

One ``run_merge`` call is one Delta transaction: snapshot at version V, data
skipping, findTouchedFiles (or the insert-only path), writeAllChanges, and a single
commit of removes + adds (+ the app transaction) against V. With a materialized
source a lost block reruns the whole transaction from the original source.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from pyspark.sql import Column, DataFrame, SparkSession

from streaming_merge.errors import MaterializedSourceLostError, MergeAssignmentOverflowError
from streaming_merge.merge.clauses import ClauseSet, MergeClause, expr_text
from streaming_merge.merge.materialize import (
    DEFAULT_STORAGE_LEVELS,
    MaterializePolicy,
    is_lost_block_error,
    level_for_attempt,
    materialize,
    release,
    should_materialize,
)
from streaming_merge.merge.metrics import MergeMetrics
from streaming_merge.merge.resolve import OVERFLOW_MARKER, ResolvedMerge, resolve_merge
from streaming_merge.merge.rewrite import RewriteResult, write_all_changes, write_inserts_only
from streaming_merge.merge.skipping import SkippingPlan, key_pairs, plan_skipping
from streaming_merge.merge.touched import find_touched_files
from streaming_merge.table.commit import CommitRequest, add_columns, commit
from streaming_merge.table.schema import check_partition_columns
from streaming_merge.table.snapshot import DataFile, Snapshot, check_writable, load_snapshot
from streaming_merge.table.write import delete_written

log = logging.getLogger(__name__)

PhaseHook = Callable[[str, DataFrame], None]


@dataclass(frozen=True)
class MergeOptions:
    """Knobs with Delta's defaults (``spark.databricks.delta.merge.*`` in Delta)."""

    materialize_source: MaterializePolicy = "auto"
    storage_levels: tuple[str, ...] = DEFAULT_STORAGE_LEVELS
    max_attempts: int = 4
    optimize_matched_only: bool = True
    repartition_before_write: bool = True
    source_key_range_skipping: bool = True
    # Called with a phase name and the (materialized) source between phases; for
    # diagnostics and fault-injection tests.
    phase_hook: PhaseHook | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, got {self.max_attempts}")
        if not self.storage_levels:
            raise ValueError("storage_levels needs at least one storage level name")


@dataclass(frozen=True)
class MergeRequest:
    table_path: str
    source: DataFrame
    source_alias: str
    target_alias: str
    condition: Column
    clauses: Sequence[MergeClause]
    schema_evolution: bool = False
    options: MergeOptions = field(default_factory=MergeOptions)
    app_id: str | None = None
    app_version: int | None = None


@contextlib.contextmanager
def job_description(spark: SparkSession, status: str) -> Iterator[None]:
    """Name the Spark jobs of a phase in the UI, as Delta's recordMergeOperation does."""
    context = spark.sparkContext
    previous = context.getLocalProperty("spark.job.description")
    context.setJobDescription(status if previous is None else f"{previous}: {status}")
    try:
        yield
    finally:
        context.setLocalProperty("spark.job.description", previous)  # type: ignore[arg-type]


_AQE_EXCLUDED_RULES = "spark.sql.adaptive.optimizer.excludedRules"
_AQE_EMPTY_RELATION = "org.apache.spark.sql.execution.adaptive.AQEPropagateEmptyRelation"


@contextlib.contextmanager
def keep_observations(spark: SparkSession) -> Iterator[None]:
    """Keep AQE from pruning the plan nodes that carry our metrics.

    When a shuffle stage turns out empty, AQE's empty-relation rule rewrites the rest of the
    plan without the ``CollectMetrics`` nodes that already ran, and Spark then reports no
    metrics for them (counts silently lost). The rule only saves work on empty stages, so
    it is switched off for the duration of a MERGE.
    """
    previous = spark.conf.get(_AQE_EXCLUDED_RULES, None)
    rules = [r for r in (previous or "").split(",") if r]
    if _AQE_EMPTY_RELATION in rules:
        yield
        return
    spark.conf.set(_AQE_EXCLUDED_RULES, ",".join([*rules, _AQE_EMPTY_RELATION]))
    try:
        yield
    finally:
        if previous is None:
            spark.conf.unset(_AQE_EXCLUDED_RULES)
        else:
            spark.conf.set(_AQE_EXCLUDED_RULES, previous)


def _millis_since(start: float) -> int:
    return int((time.monotonic() - start) * 1000)


def run_merge(spark: SparkSession, request: MergeRequest) -> MergeMetrics:
    """Run the MERGE, rerunning it when the materialized source lost blocks."""
    clauses = ClauseSet.of(request.clauses)
    clauses.validate()
    options = request.options
    materializing = should_materialize(options.materialize_source, request.source, clauses.is_insert_only)
    for attempt in range(1, options.max_attempts + 1):
        level = level_for_attempt(options.storage_levels, attempt)
        source = materialize(request.source, level) if materializing else request.source
        try:
            with keep_observations(spark):
                return _run_once(spark, request, clauses, source, attempt)
        except Exception as exc:
            if not (materializing and is_lost_block_error(exc)):
                raise _translate(exc) from exc
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
        finally:
            if materializing:
                release(source)
    raise AssertionError("unreachable")


def _translate(exc: Exception) -> Exception:
    text = str(exc)
    if OVERFLOW_MARKER in text:
        start = text.find(f"[{OVERFLOW_MARKER}]")
        message = text[start:].split("\n")[0] if start >= 0 else text
        return MergeAssignmentOverflowError(message.strip().strip('"'))
    return exc


def _run_once(spark: SparkSession, request: MergeRequest, clauses: ClauseSet, source: DataFrame,
              attempt: int) -> MergeMetrics:
    started = time.monotonic()
    snapshot = load_snapshot(request.table_path)
    check_writable(snapshot)
    check_partition_columns(snapshot.schema, snapshot.partition_columns)
    if request.app_id is not None and request.app_version is not None:
        applied = snapshot.transaction_version(request.app_id)
        if applied is not None and applied >= request.app_version:
            log.info("MERGE into %s skipped: txn %r already at version %d >= %d", request.table_path,
                     request.app_id, applied, request.app_version)
            return MergeMetrics({}, skipped=True, attempts=attempt, table_version=snapshot.version)

    resolved = resolve_merge(spark, source, request.source_alias, snapshot.schema, request.target_alias,
                             request.condition, clauses, request.schema_evolution)
    hook = request.options.phase_hook or (lambda phase, frame: None)
    metrics: dict[str, int] = {
        "numTargetFilesBeforeSkipping": len(snapshot.files),
        "numTargetBytesBeforeSkipping": snapshot.num_bytes,
    }

    scan_started = time.monotonic()
    with job_description(spark, "MERGE operation - scanning files for matches"):
        skipping = plan_skipping(
            source, request.source_alias, request.target_alias, snapshot.schema, request.condition,
            [c.condition for c in resolved.matched] if clauses.is_matched_only
            and all(c.condition is not None for c in resolved.matched) else None,  # type: ignore[misc]
            bool(resolved.not_matched_by_source), request.options.source_key_range_skipping,
        )
        candidates = skipping.select(spark, snapshot, snapshot.files)
        metrics["numTargetFilesAfterSkipping"] = len(candidates)
        metrics["numTargetBytesAfterSkipping"] = sum(f.size for f in candidates)
        metrics["numTargetPartitionsAfterSkipping"] = _partitions(snapshot, candidates)
        to_rewrite: list[DataFile] = []
        if not clauses.is_insert_only:
            touched = find_touched_files(spark, snapshot, candidates, source, resolved,
                                         [t for t, _ in key_pairs(request.condition, skipping.scope)],
                                         skipping.source_rows)
            metrics["numSourceRows"] = touched.num_source_rows
            to_rewrite = touched.files
    metrics["scanTimeMs"] = _millis_since(scan_started) if not clauses.is_insert_only else 0
    hook("after_find_touched_files", source)

    rewrite_started = time.monotonic()
    result = _rewrite(spark, snapshot, candidates, to_rewrite, source, resolved, request.options,
                      skipping.source_rows)
    metrics["rewriteTimeMs"] = _millis_since(rewrite_started)
    metrics.update(result.counts)
    if clauses.is_only_one_unconditional_delete and to_rewrite:
        metrics["numTargetRowsMatchedDeleted"] = touched.matched_target_rows  # once per row, not per match
    hook("before_commit", source)

    written = result.files
    metrics.update({
        "numTargetFilesRemoved": len(to_rewrite),
        "numTargetBytesRemoved": sum(f.size for f in to_rewrite),
        "numTargetPartitionsRemovedFrom": _partitions(snapshot, to_rewrite),
        "numTargetFilesAdded": len(written),
        "numTargetBytesAdded": sum(w.size for w in written),
        "numTargetPartitionsAddedTo": len({tuple(sorted(w.partition_values.items())) for w in written})
        if snapshot.partition_columns else 0,
    })
    try:
        commit_snapshot = snapshot
        if resolved.output_schema != snapshot.schema:
            commit_snapshot = add_columns(snapshot, resolved.output_schema)
        metrics["executionTimeMs"] = _millis_since(started)
        final = MergeMetrics(metrics, attempts=attempt)
        version = commit(CommitRequest(
            snapshot=commit_snapshot,
            adds=written,
            removes=to_rewrite,
            operation="MERGE",
            operation_parameters=_parameters(resolved),
            operation_metrics=final.delta_metrics(),
            app_id=request.app_id,
            app_version=request.app_version,
            read_files=candidates,
            concurrent_append_filter=_append_filter(spark, skipping),
        ))
    except BaseException:
        delete_written(snapshot.table_path, written)
        raise
    return MergeMetrics(metrics, attempts=attempt, table_version=version)


def _rewrite(spark: SparkSession, snapshot: Snapshot, candidates: list[DataFile], to_rewrite: list[DataFile],
             source: DataFrame, resolved: ResolvedMerge, options: MergeOptions, source_rows: int
             ) -> RewriteResult:
    clauses = resolved.clauses
    if clauses.is_insert_only or (not to_rewrite and resolved.not_matched):
        with job_description(spark, "MERGE operation - writing new files for only inserts"):
            return write_inserts_only(
                spark, snapshot, candidates, source, resolved, repartition=options.repartition_before_write,
                source_count_metric="numSourceRows" if clauses.is_insert_only else "numSourceRowsInSecondScan",
            )
    if not to_rewrite:
        return RewriteResult([], {})
    with job_description(spark, f"MERGE operation - Rewriting {len(to_rewrite)} files"):
        return write_all_changes(spark, snapshot, to_rewrite, source, resolved,
                                 optimize_matched_only=options.optimize_matched_only,
                                 repartition=options.repartition_before_write, source_rows=source_rows)


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
