"""Differential oracle: random MERGEs run through our engine and through Delta Lake's own
``DeltaTable.merge`` (delta-spark, MergeIntoCommand), on copies of one table, and must agree.

Why: ``test_merge_properties`` checks the engine against ``merge_model``, our reading of Delta's
rules. This test checks both against Delta itself, in the test session's JVM (which carries
Delta's jar, SQL extension and catalog). The generator is the property test's
(``tests/merge_strategies.py``: every clause kind, conditions, NOT MATCHED BY SOURCE, ``*``,
NULL keys, multiple matches, invalid clause lists), plus schema evolution, which the model does
not know but Delta does.

Per example and table kind (copy-on-write, deletion vectors, change data feed): our engine
creates the target; a byte copy of its folder is Delta's. Each step runs on both, then:
  (a) both raised: the same kind of error (multiple matches: Delta's
      ``DELTA_MULTIPLE_SOURCE_ROW_MATCHING_TARGET_ROW_IN_MERGE``, our error's ``error_class``;
      an invalid MERGE: Delta's ``AnalysisException``, our ``MergeAnalysisError``), Delta's message
      text (before its documentation link) begins ours, and neither table got a commit;
  (b) one raised: allowed only for the layout-dependent multiple match of the model
      (``AmbiguousMultipleMatches``), and the case stops there (the tables now differ by design);
  (c) both succeeded: the same rows and schema (our table read by our reader and by Delta's, Delta's
      by Delta's), the same row metrics as far as Delta reports them (``DeltaTable.history(1)``;
      its insert-only path has no ``numSourceRows``), and with the change data feed the same
      change rows (Delta's ``readChangeFeed`` on both tables, our ``changes()`` on ours).

Documented differences (docs/guides/delta-lake.md) are asserted here too, so a change on
either side shows up: a MERGE that changes nothing makes no commit in Delta, and one that adds
and removes no file in ours; rows copied and files removed may be fewer in ours.

``MERGE_DELTA_ORACLE_EXAMPLES`` sets the random examples per table kind (default 2: the two
engines share one local[2] JVM and Delta's MERGE takes seconds; raise it for a thorough run).
"""

from __future__ import annotations

import os
import shutil
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pytest
from delta.tables import DeltaTable as DeltaLakeTable
from hypothesis import HealthCheck, example, given, settings
from pyspark.errors import AnalysisException, PySparkException
from pyspark.sql import DataFrame, SparkSession

from streaming_merge import DeltaTable
from streaming_merge.errors import MergeAnalysisError, MultipleSourceRowMatchingTargetRowError
from tests.merge_model import AmbiguousMultipleMatches, InvalidClauses, MultipleMatches, apply_merge
from tests.merge_strategies import MergeCase, MergeStep, merge_cases
from tests.spark.test_merge_properties import EXAMPLES, fresh_table_path, report, source_df, target_df

pytestmark = [pytest.mark.delta, pytest.mark.slow]

Row = dict[str, Any]
KINDS: dict[str, dict[str, str]] = {
    "copy-on-write": {},
    "deletion-vectors": {"delta.enableDeletionVectors": "true"},
    "change-data-feed": {"delta.enableChangeDataFeed": "true"},
}
#: The row metrics both engines report (Delta's operationMetrics names).
METRIC_KEYS: tuple[str, ...] = (
    "numSourceRows", "numTargetRowsInserted", "numTargetRowsUpdated", "numTargetRowsDeleted",
    "numTargetRowsCopied", "numTargetRowsMatchedUpdated", "numTargetRowsMatchedDeleted",
    "numTargetRowsNotMatchedBySourceUpdated", "numTargetRowsNotMatchedBySourceDeleted",
    "numTargetFilesRemoved",
)
#: Metrics that count what an engine rewrites: ours may be smaller than Delta's.
LAYOUT_METRICS = ("numTargetRowsCopied", "numTargetFilesRemoved")
MULTIPLE_MATCH_CLASS = "DELTA_MULTIPLE_SOURCE_ROW_MATCHING_TARGET_ROW_IN_MERGE"
CDF_META = ("_commit_version", "_commit_timestamp")


@dataclass(frozen=True)
class Outcome:
    """What one engine's MERGE did: its error, or the metrics it reported (Delta's from history)."""

    error: BaseException | None = None
    metrics: Mapping[str, int] | None = None


# --- the two engines --------------------------------------------------------------------------


