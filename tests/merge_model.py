"""Reference model of Delta Lake MERGE (DESIGN.md §3), in plain Python, row by row.

It exists to be the oracle for the property tests: short enough to check by reading, with no
Spark, no files and no optimisation. Rows are dicts; NULL is ``None``.

Clauses, each optionally with a condition, are evaluated in the order given within their kind;
the first whose condition is TRUE applies (a NULL condition counts as false):

- ``WHEN MATCHED``              -> ``UPDATE SET ...`` / ``UPDATE SET *`` / ``DELETE``
- ``WHEN NOT MATCHED``          -> ``INSERT (...) VALUES (...)`` / ``INSERT *``
- ``WHEN NOT MATCHED BY SOURCE`` -> ``UPDATE SET ...`` / ``DELETE``

=====================================  ================  =========================================
row                                    no clause applies rule
=====================================  ================  =========================================
target row matched by one source row   copied unchanged
target row matched by 2+ source rows   error             ``MultipleMatches`` — every ON match
                                                         counts, whatever the clause conditions;
                                                         exempt: an insert-only merge (no MATCHED,
                                                         no NOT MATCHED BY SOURCE clauses), and a
                                                         merge whose only WHEN MATCHED clause is
                                                         one unconditional DELETE (the row is
                                                         deleted once and counted once)
                                       either            in a matched-only merge (MATCHED clauses
                                                         only), when no WHEN MATCHED condition holds
                                                         for the row with any of its matches: the
                                                         conditions' target-only parts may skip the
                                                         row's file before the join (Delta's
                                                         getTargetOnlyPredicates), so the merge
                                                         either raises or leaves the row unchanged
                                                         (``AmbiguousMultipleMatches``)
source row with no match               dropped
target row with no match               copied unchanged
=====================================  ================  =========================================

Also: the ON condition uses SQL NULL semantics (a row pair matches only when it is TRUE, so
``t.k = s.k`` never matches NULL keys); only the last clause of each kind may be unconditional,
and a MERGE needs at least one clause (``InvalidClauses``, checked before anything runs); columns
absent from an UPDATE's ``set`` keep their value; all right-hand sides read the row *before* the
update; columns absent from an INSERT's ``values`` are NULL; ``*`` takes every target column from
the source column of the same name (extra source columns are ignored).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from tests.merge_exprs import Expr, Row

Kind = Literal["matched", "not_matched", "not_matched_by_source"]
Action = Literal["update", "update_all", "delete", "insert", "insert_all"]
KINDS: tuple[Kind, ...] = ("matched", "not_matched", "not_matched_by_source")

#: The metrics the model predicts: row counts only. numTargetRowsCopied and the file metrics
#: depend on which files the engine chooses to rewrite, so the model does not predict them.
COUNT_KEYS: tuple[str, ...] = (
    "numSourceRows", "numTargetRowsInserted", "numTargetRowsUpdated", "numTargetRowsDeleted",
    "numTargetRowsMatchedUpdated", "numTargetRowsMatchedDeleted",
    "numTargetRowsNotMatchedBySourceUpdated", "numTargetRowsNotMatchedBySourceDeleted",
    "num_affected_rows", "num_updated_rows", "num_deleted_rows", "num_inserted_rows",
)


class MultipleMatches(Exception):
    """The model's counterpart of ``MultipleSourceRowMatchingTargetRowError``."""


class AmbiguousMultipleMatches(MultipleMatches):
    """Multiple matches that the engine may or may not see, depending on the file layout: raised
    with the outcome of the merge for when it does not (every such row copied unchanged)."""

    def __init__(self, message: str, rows: list[Row], counts: dict[str, int]) -> None:
        super().__init__(message)
        self.rows = rows
        self.counts = counts


class InvalidClauses(Exception):
    """The model's counterpart of ``MergeAnalysisError`` for a malformed clause list."""


_KEYWORDS: dict[Kind, str] = {
    "matched": "WHEN MATCHED", "not_matched": "WHEN NOT MATCHED",
    "not_matched_by_source": "WHEN NOT MATCHED BY SOURCE",
}
_BUILDER_METHODS: dict[tuple[Kind, Action], str] = {
    ("matched", "update"): "whenMatchedUpdate", ("matched", "update_all"): "whenMatchedUpdateAll",
    ("matched", "delete"): "whenMatchedDelete", ("not_matched", "insert"): "whenNotMatchedInsert",
    ("not_matched", "insert_all"): "whenNotMatchedInsertAll",
    ("not_matched_by_source", "update"): "whenNotMatchedBySourceUpdate",
    ("not_matched_by_source", "delete"): "whenNotMatchedBySourceDelete",
}


