"""The expression grammar's Python evaluators agree with Spark SQL on the same rows.

Why: the MERGE property test compares the engine against ``merge_model``, and the model evaluates
conditions and assignments with the Python half of each ``merge_exprs.Expr``. If a Python half
disagreed with Spark (NULL handling, ``%`` on negatives, ``concat`` with NULL, types), a correct
engine would fail the property test. This check needs only Spark, not the engine, so an oracle
problem is caught here and a property-test failure can be blamed on the engine.
"""

from __future__ import annotations

import os
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from tests.merge_exprs import BOTH, COLUMN_TYPES, COLUMNS, ON_CONDITIONS, PREDICATES, VALUES, Expr
from tests.merge_strategies import assignments, conditions, table_rows

TARGET_DDL = "tid INT, " + ", ".join(f"{c} {COLUMN_TYPES[c]}" for c in COLUMNS)
SOURCE_DDL = "sid INT, " + ", ".join(f"{c} {COLUMN_TYPES[c]}" for c in COLUMNS) + ", x INT"
FIXED: list[Expr] = [*PREDICATES, *ON_CONDITIONS, *(v for values in VALUES.values() for v in values)]


def same_value(spark_value: Any, python_value: Any) -> bool:
    """Equal and of the same Python type, so ``1`` does not pass for ``True``."""
    return type(spark_value) is type(python_value) and spark_value == python_value


@settings(
    max_examples=int(os.environ.get("MERGE_EXPR_EXAMPLES", "30")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    target=table_rows(6).filter(bool),
    source=table_rows(4, with_x=True).filter(bool),
    drawn_conditions=st.lists(conditions(BOTH), min_size=1, max_size=10),
    drawn_values=st.lists(assignments(BOTH), min_size=1, max_size=3),
)
def test_python_evaluators_agree_with_spark(
    spark: SparkSession,
    target: list[dict[str, Any]],
    source: list[dict[str, Any]],
    drawn_conditions: list[Expr],
    drawn_values: list[tuple[tuple[str, Expr], ...]],
) -> None:
    exprs = [*FIXED, *drawn_conditions, *(value for pairs in drawn_values for _, value in pairs)]
    t_df = spark.createDataFrame([(i, *(r[c] for c in COLUMNS)) for i, r in enumerate(target)], TARGET_DDL)
    s_df = spark.createDataFrame(
        [(i, *(r[c] for c in COLUMNS), r["x"]) for i, r in enumerate(source)], SOURCE_DDL
    )
    joined = t_df.alias("t").crossJoin(s_df.alias("s"))
    out = joined.select("t.tid", "s.sid", *(F.expr(e.sql).alias(f"e{i}") for i, e in enumerate(exprs)))
    rows = out.collect()
    assert len(rows) == len(target) * len(source)
    for r in rows:
        t, s = target[r["tid"]], source[r["sid"]]
        for i, e in enumerate(exprs):
            expected = e(t, s)
            actual = r[f"e{i}"]
            assert same_value(actual, expected), f"{e.sql}: Spark {actual!r}, model {expected!r}; t={t} s={s}"


def test_value_expressions_have_their_column_type(spark: SparkSession) -> None:
    """Assignments need no lossy cast: each candidate value has its column's type (or is NULL)."""
    t_df = spark.createDataFrame([], TARGET_DDL).alias("t")
    s_df = spark.createDataFrame([], SOURCE_DDL).alias("s")
    joined = t_df.crossJoin(s_df)
    for column, values in VALUES.items():
        schema = joined.select(*(F.expr(v.sql).alias(f"e{i}") for i, v in enumerate(values))).schema
        for value, field in zip(values, schema.fields, strict=True):
            assert field.dataType.simpleString() in (COLUMN_TYPES[column], "void"), (column, value.sql)
    for predicate in (*PREDICATES, *ON_CONDITIONS):
        assert joined.select(F.expr(predicate.sql)).schema.fields[0].dataType.simpleString() == "boolean"