def merge_builder(table_api: Any, spark: SparkSession, path: str, step: MergeStep) -> Any:
    """``step``'s MERGE, not yet executed, through ``table_api`` (ours or Delta's ``DeltaTable``:
    the same builder API)."""
    builder = table_api.forPath(spark, path).alias("t").merge(source_df(spark, step).alias("s"), step.on.sql)
    for clause in step.clauses:
        builder = clause.add_to(builder)
    return builder.withSchemaEvolution() if step.schema_evolution else builder


def run_ours(spark: SparkSession, path: str, step: MergeStep) -> Outcome:
    builder = merge_builder(DeltaTable, spark, path, step)
    try:
        metrics = builder.execute()
    except (MultipleSourceRowMatchingTargetRowError, MergeAnalysisError) as error:
        return Outcome(error=error)
    return Outcome(metrics={key: int(metrics[key]) for key in METRIC_KEYS if key in metrics})


def delta_version(spark: SparkSession, path: str) -> int:
    return int(DeltaLakeTable.forPath(spark, path).history(1).collect()[0]["version"])


def run_delta(spark: SparkSession, path: str, step: MergeStep) -> Outcome:
    """Delta's MERGE; metrics from the commit it made (None when it made none)."""
    version = delta_version(spark, path)
    builder = merge_builder(DeltaLakeTable, spark, path, step)
    try:
        builder.execute()
    except PySparkException as error:
        return Outcome(error=error)
    last = DeltaLakeTable.forPath(spark, path).history(1).collect()[0]
    if int(last["version"]) == version:
        return Outcome()
    assert last["operation"] == "MERGE", last
    return Outcome(metrics={key: int(value) for key, value in last["operationMetrics"].items()})


# --- comparisons ------------------------------------------------------------------------------


def rows_of(df: DataFrame) -> Counter[tuple[tuple[str, Any], ...]]:
    return Counter(tuple(sorted(r.asDict().items(), key=lambda kv: kv[0])) for r in df.collect())


def delta_read(spark: SparkSession, path: str) -> DataFrame:
    return spark.read.format("delta").load(path)


def normalized(text: str) -> str:
    return " ".join(text.split())


def delta_message(error: PySparkException) -> str:
    """Delta's message without its ``[CLASS]`` prefix, documentation link and JVM stack trace
    (``str``, not ``getMessage()``: Spark's error-class reader does not know Delta's classes)."""
    message = normalized(str(error).split("JVM stacktrace:")[0])
    condition = error.getCondition()
    if condition and message.startswith(f"[{condition}]"):
        message = message[len(condition) + 2:].strip()
    return message.split(" Please refer to ")[0].split(" SQLSTATE:")[0].strip()


def assert_same_error(ours: BaseException, theirs: BaseException) -> None:
    assert isinstance(theirs, PySparkException), theirs
    if isinstance(ours, MultipleSourceRowMatchingTargetRowError):
        assert theirs.getCondition() == MULTIPLE_MATCH_CLASS == ours.error_class, (theirs.getCondition(), ours)
    else:
        assert isinstance(ours, MergeAnalysisError) and isinstance(theirs, AnalysisException), (ours, theirs)
    assert normalized(str(ours)).startswith(delta_message(theirs)), (
        f"our message does not begin with Delta's\n  ours:  {ours}\n  Delta: {delta_message(theirs)}")


def assert_same_table(spark: SparkSession, ours: str, theirs: str) -> None:
    our_df, our_by_delta, their_df = DeltaTable.forPath(spark, ours).toDF(), delta_read(spark, ours), \
        delta_read(spark, theirs)
    assert our_df.schema.simpleString() == our_by_delta.schema.simpleString() == their_df.schema.simpleString(), (
        our_df.schema.simpleString(), our_by_delta.schema.simpleString(), their_df.schema.simpleString())
    expected = rows_of(their_df)
    assert rows_of(our_df) == expected, f"rows differ\n  ours:  {rows_of(our_df)}\n  Delta: {expected}"
    assert rows_of(our_by_delta) == expected, "Delta reads our table differently from our reader"


def assert_same_metrics(ours: Mapping[str, int], theirs: Mapping[str, int]) -> None:
    """Every row metric Delta reports, equal; but rows copied and files removed count what each
    engine rewrites, and Delta rewrites more: with a NOT MATCHED BY SOURCE clause every file, and
    otherwise every file with a matched row, where we rewrite only files with a changed row
    (docs/guides/delta-lake.md, "Differences"). Ours may be smaller, never larger."""
    reported = [key for key in METRIC_KEYS if key in theirs]
    assert "numTargetRowsInserted" in reported, theirs
    differ = {key: (ours[key], theirs[key]) for key in reported
              if key not in LAYOUT_METRICS and ours[key] != theirs[key]}
    differ |= {key: (ours[key], theirs[key]) for key in LAYOUT_METRICS
               if key in ours and key in theirs and ours[key] > theirs[key]}
    assert not differ, f"metrics (ours, Delta's) differ: {differ}"


