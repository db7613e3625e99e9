"""Data skipping: which target files can possibly hold a row this MERGE touches.

Three sources of pruning, all conservative (a file is kept unless it provably cannot
match):
1. target-only conjuncts of the ON condition (plus, for a matched-only merge, the OR of
   the WHEN MATCHED conditions when all of them are target-only), evaluated against each
   file's partition values and min/max/null-count stats, as Delta's filterFiles does;
2. the source's key range: for each ``target.k = source.k`` conjunct, a file whose
   [min, max] of k lies outside the source's [min, max] cannot match (beyond Delta);
3. nothing at all with WHEN NOT MATCHED BY SOURCE clauses, which touch unmatched rows.

The predicates are Spark Columns over a small DataFrame of per-file stats, so literal
typing and comparison semantics are Spark's, not ours. Expression trees are read from
Spark's parser through the JVM (``SparkSession.expression``), never by parsing SQL ourselves.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import AtomicType, BinaryType, IntegralType, StringType, StructType

from streaming_merge.table.snapshot import DataFile, Snapshot

log = logging.getLogger(__name__)

STRING_STATS_PREFIX = 32
StatsColumns = Callable[[str], tuple[Column, Column, Column]]  # column → (min, max, nulls)


def _children(node: Any) -> list[Any]:
    seq = node.children()
    return [seq.apply(i) for i in range(seq.size())]


_FUNCTION_KINDS = {
    "and": "And", "or": "Or", "=": "EqualTo", "==": "EqualTo", "<": "LessThan", "<=": "LessThanOrEqual",
    ">": "GreaterThan", ">=": "GreaterThanOrEqual", "in": "In", "isnull": "IsNull", "isnotnull": "IsNotNull",
    "not": "Not", "<=>": "EqualNullSafe",
}


def _kind(node: Any) -> str:
    """Catalyst class name; Column-API calls arrive as UnresolvedFunction("=", ...) and are
    mapped to the class the SQL parser would have produced."""
    kind = str(node.getClass().getSimpleName())
    if kind == "UnresolvedFunction":
        parts = node.nameParts()
        name = str(parts.apply(parts.size() - 1)).lower()
        return _FUNCTION_KINDS.get(name, kind)
    return kind


def catalyst(column: Column) -> Any:
    """The unresolved Catalyst expression behind a Column (Spark 4 classic)."""
    spark = SparkSession.getActiveSession()
    assert spark is not None, "an active SparkSession is required"
    return spark._jsparkSession.expression(column._jc)


def _literal_sql(node: Any) -> str | None:
    """SQL text of a constant (a literal, or a cast of one), else None."""
    kind = _kind(node)
    if kind == "Literal" or (kind == "Cast" and all(_literal_sql(c) is not None for c in _children(node))):
        try:
            return str(node.sql())
        except Exception:
            return None
    return None


def _name_parts(node: Any) -> list[str]:
    parts = node.nameParts()
    return [str(parts.apply(i)) for i in range(parts.size())]


def split_conjuncts(node: Any) -> list[Any]:
    if _kind(node) == "And":
        left, right = _children(node)
        return split_conjuncts(left) + split_conjuncts(right)
    return [node]


@dataclass(frozen=True)
class ColumnScope:
    """Which names belong to the target and which to the source (case-insensitive)."""

    target_alias: str
    source_alias: str
    target_columns: Sequence[str]
    source_columns: Sequence[str]

    def target_column(self, node: Any) -> str | None:
        """Target column an UnresolvedAttribute refers to, else None."""
        return _column_of(node, self.target_alias, self.target_columns, self.source_columns)

    def source_column(self, node: Any) -> str | None:
        """Source column an UnresolvedAttribute refers to, else None."""
        return _column_of(node, self.source_alias, self.source_columns, self.target_columns)

    def is_target_only(self, node: Any) -> bool:
        """True when every attribute under ``node`` is a target column (and there is one)."""
        attributes = _attributes(node)
        return bool(attributes) and all(self.target_column(a) is not None for a in attributes)


def _column_of(node: Any, alias: str, own: Sequence[str], other: Sequence[str]) -> str | None:
    """Column of one side an attribute names: qualified by that side's alias, or unqualified
    and not a column of the other side (case-insensitive)."""
    if _kind(node) != "UnresolvedAttribute":
        return None
    parts = _name_parts(node)
    by_lower = {c.lower(): c for c in own}
    if len(parts) == 2 and parts[0].lower() == alias.lower():
        return by_lower.get(parts[1].lower())
    if len(parts) == 1 and parts[0].lower() not in {c.lower() for c in other}:
        return by_lower.get(parts[0].lower())
    return None


def _attributes(node: Any) -> list[Any]:
    if _kind(node) == "UnresolvedAttribute":
        return [node]
    if _kind(node).startswith("Unresolved") and _kind(node) not in ("UnresolvedFunction", "UnresolvedAlias"):
        return [node]  # a star or something we cannot see into: treat as non-target
    found: list[Any] = []
    for child in _children(node):
        found += _attributes(child)
    return found


def key_pairs(condition: Column, scope: ColumnScope) -> list[tuple[str, str]]:
    """``(target column, source column)`` for every ``t.a = s.b`` conjunct of the ON condition."""
    return [pair for conjunct in split_conjuncts(catalyst(condition))
            if (pair := _key_pair(conjunct, scope)) is not None]


def _key_pair(conjunct: Any, scope: ColumnScope) -> tuple[str, str] | None:
    if _kind(conjunct) != "EqualTo":
        return None
    left, right = _children(conjunct)
    for t_node, s_node in ((left, right), (right, left)):
        t_col, s_col = scope.target_column(t_node), scope.source_column(s_node)
        if t_col and s_col:
            return t_col, s_col
    return None


def matches_by_key(condition: Column, scope: ColumnScope) -> bool:
    """True when whether a source row matches depends on its key-pair columns alone: every
    conjunct of the ON condition is a ``t.a = s.b`` pair or reads no source column, so the
    source rows of one key all match or none does (and the unmatched ones can be found by
    key from the matched ones)."""
    pairs = 0
    for conjunct in split_conjuncts(catalyst(condition)):
        if _key_pair(conjunct, scope) is not None:
            pairs += 1
        elif _attributes(conjunct) and not scope.is_target_only(conjunct):
            return False
    return pairs > 0


def target_only_conjuncts(conditions: Sequence[Column], scope: ColumnScope) -> list[Any]:
    nodes = []
    for condition in conditions:
        nodes += [c for c in split_conjuncts(catalyst(condition)) if scope.is_target_only(c)]
    return nodes


class StatsPredicate:
    """Turns a target-only expression into "this file may hold a matching row"."""

    _FLIP: ClassVar[dict[str, str]] = {"LessThan": "GreaterThan", "LessThanOrEqual": "GreaterThanOrEqual",
             "GreaterThan": "LessThan", "GreaterThanOrEqual": "LessThanOrEqual", "EqualTo": "EqualTo"}

    def __init__(self, scope: ColumnScope, stats: StatsColumns) -> None:
        self._scope = scope
        self._stats = stats

    def may_match(self, node: Any) -> Column | None:
        """A Column over the stats frame, or None when the node tells us nothing."""
        kind = _kind(node)
        if kind == "And":
            parts = [p for p in (self.may_match(c) for c in _children(node)) if p is not None]
            return parts[0] & parts[1] if len(parts) == 2 else (parts[0] if parts else None)
        if kind == "Or":
            either = [self.may_match(c) for c in _children(node)]
            known = [p for p in either if p is not None]
            return None if len(known) != len(either) else known[0] | known[1]
        if kind in self._FLIP:
            left, right = _children(node)
            column, literal, op = self._scope.target_column(left), right, kind
            if column is None:
                column, literal, op = self._scope.target_column(right), left, self._FLIP[kind]
            literal_sql = _literal_sql(literal)
            if column is None or literal_sql is None:
                return None
            return self._compare(column, op, F.expr(literal_sql))
        if kind == "In":
            children = _children(node)
            column = self._scope.target_column(children[0])
            literals = [_literal_sql(c) for c in children[1:]]
            if column is None or any(sql is None for sql in literals):
                return None
            options = [self._compare(column, "EqualTo", F.expr(sql)) for sql in literals if sql is not None]
            result = options[0] if options else F.lit(False)
            for option in options[1:]:
                result = result | option
            return result
        if kind in ("IsNull", "IsNotNull"):
            column = self._scope.target_column(_children(node)[0])
            if column is None:
                return None
            low, _, nulls = self._stats(column)
            if kind == "IsNull":
                return nulls.isNull() | (nulls > 0)
            return nulls.isNull() | low.isNotNull() | F.col("num_records").isNull() | (nulls < F.col("num_records"))
        return None

    def _compare(self, column: str, op: str, value: Column) -> Column:
        low, high, _ = self._stats(column)
        if op == "EqualTo":
            return (low.isNull() | (low <= value)) & (high.isNull() | (high >= value))
        if op == "LessThan":
            return low.isNull() | (low < value)
        if op == "LessThanOrEqual":
            return low.isNull() | (low <= value)
        if op == "GreaterThan":
            return high.isNull() | (high > value)
        return high.isNull() | (high >= value)


class FileStats:
    """Per-file stats of a snapshot as a Spark DataFrame with one row per file."""

    def __init__(self, spark: SparkSession, snapshot: Snapshot, schema: StructType) -> None:
        self._spark = spark
        self._snapshot = snapshot
        self._names = {f.name: i for i, f in enumerate(schema.fields)}
        self._schema = schema
        self._present: set[str] = set()

    def stats_columns(self, column: str) -> tuple[Column, Column, Column]:
        """(min, max, null count) columns of ``column``; NULL literals where no stats exist."""
        index = self._names[column]
        names = (f"min_{index}", f"max_{index}", f"nulls_{index}")
        low, high, nulls = (F.col(n) if n in self._present else F.lit(None) for n in names)
        return low, high, nulls

    def frame(self, files: Sequence[DataFile]) -> DataFrame:
        stats = self._snapshot.stats
        wanted = {f.path for f in files}
        rows = stats.filter(pa.array([p in wanted for p in decoded_paths(stats)], pa.bool_()))
        n = rows.num_rows
        columns: dict[str, pa.Array] = {
            "path": pa.array(decoded_paths(rows)),
            "num_records": rows.column("num_records") if "num_records" in rows.column_names
            else pa.nulls(n, pa.int64()),
        }
        partition_columns = set(self._snapshot.partition_columns)
        for field in self._schema.fields:
            index = self._names[field.name]
            if not isinstance(field.dataType, AtomicType) or isinstance(field.dataType, BinaryType):
                continue
            if field.name in partition_columns and f"partition.{field.name}" in rows.column_names:
                value = rows.column(f"partition.{field.name}")
                columns[f"min_{index}"] = value
                columns[f"max_{index}"] = value
                nulls = [None if r is None else (r if v is None else 0)
                         for v, r in zip(value.to_pylist(), columns["num_records"].to_pylist(), strict=True)]
                columns[f"nulls_{index}"] = pa.array(nulls, pa.int64())
                continue
            for prefix, name in (("min", "min"), ("max", "max"), ("null_count", "nulls")):
                key = f"{prefix}.{field.name}"
                if key in rows.column_names:
                    columns[f"{name}_{index}"] = rows.column(key)
        if not n:
            return self._spark.createDataFrame([], "path string, num_records long")
        frame = self._spark.createDataFrame(pa.table(columns))
        for field in self._schema.fields:
            index = self._names[field.name]
            if f"max_{index}" in frame.columns and isinstance(field.dataType, StringType):
                # A truncated max is not an upper bound; treat long strings as unknown.
                high = F.col(f"max_{index}")
                frame = frame.withColumn(f"max_{index}", F.when(F.length(high) < STRING_STATS_PREFIX, high))
        self._present = set(frame.columns)
        return frame


def decoded_paths(stats: pa.Table) -> list[str]:
    """The ``path`` column of a snapshot's stats table, URL-decoded as ``DataFile.path`` is."""
    from urllib.parse import unquote

    return [unquote(p) for p in stats.column("path").to_pylist()]


