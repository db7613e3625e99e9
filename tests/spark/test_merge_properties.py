"""Property test: the MERGE engine agrees with the reference model on random tables and clauses.

Why: MERGE has many interacting rules (clause order, NULL conditions, multiple matches and their
exemptions, NOT MATCHED BY SOURCE, partition pruning and min/max skipping that must never change
the result). Hand-written cases cover each rule once; this test throws hundreds of small random
combinations at the engine and checks every one against ``merge_model.apply_merge``.

Per example: create the target with ``DeltaTable.createFromDataFrame`` in a fresh temp folder, a
copy-on-write table, and a copy of it turned into a deletion-vector table
(``delta.enableDeletionVectors``, where MERGE marks replaced rows in deletion vectors and writes
only the changed rows; the same files, so both start from one layout); run one or two
merges on each, and after each compare
  (a) the rows read back by delta-rs (independent of our reader; its DataFusion scan, which
      applies deletion vectors) with the model's, as multisets;
  (b) our own reader (``DeltaTable.forPath(...).toDF()``) with the delta-rs read, and the schema
      with the one the table was created with;
  (c) the row-count metrics with the model's counts (numTargetRowsCopied and the file metrics
      depend on which files the engine rewrites, so they only get sanity bounds);
  (d) when the model raises MultipleMatches / InvalidClauses, that the engine raises
      MultipleSourceRowMatchingTargetRowError / MergeAnalysisError and the table is unchanged;
      for AmbiguousMultipleMatches (a layout-dependent case, see the model), either that or (a)-(c)
      against the model's outcome without the error.

``MERGE_PROPERTY_EXAMPLES`` sets the number of examples (default 40; the same
generator's cases also run against Delta Lake's own MERGE in test_merge_delta_oracle.py, and
hypothesis draws new cases on every run, as CI keeps no example database, so runs add up; raise
it for a thorough run). A failure prints the target rows and each
step as a MERGE statement with its source rows.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import deltalake
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, currently_in_test_context, example, given, note, settings
from pyspark.sql import DataFrame, SparkSession

from streaming_merge import DeltaTable
from streaming_merge.errors import MergeAnalysisError, MultipleSourceRowMatchingTargetRowError
from streaming_merge.merge.skipping import SourceStats
from tests.merge_exprs import COLUMN_TYPES, COLUMNS, S, T, and_, eq, gt, is_null, lit, not_, null_safe_eq
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
    not_matched_insert,
    not_matched_insert_all,
)
from tests.merge_strategies import MergeCase, MergeStep, merge_cases, source_side_cases

Row = dict[str, Any]
TARGET_DDL = ", ".join(f"{c} {COLUMN_TYPES[c]}" for c in COLUMNS)
SOURCE_TYPES = {**COLUMN_TYPES, "x": "int"}
ON = eq(T["k"], S["k"])


# --- helpers ------------------------------------------------------------------------------------


def report(text: str) -> None:
    """Attach ``text`` to a failure report: a hypothesis note inside @given, else printed (pytest
    shows captured output of failing tests)."""
    if currently_in_test_context():
        note(text)
    else:
        print(text)


@contextmanager
def fresh_table_path() -> Iterator[str]:
    """A not-yet-existing table folder per example (hypothesis reuses function-scoped fixtures)."""
    folder = tempfile.mkdtemp(prefix="merge_prop_")
    try:
        yield os.path.join(folder, "table")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def target_df(spark: SparkSession, case: MergeCase) -> DataFrame:
    """The target rows, spread over ``case.files`` files as ``case.layout`` says: one file, round
    robin (every file spans every key), or by key range (files with narrow key ranges, so that
    min/max and source-key-range skipping can actually skip)."""
    df = spark.createDataFrame([tuple(r[c] for c in COLUMNS) for r in case.target], TARGET_DDL)
    if case.layout == "single":
        return df.coalesce(1)
    if case.layout == "round_robin":
        return df.repartition(case.files)
    return df.repartitionByRange(case.files, "k")


def source_df(spark: SparkSession, step: MergeStep) -> DataFrame:
    ddl = ", ".join(f"{c} {SOURCE_TYPES[c]}" for c in step.source_columns)
    return spark.createDataFrame([tuple(r[c] for c in step.source_columns) for r in step.source], ddl)


def multiset(rows: Sequence[Row]) -> Counter[tuple[Any, ...]]:
    return Counter(tuple(r[c] for c in COLUMNS) for r in rows)


def sorted_rows(rows: Sequence[Row]) -> list[tuple[Any, ...]]:
    """Rows as tuples in a total order (NULLs first), for readable failure messages."""
    return sorted(
        (tuple(r[c] for c in COLUMNS) for r in rows),
        key=lambda t: tuple((v is not None, v if v is not None else 0) for v in t),
    )


def assert_same_rows(actual: Sequence[Row], expected: Sequence[Row], what: str) -> None:
    assert multiset(actual) == multiset(expected), (
        f"{what}\n  actual:   {sorted_rows(actual)}\n  expected: {sorted_rows(expected)}"
    )


def delta_rs_rows(path: str) -> list[Row]:
    """The table read by delta-rs' DataFusion scan, which applies deletion vectors."""
    table = pa.table(deltalake.DeltaTable(path).scan())
    return table.select(list(COLUMNS)).to_pylist()