@dataclass(frozen=True)
class Clause:
    """One WHEN clause, usable by both sides: the model evaluates ``condition``/``assignments`` as
    Python, ``add_to`` hands their SQL text to a delta-spark style merge builder."""

    kind: Kind
    action: Action
    condition: Expr | None = None
    assignments: tuple[tuple[str, Expr], ...] = ()  # (target column, value) for update / insert

    def __post_init__(self) -> None:
        assert (self.kind, self.action) in _BUILDER_METHODS, (self.kind, self.action)
        assert bool(self.assignments) == (self.action in ("update", "insert")), self

    def applies(self, t: Row | None, s: Row | None) -> bool:
        """True when the condition is absent or TRUE (NULL counts as false)."""
        return self.condition is None or self.condition(t, s) is True

    def add_to(self, builder: Any) -> Any:
        """Append this clause to a ``DeltaMergeBuilder`` and return the new builder."""
        method = getattr(builder, _BUILDER_METHODS[(self.kind, self.action)])
        condition = None if self.condition is None else self.condition.sql
        sql = {column: value.sql for column, value in self.assignments}
        if self.action == "update":
            return method(condition=condition, set=sql)
        if self.action == "insert":
            return method(condition=condition, values=sql)
        return method(condition=condition)

    def __repr__(self) -> str:
        cond = "" if self.condition is None else f" AND {self.condition.sql}"
        pairs = ", ".join(f"{c} = {v.sql}" for c, v in self.assignments)
        action = {"update": f"UPDATE SET {pairs}", "update_all": "UPDATE SET *", "delete": "DELETE",
                  "insert": f"INSERT ({', '.join(c for c, _ in self.assignments)}) VALUES "
                            f"({', '.join(v.sql for _, v in self.assignments)})",
                  "insert_all": "INSERT *"}[self.action]
        return f"{_KEYWORDS[self.kind]}{cond} THEN {action}"


def validate(clauses: Sequence[Clause]) -> None:
    """Raise ``InvalidClauses`` unless there is a clause and only the last of each kind lacks a
    condition (an unconditional clause would make every later clause of its kind unreachable)."""
    if not clauses:
        raise InvalidClauses("There must be at least one WHEN clause in a MERGE statement.")
    for kind in KINDS:
        of_kind = [c for c in clauses if c.kind == kind]
        if any(c.condition is None for c in of_kind[:-1]):
            raise InvalidClauses(f"only the last {_KEYWORDS[kind]} clause may omit its condition")


def _first(clauses: Sequence[Clause], t: Row | None, s: Row | None) -> Clause | None:
    return next((c for c in clauses if c.applies(t, s)), None)


def _updated(t: Row, s: Row | None, clause: Clause, columns: Sequence[str]) -> Row:
    if clause.action == "update_all":
        assert s is not None
        return {c: s[c] for c in columns}
    new_values = {c: value(t, s) for c, value in clause.assignments}  # all read the old row
    return {**t, **new_values}


def _inserted(s: Row, clause: Clause, columns: Sequence[str]) -> Row:
    if clause.action == "insert_all":
        return {c: s[c] for c in columns}
    values = {c: value(None, s) for c, value in clause.assignments}
    return {c: values.get(c) for c in columns}


def apply_merge(
    target_rows: Sequence[Row],
    source_rows: Sequence[Row],
    on: Callable[[Row, Row], bool | None],
    clauses: Sequence[Clause],
    *,
    columns: Sequence[str] | None = None,
    changes: list[tuple[str, Row]] | None = None,
) -> tuple[list[Row], dict[str, int]]:
    """Return (the target's rows after the MERGE, the predicted row-count metrics).

    ``columns`` are the target's columns (default: the keys of the first target row, else of the
    first source row). Raises ``InvalidClauses`` or ``MultipleMatches`` as described above.
    ``changes``, when given, receives the change data feed's rows as (``_change_type``, row):
    ``update_preimage`` and ``update_postimage`` for an updated target row, ``delete`` for a
    deleted one, ``insert`` for an inserted source row (also filled before
    ``AmbiguousMultipleMatches`` is raised, for its outcome).
    """
    validate(clauses)
    if columns is None:
        first_row = next(iter([*target_rows, *source_rows]), {})
        columns = list(first_row)
    matched = [c for c in clauses if c.kind == "matched"]
    not_matched = [c for c in clauses if c.kind == "not_matched"]
    by_source = [c for c in clauses if c.kind == "not_matched_by_source"]
    insert_only = not matched and not by_source
    only_unconditional_delete = (
        len(matched) == 1 and matched[0].action == "delete" and matched[0].condition is None
    )

    matches = [[s for s in source_rows if on(t, s) is True] for t in target_rows]
    conflicts = [] if insert_only or only_unconditional_delete else [
        (t, ms) for t, ms in zip(target_rows, matches, strict=True) if len(ms) > 1]
    matched_only = not not_matched and not by_source
    for t, ms in conflicts:
        if not matched_only or any(_first(matched, t, s) is not None for s in ms):
            raise MultipleMatches(f"{len(ms)} source rows match target row {t}")
    rows, counts = _merged(target_rows, source_rows, on, matched, not_matched, by_source, matches, columns,
                           changes if changes is not None else [])
    if conflicts:
        t, ms = conflicts[0]
        raise AmbiguousMultipleMatches(
            f"{len(ms)} source rows match target row {t}, which no WHEN MATCHED condition selects", rows, counts)
    return rows, counts


