"""A tiny expression language whose terms carry both their Spark SQL text and a Python evaluator.

Why: one hypothesis-generated MERGE has to drive two implementations — the engine, which only sees
SQL strings, and the reference model in ``merge_model.py``, which only runs Python. Every term is
built by a combinator that produces both forms at once, so the two cannot drift apart, and
``tests/spark/test_merge_exprs_spark.py`` checks each pairing against Spark itself (it needs no
engine), so a failing property test points at the engine, not at the oracle.

The Python side follows Spark SQL semantics (ANSI mode, small values so nothing overflows):
NULL is ``None``; comparisons and arithmetic with NULL give NULL; ``AND``/``OR``/``NOT`` use
three-valued logic; ``<=>`` is null-safe equality; ``%`` takes the sign of the dividend (as in
Java, unlike Python); ``concat``/``upper`` return NULL for a NULL input; ``coalesce`` returns its
first non-NULL argument. The aliases are fixed: ``t`` for the target, ``s`` for the source.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

Row = dict[str, Any]
Alias = Literal["t", "s"]
Evaluator = Callable[[Row | None, Row | None], Any]

#: The target table's columns, in schema order; ``p`` is the (optional) partition column.
COLUMNS: tuple[str, ...] = ("k", "v", "w", "p")
#: Spark SQL type of each target column (``k``, ``v``, ``p`` INT; ``w`` STRING), all nullable.
COLUMN_TYPES: dict[str, str] = {"k": "int", "v": "int", "w": "string", "p": "int"}

TARGET: frozenset[str] = frozenset({"t"})
SOURCE: frozenset[str] = frozenset({"s"})
BOTH: frozenset[str] = frozenset({"t", "s"})


@dataclass(frozen=True)
class Expr:
    """A SQL expression (``sql``) paired with its Python meaning (``fn(t, s)``).

    ``scope`` is the set of aliases the expression reads; the generators use it to offer a clause
    kind only the expressions it may reference (a NOT MATCHED clause sees only ``s``, a NOT MATCHED
    BY SOURCE clause only ``t``). The evaluator receives ``None`` for an alias out of scope, so a
    misplaced expression fails loudly instead of evaluating to something plausible.
    """

    sql: str
    fn: Evaluator = field(compare=False, repr=False)
    scope: frozenset[str] = frozenset()

    def __call__(self, t: Row | None, s: Row | None) -> Any:
        return self.fn(t, s)

    def __repr__(self) -> str:
        return self.sql


def sql_mod(x: int, y: int) -> int:
    """Spark's integer ``%``: the remainder has the sign of the dividend (``-7 % 3 = -1``)."""
    remainder = abs(x) % abs(y)
    return remainder if x >= 0 else -remainder


def sql_and(x: bool | None, y: bool | None) -> bool | None:
    """Three-valued AND: FALSE wins over NULL."""
    if x is False or y is False:
        return False
    return None if x is None or y is None else True


def sql_or(x: bool | None, y: bool | None) -> bool | None:
    """Three-valued OR: TRUE wins over NULL."""
    if x is True or y is True:
        return True
    return None if x is None or y is None else False