@dataclass(frozen=True)
class SourceStats:
    """The source's row count and the [min, max] of some of its columns.

    Observed in the job that materializes the source (or handed in by a caller that already
    observed them, like the streaming sink), so knowing them costs no pass of its own.
    ``ranges`` maps a source column to (min, max); both are None when the column holds only
    NULLs or the source is empty.
    """

    rows: int
    ranges: Mapping[str, tuple[Any, Any]]
    # Source columns whose values are known to be unique together (the sink keeps one event
    # per key): a MERGE joining on equality of all of them cannot match a target row twice.
    unique_keys: tuple[str, ...] = ()
    # Target files (log paths) whose own key ranges hold no source row's keys
    # (streaming_merge.merge.key_presence): none of their rows can match.
    absent_files: frozenset[str] = frozenset()

    def covers(self, columns: Sequence[str]) -> bool:
        return all(c in self.ranges for c in columns)


def source_stats_columns(columns: Sequence[str]) -> list[Column]:
    """Aggregates giving a SourceStats, for ``DataFrame.observe`` or ``agg``."""
    aggregates = [F.count(F.lit(1)).alias("rows")]
    for i, name in enumerate(columns):
        aggregates += [F.min(F.col(f"`{name}`")).alias(f"lo{i}"), F.max(F.col(f"`{name}`")).alias(f"hi{i}")]
    return aggregates


