"""Resolve a MERGE's condition and clauses against the real source and target schemas.

Spark's analyzer does the resolving (every expression is analysed on a probe join of
the source and an empty target), so "unresolvable column" errors are Spark's own,
wrapped with the clause they come from. Assignments are cast to the target column type
with Spark's ANSI store-assignment rule, and numeric narrowing is checked at run time:
an overflow raises instead of wrapping or turning into NULL.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from pyspark.errors import AnalysisException
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    BooleanType,
    DataType,
    DecimalType,
    IntegralType,
    NumericType,
    StructField,
    StructType,
)

from streaming_merge.errors import MergeAnalysisError
from streaming_merge.merge.clauses import ClauseSet, MergeClause, expr_text, to_column
from streaming_merge.spark.jvm import jvm_class
from streaming_merge.table.schema import evolve

T = TypeVar("T")

# A joined row's action: the number of the first clause that applies (ResolvedClause.code), or
# one of these: keep the target row as it is, or write nothing.
COPY = -1
DROP = -2
ACTION_COL = "__sm_action__"
SOURCE_PRESENT = "__sm_source_row_present__"
TARGET_PRESENT = "__sm_target_row_present__"
OVERFLOW_MARKER = "CAST_OVERFLOW_IN_TABLE_INSERT"


@dataclass(frozen=True)
class ResolvedClause:
    """A clause ready for code generation: ``outputs`` maps every output column to its new
    value (None for DELETE); ``code`` is the clause's number in the action column."""

    clause: MergeClause
    condition: Column | None
    outputs: dict[str, Column] | None
    code: int


@dataclass(frozen=True)
class ResolvedMerge:
    condition: Column
    clauses: ClauseSet
    matched: list[ResolvedClause]
    not_matched: list[ResolvedClause]
    not_matched_by_source: list[ResolvedClause]
    output_schema: StructType
    target_alias: str
    source_alias: str
    # The target's own columns (output_schema may add some: schema evolution).
    target_columns: frozenset[str] = frozenset()
    # The table records change data (delta.enableChangeDataFeed): rewrites write change rows too.
    change_data: bool = False
    # Expressions derived from this MERGE alone (the rewrite's action codes, outputs and
    # counts), built by the first MERGE that needs them: a resolved MERGE is reused by every
    # micro-batch of a stream, and building them is hundreds of Python→JVM round trips.
    derived: dict[tuple[Any, ...], Any] = dataclasses.field(default_factory=dict, compare=False, repr=False)

    @property
    def all(self) -> list[ResolvedClause]:
        return [*self.matched, *self.not_matched, *self.not_matched_by_source]

    def derive(self, key: tuple[Any, ...], build: Callable[[], T]) -> T:
        """``build()``, remembered under ``key`` for the next MERGE that reuses this resolution."""
        found = self.derived.get(key)
        if found is None:
            found = self.derived[key] = build()
        return found  # type: ignore[no-any-return]


def fits_broadcast(frame: DataFrame, rows: int, threshold: int | None = None) -> bool:
    """Whether a source of ``rows`` rows is small enough to broadcast.

    A materialized source has no size statistics, so Spark could not decide this up front;
    we know the row count, so we decide with Spark's own threshold
    (``spark.sql.autoBroadcastJoinThreshold``) unless the MERGE sets its own.
    """
    if threshold is None:
        spark = frame.sparkSession
        threshold = int(spark._jsparkSession.sessionState().conf().autoBroadcastJoinThreshold())
    return threshold >= 0 and rows * estimated_row_bytes(frame) <= threshold


def estimated_row_bytes(frame: DataFrame) -> int:
    return sum(_WIDTHS.get(type(f.dataType).__name__, 32) for f in frame.schema.fields)


_WIDTHS = {"BooleanType": 1, "ByteType": 1, "ShortType": 2, "IntegerType": 4, "LongType": 8, "FloatType": 4,
           "DoubleType": 8, "DateType": 4, "TimestampType": 8, "TimestampNTZType": 8, "StringType": 24}


def qualified(alias: str, name: str) -> Column:
    return F.col(f"`{alias}`.`{name}`")


