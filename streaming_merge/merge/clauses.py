"""The MERGE clause model and the checks Delta applies before running a merge.

Clauses are kept exactly as the user gave them (SQL strings or Columns); resolution
against real schemas happens in ``resolve.py`` once source and target are known.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from pyspark.sql import Column
from pyspark.sql import functions as F

from streaming_merge.errors import MergeAnalysisError

ClauseKind = Literal["matched", "not_matched", "not_matched_by_source"]
ClauseAction = Literal["update", "update_all", "delete", "insert", "insert_all"]
ExprLike = str | Column

# Delta Lake's words for the clause kinds in its analysis errors, which ours begin with.
_DELTA_KIND = {"matched": "MATCHED", "not_matched": "NOT MATCHED", "not_matched_by_source": "NOT MATCHED BY SOURCE"}
_KIND_SQL = {
    "matched": "WHEN MATCHED",
    "not_matched": "WHEN NOT MATCHED",
    "not_matched_by_source": "WHEN NOT MATCHED BY SOURCE",
}


def to_column(expr: ExprLike) -> Column:
    """SQL text or Column → Column (SQL text is parsed by Spark, never by us)."""
    return F.expr(expr) if isinstance(expr, str) else expr


def expr_text(expr: ExprLike | None) -> str:
    """Human form of a condition/assignment for messages and commitInfo."""
    if expr is None:
        return "true"
    if isinstance(expr, str):
        return expr
    text = str(expr)  # "Column<'(t.k = s.k)'>"
    return text[len("Column<'"):-len("'>")] if text.startswith("Column<'") else text


@dataclass(frozen=True)
class MergeClause:
    """One WHEN clause: its kind, action, optional condition and assignments."""

    kind: ClauseKind
    action: ClauseAction
    condition: ExprLike | None = None
    assignments: Mapping[str, ExprLike] = field(default_factory=dict)

    @property
    def is_delete(self) -> bool:
        return self.action == "delete"

    def describe(self) -> str:
        action = {
            "update": "UPDATE SET ...",
            "update_all": "UPDATE SET *",
            "delete": "DELETE",
            "insert": "INSERT (...)",
            "insert_all": "INSERT *",
        }[self.action]
        cond = f" AND {expr_text(self.condition)}" if self.condition is not None else ""
        return f"{_KIND_SQL[self.kind]}{cond} THEN {action}"

    def to_json(self) -> dict[str, object]:
        """commitInfo's form, as Delta records matchedPredicates etc."""
        out: dict[str, object] = {"actionType": self.action.removesuffix("_all")}
        if self.condition is not None:
            out["predicate"] = expr_text(self.condition)
        return out


@dataclass(frozen=True)
class ClauseSet:
    """The clauses of one MERGE, grouped by kind in the order given."""

    matched: Sequence[MergeClause]
    not_matched: Sequence[MergeClause]
    not_matched_by_source: Sequence[MergeClause]

    @classmethod
    def of(cls, clauses: Sequence[MergeClause]) -> ClauseSet:
        return cls(
            matched=[c for c in clauses if c.kind == "matched"],
            not_matched=[c for c in clauses if c.kind == "not_matched"],
            not_matched_by_source=[c for c in clauses if c.kind == "not_matched_by_source"],
        )

    @property
    def is_insert_only(self) -> bool:
        return not self.matched and not self.not_matched_by_source and bool(self.not_matched)

    @property
    def is_matched_only(self) -> bool:
        return bool(self.matched) and not self.not_matched and not self.not_matched_by_source

    @property
    def is_only_one_unconditional_delete(self) -> bool:
        """Multiple matches are harmless then: the row is deleted once."""
        return len(self.matched) == 1 and self.matched[0].is_delete and self.matched[0].condition is None

    @property
    def all(self) -> list[MergeClause]:
        return [*self.matched, *self.not_matched, *self.not_matched_by_source]

    def validate(self) -> None:
        """Delta's static checks: something to do, and only the last clause of each kind may
        be unconditional (an unconditional clause in the middle makes the rest unreachable)."""
        if not self.all:
            raise MergeAnalysisError(
                "There must be at least one WHEN clause in a MERGE statement; add whenMatched..., "
                "whenNotMatched... or whenNotMatchedBySource... before execute()."
            )
        for group in (self.matched, self.not_matched, self.not_matched_by_source):
            for clause in group[:-1]:
                if clause.condition is None:
                    raise MergeAnalysisError(
                        f"When there are more than one {_DELTA_KIND[clause.kind]} clauses in a MERGE "
                        f"statement, only the last {_DELTA_KIND[clause.kind]} clause can omit the condition. "
                        f"`{clause.describe()}` is unconditional but is followed by "
                        f"{len(group) - group.index(clause) - 1} more; add a condition or move it last."
                    )
