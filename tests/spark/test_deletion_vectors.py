"""Deletion vectors end to end: tables Delta Lake on Spark wrote, MERGEs that write DVs, the
protocol upgrade, conflicts, and a process killed between writing a DV file and committing.

Every table is read back by delta-rs' DataFusion reader (``QueryBuilder``, which applies DVs)
and by our own reader, and the two must agree with the expected rows.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path
from typing import Any

import deltalake
import pyarrow as pa
import pytest
from pyspark.sql import SparkSession

from streaming_merge import DeltaTable
from streaming_merge.errors import (
    ConcurrentModificationError,
    MultipleSourceRowMatchingTargetRowError,
    UnsupportedTableFeatureError,
)
from streaming_merge.table import dv_log
from streaming_merge.table.snapshot import load_snapshot
from tests.delta_fixtures import FIXTURES, fixture_copy
from tests.job_count import jobs_and_shuffled_bytes_of, shuffled_bytes_of

DELETION_VECTORS = {"delta.enableDeletionVectors": "true"}


def delta_rs_rows(path: str | Path, version: int | None = None) -> Counter[tuple[Any, ...]]:
    """The table as delta-rs' DataFusion engine reads it (deletion vectors applied)."""
    table = deltalake.DeltaTable(str(path), version=version)
    read = pa.table(deltalake.QueryBuilder().register("t", table).execute("SELECT * FROM t"))
    columns = [f.name for f in table.schema().fields]
    return Counter(tuple(row[c] for c in columns) for row in read.to_pylist())


def our_rows(spark: SparkSession, path: str | Path, version: int | None = None) -> Counter[tuple[Any, ...]]:
    return Counter(tuple(row) for row in DeltaTable.forPath(spark, str(path)).toDF(version).collect())


@pytest.mark.parametrize("name", ["table-with-dv-small", "table-with-dv-large"])
def test_reads_of_delta_lake_dv_tables_equal_delta_rs_at_every_version(spark: SparkSession, name: str) -> None:
    path = FIXTURES / name
    latest = deltalake.DeltaTable(str(path)).version()
    counts = []
    for version in range(latest + 1):
        expected = delta_rs_rows(path, version)
        assert our_rows(spark, path, version) == expected, f"version {version}"
        counts.append(sum(expected.values()))
    assert counts == {"table-with-dv-small": [10, 8], "table-with-dv-large": [2000, 1995, 1997, 1991, 1993]}[name]


def test_merge_into_a_delta_lake_dv_table_adds_dvs_beside_its_own(spark: SparkSession, tmp_path: Path) -> None:
    path = fixture_copy("table-with-dv-large", tmp_path)
    before = delta_rs_rows(path)
    files_before = {f.path: f.deletion_vector for f in load_snapshot(str(path)).files}
    values = sorted(v for (v,) in before)
    updated, deleted = values[:: 97][:12], values[5:: 211][:6]
    source = spark.createDataFrame([(v, "update") for v in updated if v not in deleted]
                                   + [(v, "delete") for v in deleted] + [(-1, "update"), (-2, "update")],
                                   "value int, op string")
    metrics = (DeltaTable.forPath(spark, str(path)).alias("t").merge(source.alias("s"), "t.value = s.value")
               .whenMatchedDelete("s.op = 'delete'")
               .whenMatchedUpdate(set={"value": "-t.value"})
               .whenNotMatchedInsert(values={"value": "s.value"})
               .execute())

    expected = Counter(before)
    for v in deleted:
        del expected[(v,)]
    for v in updated:
        if v not in deleted:
            del expected[(v,)]
            expected[(-v,)] += 1
    expected.update({(-1,): 1, (-2,): 1})
    assert delta_rs_rows(path) == expected == our_rows(spark, path)
    assert metrics["numTargetRowsCopied"] == 0 and metrics["numTargetFilesRemoved"] == 0
    assert metrics["numTargetRowsDeleted"] == len(deleted)
    assert metrics["numTargetRowsUpdated"] == len(set(updated) - set(deleted))
    assert metrics["numTargetRowsInserted"] == 2
    files_after = {f.path: f.deletion_vector for f in load_snapshot(str(path)).files}
    changed = {p for p in files_before if files_after.get(p) != files_before[p]}
    had_dv = {p for p in changed if files_before[p] is not None}
    assert changed and had_dv, "the MERGE must touch files that already carried Delta's own DVs"
    assert metrics["numTargetDeletionVectorsUpdated"] == len(had_dv)
    assert metrics["numTargetDeletionVectorsAdded"] == len(changed - had_dv)
    # untouched files keep Delta's DVs exactly as they were
    assert all(files_after[p] == dv for p, dv in files_before.items() if p not in changed)


