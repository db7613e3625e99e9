"""What DELETE and UPDATE share: planning against one snapshot, finding the matching rows'
positions, writing new files, committing, and Delta's metrics.

A DELETE or UPDATE is one Delta transaction, like a MERGE: one snapshot at version V, data
skipping on the condition, Spark jobs over the candidate files only, and one commit of
removes, deletion vectors and adds against V with ``read_files`` = the files scanned, so a
concurrent commit that removed one of them raises ConcurrentModificationError.

The matching rows' positions are gathered without shipping rows to the driver: one Spark job
groups the matches by (file, 32768-row bucket) and ORs their row indexes into Spark's
4 KB bitmaps (``bitmap_construct_agg``), so what reaches the driver is bounded by the candidate
files' row count / 8 bytes whatever the number of matches, and numpy decodes it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from pyroaring import BitMap64
from pyspark.errors import AnalysisException
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import DataType

from streaming_merge.errors import DeltaTableError, DmlAnalysisError, OptimizeAnalysisError
from streaming_merge.merge.clauses import expr_text, to_column
from streaming_merge.merge.command import MergeOptions, translate_overflow
from streaming_merge.merge.metrics import MetricsMapping
from streaming_merge.merge.rewrite import FileLayout
from streaming_merge.merge.skipping import ColumnScope, SkippingPlan, target_only_conjuncts
from streaming_merge.optimize.predicate import check_partition_only, files_matching
from streaming_merge.spark.answers_at_once import answer_at_once
from streaming_merge.spark.conf import temporary_conf
from streaming_merge.spark.slots import task_slots
from streaming_merge.table.commit import CommitRequest, commit_with_deletion_vectors
from streaming_merge.table.file_ids import FileIds
from streaming_merge.table.location import TableLocation
from streaming_merge.table.protocol import is_enabled
from streaming_merge.table.scan import scan_files
from streaming_merge.table.schema import check_partition_columns
from streaming_merge.table.snapshot import DataFile, Snapshot, check_writable, load_snapshot
from streaming_merge.table.spark_paths import ROW_INDEX_COL
from streaming_merge.table.write import WrittenFile, write_files

__all__ = ["DmlMetrics"]

# Metrics under Delta's names (DeleteCommandMetrics / UpdateCommand), as stored in operationMetrics.
_FILE_METRICS = ("numAddedFiles", "numRemovedFiles", "numAddedBytes", "numRemovedBytes", "numDeletionVectorsAdded",
                 "numDeletionVectorsRemoved", "numDeletionVectorsUpdated", "numAddedChangeFiles", "executionTimeMs",
                 "scanTimeMs", "rewriteTimeMs")
DELETE_METRICS: tuple[str, ...] = ("numDeletedRows", "numCopiedRows", *_FILE_METRICS)
UPDATE_METRICS: tuple[str, ...] = ("numUpdatedRows", "numCopiedRows", *_FILE_METRICS)

# Spark's bitmap functions work on buckets of 4 KB = 32768 bits.
_BUCKET_BITS = 15
_BUCKET_ROWS = 1 << _BUCKET_BITS
_FILE_ID = "__sm_dml_file_id__"
_BUCKET = "__sm_dml_bucket__"
_BITS = "__sm_dml_bits__"
# The write's sizing knobs are MERGE's (MergeOptions' defaults): one policy for new files.
_WRITE_DEFAULTS = MergeOptions()


class DmlMetrics(MetricsMapping):
    """Metrics of one DELETE or UPDATE under Delta's names (DELETE_METRICS / UPDATE_METRICS),
    plus ``num_affected_rows`` (what Delta's SQL command returns) and ``tableVersion`` (the
    version committed; None when nothing matched and nothing was committed). A read-only
    mapping, so it reads like Delta's ``operationMetrics`` and ``dict(metrics)`` serialises it."""

    def __init__(self, operation: str, values: Mapping[str, int], table_version: int | None = None) -> None:
        names = DELETE_METRICS if operation == "DELETE" else UPDATE_METRICS
        unknown = set(values) - set(names)
        if unknown:
            raise KeyError(f"Unknown {operation} metrics {sorted(unknown)}")
        self.operation = operation
        data: dict[str, int | None] = {name: int(values.get(name, 0)) for name in names}
        data["num_affected_rows"] = data[names[0]]
        data["tableVersion"] = table_version
        self._names = names
        self._data = data

    def __repr__(self) -> str:
        return f"DmlMetrics({self.operation}, {({k: v for k, v in self._data.items() if v})})"