DELETION_VECTORS = {"delta.enableDeletionVectors": "true"}
CHANGE_DATA_FEED = "delta.enableChangeDataFeed"


def delta_rs_state(path: str) -> tuple[int, str]:
    table = deltalake.DeltaTable(path)
    return table.version(), table.schema().to_json()


def run_merge(spark: SparkSession, path: str, step: MergeStep, deletion_vectors: bool = False) -> Mapping[str, Any]:
    builder = DeltaTable.forPath(spark, path).alias("t").merge(source_df(spark, step).alias("s"), step.on.sql)
    for clause in step.clauses:
        builder = clause.add_to(builder)
    if deletion_vectors:
        # One job that writes the changed rows and finds the rows to mark deleted: the target
        # streamed past the broadcast source (the inserts met with the joined rows by source row
        # id), or, with an odd number of source rows, a shuffled join (a source too large to
        # broadcast). With a multiple of 4, a MERGE whose matched clauses write only source values
        # writes them from the source side (streaming_merge.merge.dv_source_side); with 2 more,
        # the same MERGE takes the general plan.
        if len(step.source) % 2:
            builder = builder.withOptions(broadcast_source_bytes=-1)
        elif len(step.source) % 4 == 2:
            builder = builder.withOptions(dv_source_side_write=False)
        return builder.execute()
    # Which plan runs depends on the case only (so shrinking keeps it), and every plan faces the model.
    if len(step.source) % 2:
        # Odd numbers of source rows: Delta's two passes, finding the touched files the way a large
        # target does (the target streamed past the broadcast source, inserts found by key).
        builder = builder.withOptions(broadcast_scan_min_bytes=0, single_pass=False)
    elif "k" in step.source_columns and len({r["k"] for r in step.source}) == len(step.source):
        # Unique source keys, as the streaming sink hands them over with its observed stats: the
        # MERGE may skip findTouchedFiles and rewrite every candidate file instead, or rewrite them
        # in one pass that observes which were touched (no rows per key to count).
        keys = [r["k"] for r in step.source if r["k"] is not None]
        stats = SourceStats(len(step.source), {"k": (min(keys), max(keys)) if keys else (None, None)},
                            unique_keys=("k",))
        builder = builder.withOptions(materialize_source="none", source_stats=stats)
        builder = builder.withOptions(**({"rewrite_all_candidates_bytes": 1 << 40} if len(step.source) % 4 == 0
                                         else {"single_pass_min_rows_per_file": 0}))
        if len(step.source) % 8 == 2:
            # ... or rewrite them map-side in one pass (a large target, a broadcast source).
            builder = builder.withOptions(broadcast_scan_min_bytes=0)
    elif len(step.source) % 4 == 0:
        # The one-pass rewrite whatever the source's size, counting the source rows per key to
        # rule out multiple matches (and falling back to findTouchedFiles when one is possible);
        # with two clauses or more, map-side, as a large target with a broadcast source does.
        builder = builder.withOptions(single_pass_min_rows_per_file=0,
                                      **({"broadcast_scan_min_bytes": 0} if len(step.clauses) > 1 else {}))
    else:
        # Delta's two passes with the shuffled findTouchedFiles.
        builder = builder.withOptions(single_pass=False)
    if len(step.clauses) % 2 == 0:
        # Inputs this small run interpreted by default (streaming_merge.spark.interpreted); steps with
        # an even number of clauses run with generated code, so both execution modes face the model.
        builder = builder.withOptions(interpreted_max_rows=0)
    return builder.execute()


