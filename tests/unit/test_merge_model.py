"""Hand-written cases for the MERGE reference model, one group per row of DESIGN.md §3.

Why: the property tests trust ``merge_model.apply_merge`` as their oracle. If the oracle were wrong,
a correct engine would fail (or, worse, a wrong engine would pass), so every semantic rule is pinned
here on small, readable examples whose expected outcome is worked out by hand. No JVM is needed.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.merge_exprs import (
    COLUMNS,
    PREDICATES,
    VALUES,
    S,
    T,
    add,
    and_,
    coalesce,
    concat,
    eq,
    gt,
    in_scope,
    is_null,
    lit,
    mod,
    not_,
    null_safe_eq,
    or_,
    sql_and,
    sql_mod,
    sql_or,
    upper,
)
from tests.merge_model import (
    COUNT_KEYS,
    AmbiguousMultipleMatches,
    Clause,
    InvalidClauses,
    MultipleMatches,
    apply_merge,
    by_source_delete,
    by_source_update,
    matched_delete,
    matched_update,
    matched_update_all,
    merge_sql,
    not_matched_insert,
    not_matched_insert_all,
)

Row = dict[str, Any]
ON = eq(T["k"], S["k"])


def row(k: int | None, v: int | None = None, w: str | None = None, p: int | None = 0) -> Row:
    return {"k": k, "v": v, "w": w, "p": p}


def merge(target: list[Row], source: list[Row], *clauses: Clause, on: Any = ON) -> tuple[list[Row], dict]:
    return apply_merge(target, source, on, list(clauses), columns=COLUMNS)


def rows_key(rows: list[Row]) -> list[tuple]:
    """Rows as a sorted list of tuples: results are multisets, their order means nothing."""
    return sorted(tuple((r[c] is None, r[c] if r[c] is not None else 0) for c in COLUMNS) for r in rows)


def assert_rows(actual: list[Row], expected: list[Row]) -> None:
    assert rows_key(actual) == rows_key(expected)


def nonzero(counts: dict[str, int]) -> dict[str, int]:
    """Only the non-zero counts, so expectations list what happened and nothing else."""
    return {k: v for k, v in counts.items() if v}


# --- SQL value semantics of the expression language ---------------------------------------------


def test_sql_mod_takes_the_sign_of_the_dividend() -> None:
    assert [sql_mod(x, 3) for x in (-7, -3, -1, 0, 1, 7)] == [-1, 0, -1, 0, 1, 1]
    assert sql_mod(7, -3) == 1


@pytest.mark.parametrize(
    ("x", "y", "conj", "disj"),
    [
        (True, True, True, True), (True, False, False, True), (True, None, None, True),
        (False, False, False, False), (False, None, False, None), (None, None, None, None),
    ],
)
def test_three_valued_logic(x: bool | None, y: bool | None, conj: bool | None, disj: bool | None) -> None:
    assert sql_and(x, y) is conj and sql_and(y, x) is conj
    assert sql_or(x, y) is disj and sql_or(y, x) is disj


def test_expressions_propagate_null_and_render_sql() -> None:
    t, s = row(1, None, None), row(1, 4, "b")
    assert eq(T["v"], S["v"])(t, s) is None
    assert not_(eq(T["v"], S["v"]))(t, s) is None
    assert or_(eq(T["v"], S["v"]), gt(S["v"], lit(3)))(t, s) is True
    assert and_(eq(T["v"], S["v"]), gt(S["v"], lit(9)))(t, s) is False
    assert is_null(T["w"])(t, s) is True
    assert add(T["v"], lit(1))(t, s) is None
    assert mod(lit(-7), lit(2))(t, s) == -1
    assert concat(T["w"], S["w"])(t, s) is None and concat(S["w"], lit("y"))(t, s) == "by"
    assert upper(S["w"])(t, s) == "B" and coalesce(T["v"], S["v"])(t, s) == 4
    assert null_safe_eq(T["w"], lit(None))(t, s) is True and null_safe_eq(S["w"], lit(None))(t, s) is False
    assert lit("a").sql == "'a'" and lit(None).sql == "NULL"
    assert and_(eq(T["k"], S["k"]), gt(S["v"], lit(0))).sql == "((t.k = s.k) AND (s.v > 0))"


def test_out_of_scope_reference_fails_loudly() -> None:
    with pytest.raises(TypeError, match="out of scope"):
        gt(T["v"], lit(0))(None, row(1))


def test_scopes_partition_the_grammar() -> None:
    """Every clause kind has predicates and values to choose from for every column."""
    for scope in (frozenset({"s"}), frozenset({"t"}), frozenset({"t", "s"})):
        assert in_scope(PREDICATES, scope)
        for column in COLUMNS:
            assert in_scope(VALUES[column], scope)


# --- row 1: target row matched by exactly one source row -----------------------------------------


def test_matched_update_sets_listed_columns_and_keeps_the_rest() -> None:
    result, counts = merge([row(1, 1, "a", 0), row(2, 2, "b", 1)], [row(1, 10, "z", 2)],
                           matched_update({"v": S["v"], "w": concat(T["w"], S["w"])}))
    assert_rows(result, [row(1, 10, "az", 0), row(2, 2, "b", 1)])
    assert nonzero(counts) == {"numSourceRows": 1, "numTargetRowsUpdated": 1,
                               "numTargetRowsMatchedUpdated": 1, "num_updated_rows": 1,
                               "num_affected_rows": 1}
    assert set(counts) == set(COUNT_KEYS)


def test_assignments_all_read_the_old_row() -> None:
    result, _ = merge([row(1, 5, "a")], [row(1)], matched_update({"v": add(T["v"], lit(1)), "k": T["v"]}))
    assert_rows(result, [row(5, 6, "a")])


def test_matched_update_all_takes_columns_by_name_and_ignores_extra_source_columns() -> None:
    source = [{"x": 99, "w": "s", "p": 2, "v": 7, "k": 1}]
    result, counts = merge([row(1, 1, "a", 0)], source, matched_update_all())
    assert_rows(result, [row(1, 7, "s", 2)])
    assert counts["numTargetRowsMatchedUpdated"] == 1


def test_matched_delete() -> None:
    result, counts = merge([row(1, 1), row(2, 2)], [row(1)], matched_delete())
    assert_rows(result, [row(2, 2)])
    assert nonzero(counts) == {"numSourceRows": 1, "numTargetRowsDeleted": 1,
                               "numTargetRowsMatchedDeleted": 1, "num_deleted_rows": 1,
                               "num_affected_rows": 1}


def test_first_matched_clause_whose_condition_holds_wins() -> None:
    clauses = [matched_delete(gt(S["v"], lit(5))), matched_update({"w": lit("u")}, gt(S["v"], lit(0))),
               matched_update({"w": lit("last")})]
    target = [row(1, 0, "a"), row(2, 0, "a"), row(3, 0, "a"), row(4, 0, "a")]
    source = [row(1, 9), row(2, 1), row(3, -1), row(4, None)]
    result, counts = merge(target, source, *clauses)
    assert_rows(result, [row(2, 0, "u"), row(3, 0, "last"), row(4, 0, "last")])
    assert counts["numTargetRowsMatchedDeleted"] == 1 and counts["numTargetRowsMatchedUpdated"] == 3


def test_matched_row_with_no_applicable_clause_is_copied_unchanged() -> None:
    """A NULL condition counts as false: s.v is NULL, so ``s.v > 3`` does not hold."""
    clause = matched_update({"v": lit(0)}, gt(S["v"], lit(3)))
    result, counts = merge([row(1, 1, "a")], [row(1, None)], clause)
    assert_rows(result, [row(1, 1, "a")])
    assert nonzero(counts) == {"numSourceRows": 1}


def test_one_source_row_may_match_several_target_rows() -> None:
    result, counts = merge([row(1, 1), row(1, 2), row(2, 3)], [row(1, 9)], matched_update({"v": S["v"]}))
    assert_rows(result, [row(1, 9), row(1, 9), row(2, 3)])
    assert counts["numTargetRowsMatchedUpdated"] == 2


# --- row 2: target row matched by two or more source rows ----------------------------------------


def test_multiple_matches_raise() -> None:
    with pytest.raises(MultipleMatches):
        merge([row(1, 1)], [row(1, 2), row(1, 3)], matched_update({"v": S["v"]}))


def test_multiple_matches_raise_whatever_the_clause_conditions() -> None:
    """Every ON match counts, even when no clause condition holds for either source row."""
    update_big = matched_update({"v": S["v"]}, gt(S["v"], lit(100)))
    with pytest.raises(MultipleMatches) as raised:
        merge([row(1, 1)], [row(1, 2), row(1, 3)], update_big, not_matched_insert_all())
    assert not isinstance(raised.value, AmbiguousMultipleMatches)


def test_matched_only_multiple_matches_that_no_condition_selects_may_go_either_way() -> None:
    """Delta may skip such a row's file by the conditions' target-only parts before the join: the
    model says so, and gives the outcome for when the row is not seen (copied unchanged)."""
    update_big = matched_update({"v": S["v"]}, gt(T["v"], lit(100)))
    with pytest.raises(AmbiguousMultipleMatches) as raised:
        merge([row(1, 1), row(2, 200)], [row(1, 2), row(1, 3), row(2, 5)], update_big)
    assert_rows(raised.value.rows, [row(1, 1), row(2, 5)])
    assert nonzero(raised.value.counts) == {
        "numSourceRows": 3, "numTargetRowsUpdated": 1, "numTargetRowsMatchedUpdated": 1, "num_updated_rows": 1,
        "num_affected_rows": 1}
    with pytest.raises(MultipleMatches) as selected:  # a condition holds for one of the matches
        merge([row(1, 150)], [row(1, 2), row(1, 3)], update_big)
    assert not isinstance(selected.value, AmbiguousMultipleMatches)


def test_multiple_matches_raise_for_a_conditional_delete_or_a_delete_among_others() -> None:
    target, source = [row(1, 1)], [row(1, 2), row(1, 3)]
    with pytest.raises(MultipleMatches):
        merge(target, source, matched_delete(gt(S["v"], lit(0))))
    with pytest.raises(MultipleMatches):
        merge(target, source, matched_delete(gt(S["v"], lit(0))), matched_delete())
    with pytest.raises(MultipleMatches):
        merge(target, source, matched_update({"v": S["v"]}, gt(S["v"], lit(5))), matched_delete())


def test_multiple_matches_raise_with_only_not_matched_by_source_clauses() -> None:
    """Not insert-only, and no lone unconditional DELETE: the check runs."""
    with pytest.raises(MultipleMatches):
        merge([row(1, 1)], [row(1, 2), row(1, 3)], by_source_delete())


def test_insert_only_merge_skips_the_check_and_drops_matched_source_rows() -> None:
    result, counts = merge([row(1, 1)], [row(1, 2), row(1, 3), row(2, 4)], not_matched_insert_all())
    assert_rows(result, [row(1, 1), row(2, 4)])
    assert nonzero(counts) == {"numSourceRows": 3, "numTargetRowsInserted": 1, "num_inserted_rows": 1,
                               "num_affected_rows": 1}


def test_lone_unconditional_delete_deletes_once_and_counts_once() -> None:
    clauses = [matched_delete(), not_matched_insert_all(), by_source_update({"w": lit("gone")})]
    result, counts = merge([row(1, 1), row(2, 2)], [row(1, 7), row(1, 8), row(3, 9)], *clauses)
    assert_rows(result, [row(2, 2, "gone"), row(3, 9)])
    assert nonzero(counts) == {
        "numSourceRows": 3, "numTargetRowsDeleted": 1, "numTargetRowsMatchedDeleted": 1,
        "numTargetRowsInserted": 1, "numTargetRowsUpdated": 1, "numTargetRowsNotMatchedBySourceUpdated": 1,
        "num_deleted_rows": 1, "num_inserted_rows": 1, "num_updated_rows": 1, "num_affected_rows": 3,
    }


def test_duplicate_source_keys_without_a_target_match_are_all_inserted() -> None:
    clauses = [matched_update_all(), not_matched_insert_all()]
    result, counts = merge([row(1, 1)], [row(5, 1), row(5, 2)], *clauses)
    assert_rows(result, [row(1, 1), row(5, 1), row(5, 2)])
    assert counts["numTargetRowsInserted"] == 2


# --- row 3: source row with no match -------------------------------------------------------------


def test_not_matched_insert_leaves_unlisted_columns_null() -> None:
    result, counts = merge([], [row(4, 4, "d", 2)], not_matched_insert({"k": S["k"], "w": upper(S["w"])}))
    assert_rows(result, [row(4, None, "D", None)])
    assert counts["numTargetRowsInserted"] == 1


def test_first_insert_clause_whose_condition_holds_wins_and_otherwise_the_row_is_dropped() -> None:
    clauses = [not_matched_insert({"k": S["k"], "w": lit("big")}, gt(S["v"], lit(3))),
               not_matched_insert_all(is_null(S["w"]))]
    source = [row(1, 9, "a"), row(2, 0, None), row(3, 0, "c"), row(4, None, "d")]
    result, counts = merge([], source, *clauses)
    assert_rows(result, [row(1, None, "big", None), row(2, 0, None)])
    assert counts["numTargetRowsInserted"] == 2 and counts["numSourceRows"] == 4


def test_matched_source_rows_are_never_inserted() -> None:
    clauses = [matched_update({"v": S["v"]}, gt(S["v"], lit(100))), not_matched_insert_all()]
    result, _ = merge([row(1, 1)], [row(1, 2)], *clauses)
    assert_rows(result, [row(1, 1)])


# --- row 4: target row with no match -------------------------------------------------------------


def test_not_matched_by_source_update_and_delete() -> None:
    clauses = [by_source_delete(is_null(T["w"])), by_source_update({"v": coalesce(T["v"], lit(-1))})]
    target = [row(1, 1, "a"), row(2, None, "b"), row(3, 3, None), row(4, 4, "d")]
    result, counts = merge(target, [row(4, 0)], *clauses)
    assert_rows(result, [row(1, 1, "a"), row(2, -1, "b"), row(4, 4, "d")])
    assert nonzero(counts) == {
        "numSourceRows": 1, "numTargetRowsUpdated": 2, "numTargetRowsNotMatchedBySourceUpdated": 2,
        "numTargetRowsDeleted": 1, "numTargetRowsNotMatchedBySourceDeleted": 1,
        "num_updated_rows": 2, "num_deleted_rows": 1, "num_affected_rows": 3,
    }


def test_unmatched_target_row_with_no_applicable_clause_is_copied_unchanged() -> None:
    """``t.v % 2 = 0`` is NULL for a NULL v and FALSE for -3 (SQL's -3 % 2 is -1)."""
    result, counts = merge([row(1, None), row(2, -3)], [], by_source_delete(eq(mod(T["v"], lit(2)), lit(0))))
    assert_rows(result, [row(1, None), row(2, -3)])
    assert nonzero(counts) == {}


# --- ON condition: SQL NULL semantics ------------------------------------------------------------


def test_null_keys_never_match_with_equality() -> None:
    clauses = [matched_delete(), not_matched_insert_all(), by_source_update({"w": lit("nm")})]
    result, counts = merge([row(None, 1)], [row(None, 2)], *clauses)
    assert_rows(result, [row(None, 1, "nm"), row(None, 2)])
    assert counts["numTargetRowsInserted"] == 1 and counts["numTargetRowsNotMatchedBySourceUpdated"] == 1


def test_null_keys_match_with_null_safe_equality() -> None:
    result, counts = merge([row(None, 1)], [row(None, 2)], matched_update_all(), not_matched_insert_all(),
                           on=null_safe_eq(T["k"], S["k"]))
    assert_rows(result, [row(None, 2)])
    assert counts["numTargetRowsMatchedUpdated"] == 1 and counts["numTargetRowsInserted"] == 0


def test_target_only_conjunct_in_on_leaves_rows_not_matched_by_source() -> None:
    on = and_(eq(T["k"], S["k"]), eq(T["p"], lit(1)))
    result, counts = merge([row(1, 1, p=0), row(1, 2, p=1)], [row(1, 9)], matched_update({"v": S["v"]}),
                           by_source_delete(), on=on)
    assert_rows(result, [row(1, 9, p=1)])
    assert counts["numTargetRowsMatchedUpdated"] == 1
    assert counts["numTargetRowsNotMatchedBySourceDeleted"] == 1


# --- clause-list validity ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "clauses",
    [
        [matched_update({"v": S["v"]}), matched_delete(gt(S["v"], lit(0)))],
        [matched_delete(), matched_delete()],
        [not_matched_insert_all(), not_matched_insert_all(gt(S["v"], lit(0)))],
        [by_source_delete(), by_source_update({"v": lit(0)})],
        [],
    ],
    ids=["matched", "matched-two-unconditional", "not-matched", "by-source", "empty"],
)
def test_invalid_clause_lists_are_rejected(clauses: list[Clause]) -> None:
    with pytest.raises(InvalidClauses):
        merge([row(1)], [row(2)], *clauses)