def resolve_merge(
    spark: SparkSession,
    source: DataFrame,
    source_alias: str,
    target_schema: StructType,
    target_alias: str,
    condition: Column,
    clauses: ClauseSet,
    schema_evolution: bool,
) -> ResolvedMerge:
    """Check and resolve everything; raises ``MergeAnalysisError`` naming the culprit."""
    clauses.validate()
    if source_alias.lower() == target_alias.lower():
        raise MergeAnalysisError(
            f"Source and target share the alias `{source_alias}`; give them different aliases "
            "(DeltaTable.alias('t') and source.alias('s'))."
        )
    star_clauses = [c for c in clauses.all if c.action in ("update_all", "insert_all")]
    output_schema = evolve(target_schema, source.schema) if schema_evolution and star_clauses else target_schema
    src = source.alias(source_alias).withColumn(SOURCE_PRESENT, F.lit(True))
    tgt = spark.createDataFrame([], output_schema).alias(target_alias).withColumn(TARGET_PRESENT, F.lit(True))
    try:
        probe = src.join(tgt, condition, "full_outer")
    except AnalysisException as exc:
        raise MergeAnalysisError(f"Cannot resolve the MERGE condition `{expr_text(condition)}`: {exc}") from exc
    _require_boolean(probe, condition, "the MERGE condition")

    resolver = _ClauseResolver(spark, src, tgt, probe, output_schema, target_schema, source_alias, target_alias,
                               schema_evolution)
    codes = iter(range(len(clauses.all)))
    return ResolvedMerge(
        condition=condition,
        clauses=clauses,
        matched=[resolver.resolve(c, probe, next(codes)) for c in clauses.matched],
        not_matched=[resolver.resolve(c, src, next(codes)) for c in clauses.not_matched],
        not_matched_by_source=[resolver.resolve(c, tgt, next(codes)) for c in clauses.not_matched_by_source],
        output_schema=output_schema,
        target_alias=target_alias,
        source_alias=source_alias,
        target_columns=frozenset(target_schema.fieldNames()),
    )


def _require_boolean(frame: DataFrame, expr: Column, what: str) -> None:
    _require_boolean_type(_type_of(frame, expr, what), expr, what)


def _require_boolean_type(data_type: DataType, expr: Column, what: str) -> None:
    if not isinstance(data_type, BooleanType):
        raise MergeAnalysisError(
            f"{what[0].upper()}{what[1:]} `{expr_text(expr)}` must be a boolean expression, not "
            f"{data_type.simpleString()}."
        )


def _type_of(frame: DataFrame, expr: Column, what: str) -> DataType:
    try:
        return frame.select(expr.alias("_")).schema[0].dataType
    except AnalysisException as exc:
        raise MergeAnalysisError(f"Cannot resolve {what} `{expr_text(expr)}`: {exc}") from exc


def _types_of(frame: DataFrame, checked: list[tuple[Column, str]]) -> list[DataType]:
    """The types of a clause's expressions, from one analysis of them all: each analysis is a
    driver→JVM round trip through the analyzer (on a new query's JVM, not yet compiled by the
    JIT, 50-100 ms each; one per column made a wide MERGE's first batch pay seconds). When
    that analysis fails, each expression is analysed alone, in order, so the error names the
    first one that cannot be resolved."""
    if not checked:
        return []
    try:
        schema = frame.select(*[expr.alias(f"_{i}") for i, (expr, _) in enumerate(checked)]).schema
    except AnalysisException as exc:
        for expr, what in checked:
            _type_of(frame, expr, what)
        raise MergeAnalysisError(f"Cannot resolve {checked[0][1]}: {exc}") from exc
    return [f.dataType for f in schema.fields]