def check_step(spark: SparkSession, path: str, before: list[Row], step: MergeStep,
               deletion_vectors: bool = False, change_data: bool = False) -> list[Row]:
    """Run one merge, check it against the model, and return the table's rows afterwards."""
    report(f"MERGE step{' (deletion vectors)' if deletion_vectors else ''}:\n{step!r}")
    version_before, schema = delta_rs_state(path)
    changes: list[tuple[str, Row]] | None = [] if change_data else None
    try:
        expected_rows, counts = apply_merge(before, step.source, step.on, step.clauses, columns=COLUMNS,
                                            changes=changes)
    except AmbiguousMultipleMatches as outcome:
        # The engine may skip the conflicting row's file by the MATCHED conditions' target-only
        # parts (then the row is copied unchanged) or see it and raise: either is Delta's behaviour.
        try:
            metrics = run_merge(spark, path, step, deletion_vectors)
        except MultipleSourceRowMatchingTargetRowError as raised:
            check_failed(path, before, version_before, schema, raised)
            return before
        return check_succeeded(spark, path, before, version_before, schema, metrics, outcome.rows, outcome.counts,
                               deletion_vectors, changes)
    except (MultipleMatches, InvalidClauses) as outcome:
        multiple = isinstance(outcome, MultipleMatches)
        expected_error = MultipleSourceRowMatchingTargetRowError if multiple else MergeAnalysisError
        with pytest.raises(expected_error) as raised:
            run_merge(spark, path, step, deletion_vectors)
        check_failed(path, before, version_before, schema, raised.value)
        return before
    metrics = run_merge(spark, path, step, deletion_vectors)
    return check_succeeded(spark, path, before, version_before, schema, metrics, expected_rows, counts,
                           deletion_vectors, changes)


def check_failed(path: str, before: list[Row], version_before: int, schema: str, error: BaseException) -> None:
    """A merge that raised left no commit, and a multiple-match error names the offending rows."""
    if isinstance(error, MultipleSourceRowMatchingTargetRowError):
        assert "multiple source rows matched" in str(error).lower()
        offending = error.offending_rows  # type: ignore[attr-defined]
        assert 1 <= len(offending) <= 10 and all(count >= 2 for _, count in offending), offending
    assert delta_rs_state(path) == (version_before, schema), "a failed MERGE must leave no commit"
    assert_same_rows(delta_rs_rows(path), before, "a failed MERGE must leave the rows unchanged")