def change_rows(df: DataFrame) -> Counter[tuple[tuple[str, Any], ...]]:
    return rows_of(df.drop(*CDF_META))


def delta_changes(spark: SparkSession, path: str, version: int) -> DataFrame:
    return (spark.read.format("delta").option("readChangeFeed", "true").option("startingVersion", version)
            .option("endingVersion", version).load(path))


def assert_same_changes(spark: SparkSession, ours: str, theirs: str) -> None:
    our_version, their_version = DeltaTable.forPath(spark, ours).version(), delta_version(spark, theirs)
    expected = change_rows(delta_changes(spark, theirs, their_version))
    our_changes = change_rows(DeltaTable.forPath(spark, ours).changes(our_version, our_version))
    assert our_changes == expected, f"change rows differ\n  ours:  {our_changes}\n  Delta: {expected}"
    assert change_rows(delta_changes(spark, ours, our_version)) == expected, "Delta reads our change data differently"


# --- the property -----------------------------------------------------------------------------


def model_says_ambiguous(rows: list[Row], step: MergeStep) -> bool:
    """The model's layout-dependent multiple match: an engine may raise or copy the row."""
    try:
        apply_merge(rows, step.source, step.on, step.clauses, columns=list(rows[0]) if rows else None)
    except AmbiguousMultipleMatches:
        return True
    except (MultipleMatches, InvalidClauses):
        return False
    return False


def check_against_delta(spark: SparkSession, case: MergeCase, properties: dict[str, str]) -> None:
    report(repr(case))
    change_data = "delta.enableChangeDataFeed" in properties
    with fresh_table_path() as ours, fresh_table_path() as theirs:
        partition_by = ["p"] if case.partitioned else None
        DeltaTable.createFromDataFrame(target_df(spark, case), ours, partitionBy=partition_by,
                                       properties=properties if change_data else None)
        if "delta.enableDeletionVectors" in properties:
            DeltaTable.forPath(spark, ours).setProperties(properties)
        shutil.copytree(ours, theirs)
        for step in case.steps:
            report(f"step:\n{step!r}")
            before = [r.asDict() for r in delta_read(spark, theirs).collect()]
            our_version, their_version = DeltaTable.forPath(spark, ours).version(), delta_version(spark, theirs)
            mine, delta = run_ours(spark, ours, step), run_delta(spark, theirs, step)
            if mine.error is not None or delta.error is not None:
                our_after, their_after = DeltaTable.forPath(spark, ours).version(), delta_version(spark, theirs)
                if mine.error is not None and delta.error is not None:
                    assert_same_error(mine.error, delta.error)
                    assert (our_after, their_after) == (our_version, their_version), "a failed MERGE committed"
                    continue
                assert model_says_ambiguous(before, step), (
                    f"only one engine raised\n  ours:  {mine.error!r}\n  Delta: {delta.error!r}")
                return
            assert_same_table(spark, ours, theirs)
            if delta.metrics is None:  # Delta commits nothing for a MERGE that changes nothing; we
                # commit at most one MERGE that adds and removes no file (a documented difference)
                assert DeltaTable.forPath(spark, ours).version() in (our_version, our_version + 1), mine.metrics
                assert mine.metrics is not None
                assert mine.metrics.get("numTargetFilesRemoved", 0) == 0, mine.metrics
                assert all(mine.metrics[key] == 0 for key in METRIC_KEYS[1:4]), mine.metrics
                continue
            assert mine.metrics is not None
            assert_same_metrics(mine.metrics, delta.metrics)
            if change_data:
                assert_same_changes(spark, ours, theirs)


def _examples(test: Any) -> Any:
    """The property test's hand-written cases first (each row of the semantics table)."""
    for case in reversed(EXAMPLES):
        test = example(case=case)(test)
    return test


@pytest.mark.parametrize("kind", list(KINDS))
@_examples
@settings(
    max_examples=int(os.environ.get("MERGE_DELTA_ORACLE_EXAMPLES", "2")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(case=merge_cases(schema_evolution=True))
def test_merge_agrees_with_delta_lake(spark: SparkSession, kind: str, case: MergeCase) -> None:
    if kind != "copy-on-write" and case in EXAMPLES:
        return  # the hand-written cases once, on copy-on-write: each example costs Delta seconds
    check_against_delta(spark, case, KINDS[kind])