def _null_strict(op: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    """Lift a binary operator so that a NULL operand yields NULL, as SQL operators do."""
    return lambda x, y: None if x is None or y is None else op(x, y)


def _binary(template: str, a: Expr, b: Expr, op: Callable[[Any, Any], Any]) -> Expr:
    def fn(t: Row | None, s: Row | None) -> Any:
        return op(a(t, s), b(t, s))

    return Expr(template.format(a.sql, b.sql), fn, a.scope | b.scope)


def _unary(template: str, a: Expr, op: Callable[[Any], Any]) -> Expr:
    return Expr(template.format(a.sql), lambda t, s: op(a(t, s)), a.scope)


def col(alias: Alias, name: str) -> Expr:
    """Column ``name`` of the target (``t``) or source (``s``) row."""

    def fn(t: Row | None, s: Row | None) -> Any:
        row = t if alias == "t" else s
        if row is None:
            raise TypeError(f"{alias}.{name} evaluated where `{alias}` is out of scope")
        return row[name]

    return Expr(f"{alias}.{name}", fn, frozenset({alias}))


def lit(value: int | str | None) -> Expr:
    """A literal; strings must not contain quotes (the generators only use plain letters)."""
    if value is None:
        sql = "NULL"
    elif isinstance(value, str):
        assert "'" not in value and "\\" not in value
        sql = f"'{value}'"
    else:
        sql = str(value)
    return Expr(sql, lambda t, s: value)


def eq(a: Expr, b: Expr) -> Expr:
    return _binary("({} = {})", a, b, _null_strict(operator.eq))


def gt(a: Expr, b: Expr) -> Expr:
    return _binary("({} > {})", a, b, _null_strict(operator.gt))


def ge(a: Expr, b: Expr) -> Expr:
    return _binary("({} >= {})", a, b, _null_strict(operator.ge))


def lt(a: Expr, b: Expr) -> Expr:
    return _binary("({} < {})", a, b, _null_strict(operator.lt))


def add(a: Expr, b: Expr) -> Expr:
    return _binary("({} + {})", a, b, _null_strict(operator.add))


def mul(a: Expr, b: Expr) -> Expr:
    return _binary("({} * {})", a, b, _null_strict(operator.mul))


def mod(a: Expr, b: Expr) -> Expr:
    return _binary("({} % {})", a, b, _null_strict(sql_mod))


def concat(a: Expr, b: Expr) -> Expr:
    return _binary("concat({}, {})", a, b, _null_strict(operator.add))


def null_safe_eq(a: Expr, b: Expr) -> Expr:
    """``<=>``: never NULL; two NULLs are equal."""
    return _binary("({} <=> {})", a, b, lambda x, y: x == y if (x is None) == (y is None) else False)


def and_(a: Expr, b: Expr) -> Expr:
    return _binary("({} AND {})", a, b, sql_and)


def or_(a: Expr, b: Expr) -> Expr:
    return _binary("({} OR {})", a, b, sql_or)


def not_(a: Expr) -> Expr:
    return _unary("(NOT {})", a, lambda x: None if x is None else not x)


def is_null(a: Expr) -> Expr:
    return _unary("({} IS NULL)", a, lambda x: x is None)


def is_not_null(a: Expr) -> Expr:
    return _unary("({} IS NOT NULL)", a, lambda x: x is not None)


def upper(a: Expr) -> Expr:
    return _unary("upper({})", a, lambda x: None if x is None else x.upper())


def coalesce(a: Expr, b: Expr) -> Expr:
    return _binary("coalesce({}, {})", a, b, lambda x, y: y if x is None else x)


# ---------------------------------------------------------------------------------------------
# The grammar's building blocks. Predicates are chosen so that NULLs matter (IS NULL, comparisons
# with nullable columns, `%` on negative values) and so that some are target-only (data skipping)
# and some touch the partition column.
# ---------------------------------------------------------------------------------------------
T: dict[str, Expr] = {c: col("t", c) for c in COLUMNS}
S: dict[str, Expr] = {c: col("s", c) for c in COLUMNS}

PREDICATES: tuple[Expr, ...] = (
    # target only
    gt(T["v"], lit(3)),
    eq(mod(T["v"], lit(2)), lit(0)),
    eq(mod(T["v"], lit(3)), lit(-1)),
    is_null(T["w"]),
    is_not_null(T["w"]),
    eq(T["w"], lit("a")),
    eq(T["p"], lit(1)),
    is_null(T["k"]),
    lt(T["k"], lit(3)),
    # source only
    gt(S["v"], lit(3)),
    lt(S["v"], lit(2)),
    is_null(S["w"]),
    eq(S["w"], lit("b")),
    eq(mod(S["v"], lit(2)), lit(0)),
    eq(S["p"], lit(0)),
    gt(S["k"], lit(2)),
    # both
    gt(S["v"], T["v"]),
    eq(S["w"], T["w"]),
    gt(add(T["v"], S["v"]), lit(5)),
    null_safe_eq(S["p"], T["p"]),
)

#: Candidate right-hand sides per target column, filtered by scope when a clause is generated.
#: Values stay small (|v| < 100), so no assignment can overflow INT.
VALUES: dict[str, tuple[Expr, ...]] = {
    "k": (T["k"], S["k"], add(T["k"], lit(10)), add(S["k"], lit(10)), coalesce(S["k"], T["k"]),
          lit(None), lit(7)),
    "v": (T["v"], S["v"], add(T["v"], lit(1)), mul(S["v"], lit(2)), add(T["v"], S["v"]),
          coalesce(S["v"], lit(0)), coalesce(T["v"], lit(-1)), lit(None), lit(7)),
    "w": (T["w"], S["w"], concat(T["w"], lit("x")), concat(S["w"], lit("y")), concat(T["w"], S["w"]),
          upper(S["w"]), upper(T["w"]), coalesce(S["w"], T["w"]), lit(None), lit("z")),
    "p": (T["p"], S["p"], coalesce(S["p"], lit(0)), coalesce(T["p"], lit(0)), lit(None), lit(2)),
}

#: MERGE ... ON conditions: plain key equality (most often), null-safe equality (NULL keys DO
#: match), and conjunctions with a partition, source-only or target-only predicate (the last two
#: exercise partition pruning and min/max skipping; with NOT MATCHED BY SOURCE clauses a target
#: row failing the target-only conjunct is "not matched by source", so it must not be skipped).
ON_CONDITIONS: tuple[Expr, ...] = (
    eq(T["k"], S["k"]),
    eq(T["k"], S["k"]),
    eq(T["k"], S["k"]),
    null_safe_eq(T["k"], S["k"]),
    and_(eq(T["k"], S["k"]), eq(T["p"], S["p"])),
    and_(eq(T["k"], S["k"]), eq(T["p"], lit(1))),
    and_(eq(T["k"], S["k"]), gt(S["v"], lit(0))),
    and_(eq(T["k"], S["k"]), ge(T["v"], lit(0))),
)


def in_scope(exprs: tuple[Expr, ...], scope: frozenset[str]) -> tuple[Expr, ...]:
    """The expressions that read only aliases in ``scope``."""
    return tuple(e for e in exprs if e.scope <= scope)