def source_stats_of(values: Mapping[str, Any], columns: Sequence[str]) -> SourceStats:
    """SourceStats from the values of ``source_stats_columns`` (an observation or a row)."""
    return SourceStats(int(values.get("rows") or 0),
                       {name: (values.get(f"lo{i}"), values.get(f"hi{i}")) for i, name in enumerate(columns)})


def compute_source_stats(source: DataFrame, columns: Sequence[str], extra: Sequence[Column] = ()
                         ) -> tuple[SourceStats, dict[str, Any]]:
    """One aggregate job over a source that is not materialized (a stable one: local data or
    pinned table files, or one the caller chose not to materialize); ``extra`` aggregates
    ride along, their values returned with the stats."""
    values = source.agg(*source_stats_columns(columns), *extra).collect()[0].asDict()
    return source_stats_of(values, columns), values


def skipping_key_pairs(pairs: Sequence[tuple[str, str]], target_schema: StructType) -> list[tuple[str, str]]:
    """Of the ON condition's ``t.a = s.b`` pairs (:func:`key_pairs`), those whose source range
    can prune target files by their min/max."""
    types = {f.name: f.dataType for f in target_schema.fields}
    return [(t, s) for t, s in pairs if isinstance(types[t], AtomicType) and not isinstance(types[t], BinaryType)]


