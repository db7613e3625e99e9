"""Differential oracle for DELETE, UPDATE and OPTIMIZE: random sequences of them run through our
``DeltaTable`` and through Delta Lake's own (delta-spark) on copies of one table, and must agree.

Why beside the MERGE oracle (``test_merge_delta_oracle``): the three commands have planners of
their own (metadata-only deletes of whole files and partitions, deletion vectors for DELETE and
UPDATE, bin-packing), which the MERGE generator never reaches.

Per example: a small target (the MERGE generator's rows, partitioned or not, spread over 1-4
files), copy-on-write, deletion vectors or the change data feed, and 1-3 commands with
conditions and assignments from the MERGE grammar's target-only terms. After each command:
  - the same rows and schema, our table read by our reader and by Delta's;
  - a commit on both sides or on neither, and the same row metrics as Delta's
    ``operationMetrics`` (``numDeletedRows``/``numUpdatedRows``; ``numCopiedRows`` too while both
    tables still have the files they were copied with);
  - OPTIMIZE on those files: files removed and added counted alike. After a command has written
    files, each engine has laid them out its own way (Delta writes a file per task), so what
    OPTIMIZE then compacts, and whether it commits at all, may differ; only the rows must agree;
  - with the change data feed, the same change rows (Delta's ``readChangeFeed`` on both
    tables, our ``changes()`` on ours).

``DML_DELTA_ORACLE_EXAMPLES`` sets the number of random examples (default 2: Delta's commands
take about a second each in the shared local[2] JVM).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import pytest
from delta.tables import DeltaTable as DeltaLakeTable
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pyspark.sql import SparkSession

from streaming_merge import DeltaTable
from tests.merge_exprs import PREDICATES, TARGET, VALUES, Expr
from tests.merge_strategies import assignments, conditions, table_rows
from tests.spark.test_merge_delta_oracle import (
    KINDS,
    assert_same_changes,
    assert_same_table,
    delta_version,
)
from tests.spark.test_merge_properties import fresh_table_path, report, target_df

pytestmark = [pytest.mark.delta, pytest.mark.slow]

Operation = Literal["DELETE", "UPDATE", "OPTIMIZE"]
#: Delta's row metrics per command, as its ``operationMetrics`` name them (and ours do).
ROW_METRICS: dict[str, tuple[str, ...]] = {"DELETE": ("numDeletedRows", "numCopiedRows"),
                                          "UPDATE": ("numUpdatedRows", "numCopiedRows")}


@dataclass(frozen=True)
class Command:
    operation: Operation
    condition: Expr | None = None
    assignments: tuple[tuple[str, Expr], ...] = ()

    def __repr__(self) -> str:
        where = f" WHERE {self.condition.sql}" if self.condition is not None else ""
        sets = " SET " + ", ".join(f"{c} = {e.sql}" for c, e in self.assignments) if self.assignments else ""
        return f"{self.operation}{sets}{where}"


@dataclass(frozen=True)
class DmlCase:
    """The MergeCase shape (``target_df`` reads its fields) with commands instead of MERGEs."""

    kind: str
    target: tuple[dict[str, Any], ...]
    partitioned: bool
    layout: str
    files: int
    commands: tuple[Command, ...]


@st.composite
def commands(draw: st.DrawFn) -> Command:
    operation: Operation = draw(st.sampled_from(("DELETE", "DELETE", "UPDATE", "UPDATE", "OPTIMIZE")))
    if operation == "OPTIMIZE":
        return Command(operation)
    condition = draw(st.one_of(st.none(), conditions(TARGET)))
    if operation == "DELETE":
        return Command(operation, condition)
    return Command(operation, condition, draw(assignments(TARGET)))


@st.composite
def dml_cases(draw: st.DrawFn) -> DmlCase:
    return DmlCase(
        kind=draw(st.sampled_from(list(KINDS))),
        target=tuple(draw(table_rows(12, min_size=1))),
        partitioned=draw(st.booleans()),
        layout=draw(st.sampled_from(["single", "round_robin", "by_key"])),
        files=draw(st.integers(1, 4)),
        commands=tuple(draw(st.lists(commands(), min_size=1, max_size=3))),
    )


def _run(table_api: Any, spark: SparkSession, path: str, command: Command) -> Any:
    table = table_api.forPath(spark, path).alias("t")
    condition = command.condition.sql if command.condition is not None else None
    if command.operation == "DELETE":
        return table.delete(condition) if condition is not None else table.delete()
    if command.operation == "UPDATE":
        return table.update(condition, {c: e.sql for c, e in command.assignments})
    return table.optimize().executeCompaction()


def _delta_commit(spark: SparkSession, path: str, before: int) -> Mapping[str, str] | None:
    last = DeltaLakeTable.forPath(spark, path).history(1).collect()[0]
    return None if int(last["version"]) == before else dict(last["operationMetrics"])


def check_against_delta(spark: SparkSession, case: DmlCase) -> None:
    report(repr(case))
    properties = KINDS[case.kind]
    with fresh_table_path() as ours, fresh_table_path() as theirs:
        change_data = "delta.enableChangeDataFeed" in properties
        DeltaTable.createFromDataFrame(target_df(spark, case), ours,  # type: ignore[arg-type]
                                       partitionBy=["p"] if case.partitioned else None,
                                       properties=properties if change_data else None)
        if "delta.enableDeletionVectors" in properties:
            DeltaTable.forPath(spark, ours).setProperties(properties)
        shutil.copytree(ours, theirs)
        same_layout = True  # until a command writes files: each engine lays its new files out its own way
        for command in case.commands:
            our_version, their_version = DeltaTable.forPath(spark, ours).version(), delta_version(spark, theirs)
            mine = _run(DeltaTable, spark, ours, command)
            _run(DeltaLakeTable, spark, theirs, command)
            theirs_metrics = _delta_commit(spark, theirs, their_version)
            our_committed = DeltaTable.forPath(spark, ours).version() != our_version
            assert_same_table(spark, ours, theirs)
            if command.operation == "OPTIMIZE" and not same_layout:
                continue  # which files it compacts, and whether any, depends on the layout
            assert our_committed == (theirs_metrics is not None), (
                f"{command!r}: committed ours={our_committed}, Delta's={theirs_metrics is not None}", mine)
            if theirs_metrics is None:
                continue
            if command.operation == "OPTIMIZE":
                theirs_files = (int(theirs_metrics["numRemovedFiles"]), int(theirs_metrics["numAddedFiles"]))
                assert (mine.numFilesRemoved, mine.numFilesAdded) == theirs_files, (mine, theirs_metrics)
            else:
                compared = ROW_METRICS[command.operation][: None if same_layout else 1]
                differ = {key: (mine[key], int(theirs_metrics[key])) for key in compared
                          if key in theirs_metrics and mine[key] != int(theirs_metrics[key])}
                assert not differ, f"{command!r}: metrics (ours, Delta's) differ: {differ}"
            same_layout = False
            if change_data:
                assert_same_changes(spark, ours, theirs)


def _cases() -> list[DmlCase]:
    """Hand-written cases: a whole-table delete (metadata only), a partition-only condition,
    and an update that moves rows across partitions, then compaction, on DVs."""
    rows = tuple({"k": k, "v": k % 4, "w": "abc"[k % 3], "p": k % 3} for k in range(9))
    partition_one = next(p for p in PREDICATES if p.sql == "(t.p = 1)")
    move = next(v for v in VALUES["p"] if v.sql == "2")
    return [
        DmlCase("copy-on-write", rows, True, "round_robin", 3, (Command("DELETE", partition_one), Command("DELETE"))),
        DmlCase("deletion-vectors", rows, True, "round_robin", 2,
                (Command("UPDATE", partition_one, (("p", move),)), Command("OPTIMIZE"))),
    ]


def _examples(test: Any) -> Any:
    for case in reversed(_cases()):
        test = example(case=case)(test)
    return test


@_examples
@settings(
    max_examples=int(os.environ.get("DML_DELTA_ORACLE_EXAMPLES", "2")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(case=dml_cases())
def test_delete_update_optimize_agree_with_delta_lake(spark: SparkSession, case: DmlCase) -> None:
    check_against_delta(spark, case)