def test_unconditional_clauses_of_different_kinds_and_conditional_last_are_valid() -> None:
    clauses = [matched_delete(), by_source_delete(), not_matched_insert_all(),
               matched_update({"v": lit(1)}, gt(S["v"], lit(0)))]
    with pytest.raises(InvalidClauses):  # the unconditional DELETE is not the last MATCHED clause
        merge([], [], *clauses)
    merge([], [], *clauses[1:], matched_delete(is_null(T["w"])))  # all conditional or last: fine


def test_merge_sql_renders_every_clause_kind() -> None:
    clauses = [matched_update({"v": S["v"]}, gt(S["v"], lit(3))), matched_update_all(), not_matched_insert(
        {"k": S["k"]}), by_source_delete(is_null(T["w"]))]
    assert merge_sql(ON, clauses) == (
        "MERGE INTO target t USING source s\nON (t.k = s.k)\n"
        "WHEN MATCHED AND (s.v > 3) THEN UPDATE SET v = s.v\nWHEN MATCHED THEN UPDATE SET *\n"
        "WHEN NOT MATCHED THEN INSERT (k) VALUES (s.k)\n"
        "WHEN NOT MATCHED BY SOURCE AND (t.w IS NULL) THEN DELETE"
    )


def test_add_to_calls_the_builder_method_of_each_kind_with_sql_text() -> None:
    """The engine receives exactly the SQL strings the model evaluated, via delta-spark's names."""
    calls: list[tuple[str, dict[str, Any]]] = []

    class Recorder:
        def __getattr__(self, name: str) -> Any:
            def method(**kwargs: Any) -> Recorder:
                calls.append((name, kwargs))
                return self
            return method

    builder: Any = Recorder()
    for clause in [matched_update({"v": S["v"]}, gt(S["v"], lit(3))), matched_update_all(), matched_delete(),
                   not_matched_insert({"k": S["k"]}), not_matched_insert_all(is_null(S["w"])),
                   by_source_update({"w": lit("z")}), by_source_delete(is_null(T["w"]))]:
        builder = clause.add_to(builder)
    assert calls == [
        ("whenMatchedUpdate", {"condition": "(s.v > 3)", "set": {"v": "s.v"}}),
        ("whenMatchedUpdateAll", {"condition": None}),
        ("whenMatchedDelete", {"condition": None}),
        ("whenNotMatchedInsert", {"condition": None, "values": {"k": "s.k"}}),
        ("whenNotMatchedInsertAll", {"condition": "(s.w IS NULL)"}),
        ("whenNotMatchedBySourceUpdate", {"condition": None, "set": {"w": "'z'"}}),
        ("whenNotMatchedBySourceDelete", {"condition": "(t.w IS NULL)"}),
    ]