@dataclass(frozen=True)
class DmlPlan:
    """One DELETE or UPDATE planned against one snapshot.

    ``candidates`` are the files that may hold a matching row: with ``exact`` every live row
    of every candidate matches (no condition, or a deterministic one over partition values
    only, decided per file from the log), so no Spark job is needed to find the rows.
    ``skipping`` also decides which concurrently appended files the condition could match."""

    snapshot: Snapshot
    alias: str
    condition: Column | None
    predicate: str | None  # the condition as SQL text, for the commit's operationParameters
    candidates: list[DataFile]
    exact: bool
    skipping: SkippingPlan
    analysis_frame: DataFrame  # an empty DataFrame of the table, aliased: resolves expressions, runs no job

    def scan(self, spark: SparkSession, files: Sequence[DataFile], with_row_id: bool = False) -> DataFrame:
        """The live rows of ``files`` (deletion vectors applied), aliased as the table, so a
        condition may name ``alias.column``."""
        return scan_files(spark, self.snapshot, files, with_row_id=with_row_id,
                          with_file_size=with_row_id).alias(self.alias)


def plan_dml(spark: SparkSession, location: TableLocation, alias: str, condition: str | Column | None,
             operation: str, checked: Callable[[Snapshot], Sequence[tuple[Column, str]]] | None = None,
             ) -> tuple[DmlPlan, list[DataType]]:
    """Snapshot the table, refuse what cannot be written, resolve the condition (and the
    expressions ``checked`` gives for the snapshot, with what each is, in the same analysis:
    each Spark analysis is a round trip through the analyzer; their types are returned) and
    choose the candidate files.

    Data skipping is the MERGE's (streaming_merge.merge.skipping): the condition's conjuncts
    against each file's partition values and min/max/null-count stats; a condition over
    partition columns only is decided exactly per partition (optimize.predicate.files_matching),
    which for a DELETE removes whole files without reading them, as Delta's metadata-only delete."""
    answer_at_once(spark)
    snapshot = load_snapshot(location)
    check_writable(snapshot)
    check_partition_columns(snapshot.schema, snapshot.partition_columns)
    if is_enabled(snapshot.configuration, "delta.appendOnly"):
        # commit() refuses this too; here the refusal comes before any Spark job or file.
        raise DeltaTableError(
            f"This table is configured to only allow appends (`{snapshot.table_path}`, delta.appendOnly=true); "
            f"{operation} is refused. If you would like to permit updates or deletes, set delta.appendOnly=false."
        )
    frame = spark.createDataFrame([], snapshot.schema).alias(alias)
    column = parse_expression(condition, f"the {operation} condition") if condition is not None else None
    expressions = [*([(column, f"the {operation} condition `{expr_text(condition)}`")]
                     if column is not None and condition is not None else []),
                   *(checked(snapshot) if checked is not None else ())]
    types, deterministic, resolved_sql = analyze(frame, expressions)
    names = [f.name for f in snapshot.schema.fields]
    scope = ColumnScope(alias, "", names, [])
    if column is None or condition is None:
        skipping = SkippingPlan((), (), scope, snapshot.schema, skip_nothing=True)
        return DmlPlan(snapshot, alias, None, None, list(snapshot.files), True, skipping, frame), types
    condition_type = types.pop(0)
    if condition_type.typeName() != "boolean":
        raise DmlAnalysisError(f"The {operation} condition `{expr_text(condition)}` must be a boolean "
                               f"expression, not {condition_type.simpleString()}.")
    skipping = SkippingPlan(target_only_conjuncts([column], scope), (), scope, snapshot.schema, skip_nothing=False)
    exact = deterministic and _partition_only(column, snapshot.partition_columns)
    candidates = None
    if exact:
        try:
            candidates = files_matching(spark, snapshot, [column])
        except OptimizeAnalysisError:  # e.g. a qualified name the partition table cannot resolve: scan instead
            exact = False
    if candidates is None:
        candidates = skipping.select(spark, snapshot, snapshot.files)
    # A Column's own text is its unresolved tree (``=(k, 3)``); Spark's SQL of it, resolved, reads as written.
    predicate = condition if isinstance(condition, str) else resolved_sql
    return DmlPlan(snapshot, alias, column, predicate, candidates, exact, skipping, frame), types


