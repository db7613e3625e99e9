"""AUTO CDC FROM SNAPSHOT (streaming_merge.snapshots): random snapshot sequences against the
reference model (tests/snapshot_model.py) after every snapshot, SCD 1 and SCD 2; exactly once
across a run that dies after a commit and one killed before its commit; the errors.

Tables are read back with delta-rs, independently of the flow. ``SNAPSHOT_CDC_EXAMPLES`` sets
the property test's example count (default 10, plus two explicit ones)."""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import deltalake
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from streaming_merge import DeltaTable, MergeOptions
from streaming_merge.merge.materialize import checkpoint_rdd_id
from streaming_merge.snapshots import (
    AppliedSnapshot,
    SnapshotCdcResult,
    SnapshotKeyError,
    SnapshotSchemaError,
    SnapshotVersionError,
    create_auto_cdc_from_snapshot_flow,
)
from tests.job_count import jobs_of
from tests.snapshot_model import Counts, SnapshotModel, sorted_rows

SCHEMA = "id long, name string, v int"
COLUMNS = ["name", "v"]

Snapshot = dict[int, dict[str, Any]]


def frame(spark: SparkSession, snapshot: Snapshot) -> DataFrame:
    return spark.createDataFrame([(k, r["name"], r["v"]) for k, r in sorted(snapshot.items())], SCHEMA)


def table_rows(path: str) -> list[dict[str, Any]]:
    return sorted_rows(deltalake.DeltaTable(path).to_pyarrow_table().to_pylist())


def txn(path: str, name: str) -> int | None:
    return deltalake.DeltaTable(path).transaction_version(name)


values = st.fixed_dictionaries({"name": st.sampled_from(["a", "b", None]), "v": st.sampled_from([1, 2, None])})
snapshots = st.dictionaries(st.integers(0, 5), values, max_size=5)
# (track_history_column_list, track_history_except_column_list, tracked): [] counts as not given
TRACKING = {"all": ([], None, COLUMNS), "name only": (["name"], None, ["name"]),
            "all but name": (None, ["NAME"], ["v"])}


