"""``optimize().where(...)``: the partition predicate that limits what OPTIMIZE compacts.

As in Delta, the predicate may reference partition columns only: a compaction rewrites
whole files, and a predicate over data columns would have to split them. It is evaluated
by Spark (Spark's typing and comparison rules, not ours) over a small local table of the
distinct partition values taken from the log; Spark folds a filter over local rows on the
driver, so this costs no Spark job.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql import Column, SparkSession
from pyspark.sql import functions as F

from streaming_merge.errors import OptimizeAnalysisError
from streaming_merge.merge.skipping import catalyst
from streaming_merge.optimize.binpack import PartitionKey, partition_key
from streaming_merge.table.snapshot import DataFile, Snapshot

Predicate = str | Column

_ID = "__sm_partition_id__"
_SUBQUERY_KINDS = ("Exists", "ListQuery", "ScalarSubquery", "LateralSubquery")


def as_column(predicate: Predicate) -> Column:
    if isinstance(predicate, Column):
        return predicate
    if not isinstance(predicate, str) or not predicate.strip():
        raise OptimizeAnalysisError(f"optimize().where() needs a SQL predicate or a Column, got {predicate!r}")
    try:
        column = F.expr(predicate)
        catalyst(column)  # PySpark parses lazily; parse now, so a syntax error names the predicate
        return column
    except Exception as exc:  # ParseException
        raise OptimizeAnalysisError(f"Cannot parse the OPTIMIZE predicate {predicate!r}: {exc}") from exc


def predicate_text(predicate: Predicate) -> str:
    """The predicate as SQL text, for the commit's ``operationParameters``."""
    if isinstance(predicate, str):
        return predicate
    try:
        return str(catalyst(predicate).sql())
    except Exception:
        return str(predicate)


def check_partition_only(predicate: Predicate, partition_columns: Sequence[str]) -> None:
    """Refuse (with Delta's message) a predicate that references a non-partition column."""
    node = catalyst(as_column(predicate))
    known = {c.lower() for c in partition_columns}
    for kind, name in _references(node):
        if kind in _SUBQUERY_KINDS or "Subquery" in kind:
            raise OptimizeAnalysisError(
                f"Subqueries are not supported in the OPTIMIZE predicate {predicate_text(predicate)!r}.")
        if name is not None and name.lower() not in known:
            raise OptimizeAnalysisError(
                f"Predicate references non-partition column '{name}'. Only the partition columns may be "
                f"referenced: [{', '.join(partition_columns)}]")


def _references(node: Any) -> list[tuple[str, str | None]]:
    """(Catalyst class, referenced column name or None) for every node under ``node``."""
    kind = str(node.getClass().getSimpleName())
    if kind == "UnresolvedAttribute":
        parts = node.nameParts()
        return [(kind, ".".join(str(parts.apply(i)) for i in range(parts.size())))]
    if kind.startswith("Unresolved") and kind not in ("UnresolvedFunction", "UnresolvedAlias"):
        return [(kind, str(node))]  # a star or another name we cannot resolve against partitions
    found: list[tuple[str, str | None]] = [(kind, None)]
    children = node.children()
    for i in range(children.size()):
        found += _references(children.apply(i))
    return found


def files_matching(spark: SparkSession, snapshot: Snapshot, predicates: Sequence[Predicate]) -> list[DataFile]:
    """The snapshot's files whose partition satisfies every predicate."""
    if not predicates:
        return list(snapshot.files)
    columns = snapshot.partition_columns
    for predicate in predicates:
        check_partition_only(predicate, columns)
    if not snapshot.files:
        return []
    keys = _distinct_partitions(snapshot)
    frame = spark.createDataFrame(_partition_table(snapshot, keys))
    typed = frame.select(*[F.col(f"`{c}`").cast(snapshot.schema[c].dataType).alias(c) for c in columns],
                         F.col(_ID))
    condition = as_column(predicates[0])
    for predicate in predicates[1:]:
        condition = condition & as_column(predicate)
    try:
        kept_ids = {row[0] for row in typed.filter(condition).select(_ID).collect()}
    except Exception as exc:  # AnalysisException: unknown function, type mismatch, ...
        raise OptimizeAnalysisError(
            f"Cannot evaluate the OPTIMIZE predicate {[predicate_text(p) for p in predicates]} over the "
            f"partition columns {columns}: {str(exc).splitlines()[0]}") from exc
    kept = {keys[i] for i in kept_ids}
    return [f for f in snapshot.files if partition_key(f, columns) in kept]


def _distinct_partitions(snapshot: Snapshot) -> list[PartitionKey]:
    seen: dict[PartitionKey, None] = {}
    for file in snapshot.files:
        seen.setdefault(partition_key(file, snapshot.partition_columns), None)
    return list(seen)


def _partition_table(snapshot: Snapshot, keys: list[PartitionKey]) -> pa.Table:
    """One row per partition, typed as the log's add actions type the values (an Arrow table
    becomes a local relation: no Spark job to filter it)."""
    columns: dict[str, pa.Array] = {}
    for i, name in enumerate(snapshot.partition_columns):
        stats_column = f"partition.{name}"
        arrow_type = (snapshot.stats.schema.field(stats_column).type
                      if stats_column in snapshot.stats.column_names else pa.string())
        columns[name] = pa.array([key[i][1] for key in keys], arrow_type)
    columns[_ID] = pa.array(range(len(keys)), pa.int64())
    return pa.table(columns)
