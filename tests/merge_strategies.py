"""Hypothesis strategies for MERGE property tests: small tables, source batches and clause lists.

Why a module of its own: the engine property test and the Spark check of the expression grammar
(``tests/spark/test_merge_exprs_spark.py``) draw from the same generators, so the grammar the
oracle is validated on is exactly the grammar the engine is tested with.

Shape of the data (kept small so hundreds of examples run in minutes):
- target: up to 12 rows ``(k INT, v INT, w STRING, p INT)``; keys repeat and may be NULL;
  ``p`` has three values plus NULL (it is the partition column when the table is partitioned);
- source: up to 8 rows of the same columns plus ``x`` (an extra column that ``*`` must ignore),
  in a random column order (``*`` matches by name); keys are unique in about half the batches
  so that not every example ends in a multiple-match error;
- clauses: zero to three of each kind, interleaved at random, with conditions from a small
  grammar (NOT/AND/OR over atoms chosen so that NULLs matter). Valid lists by default: every
  clause but the last of its kind gets a condition.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from hypothesis import strategies as st

from tests.merge_exprs import (
    BOTH,
    COLUMNS,
    ON_CONDITIONS,
    PREDICATES,
    SOURCE,
    TARGET,
    VALUES,
    Expr,
    and_,
    in_scope,
    not_,
    or_,
)
from tests.merge_model import (
    KINDS,
    Action,
    Clause,
    Kind,
    matched_delete,
    matched_update_all,
    merge_sql,
    not_matched_insert_all,
)

Row = dict[str, Any]
Layout = Literal["single", "round_robin", "by_key"]

KEYS: tuple[int | None, ...] = (0, 1, 2, 3, 4, 5, 6, None)
INTS: tuple[int | None, ...] = (0, 1, 2, 3, 4, 5, 6, 7, 8, 9, -1, -2, -3, -4, None, None)
STRINGS: tuple[str | None, ...] = ("a", "b", "c", "", None, None)
PARTITIONS: tuple[int | None, ...] = (0, 1, 2, None)

SCOPES: dict[Kind, frozenset[str]] = {"matched": BOTH, "not_matched": SOURCE, "not_matched_by_source": TARGET}
ACTIONS: dict[Kind, tuple[Action, ...]] = {
    "matched": ("update", "update_all", "delete"),
    "not_matched": ("insert", "insert_all"),
    "not_matched_by_source": ("update", "delete"),
}


@dataclass(frozen=True)
class MergeStep:
    """One MERGE: a source batch (with ``source_columns`` as its DataFrame columns), ON and clauses."""

    source: tuple[Row, ...]
    source_columns: tuple[str, ...]
    on: Expr
    clauses: tuple[Clause, ...]
    schema_evolution: bool = False  # withSchemaEvolution(): ``*`` adds the source's extra column x

    def __repr__(self) -> str:
        rows = "\n".join(f"    {r}" for r in self.source)
        evolution = " (WITH SCHEMA EVOLUTION)" if self.schema_evolution else ""
        return f"{merge_sql(self.on, self.clauses)}{evolution}\n  source columns {self.source_columns}:\n{rows}"


@dataclass(frozen=True)
class MergeCase:
    """A target table (rows, partitioning, how its rows are spread over files) and 1-2 merges.

    A second merge reads files the engine wrote in the first, so stats and partition values
    written by the engine are exercised by its own data skipping, not only those from create.
    """

    target: tuple[Row, ...]
    partitioned: bool
    layout: Layout
    files: int
    steps: tuple[MergeStep, ...]

    def __repr__(self) -> str:
        rows = "\n".join(f"    {r}" for r in self.target)
        steps = "\n".join(f"  step {i}:\n{step!r}" for i, step in enumerate(self.steps))
        return (f"MergeCase(partitioned={self.partitioned}, layout={self.layout}, files={self.files})\n"
                f"  target:\n{rows}\n{steps}")


def table_rows(
    max_size: int, *, min_size: int = 0, with_x: bool = False, unique_keys: bool = False
) -> st.SearchStrategy[list[Row]]:
    """Rows of the target schema (plus the extra source column ``x`` when ``with_x``)."""
    fields: dict[str, st.SearchStrategy[Any]] = {
        "k": st.sampled_from(KEYS), "v": st.sampled_from(INTS), "w": st.sampled_from(STRINGS),
        "p": st.sampled_from(PARTITIONS),
    }
    if with_x:
        fields["x"] = st.sampled_from(INTS)
    return st.lists(st.fixed_dictionaries(fields), min_size=min_size, max_size=max_size,
                    unique_by=(lambda r: r["k"]) if unique_keys else None)


def conditions(scope: frozenset[str]) -> st.SearchStrategy[Expr]:
    """Boolean expressions over ``scope``: an atom, or NOT/AND/OR of up to three atoms."""
    atoms = st.sampled_from(in_scope(PREDICATES, scope))
    return st.recursive(
        atoms,
        lambda inner: st.one_of(
            st.builds(not_, inner), st.builds(and_, inner, inner), st.builds(or_, inner, inner)
        ),
        max_leaves=3,
    )


@st.composite
def assignments(draw: st.DrawFn, scope: frozenset[str]) -> tuple[tuple[str, Expr], ...]:
    """A non-empty ``set``/``values`` map: some target columns, each with a value in scope."""
    columns = draw(st.lists(st.sampled_from(COLUMNS), min_size=1, max_size=len(COLUMNS), unique=True))
    return tuple((c, draw(st.sampled_from(in_scope(VALUES[c], scope)))) for c in columns)


@st.composite
def clauses(draw: st.DrawFn, kind: Kind, *, conditional: bool, action: Action | None = None) -> Clause:
    """One clause of ``kind``; with a condition when ``conditional``."""
    scope = SCOPES[kind]
    action = action or draw(st.sampled_from(ACTIONS[kind]))
    condition = draw(conditions(scope)) if conditional else None
    values = draw(assignments(scope)) if action in ("update", "insert") else ()
    return Clause(kind, action, condition, values)


@st.composite
def clauses_of_kind(draw: st.DrawFn, kind: Kind, *, allow_invalid: bool = False) -> list[Clause]:
    """Zero to three clauses of ``kind``; only the last may lack a condition unless ``allow_invalid``."""
    count = draw(st.integers(0, 3))
    result = []
    for i in range(count):
        must_have_condition = i < count - 1 and not allow_invalid
        result.append(draw(clauses(kind, conditional=must_have_condition or draw(st.booleans()))))
    return result


@st.composite
def clause_lists(draw: st.DrawFn, *, allow_invalid: bool = False) -> tuple[Clause, ...]:
    """A whole WHEN list, order within a kind kept, kinds interleaved at random.

    A shape is drawn first so the two exempt cases of the multiple-match check (insert-only, and a
    lone unconditional WHEN MATCHED DELETE) come up often, not by the odd coincidence.
    """
    shape = draw(st.sampled_from(["random"] * 6 + ["insert_only", "lone_delete"]))
    per_kind = {kind: draw(clauses_of_kind(kind, allow_invalid=allow_invalid)) for kind in KINDS}
    if shape == "insert_only":
        per_kind["matched"], per_kind["not_matched_by_source"] = [], []
    if shape == "lone_delete":
        per_kind["matched"] = [Clause("matched", "delete")]
    if not any(per_kind.values()):
        kind = draw(st.sampled_from(KINDS))
        per_kind[kind] = [draw(clauses(kind, conditional=draw(st.booleans())))]
    labels = draw(st.permutations([kind for kind in KINDS for _ in per_kind[kind]]))
    remaining = {kind: iter(per_kind[kind]) for kind in KINDS}
    return tuple(next(remaining[kind]) for kind in labels)


@st.composite
def merge_steps(draw: st.DrawFn, *, schema_evolution: bool = False) -> MergeStep:
    """A source batch, an ON condition and a clause list (rarely a possibly invalid one); with
    ``schema_evolution``, one step in three evolves the schema (the model knows no evolution, so
    only the Delta oracle asks for it).

    The batch is empty only about one time in ten (left to itself hypothesis draws many empty
    lists, and an empty batch is one edge case, not a fifth of the test)."""
    unique_keys = draw(st.booleans())
    min_size = 0 if draw(st.integers(0, 9)) == 0 else 1
    source = draw(table_rows(8, min_size=min_size, with_x=True, unique_keys=unique_keys))
    columns = list(draw(st.permutations([*COLUMNS, "x"])))
    if draw(st.booleans()):
        columns.remove("x")
    allow_invalid = draw(st.integers(0, 19)) == 0
    evolve = schema_evolution and draw(st.integers(0, 2)) == 0
    return MergeStep(tuple(source), tuple(columns), draw(st.sampled_from(ON_CONDITIONS)),
                     draw(clause_lists(allow_invalid=allow_invalid)), evolve)


@st.composite
def merge_cases(draw: st.DrawFn, *, schema_evolution: bool = False) -> MergeCase:
    """A target table and one merge, or (one time in four) two merges in sequence."""
    step_count = 2 if draw(st.integers(0, 3)) == 0 else 1
    min_size = 0 if draw(st.integers(0, 9)) == 0 else 1  # an empty target about one time in ten
    return MergeCase(
        target=tuple(draw(table_rows(12, min_size=min_size))),
        partitioned=draw(st.booleans()),
        layout=draw(st.sampled_from(["single", "round_robin", "by_key"])),
        files=draw(st.integers(1, 4)),
        steps=tuple(draw(merge_steps(schema_evolution=schema_evolution)) for _ in range(step_count)),
    )


@st.composite
def source_side_clause_lists(draw: st.DrawFn) -> tuple[Clause, ...]:
    """Clauses whose written values all come from the source: WHEN MATCHED UPDATE SET * or DELETE
    (their conditions may read the target), WHEN NOT MATCHED inserts, no NOT MATCHED BY SOURCE:
    what a deletion-vector MERGE writes from the source side (streaming_merge.merge.dv_source_side).
    A quarter are lists whose source rows write the same row matched or not (its one-job write):
    UPDATE SET * beside INSERT * under the same source condition, or none, the CDC clauses (a
    delete on a condition, the update and insert on its negation)."""
    if draw(st.booleans()) and draw(st.booleans()):
        condition = draw(conditions(SOURCE))
        return draw(st.sampled_from((
            (matched_update_all(), not_matched_insert_all()),
            (matched_update_all(condition), not_matched_insert_all(condition)),
            (not_matched_insert_all(not_(condition)), matched_delete(condition), matched_update_all(not_(condition))),
        )))
    matched: list[Clause] = []
    count = draw(st.integers(0, 2))
    for i in range(count):  # half the conditions read the target alone (a sequence guard's side)
        condition = (draw(st.one_of(conditions(TARGET), conditions(BOTH)))
                     if i < count - 1 or draw(st.booleans()) else None)
        matched.append(Clause("matched", draw(st.sampled_from(("update_all", "delete"))), condition))
    inserts = draw(st.integers(1, 2))
    per_kind: dict[Kind, list[Clause]] = {"matched": matched, "not_matched": [
        draw(clauses("not_matched", conditional=i < inserts - 1 or draw(st.booleans()))) for i in range(inserts)]}
    labels = draw(st.permutations([kind for kind, listed in per_kind.items() for _ in listed]))
    remaining = {kind: iter(listed) for kind, listed in per_kind.items()}
    return tuple(next(remaining[kind]) for kind in labels)


@st.composite
def source_side_cases(draw: st.DrawFn) -> MergeCase:
    """A target with an even number of rows (so the property test records no change data) and one
    MERGE of 4 or 8 source rows (so its deletion-vector run writes from the source side) with
    source_side_clause_lists."""
    target = draw(table_rows(12))
    columns = list(draw(st.permutations([*COLUMNS, "x"])))
    step = MergeStep(tuple(draw(table_rows(8, min_size=8, with_x=True)))[: draw(st.sampled_from((4, 8)))],
                     tuple(columns), draw(st.sampled_from(ON_CONDITIONS)), draw(source_side_clause_lists()))
    return MergeCase(
        target=tuple(target[: len(target) - len(target) % 2]),
        partitioned=draw(st.booleans()),
        layout=draw(st.sampled_from(["single", "round_robin", "by_key"])),
        files=draw(st.integers(1, 4)),
        steps=(step,),
    )