@pytest.fixture(scope="module")
def empty_tables(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    """An empty target per SCD type, as the flow creates it, for the property test to copy:
    creating a table costs a Spark job (the other tests cover the flow creating its table)."""
    folder = tmp_path_factory.mktemp("empty-targets")
    history = ", __START_AT long, __END_AT long"
    for scd_type, schema in ((1, SCHEMA), (2, SCHEMA + history)):
        DeltaTable.createFromDataFrame(spark.createDataFrame([], schema), str(folder / str(scd_type)))
    return {1: folder / "1", 2: folder / "2"}


@settings(max_examples=int(os.environ.get("SNAPSHOT_CDC_EXAMPLES", "10")), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(scd_type=st.sampled_from([1, 2]), tracking=st.sampled_from(sorted(TRACKING)),
       sequence=st.lists(snapshots, min_size=1, max_size=4), gaps=st.lists(st.integers(1, 3), min_size=4, max_size=4),
       as_function=st.booleans())
@example(scd_type=2, tracking="name only", as_function=True, gaps=[1, 1, 1, 1], sequence=[
    {1: {"name": "a", "v": 1}, 2: {"name": "b", "v": None}},
    {1: {"name": "a", "v": 1}, 2: {"name": "b", "v": None}},  # unchanged: nothing rewritten
    {1: {"name": "a", "v": 2}, 3: {"name": None, "v": None}},  # untracked change, delete, insert
    {1: {"name": "b", "v": 2}, 2: {"name": "b", "v": None}}])  # tracked change, a key comes back
@example(scd_type=1, tracking="all", as_function=False, gaps=[1, 1, 1, 1],
         sequence=[{0: {"name": "a", "v": 1}}, {0: {"name": "a", "v": 1}}, {}, {0: {"name": None, "v": None}}])
def test_snapshots_match_the_model(spark: SparkSession, tmp_path: Path, empty_tables: dict[int, Path], scd_type: int,
                                   tracking: str, sequence: list[Snapshot], gaps: list[int], as_function: bool) -> None:
    """After every snapshot the table equals the model's, the counts are the model's, and the
    MERGE touched only changed rows: an unchanged snapshot adds and removes no file."""
    include, exclude, tracked = TRACKING[tracking] if scd_type == 2 else (None, None, COLUMNS)
    model = SnapshotModel(scd_type, COLUMNS, tracked)
    path, name = str(tmp_path / f"t-{uuid.uuid4().hex[:8]}"), "flow"
    shutil.copytree(empty_tables[scd_type], path)
    versions = [sum(gaps[: i + 1]) if as_function else i + 1 for i in range(len(sequence))]
    expected: dict[int, Counts] = {}

    def after(version: int) -> None:
        """The table holds ``version`` now: it equals the model's."""
        expected[version] = model.apply(sequence[versions.index(version)], version)
        assert table_rows(path) == model.table("id"), f"after version {version}"
        assert txn(path, name) == version

    def run(source: Any) -> SnapshotCdcResult:
        return create_auto_cdc_from_snapshot_flow(
            spark, target=path, source=source, keys=["id"], stored_as_scd_type=scd_type, name=name,
            track_history_column_list=include, track_history_except_column_list=exclude)

    if as_function:
        calls: list[int | None] = []

        def next_snapshot(latest: int | None) -> tuple[DataFrame, int] | None:
            calls.append(latest)
            if latest is not None:
                after(latest)
            following = [v for v in versions if latest is None or v > latest]
            return (frame(spark, sequence[versions.index(following[0])]), following[0]) if following else None

        applied = list(run(next_snapshot).applied)
        assert calls == [None, *versions]
    else:
        applied = []
        for snapshot, version in zip(sequence, versions, strict=True):
            applied += run(frame(spark, snapshot)).applied
            after(version)
    assert [a.version for a in applied] == versions
    for record in applied:
        check_counts(record, expected[record.version], scd_type)


def check_counts(record: AppliedSnapshot, counts: Counts, scd_type: int) -> None:
    """The flow's counts are the model's, and the MERGE touched changed rows only: an
    unchanged snapshot adds and removes no file."""
    assert not record.skipped
    assert (record.inserted, record.updated, record.deleted, record.unchanged, record.new_versions) == (
        counts.inserted, counts.updated, counts.deleted, counts.unchanged, counts.new_versions if scd_type == 2 else 0)
    assert record.snapshot_rows == counts.inserted + counts.updated + counts.unchanged
    if scd_type == 1:
        merged = (counts.inserted, counts.updated, counts.deleted)
    else:  # a new version is an inserted row; a closed version, or one updated in place, an updated row
        merged = (counts.inserted + counts.new_versions, counts.deleted + counts.updated, 0)
    metrics = record.metrics
    rows = (metrics["numTargetRowsInserted"], metrics["numTargetRowsUpdated"], metrics["numTargetRowsDeleted"])
    assert rows == merged
    if counts.inserted == counts.updated == counts.deleted == 0:
        assert metrics["numTargetFilesAdded"] == metrics["numTargetFilesRemoved"] == 0


# ---------------------------------------------------------------- exactly once

def snapshot_of(version: int) -> Snapshot:
    """A deterministic snapshot per version: keys come and go, values change."""
    return {k: {"name": "abc"[(k + version) % 3], "v": version if k % 2 else k}
            for k in range(6) if (k + version) % 4 != 0}


def numbered(spark: SparkSession, upto: int, die_at: int | None = None
             ) -> tuple[Callable[[int | None], tuple[DataFrame, int] | None], list[int | None]]:
    """``next_snapshot_and_version`` over versions 1..upto that raises when asked for the
    snapshot after ``die_at`` (the run dies right after committing ``die_at``)."""
    calls: list[int | None] = []

    def next_snapshot(latest: int | None) -> tuple[DataFrame, int] | None:
        calls.append(latest)
        if die_at is not None and latest == die_at:
            raise RuntimeError(f"killed after committing version {die_at}")
        following = (latest or 0) + 1
        return (frame(spark, snapshot_of(following)), following) if following <= upto else None

    return next_snapshot, calls


def committed_txns(path: str, name: str) -> list[int]:
    """The txn versions of ``name`` in the log's commits, in commit order."""
    found: list[int] = []
    for commit in sorted((Path(path) / "_delta_log").glob("*.json")):
        for line in commit.read_text().splitlines():
            action = json.loads(line)
            if "txn" in action and action["txn"]["appId"] == name:
                found.append(action["txn"]["version"])
    return found


def expected_table(scd_type: int, versions: list[int]) -> list[dict[str, Any]]:
    model = SnapshotModel(scd_type, COLUMNS, COLUMNS)
    for version in versions:
        model.apply(snapshot_of(version), version)
    return model.table("id")


@pytest.mark.parametrize("scd_type", [1, 2])
def test_a_run_that_dies_after_a_commit_resumes_after_it(spark: SparkSession, table_path: str, scd_type: int) -> None:
    """Versions 1..3 applied; the next run commits 4 and dies; the rerun is asked for the
    snapshot after 4 and applies 5 and 6 only: every version committed exactly once."""
    def run(source: Any) -> SnapshotCdcResult:
        return create_auto_cdc_from_snapshot_flow(spark, target=table_path, source=source, keys="id",
                                                  stored_as_scd_type=scd_type, name="daily")

    first, _ = numbered(spark, upto=3)
    assert run(first).versions == [1, 2, 3]
    dying, calls = numbered(spark, upto=6, die_at=4)
    with pytest.raises(RuntimeError, match="killed after committing version 4"):
        run(dying)
    assert calls == [3, 4]
    assert txn(table_path, "daily") == 4
    assert table_rows(table_path) == expected_table(scd_type, [1, 2, 3, 4])
    rerun, calls = numbered(spark, upto=6)
    assert run(rerun).versions == [5, 6]
    assert calls == [4, 5, 6]
    assert committed_txns(table_path, "daily") == [1, 2, 3, 4, 5, 6]
    assert table_rows(table_path) == expected_table(scd_type, [1, 2, 3, 4, 5, 6])
    done, calls = numbered(spark, upto=6)
    assert run(done).applied == () and calls == [6]


def test_a_version_killed_before_its_commit_is_redone(spark: SparkSession, table_path: str) -> None:
    """A run dying after writing version 2's files but before its commit leaves the table at
    version 1 (the files are never committed); the rerun applies version 2."""
    def run(merge_options: MergeOptions | None = None) -> SnapshotCdcResult:
        source, _ = numbered(spark, upto=2)
        return create_auto_cdc_from_snapshot_flow(spark, target=table_path, source=source, keys="id", name="n",
                                                  merge_options=merge_options)

    def die() -> None:
        raise RuntimeError("killed before the commit")

    first, _ = numbered(spark, upto=1)
    create_auto_cdc_from_snapshot_flow(spark, target=table_path, source=first, keys="id", name="n")
    with pytest.raises(RuntimeError, match="killed before the commit"):
        run(MergeOptions(before_commit=die))
    assert txn(table_path, "n") == 1
    assert table_rows(table_path) == expected_table(1, [1])
    assert run().versions == [2]
    assert committed_txns(table_path, "n") == [1, 2]
    assert table_rows(table_path) == expected_table(1, [1, 2])


def test_a_concurrent_commit_reruns_the_version_against_the_new_table(spark: SparkSession, table_path: str) -> None:
    """Another writer commits between the diff and the MERGE's commit: the MERGE conflicts and
    the version is diffed again against the table as it is now, so the table still ends equal
    to the snapshot (a stale diff would leave the other writer's change in place)."""
    source, _ = numbered(spark, upto=1)
    create_auto_cdc_from_snapshot_flow(spark, target=table_path, source=source, keys="id", name="n")
    interfered: list[bool] = []

    def other_writer() -> None:
        if not interfered:
            interfered.append(True)
            DeltaTable.forPath(spark, table_path).update("id = 1", {"name": "'other'"})

    source, _ = numbered(spark, upto=2)
    result = create_auto_cdc_from_snapshot_flow(spark, target=table_path, source=source, keys="id", name="n",
                                                merge_options=MergeOptions(before_commit=other_writer))
    assert [(a.version, a.attempts) for a in result.applied] == [(2, 2)]
    assert table_rows(table_path) == expected_table(1, [2])


def test_lost_materialized_changes_rerun_the_version(spark: SparkSession, table_path: str) -> None:
    source, _ = numbered(spark, upto=1)
    create_auto_cdc_from_snapshot_flow(spark, target=table_path, source=source, keys="id", name="n")
    seen: list[str] = []

    def lose_once(phase: str, materialized: DataFrame) -> None:
        seen.append(phase)
        if phase == "after_find_touched_files" and seen.count(phase) == 1:
            spark.sparkContext._jsc.sc().unpersistRDD(checkpoint_rdd_id(materialized), True)

    source, _ = numbered(spark, upto=2)
    result = create_auto_cdc_from_snapshot_flow(spark, target=table_path, source=source, keys="id", name="n",
                                                merge_options=MergeOptions(phase_hook=lose_once))
    assert [(a.version, a.attempts) for a in result.applied] == [(2, 2)]
    assert table_rows(table_path) == expected_table(1, [1, 2])
    assert committed_txns(table_path, "n") == [1, 2]


# ---------------------------------------------------------------- sources and tables

def test_a_table_path_or_dataframe_is_the_next_version(spark: SparkSession, tmp_path: Path) -> None:
    """Each call snapshots a Delta table (read at its latest version) or a DataFrame once and
    applies it as the last applied version plus one. Composite keys (names or Columns) resolve
    case-insensitively; table properties and partition columns reach the created table."""
    source_path, target = str(tmp_path / "source"), str(tmp_path / "target")
    rows = [("eu", 1, "a"), ("us", 1, "b"), ("eu", 2, "c")]
    DeltaTable.createFromDataFrame(spark.createDataFrame(rows, "region string, id long, name string"), source_path)

    def run(source: Any) -> SnapshotCdcResult:
        return create_auto_cdc_from_snapshot_flow(
            spark, target=target, source=source, keys=[F.col("REGION"), "Id"], partition_cols=["region"],
            table_properties={"delta.logRetentionDuration": "interval 60 days"})

    first = run(source_path)
    assert first.versions == [1] and first.applied[0].inserted == 3
    DeltaTable.forPath(spark, source_path).update("id = 2", {"name": "'C'"})
    second = run(source_path)
    assert second.versions == [2]
    assert (second.applied[0].updated, second.applied[0].unchanged) == (1, 2)
    third = run(spark.createDataFrame([("us", 1, "b")], "region string, id long, name string"))
    assert third.versions == [3] and third.applied[0].deleted == 2
    table = deltalake.DeltaTable(target)
    assert table.metadata().partition_columns == ["region"]
    assert table.metadata().configuration["delta.logRetentionDuration"] == "interval 60 days"
    assert table.to_pyarrow_table().to_pylist() == [{"region": "us", "id": 1, "name": "b"}]
    assert table.transaction_version(f"auto_cdc_from_snapshot:{first.target}") == 3


def test_a_snapshot_runs_few_spark_jobs(spark: SparkSession, table_path: str) -> None:
    """One job diffs the snapshot against the table and materializes the differences with
    their statistics; the MERGE of those few rows, with unique keys, into small files rewrites
    them in one job without findTouchedFiles (an unchanged snapshot: one job writing nothing)."""
    create_auto_cdc_from_snapshot_flow(spark, target=table_path, source=frame(spark, snapshot_of(1)), keys="id")
    jobs, _ = jobs_of(spark, lambda: create_auto_cdc_from_snapshot_flow(
        spark, target=table_path, source=frame(spark, snapshot_of(2)), keys="id"))
    assert jobs <= 2
    jobs, result = jobs_of(spark, lambda: create_auto_cdc_from_snapshot_flow(
        spark, target=table_path, source=frame(spark, snapshot_of(2)), keys="id"))
    assert result.applied[0].unchanged == len(snapshot_of(2))
    assert jobs <= 2


# ---------------------------------------------------------------- errors

def test_versions_must_increase(spark: SparkSession, table_path: str) -> None:
    handed = iter([(frame(spark, snapshot_of(1)), 5), (frame(spark, snapshot_of(2)), 5)])
    with pytest.raises(SnapshotVersionError, match=r"returned version 5, which is not greater than the last applied "
                                                   r"version 5"):
        create_auto_cdc_from_snapshot_flow(spark, target=table_path, source=lambda latest: next(handed), keys="id")
    assert deltalake.DeltaTable(table_path).transaction_version(f"auto_cdc_from_snapshot:file:{table_path}") == 5
    with pytest.raises(SnapshotVersionError, match=r"the version '6' \(str\)"):
        create_auto_cdc_from_snapshot_flow(spark, target=table_path, keys="id",
                                           source=lambda latest: (frame(spark, {}), "6"))


def test_missing_key_columns_and_other_columns_are_refused(spark: SparkSession, table_path: str) -> None:
    for wrong, message in (({"stored_as_scd_type": 0}, "stored_as_scd_type must be 1 or 2"),
                           ({"track_history_column_list": ["v"]}, "need stored_as_scd_type=2"),
                           ({"keys": []}, "keys must name at least one column")):
        with pytest.raises(ValueError, match=message):
            create_auto_cdc_from_snapshot_flow(spark, **{"target": table_path, "source": frame(spark, {}),
                                                         "keys": "id", **wrong})
    with pytest.raises(SnapshotSchemaError, match=r"no key column\(s\) \['order_id'\]"):
        create_auto_cdc_from_snapshot_flow(spark, target=table_path, source=frame(spark, snapshot_of(1)),
                                           keys=["id", "order_id"])
    assert not DeltaTable.isDeltaTable(spark, table_path)  # nothing created
    create_auto_cdc_from_snapshot_flow(spark, target=table_path, source=frame(spark, snapshot_of(1)), keys="id")
    wider = frame(spark, snapshot_of(2)).withColumnRenamed("v", "w")
    with pytest.raises(SnapshotSchemaError, match=r"Not in the table: \['w'\]; not in the snapshot: \['v'\]"):
        create_auto_cdc_from_snapshot_flow(spark, target=table_path, source=wider, keys="id")
    with pytest.raises(SnapshotSchemaError, match="track_history_column_list names"):
        create_auto_cdc_from_snapshot_flow(spark, target=str(Path(table_path).parent / "history"), keys="id",
                                           source=frame(spark, snapshot_of(1)), stored_as_scd_type="2",
                                           track_history_column_list=["nope"])


@pytest.mark.parametrize("scd_type", [1, 2])
def test_duplicate_and_null_keys_are_named(spark: SparkSession, table_path: str, scd_type: int) -> None:
    """Checked in the diff's own job: the error names the key and nothing of the version is written."""
    def run(rows: list[tuple[Any, ...]]) -> SnapshotCdcResult:
        return create_auto_cdc_from_snapshot_flow(spark, target=table_path, source=spark.createDataFrame(rows, SCHEMA),
                                                  keys="id", stored_as_scd_type=scd_type, name="n")

    run([(1, "a", 1), (2, "b", 2)])
    before = table_rows(table_path)
    with pytest.raises(SnapshotKeyError, match=r'2 rows with the key \{"id":7\}') as raised:
        run([(1, "a", 1), (7, "b", 2), (7, "c", 3)])
    assert (raised.value.key, raised.value.rows) == ('{"id":7}', 2)
    with pytest.raises(SnapshotKeyError, match=r"a row with a NULL key \['id'\]") as raised:
        run([(1, "a", 1), (None, "b", 2)])
    assert raised.value.rows is None
    assert table_rows(table_path) == before
    assert txn(table_path, "n") == 1