def check_succeeded(spark: SparkSession, path: str, before: list[Row], version_before: int, schema: str,
                    metrics: Mapping[str, Any], expected_rows: list[Row], counts: Mapping[str, int],
                    merge_on_read: bool = False, changes: list[tuple[str, Row]] | None = None) -> list[Row]:
    """The table and the metrics after a merge that went through agree with the model."""
    version_after, schema_after = delta_rs_state(path)

    # (a) result, read independently through delta-rs
    actual_rows = delta_rs_rows(path)
    assert_same_rows(actual_rows, expected_rows, "rows after MERGE (delta-rs) differ from the model")

    # (b) our reader agrees with delta-rs, and the schema is unchanged
    assert schema_after == schema, "MERGE changed the table schema"
    ours = DeltaTable.forPath(spark, path).toDF()
    assert ours.columns == list(COLUMNS)
    assert_same_rows([r.asDict() for r in ours.collect()], actual_rows, "toDF() differs from delta-rs")

    # (c) metrics
    actual = {key: metrics[key] for key in COUNT_KEYS}
    assert actual == counts, {k: (actual[k], counts[k]) for k in COUNT_KEYS if actual[k] != counts[k]}
    assert not metrics["skipped"]
    unchanged = len(before) - counts["numTargetRowsUpdated"] - counts["numTargetRowsDeleted"]
    assert 0 <= metrics["numTargetRowsCopied"] <= unchanged, metrics
    if merge_on_read:  # deletion vectors: no row is copied, only updated and inserted rows are written
        assert metrics["numTargetRowsCopied"] == 0, metrics
        written_rows = counts["numTargetRowsUpdated"] + counts["numTargetRowsInserted"]  # updates of both kinds
        assert metrics["numTargetFilesAdded"] <= written_rows, metrics
    assert metrics["numTargetFilesRemoved"] >= 0 and metrics["numTargetFilesAdded"] >= 0, metrics
    assert version_after in (version_before, version_before + 1)
    if counts["num_affected_rows"]:
        assert version_after == version_before + 1, "a MERGE that changed rows must commit"
    if metrics.get("tableVersion") is not None:
        assert metrics["tableVersion"] == version_after

    # (e) change data feed: the version's change rows, read by delta-rs and by us, are the model's
    if changes is not None and version_after > version_before:
        assert_same_changes(change_rows(path, version_after), changes)
        ours_changes = DeltaTable.forPath(spark, path).changes(version_after, version_after).collect()
        assert_same_changes([(r["_change_type"], r.asDict()) for r in ours_changes], changes)
        if not changes:  # nothing changed: no change file, and readers skip the rewrite
            assert metrics["numTargetChangeFilesAdded"] == 0, metrics
    return expected_rows


def change_rows(path: str, version: int) -> list[tuple[str, Row]]:
    """The change data feed of one version, read by delta-rs' ``load_cdf``."""
    table = pa.table(deltalake.DeltaTable(path).load_cdf(starting_version=version, ending_version=version))
    return [(r["_change_type"], {c: r[c] for c in COLUMNS}) for r in table.to_pylist()]


def assert_same_changes(actual: Sequence[tuple[str, Row]], expected: Sequence[tuple[str, Row]]) -> None:
    def counted(rows: Sequence[tuple[str, Row]]) -> Counter[tuple[Any, ...]]:
        return Counter((kind, *(r[c] for c in COLUMNS)) for kind, r in rows)

    assert counted(actual) == counted(expected), (
        f"change data differs from the model\n  actual:   {sorted(counted(actual).items(), key=str)}\n"
        f"  expected: {sorted(counted(expected).items(), key=str)}")


def check_case(spark: SparkSession, case: MergeCase) -> None:
    report(repr(case))
    # Every other case records change data on both tables (which depends on the case only, so
    # shrinking keeps it), and each step's change rows then face the model's.
    change_data = len(case.target) % 2 == 1
    cdf = {CHANGE_DATA_FEED: "true"} if change_data else {}
    with fresh_table_path() as path, fresh_table_path() as dv_path:
        partition_by = ["p"] if case.partitioned else None
        DeltaTable.createFromDataFrame(target_df(spark, case), path, partitionBy=partition_by,
                                       properties=cdf or None)
        # The deletion-vector table: a copy of the same files with the property turned on (a
        # protocol upgrade commit): both tables start from one layout, for one Spark write, not two.
        shutil.copytree(path, dv_path)
        DeltaTable.forPath(spark, dv_path).setProperties(DELETION_VECTORS)
        rows = delta_rs_rows(path)
        assert_same_rows(rows, list(case.target), "createFromDataFrame did not store the target rows")
        dv_rows = list(rows)
        for step in case.steps:
            rows = check_step(spark, path, rows, step, change_data=change_data)
            dv_rows = check_step(spark, dv_path, dv_rows, step, deletion_vectors=True, change_data=change_data)


# --- explicit examples: each row of the semantics table, run before the random ones -----------


def _row(k: int | None, v: int | None = None, w: str | None = None, p: int | None = 0,
         x: int | None = None) -> Row:
    return {"k": k, "v": v, "w": w, "p": p, "x": x}