def _dv_table(spark: SparkSession, path: str, rows: int = 400, files: int = 4) -> DeltaTable:
    frame = spark.range(0, rows).selectExpr("id AS k", "id * 10 AS v", "CAST(id % 7 AS STRING) AS w")
    return DeltaTable.createFromDataFrame(frame.repartition(files), path, properties=DELETION_VECTORS)


def test_upsert_writes_only_changed_rows_and_time_travel_reads_each_version(spark: SparkSession,
                                                                           tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    table = _dv_table(spark, path)
    original = {f.path for f in load_snapshot(path).files}
    protocol = load_snapshot(path).protocol
    assert (protocol.min_reader_version, protocol.min_writer_version) == (3, 7)
    assert "deletionVectors" in protocol.reader_features and "deletionVectors" in protocol.writer_features
    source = spark.createDataFrame([(k, -k, "x") for k in [*range(0, 400, 40), 1000, 1001]], "k long, v long, w string")
    metrics = (table.alias("t").merge(source.alias("s"), "t.k = s.k").whenMatchedUpdateAll()
               .whenNotMatchedInsertAll().execute())
    assert (metrics["numTargetRowsUpdated"], metrics["numTargetRowsInserted"], metrics["numTargetRowsCopied"]) == (
        10, 2, 0)
    assert metrics["numTargetFilesRemoved"] == 0 and metrics["numTargetDeletionVectorsAdded"] >= 1
    # the new files hold exactly the 12 changed rows; a DV of two or three rows goes inline
    added = [f for f in load_snapshot(path).files if f.path not in original]
    vectors = [f.deletion_vector for f in load_snapshot(path).files if f.deletion_vector is not None]
    assert vectors and all(v.storage_type == "i" for v in vectors)
    assert not list(Path(path).glob("deletion_vector_*.bin"))
    assert sum(f.num_records or 0 for f in added) == 12
    expected = Counter((k, k * 10, str(k % 7)) for k in range(400) if k % 40)
    expected.update((k, -k, "x") for k in [*range(0, 400, 40), 1000, 1001])
    assert delta_rs_rows(path) == expected == our_rows(spark, path)
    assert our_rows(spark, path, 0) == delta_rs_rows(path, 0)
    assert sum(our_rows(spark, path, 0).values()) == 400

    # a second MERGE deletes rows of files that already have a DV: the DV is updated, not added
    again = spark.createDataFrame([(k,) for k in range(1, 400, 40)], "k long")
    metrics = table.alias("t").merge(again.alias("s"), "t.k = s.k").whenMatchedDelete().execute()
    assert metrics["numTargetRowsDeleted"] == 10 and metrics["numTargetDeletionVectorsUpdated"] >= 1
    for k in range(1, 400, 40):
        del expected[(k, k * 10, str(k % 7))]
    assert delta_rs_rows(path) == expected == our_rows(spark, path)


_COUNTS = ("numSourceRows", "numTargetRowsUpdated", "numTargetRowsDeleted", "numTargetRowsInserted",
           "numTargetRowsCopied", "numTargetFilesAdded", "numTargetFilesRemoved", "numTargetDeletionVectorsAdded",
           "numTargetDeletionVectorsUpdated", "numTargetDeletionVectorsRemoved", "num_affected_rows")


@pytest.mark.parametrize(("guarded", "target_key_twice"), [(False, False), (False, True), (True, False)])
def test_an_upsert_whose_matched_clauses_write_only_source_values_writes_no_row_through_a_shuffle(
        spark: SparkSession, tmp_path: Path, guarded: bool, target_key_twice: bool) -> None:
    """CDC clauses (a delete flag; ``guarded``: only a newer event than the row applies, a
    condition that reads the target): the written rows come from the source side and nothing is
    shuffled; the rows and metrics equal the general plan's. A key the target holds twice (a
    source row matching two target rows) takes the general plan."""
    newer = " AND s.v > t.v" if guarded else ""
    results = []
    for source_side in (True, False):
        path = str(tmp_path / f"t-{source_side}")
        table = _dv_table(spark, path)
        if target_key_twice:  # key 40 a second time: an insert the ON condition cannot match
            twin = spark.createDataFrame([(40, -1, "twin")], "k long, v long, w string")
            table.alias("t").merge(twin.alias("s"), "t.k = s.k + 100000").whenNotMatchedInsertAll().execute()
        # v is the sequence: the row's is k * 10; events of even keys are newer, of odd keys older
        events = [(k, k * 10 + (1 if k % 80 == 0 else -1), "x", False) for k in range(0, 400, 40)] + [
            (k, k * 10 + 1, "d", True) for k in (1, 81, 2000)] + [(k, 0, "d", True) for k in (121,)] + [
            (1000 + k, k, "n", False) for k in range(3)]
        source = spark.createDataFrame(events, "k long, v long, w string, deleted boolean")

        def merge(table: DeltaTable = table, source: Any = source, source_side: bool = source_side) -> Any:
            return (table.alias("t").merge(source.alias("s"), "t.k = s.k")
                    .withOptions(dv_source_side_write=source_side)
                    .whenMatchedDelete(f"s.deleted{newer}").whenMatchedUpdateAll(f"NOT s.deleted{newer}")
                    .whenNotMatchedInsertAll("NOT s.deleted").execute())

        shuffled, metrics = shuffled_bytes_of(spark, merge)
        assert delta_rs_rows(path) == our_rows(spark, path)
        results.append((shuffled, {k: metrics[k] for k in _COUNTS}, our_rows(spark, path)))
    (side_shuffled, side_metrics, side_rows), (general_shuffled, general_metrics, general_rows) = results
    assert side_rows == general_rows and side_metrics == general_metrics
    updated = (5 if guarded else 10) + (1 if target_key_twice else 0)
    assert (side_metrics["numTargetRowsUpdated"], side_metrics["numTargetRowsDeleted"],
            side_metrics["numTargetRowsInserted"], side_metrics["numTargetRowsCopied"]) == (
        updated, 2 if guarded else 3, 3, 0)
    assert general_shuffled > 0
    assert (side_shuffled > 0) == target_key_twice


_UPSERTS = {  # clauses; whether a source row writes the same row matched or not; rows updated, inserted, deleted
    "update all, insert all": (lambda m: m.whenMatchedUpdateAll().whenNotMatchedInsertAll(), True, (12, 3, 0)),
    "equal explicit values": (lambda m: m.whenMatchedUpdate(set={"k": "s.k", "v": "s.v", "w": "s.w"})
                              .whenNotMatchedInsert(values={"k": "s.k", "v": "s.v", "w": "s.w"}), True, (12, 3, 0)),
    "the CDC clauses": (lambda m: m.whenMatchedDelete("s.w = 'd'").whenMatchedUpdateAll("NOT s.w = 'd'")
                        .whenNotMatchedInsertAll("NOT s.w = 'd'"), True, (11, 2, 1)),
    "an update of other values": (lambda m: m.whenMatchedUpdate(set={"k": "s.k", "v": "s.v + 1", "w": "s.w"})
                                  .whenNotMatchedInsertAll(), False, (12, 3, 0)),
    "a guard reading the target": (lambda m: m.whenMatchedDelete("s.w = 'd'").whenMatchedUpdateAll(
        "NOT s.w = 'd' AND s.v < t.v").whenNotMatchedInsertAll("NOT s.w = 'd'"), False, (9, 2, 1)),
    "a delete before the update, not its opposite": (lambda m: m.whenMatchedDelete("s.v > 100").whenMatchedUpdateAll(
        "NOT s.w = 'd'").whenNotMatchedInsertAll("NOT s.w = 'd'"), False, (10, 2, 1)),
}


@pytest.mark.parametrize("clauses", list(_UPSERTS))
@pytest.mark.parametrize("target_key_twice", [False, True])
def test_a_plain_upsert_writes_its_rows_in_the_job_that_matches_them(spark: SparkSession, tmp_path: Path,
                                                                      clauses: str, target_key_twice: bool) -> None:
    """When a source row writes the same row whether it matched or not, the matching and the
    write are one job: as many jobs as the general plan, and no shuffle. A key the target holds
    twice takes the general plan after that job, whose files leave no trace."""
    add_clauses, same_row_either_way, (updated, inserted, deleted) = _UPSERTS[clauses]
    source_rows = [*[(k, -k, "x") for k in [*range(0, 400, 40), 1000, 1001]], (1, 0, "d"), (2000, 0, "d"),
                   (3, 500, "x")]
    results = []
    for source_side in (True, False):
        path = str(tmp_path / f"t-{source_side}")
        table = _dv_table(spark, path)
        if target_key_twice:  # key 40 a second time
            twin = spark.createDataFrame([(40, -1, "twin")], "k long, v long, w string")
            table.alias("t").merge(twin.alias("s"), "t.k = s.k + 100000").whenNotMatchedInsertAll().execute()
        source = spark.createDataFrame(source_rows, "k long, v long, w string")
        builder = table.alias("t").merge(source.alias("s"), "t.k = s.k").withOptions(dv_source_side_write=source_side)
        jobs, shuffled, metrics = jobs_and_shuffled_bytes_of(spark, add_clauses(builder).execute)
        assert _data_files_on_disk(path) == _data_files_ever_added(path)  # nothing written and left behind
        assert delta_rs_rows(path) == our_rows(spark, path)
        results.append((jobs, shuffled, {k: metrics[k] for k in _COUNTS}, our_rows(spark, path)))
    (side_jobs, side_shuffled, side_metrics, side_rows), (general_jobs, _, general_metrics, general_rows) = results
    assert side_rows == general_rows and side_metrics == general_metrics
    assert (side_metrics["numTargetRowsUpdated"], side_metrics["numTargetRowsInserted"],
            side_metrics["numTargetRowsDeleted"]) == (updated + (1 if target_key_twice else 0), inserted, deleted)
    if target_key_twice:  # the source side's first job, then the general plan
        assert side_shuffled > 0 and side_jobs > general_jobs
    else:
        assert side_shuffled == 0
        assert side_jobs == general_jobs + (0 if same_row_either_way else 1)


def _data_files_on_disk(path: str) -> set[str]:
    return {p.relative_to(path).as_posix() for p in Path(path).rglob("*.parquet") if "_delta_log" not in p.parts}


def _data_files_ever_added(path: str) -> set[str]:
    """The data files some commit of the table added (a removed one stays until VACUUM)."""
    actions = [json.loads(line) for commit in sorted(Path(path, "_delta_log").glob("*.json"))
               for line in commit.read_text().splitlines()]
    return {a["add"]["path"] for a in actions if "add" in a}


def test_a_plain_upsert_whose_source_matches_a_row_twice_raises_and_leaves_nothing(spark: SparkSession,
                                                                                  tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    table = _dv_table(spark, path, rows=20, files=2)
    before = (deltalake.DeltaTable(path).version(), sorted(p.as_posix() for p in Path(path).rglob("*")))
    twice = spark.createDataFrame([(3, 1, "a"), (3, 2, "b"), (400, 1, "c")], "k long, v long, w string")
    with pytest.raises(MultipleSourceRowMatchingTargetRowError, match="multiple source rows matched"):
        table.alias("t").merge(twice.alias("s"), "t.k = s.k").whenMatchedUpdateAll().whenNotMatchedInsertAll().execute()
    assert (deltalake.DeltaTable(path).version(), sorted(p.as_posix() for p in Path(path).rglob("*"))) == before


def test_a_file_whose_rows_are_all_deleted_is_removed(spark: SparkSession, tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    table = _dv_table(spark, path, rows=40, files=1)
    everything = spark.range(0, 40).selectExpr("id AS k")
    metrics = table.alias("t").merge(everything.alias("s"), "t.k = s.k").whenMatchedDelete().execute()
    assert metrics["numTargetFilesRemoved"] == 1 and metrics["numTargetDeletionVectorsAdded"] == 0
    assert load_snapshot(path).files == [] and delta_rs_rows(path) == Counter()


def test_multiple_matches_raise_delta_error_and_leave_nothing(spark: SparkSession, tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    table = _dv_table(spark, path, rows=20, files=2)
    before = (deltalake.DeltaTable(path).version(), sorted(os.listdir(path)))
    twice = spark.createDataFrame([(3, 1), (3, 2), (4, 1)], "k long, v long")
    with pytest.raises(MultipleSourceRowMatchingTargetRowError, match="multiple source rows matched"):
        table.alias("t").merge(twice.alias("s"), "t.k = s.k").whenMatchedUpdate(set={"v": "s.v"}).execute()
    assert (deltalake.DeltaTable(path).version(), sorted(os.listdir(path))) == before


def test_enabling_dvs_on_an_existing_table_upgrades_the_protocol(spark: SparkSession, tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    frame = spark.range(0, 50).selectExpr("id AS k", "id AS v")
    table = DeltaTable.createFromDataFrame(frame.coalesce(1), path)
    assert load_snapshot(path).writes_deletion_vectors is False
    version = table.enableDeletionVectors()
    snapshot = load_snapshot(path)
    assert version == 1 and snapshot.writes_deletion_vectors
    assert (snapshot.protocol.min_reader_version, snapshot.protocol.min_writer_version) == (3, 7)
    # the features writer version 2 implied stay, now listed
    assert {"appendOnly", "invariants", "deletionVectors"} <= set(snapshot.protocol.writer_features)
    table.alias("t").merge(spark.createDataFrame([(7, -7)], "k long, v long").alias("s"), "t.k = s.k") \
        .whenMatchedUpdateAll().execute()
    assert [f.deletion_vector is not None for f in load_snapshot(path).files].count(True) == 1
    assert delta_rs_rows(path) == our_rows(spark, path) == Counter((k, -k if k == 7 else k) for k in range(50))
    with pytest.raises(Exception, match="row tracking"):
        table.setProperties({"delta.enableRowTracking": "true"})
    assert deltalake.DeltaTable(path).version() == 2


@pytest.mark.no_delta_reads  # rowTracking without domainMetadata: a protocol Delta refuses to read
def test_an_unknown_writer_feature_is_refused_before_anything_is_written(spark: SparkSession,
                                                                        tmp_path: Path) -> None:
    path = fixture_copy("table-with-dv-small", tmp_path)
    log = path / "_delta_log" / f"{2:020d}.json"
    log.write_text(json.dumps({"commitInfo": {"timestamp": 1, "operation": "UPGRADE"}}) + "\n" + json.dumps(
        {"protocol": {"minReaderVersion": 3, "minWriterVersion": 7, "readerFeatures": ["deletionVectors"],
                      "writerFeatures": ["deletionVectors", "rowTracking"]}}) + "\n")
    source = spark.createDataFrame([(1,)], "value int")
    with pytest.raises(UnsupportedTableFeatureError, match="rowTracking"):
        DeltaTable.forPath(spark, str(path)).alias("t").merge(source.alias("s"), "t.value = s.value") \
            .whenMatchedDelete().execute()
    assert deltalake.DeltaTable(str(path)).version() == 2


def test_a_concurrent_dv_change_to_a_file_read_is_a_conflict(spark: SparkSession, tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    table = _dv_table(spark, path, rows=40, files=1)
    first = spark.createDataFrame([(1,)], "k long")
    second = spark.createDataFrame([(2,)], "k long")

    def concurrent_delete() -> None:  # commits while the outer MERGE waits to commit
        table.alias("t").merge(second.alias("s"), "t.k = s.k").whenMatchedDelete().execute()

    with pytest.raises(ConcurrentModificationError, match="removed files"):
        table.alias("t").merge(first.alias("s"), "t.k = s.k").whenMatchedDelete() \
            .withOptions(before_commit=concurrent_delete).execute()
    assert delta_rs_rows(path) == our_rows(spark, path) == Counter(
        (k, k * 10, str(k % 7)) for k in range(40) if k != 2)
    # the failed MERGE deleted what it wrote: only the winner's files remain (its one-row DV is inline)
    assert not [n for n in os.listdir(path) if n.startswith("deletion_vector_")]
    assert len(list(Path(path).rglob("*.parquet"))) == 1


_KILLED_MERGE = textwrap.dedent("""
    import os, signal, sys
    import streaming_merge.table.commit as table_commit
    from streaming_merge import DeltaTable
    from streaming_merge.session import local_session

    def killed(request):  # the data files and the DV file are written: die before the commit
        marker = sys.argv[2]
        open(marker, "w").write(",".join(sorted(os.listdir(sys.argv[1]))))
        os.kill(os.getpid(), signal.SIGKILL)

    table_commit.commit = killed
    spark = local_session("killed-merge", "local[1]", shuffle_partitions=1)
    source = spark.createDataFrame([(k, -k, "x") for k in range(0, 400, 4)] + [(999, 0, "new")],
                                   "k long, v long, w string")
    (DeltaTable.forPath(spark, sys.argv[1]).alias("t").merge(source.alias("s"), "t.k = s.k")
     .whenMatchedUpdateAll().whenNotMatchedInsertAll().execute())
""")


@pytest.mark.slow
def test_sigkill_between_the_dv_write_and_the_commit_loses_nothing(spark: SparkSession, tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    _dv_table(spark, path, rows=400, files=2)  # 50 rows a file: DVs too large to go inline
    before = delta_rs_rows(path)
    marker = tmp_path / "written"
    run = subprocess.run([sys.executable, "-c", _KILLED_MERGE, path, str(marker)], capture_output=True, text=True,
                         timeout=300, cwd=Path(__file__).resolve().parents[2])
    assert run.returncode == -signal.SIGKILL, run.stderr[-2000:]
    written_before_kill = marker.read_text().split(",")
    assert any(n.startswith("deletion_vector_") for n in written_before_kill), written_before_kill
    # nothing visible: same version, same rows, for delta-rs and for us
    assert deltalake.DeltaTable(path).version() == 0
    assert delta_rs_rows(path) == before == our_rows(spark, path)
    # and the table takes the same MERGE afterwards
    source = spark.createDataFrame([(k, -k, "x") for k in range(0, 400, 4)], "k long, v long, w string")
    DeltaTable.forPath(spark, path).alias("t").merge(source.alias("s"), "t.k = s.k").whenMatchedUpdateAll().execute()
    expected = Counter((k, -k, "x") if k % 4 == 0 else (k, k * 10, str(k % 7)) for k in range(400))
    assert delta_rs_rows(path) == expected == our_rows(spark, path)


def test_a_writer_reads_back_none_of_its_own_vectors(spark: SparkSession, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A stream's batches rescan the files the batch before gave vectors: what this process
    committed is kept, and what it must read (another writer's) takes a request per DV file."""
    from collections import OrderedDict

    from streaming_merge.spark.per_context import PerContext
    from streaming_merge.table import deletion_vectors, dv_filter, dv_positions

    path = str(tmp_path / "t")
    table = _dv_table(spark, path, rows=3000, files=3)
    reads: list[str] = []

    def counting(original: Any) -> Any:
        def counted(store: Any, name: str, **kwargs: Any) -> Any:
            reads.append(name)
            return original(store, name, **kwargs)
        return counted

    for function in ("get_range", "get_ranges"):  # any read of a DV file
        monkeypatch.setattr(deletion_vectors.obstore, function, counting(getattr(deletion_vectors.obstore, function)))
    expected = Counter((k, k * 10, str(k % 7)) for k in range(3000))
    for step in range(3):  # each MERGE deletes a third of the remaining rows of every file
        gone = spark.range(step, 3000, 3).selectExpr("id AS k")
        table.alias("t").merge(gone.alias("s"), "t.k = s.k").whenMatchedDelete().execute()
        expected -= Counter((k, k * 10, str(k % 7)) for k in range(step, 3000, 3))
        if step < 2:
            assert {len(list(Path(path).glob("deletion_vector_*.bin")))} == {step + 1}
    assert reads == []  # the 2nd and 3rd MERGEs scanned files whose vectors the MERGE before wrote
    assert our_rows(spark, path) == Counter()

    # a new process: no positions and no built scan filter in memory
    monkeypatch.setattr(dv_positions, "_cache", OrderedDict())
    monkeypatch.setattr(dv_positions, "_cache_bytes", 0)
    monkeypatch.setattr(dv_filter, "_built", PerContext(limit=16))
    before = DeltaTable.forPath(spark, path).toDF(2)
    assert Counter(tuple(r) for r in before.collect()) == delta_rs_rows(path, 2)
    assert len(reads) == 1  # the three files' vectors of version 2 share one DV file


def test_merge_into_a_dv_table_delta_rs_created(spark: SparkSession, tmp_path: Path) -> None:
    """delta-rs creates a DV table with variantType, invariants and appendOnly among its features;
    none asks anything of us while unused, so the MERGE writes DVs there, and delta-rs reads them."""
    path = str(tmp_path / "t")
    deltalake.write_deltalake(path, pa.table({"k": pa.array(range(100), pa.int64()),
                                              "v": pa.array(range(100), pa.int64())}),
                              configuration={"delta.enableDeletionVectors": "true"})
    assert "variantType" in deltalake.DeltaTable(path).protocol().writer_features
    source = spark.createDataFrame([(k, -1) for k in range(0, 100, 3)] + [(500, -1)], "k long, v long")
    metrics = (DeltaTable.forPath(spark, path).alias("t").merge(source.alias("s"), "t.k = s.k")
               .whenMatchedUpdateAll().whenNotMatchedInsertAll().execute())
    assert (metrics["numTargetRowsUpdated"], metrics["numTargetRowsInserted"], metrics["numTargetRowsCopied"]) == (
        34, 1, 0)
    assert metrics["numTargetDeletionVectorsAdded"] == 1
    expected = Counter((k, -1 if k % 3 == 0 else k) for k in range(100))
    expected[(500, -1)] += 1
    assert delta_rs_rows(path) == expected == our_rows(spark, path)


def test_a_checkpoint_every_interval_keeps_the_dvs(spark: SparkSession, tmp_path: Path) -> None:
    """Our commits leave checkpoints to delta-rs every delta.checkpointInterval commits; the
    checkpoint keeps the DV descriptors, which the next MERGE reads back from it."""
    path = str(tmp_path / "t")
    frame = spark.range(0, 200).selectExpr("id AS k", "id AS v")
    table = DeltaTable.createFromDataFrame(frame.coalesce(1), path,
                                           properties={**DELETION_VECTORS, "delta.checkpointInterval": "2"})
    for ks in (range(0, 200, 7), range(1, 200, 7)):  # versions 1 and 2: a checkpoint at 2
        source = spark.createDataFrame([(k,) for k in ks], "k long")
        table.alias("t").merge(source.alias("s"), "t.k = s.k").whenMatchedDelete().execute()
    assert (Path(path) / "_delta_log" / f"{2:020d}.checkpoint.parquet").exists()
    shutil.rmtree(Path(path) / "_delta_log" / "_commits", ignore_errors=True)
    for version in (0, 1):  # the checkpoint alone must now carry the file and its DV
        (Path(path) / "_delta_log" / f"{version:020d}.json").unlink()
    dv_log.clear_cache()
    [live] = load_snapshot(path).files
    assert live.deletion_vector is not None and live.deleted_rows == 2 * len(range(0, 200, 7))
    source = spark.createDataFrame([(2,)], "k long")
    table.alias("t").merge(source.alias("s"), "t.k = s.k").whenMatchedDelete().execute()
    expected = Counter((k, k) for k in range(200) if k % 7 not in (0, 1) and k != 2)
    assert delta_rs_rows(path) == expected == our_rows(spark, path)


def test_a_table_created_again_at_the_same_place_is_not_read_from_the_old_ones_log(spark: SparkSession,
                                                                                tmp_path: Path) -> None:
    """The replayed add actions are cached per table and version; a table dropped and created
    again at the same path (same versions, new files) must not be answered from that cache."""
    path = str(tmp_path / "t")
    for attempt in range(2):
        shutil.rmtree(path, ignore_errors=True)
        table = _dv_table(spark, path, rows=20, files=1)
        source = spark.createDataFrame([(attempt,)], "k long")
        table.alias("t").merge(source.alias("s"), "t.k = s.k").whenMatchedDelete().execute()
        table.alias("t").merge(spark.createDataFrame([(5 + attempt, -1, "x")], "k long, v long, w string")
                               .alias("s"), "t.k = s.k").whenMatchedUpdateAll().execute()
        expected = Counter((k, -1, "x") if k == 5 + attempt else (k, k * 10, str(k % 7))
                           for k in range(20) if k != attempt)
        assert delta_rs_rows(path) == expected == our_rows(spark, path)