@dataclass(frozen=True)
class SkippingPlan:
    """The predicates that decide which files a MERGE reads; reusable on a later snapshot
    to decide whether a concurrently added file could have matched."""

    target_only: Sequence[Any]  # Catalyst expression nodes
    key_ranges: Sequence[tuple[str, Any, Any, bool]]  # (target column, min, max, source has keys)
    scope: ColumnScope
    schema: StructType
    skip_nothing: bool
    absent_files: frozenset[str] = frozenset()  # SourceStats.absent_files

    def select(self, spark: SparkSession, snapshot: Snapshot, files: Sequence[DataFile]) -> list[DataFile]:
        """The subset of ``files`` that may hold a row this MERGE matches."""
        selected = self._select(spark, snapshot, files)
        if self.absent_files and not self.skip_nothing:
            return [f for f in selected if f.path not in self.absent_files]
        return selected

    def _select(self, spark: SparkSession, snapshot: Snapshot, files: Sequence[DataFile]) -> list[DataFile]:
        if self.skip_nothing or not files or (not self.target_only and not self.key_ranges):
            return list(files)
        if not self.target_only:
            by_range = self._select_by_key_ranges(snapshot, files)
            if by_range is not None:
                return by_range
        stats = FileStats(spark, snapshot, self.schema)
        frame = stats.frame(files)
        predicate = self._predicate(stats)
        if predicate is None:
            return list(files)
        try:
            keep = {row[0] for row in frame.filter(predicate).select("path").collect()}
        except Exception as exc:  # a stats comparison Spark cannot evaluate: never skip on doubt
            log.warning("Data skipping disabled for this MERGE: %s", exc)
            return list(files)
        return [f for f in files if f.path in keep]

    def _select_by_key_ranges(self, snapshot: Snapshot, files: Sequence[DataFile]) -> list[DataFile] | None:
        """Key-range pruning alone, on the driver with pyarrow (no JVM round trip), for integer
        and string keys, whose Python and Arrow orders are Spark's; None for anything else,
        which the Spark path handles."""
        stats = snapshot.stats
        keep = pa.array([True] * stats.num_rows, pa.bool_())
        partition_columns = set(snapshot.partition_columns)
        for column, low, high, has_keys in self.key_ranges:
            data_type = self.schema[column].dataType
            if column in partition_columns or not isinstance(data_type, (IntegralType, StringType)):
                return None
            if not has_keys:
                return []
            python_type = str if isinstance(data_type, StringType) else int
            if type(low) is not python_type or type(high) is not python_type:  # a cast: Spark's rules apply
                return None
            arrow_type = pa.string() if isinstance(data_type, StringType) else pa.int64()
            mins, maxs = (stats.column(f"{side}.{column}").cast(arrow_type) if f"{side}.{column}" in
                          stats.column_names else pa.nulls(stats.num_rows, arrow_type) for side in ("min", "max"))
            if isinstance(data_type, StringType):  # a truncated max is no upper bound
                maxs = pc.if_else(pc.less(pc.utf8_length(maxs), STRING_STATS_PREFIX), maxs,
                                  pa.nulls(stats.num_rows, arrow_type))
            low_ok = pc.fill_null(pc.greater_equal(maxs, pa.scalar(low, arrow_type)), True)
            high_ok = pc.fill_null(pc.less_equal(mins, pa.scalar(high, arrow_type)), True)
            keep = pc.and_(keep, pc.and_(low_ok, high_ok))
        kept = {f.path for f, flag in zip(snapshot.files, keep.to_pylist(), strict=True) if flag}
        return [f for f in files if f.path in kept]

    def _predicate(self, stats: FileStats) -> Column | None:
        evaluator = StatsPredicate(self.scope, stats.stats_columns)
        parts = [p for p in (evaluator.may_match(node) for node in self.target_only) if p is not None]
        for column, low_value, high_value, has_keys in self.key_ranges:
            if not has_keys:
                parts.append(F.lit(False))  # only NULL keys in the source: nothing can match
                continue
            low, high, _ = stats.stats_columns(column)
            parts.append((high.isNull() | (high >= F.lit(low_value))) & (low.isNull() | (low <= F.lit(high_value))))
        if not parts:
            return None
        result = parts[0]
        for part in parts[1:]:
            result = result & part
        return result