def _case(target: list[Row], source: list[Row], clauses: list[Clause], *, on: Any = ON,
          partitioned: bool = True) -> MergeCase:
    step = MergeStep(tuple(source), ("v", "x", "k", "w", "p"), on, tuple(clauses))
    return MergeCase(tuple({c: r[c] for c in COLUMNS} for r in target), partitioned, "by_key", 2, (step,))


TARGET = [_row(1, 1, "a", 0), _row(2, 2, None, 1), _row(3, 3, "c", 2), _row(None, 4, "n", 0),
          _row(5, 5, "e", None)]
EXAMPLES: list[MergeCase] = [
    # matched by one source row: updated / deleted / copied when no condition holds
    _case(TARGET, [_row(1, 10, "z", 1), _row(3, None, "y", 2)],
          [matched_delete(gt(S["v"], lit(5))),
           matched_update({"w": S["w"], "v": lit(None)}, is_null(S["v"]))]),
    # upsert with UPDATE SET * / INSERT *, NULL source key inserted, partition value changed
    _case(TARGET, [_row(2, 20, "b", 2), _row(None, 9, "q", 1), _row(7, 7, "g", None)],
          [matched_update_all(), not_matched_insert_all()]),
    # multiple matches -> error, whatever the conditions
    _case(TARGET, [_row(1, 1), _row(1, 2)], [matched_update({"v": S["v"]}, gt(S["v"], lit(100)))]),
    # multiple matches exempt: insert-only
    _case(TARGET, [_row(1, 1), _row(1, 2), _row(8, 8)], [not_matched_insert({"k": S["k"], "w": lit("new")})]),
    # multiple matches exempt: lone unconditional DELETE (deleted once, counted once), with NMBS
    _case(TARGET, [_row(1, 1), _row(1, 2), _row(9, 9)],
          [matched_delete(), by_source_update({"v": lit(0)}, gt(T["v"], lit(2))), not_matched_insert_all()]),
    # not matched by source: update / delete / copied; a target-only conjunct in ON
    _case(TARGET, [_row(1, 1)], [by_source_delete(is_null(T["w"])), by_source_update({"w": lit("nm")})],
          on=and_(ON, eq(T["p"], lit(0)))),
    # null-safe ON: NULL keys match
    _case(TARGET, [_row(None, 40, "m", 0)], [matched_update({"v": S["v"]})], on=null_safe_eq(T["k"], S["k"]),
          partitioned=False),
    # an upsert writing only source values, on a table without change data (an even row count): a
    # DV MERGE writes it from the source side; a target key held twice (1): one source row updates
    # two target rows, which takes the general plan
    _case([*TARGET[:4], _row(1, 11, "a2", 1), _row(6, 6, "f", 0)],
          [_row(1, 10, "z", 1), _row(3, 30, "y", 2), _row(8, 8, "h", 0), _row(9, 9, "i", 1)],
          [matched_update_all(), not_matched_insert_all()]),
    # the CDC preset: a delete flag (w = 'd') and a sequence guard that reads the target (s.v > t.v)
    _case(TARGET[:4], [_row(1, 0, "u", 1), _row(2, 20, "u", 0), _row(3, 30, "d"), _row(9, 9, "d")],
          [matched_delete(and_(eq(S["w"], lit("d")), gt(S["v"], T["v"]))),
           matched_update_all(gt(S["v"], T["v"])), not_matched_insert_all(not_(eq(S["w"], lit("d"))))]),
    # invalid: an unconditional clause that is not the last of its kind
    _case(TARGET, [_row(1, 1)], [matched_delete(), matched_update({"v": S["v"]}, gt(S["v"], lit(0)))]),
]


def _with_examples(test: Any) -> Any:
    """Apply ``@example`` for every case in EXAMPLES (hypothesis runs them first, in order)."""
    for case in reversed(EXAMPLES):
        test = example(case=case)(test)
    return test


