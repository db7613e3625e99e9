"""MergeSink's arguments in AUTO CDC's forms: column names given as strings or PySpark Columns,
the SCD type as 1, 2, "1" or "2", and the sink's older option names as deprecated aliases.

Spark 4.3's ``pyspark.pipelines.create_auto_cdc_flow`` takes keys, column lists and the
sequence as "column identifiers without qualifiers, expressed as either Python strings or
PySpark Columns" (``col("userId")``, not ``col("users.userId")``); Databricks documents
``sequence_by=struct("a", "b")`` for ordering by several columns. Code written for either API
therefore passes Columns, which the sink turns back into the column names it works with. A
Column that is not a plain identifier (qualified, nested, an expression) is refused here,
before anything runs, with the option's name: the sink matches, selects and orders by column
names, and guessing what an expression meant would silently do something else.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any, Literal

from pyspark.sql import Column, SparkSession

from streaming_merge.errors import InvalidArgumentError

ColumnArg = str | Column
ScdType = Literal[1, 2, "1", "2"]

_WARNED: set[str] = set()  # deprecated names already warned about in this process


def column_name(value: Any, option: str) -> str:
    """The column a string (taken as the name itself, as before) or a Column names."""
    if isinstance(value, str):
        if not value:
            raise InvalidArgumentError(f"{option}: a column name cannot be empty")
        return value
    if isinstance(value, Column):
        names = _identifiers(value, option, allow_struct=False)
        return names[0]
    raise InvalidArgumentError(
        f"{option} takes column names (str) or PySpark Columns, got {type(value).__name__} {value!r}")


def column_names(value: Any, option: str) -> list[str]:
    """``keys``: one name or Column, or a list of them."""
    if value is None:
        return []
    if isinstance(value, str | Column):
        return [column_name(value, option)]
    if isinstance(value, Sequence):
        return [column_name(v, option) for v in value]
    raise InvalidArgumentError(f"{option} takes a column name, a Column or a list of them, got {value!r}")


def name_list(value: Any, option: str) -> list[str] | None:
    """A column list option (``column_list``, ``track_history_column_list``, ...): a list of
    names or Columns, as Spark's API takes it; a lone string is refused rather than read as
    a list of one (``column_list="name"`` is more often a slip than a choice). An empty list
    counts as not given, as in Spark's API, whose wire format cannot tell the two apart (and
    ``column_list=[]``, a table of keys alone, is more often a slip too)."""
    if value is None:
        return None
    if isinstance(value, str | Column) or not isinstance(value, Sequence):
        raise InvalidArgumentError(f"{option} must be a list of column names or Columns, got {value!r}")
    if not value:
        return None
    return [column_name(v, option) for v in value]


def sequence_columns(value: Any) -> list[str]:
    """``sequence_by``: a column name, a Column naming one, ``struct(...)`` of plain columns
    (Databricks' way to order by several), or a list of names (this sink's way)."""
    if value is None:
        return []
    if isinstance(value, str):
        return [column_name(value, "sequence_by")]
    if isinstance(value, Column):
        return _identifiers(value, "sequence_by", allow_struct=True)
    if isinstance(value, Sequence):
        return [column_name(v, "sequence_by") for v in value]
    raise InvalidArgumentError(f"sequence_by takes a column name, a Column or a list of names, got {value!r}")


def scd_type_of(value: Any, option: str = "stored_as_scd_type") -> int:
    """1, 2, "1" or "2" (Spark's and Databricks' forms) as an int."""
    if not isinstance(value, bool) and value in (1, 2, "1", "2"):
        return int(value)
    raise InvalidArgumentError(f"{option} must be 1 or 2 (or '1' / '2'), got {value!r}")


def renamed(old: str, old_value: Any, new: str, new_value: Any) -> Any:
    """The value of option ``new``, or of its deprecated alias ``old`` (warned about once per
    process, as a DeprecationWarning pointing at the caller). Both given is an error: which
    one was meant cannot be told."""
    if old_value is None:
        return new_value
    if new_value is not None:
        raise InvalidArgumentError(f"Pass {new}=... only: {old}=... is its deprecated alias, and both were given.")
    if old not in _WARNED:
        _WARNED.add(old)
        warnings.warn(f"MergeSink({old}=...) is deprecated; use {new}=..., AUTO CDC's name for it.",
                      DeprecationWarning, stacklevel=3)
    return old_value


def _identifiers(column: Column, option: str, *, allow_struct: bool) -> list[str]:
    """The column names a classic PySpark Column stands for: one for an unqualified identifier,
    several for ``struct(a, b)`` when ``allow_struct``."""
    jc = getattr(column, "_jc", None)
    if jc is None:
        raise InvalidArgumentError(f"{option}: {column!r} is a Spark Connect Column; pass the column name as a string")
    node = jc.node()
    kind = node.getClass().getSimpleName()
    if kind == "UnresolvedAttribute":
        return [_single_part(_seq(node.nameParts()), column, option)]
    if kind == "SqlExpression":  # expr("userId"): what Spark's parser makes of the text
        return _parsed_identifiers(node.expression(), column, option, allow_struct)
    if kind == "UnresolvedFunction" and allow_struct and node.functionName().lower() == "struct" \
            and not node.isDistinct():
        arguments = _seq(node.arguments())
        if arguments and all(a.getClass().getSimpleName() == "UnresolvedAttribute" for a in arguments):
            return [_single_part(_seq(a.nameParts()), column, option) for a in arguments]
    raise InvalidArgumentError(_not_an_identifier(column, option, allow_struct))


def _parsed_identifiers(text: str, column: Column, option: str, allow_struct: bool) -> list[str]:
    # Any session's SQL parser reads it the same; a Column exists, so a session does too.
    session = SparkSession.getActiveSession() or SparkSession.builder.getOrCreate()
    parsed = session._jsparkSession.sessionState().sqlParser().parseExpression(text)
    kind = parsed.getClass().getSimpleName()
    if kind == "UnresolvedAttribute":
        return [_single_part(_seq(parsed.nameParts()), column, option)]
    if kind == "CreateNamedStruct" and allow_struct:
        values = _seq(parsed.valExprs())
        if values and all(v.getClass().getSimpleName() == "UnresolvedAttribute" for v in values):
            return [_single_part(_seq(v.nameParts()), column, option) for v in values]
    raise InvalidArgumentError(_not_an_identifier(column, option, allow_struct))


def _single_part(parts: list[str], column: Column, option: str) -> str:
    if len(parts) != 1:
        raise InvalidArgumentError(
            f"{option}: {column!r} is a qualified or nested column reference ({'.'.join(parts)}); pass the column "
            f"identifier without qualifiers, e.g. col({parts[-1]!r}) or {parts[-1]!r}, as Spark's "
            "create_auto_cdc_flow requires.")
    return parts[0]


def _not_an_identifier(column: Column, option: str, allow_struct: bool) -> str:
    also = " or struct() of such columns" if allow_struct else ""
    return (f"{option}: {column!r} is not a column identifier without qualifiers{also}; pass the column's name or "
            f"col('name'). The sink matches, selects and orders by column names, not by expressions: compute the "
            f"value into a column of the source first (withColumn).")


def _seq(scala_seq: Any) -> list[Any]:
    return [scala_seq.apply(i) for i in range(scala_seq.size())]


def check_retry_budget(max_attempts: int, max_conflict_retries: int, conflict_backoff: Sequence[float]) -> None:
    """MergeSink's rerun budget: attempts after lost blocks, reruns after conflicts, their backoff."""
    if max_attempts < 1:
        raise InvalidArgumentError(f"max_attempts must be >= 1, got {max_attempts}")
    if max_conflict_retries < 0:
        raise InvalidArgumentError(f"max_conflict_retries must be >= 0, got {max_conflict_retries}")
    if len(conflict_backoff) != 2 or not 0 <= conflict_backoff[0] <= conflict_backoff[1]:
        raise InvalidArgumentError(f"conflict_backoff must be (first, cap) seconds with 0 <= first <= cap, "
                                   f"got {conflict_backoff!r}")