@dataclass(frozen=True)
class SkippingTemplate:
    """What skipping takes from the ON and MATCHED conditions, which a MERGE repeated every
    micro-batch shares: reading them goes through Spark's parser (tens of py4j round trips),
    so it is done once per resolution; each MERGE adds its source's statistics (``plan``)."""

    target_only: Sequence[Any]  # Catalyst expression nodes
    key_pairs: Sequence[tuple[str, str]]  # (target, source) columns whose ranges prune
    scope: ColumnScope
    schema: StructType
    skip_nothing: bool

    def plan(self, source_stats: SourceStats | None) -> SkippingPlan:
        """The plan for one MERGE; the source's key ranges are used when ``source_stats`` has
        them (they are trusted only for a source read once or stable)."""
        if self.skip_nothing:
            return SkippingPlan((), (), self.scope, self.schema, skip_nothing=True)
        ranges: list[tuple[str, Any, Any, bool]] = []
        if source_stats is not None:
            for t, s in self.key_pairs:
                if s in source_stats.ranges:
                    low, high = source_stats.ranges[s]
                    ranges.append((t, low, high, low is not None))
        absent = source_stats.absent_files if source_stats is not None else frozenset()
        return SkippingPlan(self.target_only, ranges, self.scope, self.schema, skip_nothing=False,
                            absent_files=absent)


def skipping_template(
    scope: ColumnScope,
    target_schema: StructType,
    condition: Column,
    pairs: Sequence[tuple[str, str]],
    matched_conditions: Sequence[Column] | None,
    has_not_matched_by_source: bool,
) -> SkippingTemplate:
    """Work out the skipping predicates of a MERGE's conditions; ``pairs``: the ON condition's
    :func:`key_pairs` (the caller has them already; each reading of a condition is a parse)."""
    if has_not_matched_by_source:
        return SkippingTemplate((), (), scope, target_schema, skip_nothing=True)
    target_only = target_only_conjuncts([condition], scope)
    if matched_conditions:
        combined = matched_conditions[0]
        for cond in matched_conditions[1:]:
            combined = combined | cond
        combined_node = catalyst(combined)
        if scope.is_target_only(combined_node):
            target_only.append(combined_node)
    return SkippingTemplate(target_only, skipping_key_pairs(pairs, target_schema), scope, target_schema,
                            skip_nothing=False)