@pytest.mark.slow
@_with_examples
@settings(
    max_examples=int(os.environ.get("MERGE_PROPERTY_EXAMPLES", "40")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(case=merge_cases())
def test_merge_agrees_with_model(spark: SparkSession, case: MergeCase) -> None:
    check_case(spark, case)


# A file whose every key is NULL (no key range in its stats) among the candidates of a plain upsert:
# the key presence check sorted the candidates' ranges before noticing the missing one (a TypeError).
NULL_KEY_FILE = MergeCase(
    ({"k": 3, "v": 0, "w": "a", "p": 0}, {"k": None, "v": 0, "w": "a", "p": 0}), False, "round_robin", 3,
    (MergeStep((_row(0, 0, "a", 0, 0), _row(0, 0, "a", 0, 0), _row(0, 0, "a", 0, 0), _row(3, 0, "a", 0, 0)),
               ("k", "v", "w", "p", "x"), ON, (matched_update_all(), not_matched_insert_all())),))


# A lone unconditional DELETE beside an insert, four source rows matching one target row: Delta's
# exemption from the multiple-match error (the row deleted once, counted once), which the DV
# source-side path once missed.
LONE_DELETE_MATCHED_FOUR_TIMES = MergeCase(
    ({"k": 0, "v": 0, "w": "a", "p": 0}, {"k": 1, "v": 0, "w": "a", "p": 0}), False, "single", 1,
    (MergeStep(tuple(_row(0, 0, "a", 0, 0) for _ in range(4)), ("k", "v", "w", "p", "x"), ON,
               (matched_delete(), not_matched_insert_all())),))


# ON with a source-only conjunct (s.v > 0): seven source rows of key 0 match nothing, one does. The
# copy-on-write map-side one pass found its inserts by key and dropped the seven (a key that
# matched through another row is not a matched row); it now runs only where matching is by key.
SOURCE_CONJUNCT_IN_ON = MergeCase(
    ({"k": 0, "v": 0, "w": "a", "p": 0}, {"k": 0, "v": 0, "w": "a", "p": 0}), False, "single", 1,
    (MergeStep((*[_row(0, 0, "a", 0, 0) for _ in range(7)], _row(0, 1, "a", 0, 0)), ("k", "v", "w", "p", "x"),
               and_(ON, gt(S["v"], lit(0))), (matched_update_all(), not_matched_insert({"k": S["k"]}))),))


@pytest.mark.slow
@example(case=NULL_KEY_FILE)
@example(case=SOURCE_CONJUNCT_IN_ON)
@example(case=LONE_DELETE_MATCHED_FOUR_TIMES)
@settings(
    max_examples=int(os.environ.get("MERGE_PROPERTY_SOURCE_SIDE_EXAMPLES", "25")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(case=source_side_cases())
def test_merges_a_dv_table_writes_from_the_source_side_agree_with_model(spark: SparkSession,
                                                                        case: MergeCase) -> None:
    """The random cases rarely fit the DV source-side write (no change data, 4 or 8 source rows,
    only UPDATE SET * and DELETE when matched, no NOT MATCHED BY SOURCE): these all do."""
    check_case(spark, case)


# --- invalid clause lists ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "clauses",
    [
        [matched_update({"v": S["v"]}), matched_delete(gt(S["v"], lit(0)))],
        [not_matched_insert_all(), not_matched_insert_all(is_null(S["w"]))],
        [by_source_delete(), by_source_update({"v": lit(0)}, gt(T["v"], lit(1)))],
        [matched_delete(), matched_delete()],
    ],
    ids=["matched", "not-matched", "not-matched-by-source", "two-unconditional"],
)
def test_unconditional_clause_before_the_last_of_its_kind_is_rejected(
    spark: SparkSession, clauses: list[Clause]
) -> None:
    """Rejected before anything runs: no commit, same rows, whatever the data."""
    case = _case(TARGET, [_row(1, 10), _row(2, 20), _row(9, 90)], clauses)
    with pytest.raises(InvalidClauses):
        apply_merge(list(case.target), case.steps[0].source, ON, clauses, columns=COLUMNS)
    check_case(spark, case)


def test_merge_without_clauses_is_rejected(spark: SparkSession) -> None:
    """delta-spark refuses a MERGE with no WHEN clause ("There must be at least one WHEN clause")."""
    check_case(spark, _case(TARGET, [_row(1, 10)], []))