def parse_expression(expr: str | Column, what: str) -> Column:
    """SQL text or a Column as a Column; a syntax error names ``what`` it is."""
    try:
        return to_column(expr)
    except AnalysisException as exc:  # ParseException: Spark parses SQL text eagerly
        raise DmlAnalysisError(f"Cannot parse {what} {expr!r}: {_first_line(exc)}") from exc


def analyze(frame: DataFrame, expressions: Sequence[tuple[Column, str]]) -> tuple[list[DataType], bool, str]:
    """The types of ``expressions`` (with what each is, for the error) resolved in one Spark
    analysis over ``frame``, and whether the first one is deterministic and its resolved SQL.
    Only when that analysis fails is each analysed alone, so the error names the first one at
    fault."""
    if not expressions:
        return [], True, ""
    try:
        projected = frame.select(*[expr.alias(f"_{i}") for i, (expr, _) in enumerate(expressions)])
        types = [f.dataType for f in projected.schema.fields]
    except AnalysisException as exc:
        for expr, what in expressions:
            try:
                frame.select(expr).schema  # noqa: B018 - analysis only
            except AnalysisException as single:
                raise DmlAnalysisError(f"Cannot resolve {what}: {_first_line(single)}") from single
        raise DmlAnalysisError(f"Cannot resolve {expressions[0][1]}: {_first_line(exc)}") from exc
    first = projected._jdf.queryExecution().analyzed().projectList().apply(0)  # Alias(expression)
    return types, bool(first.deterministic()), str(first.child().sql())


def _partition_only(condition: Column, partition_columns: Sequence[str]) -> bool:
    """Whether ``condition`` names no column but partition columns (Delta's metadata predicate)."""
    try:
        check_partition_only(condition, partition_columns)
    except OptimizeAnalysisError:
        return False
    return True


