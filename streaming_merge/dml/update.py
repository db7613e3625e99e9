"""UPDATE: Delta's UpdateCommand on Spark, returning its metrics.

Assignments are resolved by Spark against the table and stored as a MERGE stores them
(streaming_merge.merge.resolve: ANSI store assignment, and a numeric value that does not fit
its column raises MergeAssignmentOverflowError instead of wrapping); assigning a column the
table does not have raises DmlAnalysisError naming it.

- A table with ``delta.enableDeletionVectors=true``: ONE Spark job scans the candidate files,
  writes the updated rows as new files and observes their (file, row index) pairs (two lists of
  longs, bounded by the updated rows, which that job writes anyway); the old positions then go
  into the files' deletion vectors (a file whose every row was updated is removed). No
  untouched row is copied.
- Otherwise (copy-on-write): one job finds the files holding a matching row (skipped when the
  condition is decided by the log: none, or one over partition columns only), a second
  rewrites those files with the assignments applied to the matching rows.
No matching row: nothing is committed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence

import numpy as np
from pyroaring import BitMap64
from pyspark.sql import Column, DataFrame, Observation, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import DataType

from streaming_merge.dml._common import (
    DmlMetrics,
    DmlPlan,
    change_rows,
    commit_changes,
    file_metrics,
    matching_rows,
    millis_since,
    parse_expression,
    plan_dml,
    write_rows,
)
from streaming_merge.errors import DmlAnalysisError, MergeAnalysisError
from streaming_merge.merge.change_data import UPDATE_POSTIMAGE, UPDATE_PREIMAGE, records_change_data
from streaming_merge.merge.clauses import expr_text
from streaming_merge.merge.dv_rewrite import deletion_vector_changes

# Private in merge.resolve: _ClauseResolver._store is how a MERGE casts an assigned value to
# its column (ANSI store assignment, overflow raised at run time); an UPDATE must cast alike.
from streaming_merge.merge.resolve import _ClauseResolver
from streaming_merge.spark.interpreted import DEFAULT_INTERPRETED_MAX_ROWS, interpreted_if_small, rows_of
from streaming_merge.spark.observed_longs import long_list, longs, observed_row
from streaming_merge.spark.profile import phase
from streaming_merge.table.file_ids import FileIds
from streaming_merge.table.location import TableLocation
from streaming_merge.table.snapshot import DataFile, Snapshot
from streaming_merge.table.spark_paths import ROW_INDEX_COL
from streaming_merge.table.write import WrittenFile, delete_written

log = logging.getLogger(__name__)

OPERATION = "UPDATE"
_FILE_ID = "__sm_dml_file_id__"
_ROW = "__sm_dml_row_index__"
_FILE_IDS = "updatedRowFiles"
_ROWS = "updatedRowIndexes"

Assignments = Mapping[str, str | Column]


def run_update(spark: SparkSession, location: TableLocation, alias: str, condition: str | Column | None,
               assignments: Assignments | None) -> DmlMetrics:
    """Apply ``assignments`` (column -> SQL expression or Column) to the rows of the table at
    ``location`` for which ``condition`` is true (every row without one); returns Delta's UPDATE
    metrics, ``tableVersion`` None when nothing matched."""
    started = time.monotonic()
    if not assignments:
        raise DmlAnalysisError("UPDATE needs at least one assignment: update(condition, set={'column': 'expression'}).")
    parsed: dict[str, tuple[Column, str]] = {}

    def checked(snapshot: Snapshot) -> list[tuple[Column, str]]:
        parsed.update(_parse_assignments(snapshot, alias, assignments))
        return [(value, f"the value `{text}` for column `{name}`") for name, (value, text) in parsed.items()]

    with phase(spark, "snapshot"):
        plan, types = plan_dml(spark, location, alias, condition, OPERATION, checked)
    values = _stored(spark, plan, parsed, types)
    candidates = plan.candidates
    with interpreted_if_small(spark, rows_of([f.num_records for f in candidates]), DEFAULT_INTERPRETED_MAX_ROWS):
        if plan.snapshot.writes_deletion_vectors:
            return _update_with_deletion_vectors(spark, plan, values, started)
        return _copy_on_write(spark, plan, values, started)


def _parse_assignments(snapshot: Snapshot, alias: str, assignments: Assignments) -> dict[str, tuple[Column, str]]:
    """Each assigned column (the table's spelling) with its value, unresolved, and the value's
    text for messages. A target name may be qualified with the table's alias; names match
    case-insensitively, as Spark's."""
    by_lower = {f.name.lower(): f.name for f in snapshot.schema.fields}
    parsed: dict[str, tuple[Column, str]] = {}
    for key, expr in assignments.items():
        name = _strip_alias(key, alias)
        column = by_lower.get(name.lower())
        if column is None:
            raise DmlAnalysisError(
                f"UPDATE assigns to `{key}`, which is not a column of table `{snapshot.table_path}` (columns: "
                f"{snapshot.schema.fieldNames()}). Nested fields cannot be assigned one by one; assign the whole "
                "struct.")
        if column in parsed:
            raise DmlAnalysisError(f"UPDATE assigns column `{column}` more than once.")
        parsed[column] = parse_expression(expr, f"the value for column `{column}`"), expr_text(expr)
    return parsed


def _strip_alias(key: str, alias: str) -> str:
    key = key.strip().strip("`")
    prefix = f"{alias}."
    return key[len(prefix):].strip("`") if key.lower().startswith(prefix.lower()) else key


def _stored(spark: SparkSession, plan: DmlPlan, parsed: Mapping[str, tuple[Column, str]],
            types: Sequence[DataType]) -> dict[str, Column]:
    """Each assigned value cast to its column's type as a MERGE stores it (see the module
    docstring); a value no ANSI store assignment can cast is refused before anything runs."""
    schema = plan.snapshot.schema
    frame = plan.analysis_frame
    resolver = _ClauseResolver(spark, frame, frame, frame, schema, schema, "", plan.alias, False)
    stored: dict[str, Column] = {}
    for (name, (value, text)), from_type in zip(parsed.items(), types, strict=True):
        try:
            stored[name] = resolver._store(value, from_type, schema[name], f"`UPDATE SET {name} = {text}`")
        except MergeAnalysisError as exc:
            raise DmlAnalysisError(str(exc)) from exc
    return stored


def _new_columns(plan: DmlPlan, values: Mapping[str, Column], updated: Column | None) -> list[Column]:
    """The table's columns, in order, with the assignments applied (where ``updated`` holds,
    when given: a row it does not hold is copied as it is)."""
    columns = []
    for field in plan.snapshot.schema.fields:
        current = F.col(f"`{plan.alias}`.`{field.name}`")
        value = values.get(field.name)
        if value is None:
            columns.append(current.alias(field.name))
        elif updated is None:
            columns.append(value.alias(field.name))
        else:
            columns.append(F.when(updated, value).otherwise(current).alias(field.name))
    return columns


def _update_with_deletion_vectors(spark: SparkSession, plan: DmlPlan, values: Mapping[str, Column],
                                  started: float) -> DmlMetrics:
    """One job: write the updated rows, observe their positions; then the deletion vectors."""
    snapshot, candidates = plan.snapshot, plan.candidates
    ids = FileIds.of(spark, snapshot, candidates)
    scan = plan.scan(spark, candidates, with_row_id=True)
    matched = scan.filter(plan.condition) if plan.condition is not None else scan
    observation = Observation()
    names = snapshot.schema.fieldNames()
    change_data = records_change_data(snapshot)
    old = [F.col(f"`{plan.alias}`.`{n}`").alias(_old(i)) for i, n in enumerate(names)] if change_data else []
    rows = (matched.select(*_new_columns(plan, values, None), *old, ids.column().alias(_FILE_ID),
                           F.col(ROW_INDEX_COL).alias(_ROW))
            .observe(observation, long_list(F.col(_FILE_ID)).alias(_FILE_IDS), long_list(F.col(_ROW)).alias(_ROWS)))
    if change_data:
        after = [F.col(f"`{n}`") for n in names]
        before = [F.col(_old(i)) for i in range(len(names))]
        rows = rows.select(change_rows([(None, [(after, None), (before, UPDATE_PREIMAGE),
                                                (after, UPDATE_POSTIMAGE)])], names))
    else:
        rows = rows.select(*[F.col(f"`{name}`") for name in names])
    pass_started = time.monotonic()
    with phase(spark, "writeUpdatedRows", f"UPDATE operation - writing the updated rows of {len(candidates)} "
                                          "candidate files and marking their old positions in deletion vectors"):
        written = write_rows(spark, snapshot, rows, [], sum(f.size for f in candidates), change_data=change_data)
    rewrite_ms = millis_since(pass_started)
    try:
        observed = observed_row(spark, observation, lambda name: name in (_FILE_IDS, _ROWS))
        # one aggregation buffer: the two lists hold the same rows in the same order
        pairs = np.stack([longs(observed.get(_FILE_IDS)), longs(observed.get(_ROWS))], axis=1)
        deleted: dict[int, np.ndarray] = {}
        for file_id in np.unique(pairs[:, 0]):
            position = ids.position(int(file_id))
            if position is None:
                raise AssertionError(f"UPDATE observed a file id that is no candidate's: {file_id}")
            deleted[position] = np.unique(pairs[pairs[:, 0] == file_id, 1])
        changes = deletion_vector_changes(snapshot, candidates, deleted)
    except BaseException:
        delete_written(spark, snapshot.location, written)
        raise
    metrics = {"numUpdatedRows": len(pairs), "numCopiedRows": 0, "scanTimeMs": 0, "rewriteTimeMs": rewrite_ms,
               **{name.replace("Target", ""): value for name, value in changes.metrics().items()},
               **file_metrics(written, changes.removed)}
    return _commit(spark, plan, metrics, written, changes.removed, changes.vectors, started)


def _old(index: int) -> str:
    """The column that carries a row's value of the table's ``index``-th column before the update."""
    return f"__sm_dml_old_{index}__"


def _copy_on_write(spark: SparkSession, plan: DmlPlan, values: Mapping[str, Column], started: float) -> DmlMetrics:
    """Find the touched files (unless the log decides them), then rewrite them."""
    candidates = plan.candidates
    updated: int | None = None
    if plan.exact:  # every live row of every candidate matches
        touched = [f for f in candidates if f.live_records != 0]
    else:
        with phase(spark, "findTouchedFiles", f"UPDATE operation - finding the rows to update in "
                                              f"{len(candidates)} files"):
            positions = matching_rows(spark, plan, candidates)
        touched = [candidates[p] for p in sorted(positions)]
        updated = sum(len(rows) for rows in positions.values())
    scan_ms = millis_since(started)
    if not touched:
        return _nothing(plan, {"scanTimeMs": scan_ms}, started)
    rewrite_started = time.monotonic()
    condition = None if plan.exact or plan.condition is None else F.coalesce(plan.condition, F.lit(False))
    scan = plan.scan(spark, touched)
    change_data = records_change_data(plan.snapshot)
    if change_data:  # updated rows also as their pre- and postimages, copied rows as they are
        names = plan.snapshot.schema.fieldNames()
        after = _new_columns(plan, values, None)
        before = [F.col(f"`{plan.alias}`.`{n}`") for n in names]
        frame: DataFrame = scan.select(change_rows(
            [(condition, [(after, None), (before, UPDATE_PREIMAGE), (after, UPDATE_POSTIMAGE)]),
             (None, [(before, None)])], names))
    else:
        frame = scan.select(*_new_columns(plan, values, condition))
    with phase(spark, "rewrite", f"UPDATE operation - Rewriting {len(touched)} files"):
        written = write_rows(spark, plan.snapshot, frame, touched, sum(f.size for f in touched),
                             change_data=change_data)
    total = sum(w.num_records for w in written if not w.change_data)
    # The rows written are the touched files' rows: the updated ones (counted by the scan that
    # found them, or all of them when the log decided) and the copied rest.
    updated = total if updated is None else updated
    metrics = {"numUpdatedRows": updated, "numCopiedRows": total - updated, "scanTimeMs": scan_ms,
               "rewriteTimeMs": millis_since(rewrite_started),
               "numDeletionVectorsRemoved": sum(1 for f in touched if f.deletion_vector is not None),
               **file_metrics(written, touched)}
    return _commit(spark, plan, metrics, written, touched, [], started)


def _nothing(plan: DmlPlan, metrics: dict[str, int], started: float) -> DmlMetrics:
    log.info("UPDATE on %s: no row matched; nothing committed", plan.snapshot.table_path)
    return DmlMetrics(OPERATION, {**metrics, "executionTimeMs": millis_since(started)})


def _commit(spark: SparkSession, plan: DmlPlan, metrics: dict[str, int], written: list[WrittenFile],
            removed: Sequence[DataFile], vectors: Sequence[tuple[DataFile, BitMap64]], started: float) -> DmlMetrics:
    if not metrics["numUpdatedRows"]:
        delete_written(spark, plan.snapshot.location, written)
        return _nothing(plan, metrics, started)
    metrics["executionTimeMs"] = millis_since(started)
    parameters = {"predicate": plan.predicate} if plan.predicate is not None else {}
    with phase(spark, "commit"):
        version = commit_changes(spark, plan, operation=OPERATION, parameters=parameters,
                                 metrics=DmlMetrics(OPERATION, metrics), written=written, removed=removed,
                                 vectors=vectors, read_files=plan.candidates)
    return DmlMetrics(OPERATION, metrics, version)