def _merged(
    target_rows: Sequence[Row], source_rows: Sequence[Row], on: Callable[[Row, Row], bool | None],
    matched: Sequence[Clause], not_matched: Sequence[Clause], by_source: Sequence[Clause],
    matches: Sequence[Sequence[Row]], columns: Sequence[str], changes: list[tuple[str, Row]],
) -> tuple[list[Row], dict[str, int]]:
    """The merge's outcome once the multiple-match rule has let it through."""

    counts = dict.fromkeys(COUNT_KEYS, 0)
    counts["numSourceRows"] = len(source_rows)
    result: list[Row] = []
    for t, ms in zip(target_rows, matches, strict=True):
        s = ms[0] if ms else None  # with 2+ matches: the unconditional DELETE, or no clause applies
        clause = _first(matched, t, s) if ms else _first(by_source, t, None)
        prefix = "numTargetRowsMatched" if ms else "numTargetRowsNotMatchedBySource"
        if clause is None:
            result.append(dict(t))
        elif clause.action == "delete":
            counts[f"{prefix}Deleted"] += 1
            changes.append(("delete", dict(t)))
        else:
            result.append(_updated(t, s, clause, columns))
            counts[f"{prefix}Updated"] += 1
            changes += [("update_preimage", dict(t)), ("update_postimage", dict(result[-1]))]

    for s in source_rows:
        if any(on(t, s) is True for t in target_rows):
            continue
        clause = _first(not_matched, None, s)
        if clause is not None:
            result.append(_inserted(s, clause, columns))
            counts["numTargetRowsInserted"] += 1
            changes.append(("insert", dict(result[-1])))

    counts["numTargetRowsUpdated"] = (
        counts["numTargetRowsMatchedUpdated"] + counts["numTargetRowsNotMatchedBySourceUpdated"]
    )
    counts["numTargetRowsDeleted"] = (
        counts["numTargetRowsMatchedDeleted"] + counts["numTargetRowsNotMatchedBySourceDeleted"]
    )
    counts["num_updated_rows"] = counts["numTargetRowsUpdated"]
    counts["num_deleted_rows"] = counts["numTargetRowsDeleted"]
    counts["num_inserted_rows"] = counts["numTargetRowsInserted"]
    counts["num_affected_rows"] = (
        counts["num_updated_rows"] + counts["num_deleted_rows"] + counts["num_inserted_rows"]
    )
    return result, counts


# Constructors named after the builder methods, so test code reads like the API under test.
def _pairs(assignments: Mapping[str, Expr]) -> tuple[tuple[str, Expr], ...]:
    return tuple(assignments.items())


def matched_update(set: Mapping[str, Expr], condition: Expr | None = None) -> Clause:
    return Clause("matched", "update", condition, _pairs(set))


def matched_update_all(condition: Expr | None = None) -> Clause:
    return Clause("matched", "update_all", condition)


def matched_delete(condition: Expr | None = None) -> Clause:
    return Clause("matched", "delete", condition)


def not_matched_insert(values: Mapping[str, Expr], condition: Expr | None = None) -> Clause:
    return Clause("not_matched", "insert", condition, _pairs(values))


def not_matched_insert_all(condition: Expr | None = None) -> Clause:
    return Clause("not_matched", "insert_all", condition)


def by_source_update(set: Mapping[str, Expr], condition: Expr | None = None) -> Clause:
    return Clause("not_matched_by_source", "update", condition, _pairs(set))


def by_source_delete(condition: Expr | None = None) -> Clause:
    return Clause("not_matched_by_source", "delete", condition)


def merge_sql(on: Expr, clauses: Sequence[Clause]) -> str:
    """The MERGE as SQL text, for failure reports (and to replay an example on delta-spark)."""
    return "\n".join(["MERGE INTO target t USING source s", f"ON {on.sql}", *map(repr, clauses)])