class _ClauseResolver:
    """Builds each clause's output expressions; holds the frames and schemas they need."""

    def __init__(
        self,
        spark: SparkSession,
        source: DataFrame,
        target: DataFrame,
        probe: DataFrame,
        output_schema: StructType,
        target_schema: StructType,
        source_alias: str,
        target_alias: str,
        schema_evolution: bool,
    ) -> None:
        self._spark = spark
        self._source = source
        self._target = target
        self._probe = probe
        self._output = output_schema
        self._target_names = {f.name.lower() for f in target_schema.fields}
        self._source_by_lower = {f.name.lower(): f.name for f in source.schema.fields if f.name != SOURCE_PRESENT}
        self._source_alias = source_alias
        self._target_alias = target_alias
        self._evolution = schema_evolution

    def resolve(self, clause: MergeClause, scope: DataFrame, code: int) -> ResolvedClause:
        where = f"`{clause.describe()}`"
        scope_note = {
            "matched": "",
            "not_matched": " (a WHEN NOT MATCHED clause can only refer to source columns)",
            "not_matched_by_source": " (a WHEN NOT MATCHED BY SOURCE clause can only refer to target columns)",
        }[clause.kind]
        condition = to_column(clause.condition) if clause.condition is not None else None
        values = self._assignments(clause) if not clause.is_delete else {}
        fields = [f for f in self._output.fields if f.name in values]
        checked = ([(condition, f"the condition of {where}{scope_note}")] if condition is not None else []) + \
            [(values[f.name], f"the value for column `{f.name}` in {where}{scope_note}") for f in fields]
        types = _types_of(scope, checked)
        if condition is not None:
            _require_boolean_type(types.pop(0), condition, f"the condition of {where}{scope_note}")
        if clause.is_delete:
            return ResolvedClause(clause, condition, None, code)
        outputs = {f.name: self._store(values[f.name], t, f, where) for f, t in zip(fields, types, strict=True)}
        return ResolvedClause(clause, condition, outputs, code)

    def _assignments(self, clause: MergeClause) -> dict[str, Column]:
        """Every output column's value expression, before casting."""
        keep = clause.kind != "not_matched"  # updates keep unassigned columns, inserts make them NULL
        values: dict[str, Column] = {}
        if clause.action in ("update_all", "insert_all"):
            for field in self._output.fields:
                source_name = self._source_by_lower.get(field.name.lower())
                if source_name is not None:
                    values[field.name] = qualified(self._source_alias, source_name)
                elif self._evolution or field.name.lower() not in self._target_names:
                    values[field.name] = self._unassigned(field, keep)
                else:
                    raise MergeAnalysisError(
                        f"`{clause.describe()}` needs source column `{field.name}` (target column of type "
                        f"{field.dataType.simpleString()}), but the source has only "
                        f"{sorted(self._source_by_lower.values())}. Add the column to the source, list the "
                        "assignments explicitly, or enable schema evolution (withSchemaEvolution())."
                    )
            return values
        by_lower = {f.name.lower(): f for f in self._output.fields}
        assigned: dict[str, Column] = {}
        for key, expr in clause.assignments.items():
            name = _strip_alias(key, self._target_alias)
            found = by_lower.get(name.lower())
            if found is None:
                raise MergeAnalysisError(
                    f"`{clause.describe()}` assigns to `{key}`, which is not a column of the target table "
                    f"(columns: {[f.name for f in self._output.fields]}). Nested field assignment is not "
                    "supported; assign the whole struct."
                )
            if found.name in assigned:
                raise MergeAnalysisError(f"`{clause.describe()}` assigns column `{found.name}` more than once.")
            assigned[found.name] = to_column(expr)
        for field in self._output.fields:
            values[field.name] = assigned.get(field.name, self._unassigned(field, keep))
        return values

    def _unassigned(self, field: StructField, keep: bool) -> Column:
        return qualified(self._target_alias, field.name) if keep else F.lit(None).cast(field.dataType)

    def _store(self, value: Column, from_type: DataType, field: StructField, where: str) -> Column:
        to_type = field.dataType
        if from_type == to_type:
            return value
        parse = jvm_class(self._spark, "org.apache.spark.sql.types.DataType").fromJson
        if not jvm_class(self._spark, "org.apache.spark.sql.catalyst.expressions.Cast").canANSIStoreAssign(
            parse(from_type.json()), parse(to_type.json())
        ):
            raise MergeAnalysisError(
                f"Cannot write a value of type {from_type.simpleString()} to target column `{field.name}` of "
                f"type {to_type.simpleString()} in {where}: the types are not compatible under ANSI store "
                "assignment. Cast the value explicitly."
            )
        if isinstance(to_type, (IntegralType, DecimalType)) and isinstance(from_type, NumericType):
            narrowed = value.try_cast(to_type)
            message = (
                f"[{OVERFLOW_MARKER}] Fail to assign a value of {from_type.simpleString().upper()} type to the "
                f"{to_type.simpleString().upper()} type column `{field.name}` due to an overflow in {where}. "
                "Use try_cast on the input value to tolerate overflow and return NULL instead."
            )
            return F.when(value.isNotNull() & narrowed.isNull(), F.raise_error(F.lit(message)).cast(to_type)) \
                .otherwise(narrowed)
        return value.cast(to_type)


def _strip_alias(key: str, alias: str) -> str:
    key = key.strip().strip("`")
    prefix = f"{alias}."
    return key[len(prefix):].strip("`") if key.lower().startswith(prefix.lower()) else key