def matching_rows(spark: SparkSession, plan: DmlPlan, files: Sequence[DataFile]) -> dict[int, np.ndarray]:
    """The row indexes (inside their file, ascending) of the live rows of ``files`` for which
    the condition is true, by the file's position in ``files``; files without such a row are
    absent. One Spark job (see the module docstring); AQE is off for it because under AQE the
    aggregation's shuffle runs as a job of its own, and this aggregate has nothing to adapt."""
    assert plan.condition is not None
    if not files:
        return {}
    ids = FileIds.of(spark, plan.snapshot, files)
    row = F.col(ROW_INDEX_COL)
    bitmaps = (plan.scan(spark, files, with_row_id=True).filter(plan.condition)
               .groupBy(ids.column().alias(_FILE_ID), F.shiftright(row, _BUCKET_BITS).alias(_BUCKET))
               .agg(F.bitmap_construct_agg(row.bitwiseAND(_BUCKET_ROWS - 1)).alias(_BITS)))
    buckets = sum(-(-(f.num_records or _BUCKET_ROWS) // _BUCKET_ROWS) for f in files)
    partitions = max(1, min(task_slots(spark), buckets))
    with temporary_conf(spark, {"spark.sql.adaptive.enabled": "false",
                                "spark.sql.shuffle.partitions": str(partitions)}):
        table = bitmaps.toArrow()
    found: dict[int, list[np.ndarray]] = {}
    for file_id, bucket, bits in zip(table.column(_FILE_ID).to_pylist(), table.column(_BUCKET).to_pylist(),
                                     table.column(_BITS).to_pylist(), strict=True):
        position = ids.position(int(file_id))
        if position is None:
            raise AssertionError(f"{plan.snapshot.table_path}: a scanned row's file id {file_id} is no candidate's")
        set_bits = np.flatnonzero(np.unpackbits(np.frombuffer(bits, dtype=np.uint8), bitorder="little"))
        found.setdefault(position, []).append(set_bits.astype(np.int64) + int(bucket) * _BUCKET_ROWS)
    return {position: np.sort(np.concatenate(parts)) for position, parts in found.items()}


def write_rows(spark: SparkSession, snapshot: Snapshot, frame: DataFrame, rewritten: Sequence[DataFile],
               estimated_bytes: int, change_data: bool = False) -> list[WrittenFile]:
    """Write ``frame`` (the table's columns, in order; with ``change_data`` then
    ``_change_type``, see change_rows) as new files of the table, cut as a MERGE cuts them
    (FileLayout with MergeOptions' sizes) but without a shuffle: the rows are coalesced into
    that many tasks, and a partitioned table gets a file per partition value per task.
    Overflowing assignments surface here, as MergeAssignmentOverflowError."""
    layout = FileLayout(False, _WRITE_DEFAULTS.target_file_size, estimated_bytes,
                        _WRITE_DEFAULTS.min_parallel_file_size, max((f.size for f in rewritten), default=0))
    with _overflow_errors():
        return write_files(spark, frame.coalesce(layout.files(task_slots(spark))), snapshot.location,
                           snapshot.schema, snapshot.partition_columns, change_data=change_data)


def change_rows(rows: Sequence[tuple[Column | None, Sequence[tuple[Sequence[Column], str | None]]]],
                names: Sequence[str]) -> Column:
    """One ``inline`` that turns a scanned row into the rows a DML writes with change data on
    (``_change_type`` NULL for a data row): ``rows`` are (when, [(values, change type)...])
    branches, the first that holds wins (None: always); a row no branch takes writes nothing."""
    from streaming_merge.table.write import CHANGE_TYPE_COL

    def struct(values: Sequence[Column], change_type: str | None) -> Column:
        return F.struct(*[v.alias(n) for v, n in zip(values, names, strict=True)],
                        F.lit(change_type).cast("string").alias(CHANGE_TYPE_COL))

    chosen: Column | None = None
    for when, outputs in rows:
        value = F.array(*[struct(values, kind) for values, kind in outputs])
        if when is None:
            chosen = value if chosen is None else chosen.otherwise(value)
            break
        chosen = F.when(when, value) if chosen is None else chosen.when(when, value)
    assert chosen is not None
    return F.inline(chosen)


@contextlib.contextmanager
def _overflow_errors() -> Iterator[None]:
    try:
        yield
    except Exception as exc:
        translated = translate_overflow(exc)
        if translated is exc:
            raise
        raise translated from exc


def commit_changes(spark: SparkSession, plan: DmlPlan, *, operation: str, parameters: Mapping[str, Any],
                   metrics: DmlMetrics, written: list[WrittenFile], removed: Sequence[DataFile],
                   vectors: Sequence[tuple[DataFile, BitMap64]], read_files: Sequence[DataFile]) -> int:
    """Write the new deletion vectors and commit against the plan's snapshot (as a MERGE does:
    on any failure nothing the operation wrote lingers)."""
    skipping = plan.skipping
    return commit_with_deletion_vectors(spark, CommitRequest(
        snapshot=plan.snapshot,
        adds=written,
        removes=list(removed),
        operation=operation,
        operation_parameters=parameters,
        operation_metrics=metrics.delta_metrics(),
        read_files=read_files,
        concurrent_append_filter=lambda latest, added: skipping.select(spark, latest, added),
    ), vectors)


def file_metrics(written: Sequence[WrittenFile], removed: Sequence[DataFile]) -> dict[str, int]:
    data = [w for w in written if not w.change_data]
    return {"numAddedFiles": len(data), "numAddedBytes": sum(w.size for w in data),
            "numRemovedFiles": len(removed), "numRemovedBytes": sum(f.size for f in removed),
            "numAddedChangeFiles": len(written) - len(data)}


def millis_since(started: float) -> int:
    return int((time.monotonic() - started) * 1000)


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
