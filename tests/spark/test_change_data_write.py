"""Writing the change data feed: what MERGE, DELETE and UPDATE commit on a table with
``delta.enableChangeDataFeed=true``, read back by delta-rs' ``load_cdf`` (an independent reader).

The property test (test_merge_properties) checks random MERGEs' change rows against the model;
these tests pin the rest: the protocol upgrade, DML on copy-on-write and DV tables, the commits
that must write no change file, the metrics, and a table Delta Lake itself wrote.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import deltalake
import pyarrow as pa
import pytest
from pyspark.sql import SparkSession

from streaming_merge import DeltaTable
from streaming_merge.table.snapshot import load_snapshot
from tests.delta_fixtures import fixture_copy

CDF = {"delta.enableChangeDataFeed": "true"}
DV = {"delta.enableDeletionVectors": "true"}


def changes(path: str | Path, version: int, columns: tuple[str, ...] = ("k", "v")) -> Counter[tuple[Any, ...]]:
    """One version's change rows as delta-rs reads them, (_change_type, *columns) counted, after
    checking that our own reader (DeltaTable.changes) returns the same rows."""
    table = pa.table(deltalake.DeltaTable(str(path)).load_cdf(starting_version=version, ending_version=version))
    theirs = Counter((r["_change_type"], *(r[c] for c in columns)) for r in table.to_pylist())
    spark = SparkSession.getActiveSession()
    assert spark is not None
    ours = DeltaTable.forPath(spark, str(path)).changes(version, version).collect()
    assert Counter((r["_change_type"], *(r[c] for c in columns)) for r in ours) == theirs
    return theirs


def actions(path: str | Path, version: int) -> list[tuple[str, dict[str, Any]]]:
    log = Path(path) / "_delta_log" / f"{version:020d}.json"
    return [next(iter(a.items())) for a in map(json.loads, log.read_text().splitlines())]


def create(spark: SparkSession, path: Path, properties: dict[str, str], rows: int = 6,
           partitioned: bool = False) -> DeltaTable:
    frame = spark.createDataFrame([(k, k * 10, k % 2) for k in range(rows)], "k long, v long, p int")
    return DeltaTable.createFromDataFrame(frame.coalesce(1), str(path), partitionBy=["p"] if partitioned else None,
                                          properties=properties)


def test_turning_change_data_on_upgrades_the_protocol(spark: SparkSession, tmp_path: Path) -> None:
    legacy = create(spark, tmp_path / "legacy", {})
    legacy.setProperties(CDF)
    protocol = load_snapshot(legacy.path).protocol
    assert (protocol.min_reader_version, protocol.min_writer_version) == (1, 4)
    with_features = create(spark, tmp_path / "dv", DV)
    with_features.setProperties(CDF)
    protocol = load_snapshot(with_features.path).protocol
    assert protocol.min_writer_version == 7 and "changeDataFeed" in protocol.writer_features
    # both now record a MERGE's changes
    for table in (legacy, with_features):
        table.alias("t").merge(spark.createDataFrame([(1, -1)], "k long, v long").alias("s"), "t.k = s.k") \
            .whenMatchedUpdate(set={"v": "s.v"}).execute()
        assert changes(table.path, 2) == Counter({("update_preimage", 1, 10): 1, ("update_postimage", 1, -1): 1})


@pytest.mark.parametrize("dvs", [False, True], ids=["copy-on-write", "deletion-vectors"])
def test_delete_and_update_write_their_change_rows(spark: SparkSession, tmp_path: Path, dvs: bool) -> None:
    path = tmp_path / "t"
    table = create(spark, path, {**CDF, **(DV if dvs else {})}, rows=8, partitioned=True)
    deleted = table.delete("k in (2, 3)")
    assert deleted["numDeletedRows"] == 2 and deleted["numAddedChangeFiles"] >= 1
    assert changes(path, 1) == Counter({("delete", 2, 20): 1, ("delete", 3, 30): 1})
    updated = table.update("v > 50", {"v": "v + 1"})
    assert updated["numUpdatedRows"] == 2 and updated["numAddedChangeFiles"] >= 1
    assert changes(path, 2) == Counter({("update_preimage", 6, 60): 1, ("update_postimage", 6, 61): 1,
                                        ("update_preimage", 7, 70): 1, ("update_postimage", 7, 71): 1})
    if not dvs:  # copied rows are data, never change rows
        assert updated["numCopiedRows"] == 4  # the rest of both touched partitions
    # a delete the log decides (a whole partition) writes no change file: readers take the removes;
    # but a removed file with a DV: delta-rs 1.6.6's load_cdf would read the DV's rows, not the others
    whole = table.delete("p = 0")
    cdc = [a for kind, a in actions(path, 3) if kind == "cdc"]
    assert whole["numAddedChangeFiles"] == len(cdc) == (1 if dvs else 0)
    assert changes(path, 3) == Counter({("delete", 0, 0): 1, ("delete", 4, 40): 1, ("delete", 6, 61): 1})
    assert sorted(r.k for r in table.toDF().collect()) == [1, 5, 7]


def test_merge_metrics_and_commits_with_change_data(spark: SparkSession, tmp_path: Path) -> None:
    path = tmp_path / "t"
    table = create(spark, path, CDF)
    source = spark.createDataFrame([(1, -1, 1), (9, 90, 1)], "k long, v long, p int").alias("s")
    metrics = (table.alias("t").merge(source, "t.k = s.k").whenMatchedUpdateAll().whenNotMatchedInsertAll()
               .execute())
    cdc = [a for kind, a in actions(path, 1) if kind == "cdc"]
    assert metrics["numTargetChangeFilesAdded"] == len(cdc) >= 1
    assert metrics["numTargetChangeFileBytes"] == sum(a["size"] for a in cdc)
    assert all(a["dataChange"] is False and a["path"].startswith("_change_data/cdc-") for a in cdc)
    assert all((path / a["path"]).is_file() for a in cdc)
    assert changes(path, 1) == Counter({("update_preimage", 1, 10): 1, ("update_postimage", 1, -1): 1,
                                        ("insert", 9, 90): 1})
    # a commit of inserts only writes no change file: its added files are the inserted rows
    inserts = spark.createDataFrame([(20, 200, 0)], "k long, v long, p int").alias("s")
    only = table.alias("t").merge(inserts, "t.k = s.k").whenNotMatchedInsertAll().execute()
    assert only["numTargetChangeFilesAdded"] == 0 and not [a for kind, a in actions(path, 2) if kind == "cdc"]
    assert changes(path, 2) == Counter({("insert", 20, 200): 1})


def test_a_rewrite_that_changes_no_row_is_no_data_change(spark: SparkSession, tmp_path: Path) -> None:
    from streaming_merge.merge.skipping import SourceStats

    path = tmp_path / "t"
    table = create(spark, path, CDF)
    source = spark.createDataFrame([(1, 5)], "k long, v long").alias("s")
    # every candidate rewritten without findTouchedFiles, and no clause applies to any row
    metrics = (table.alias("t").merge(source, "t.k = s.k").whenMatchedUpdate("s.v > 100", {"v": "s.v"})
               .withOptions(rewrite_all_candidates_bytes=1 << 40, materialize_source="none",
                            source_stats=SourceStats(1, {"k": (1, 1)}, unique_keys=("k",)))
               .execute())
    assert metrics["numTargetFilesRemoved"] == 1 and metrics["numTargetChangeFilesAdded"] == 0
    written = actions(path, 1)
    assert {a["dataChange"] for kind, a in written if kind in ("add", "remove")} == {False}
    assert changes(path, 1) == Counter()


def test_merge_into_a_table_delta_lake_wrote(spark: SparkSession, tmp_path: Path) -> None:
    """Delta Lake on Spark's own CDF table (writer 4, partitioned): our MERGE adds a version with
    change files, and delta-rs reads the whole feed, Delta's versions and ours."""
    path = fixture_copy("cdf-table", tmp_path)
    before = pa.table(deltalake.DeltaTable(str(path)).load_cdf(starting_version=0)).num_rows
    table = DeltaTable.forPath(spark, str(path))
    target = table.toDF()
    first = target.orderBy("id").first()
    assert first is not None
    source = spark.createDataFrame([first.asDict()], target.schema)
    table.alias("t").merge(source.alias("s"), "t.id = s.id").whenMatchedUpdate(set={"name": "'renamed'"}).execute()
    version = table.version()
    feed = pa.table(deltalake.DeltaTable(str(path)).load_cdf(starting_version=0))
    assert feed.num_rows == before + 2
    ours = [r for r in feed.to_pylist() if r["_commit_version"] == version]
    assert sorted(r["_change_type"] for r in ours) == ["update_postimage", "update_preimage"]
    assert {r["name"] for r in ours if r["_change_type"] == "update_postimage"} == {"renamed"}
    assert {r["id"] for r in ours} == {first["id"]}


@pytest.mark.parametrize("scd_type", [1, 2])
def test_a_sink_batch_writes_its_change_rows(spark: SparkSession, tmp_path: Path, scd_type: int) -> None:
    """MergeSink (SCD 1 and SCD 2) on a table it creates with the feed on: each batch's commit
    carries its change rows, the same through both readers."""
    from streaming_merge import MergeSink

    path = tmp_path / "t"
    sink = MergeSink(str(path), keys="k", sequence_by="seq", apply_as_deletes="op = 'd'",
                     stored_as_scd_type=scd_type, app_id="t", table_properties=CDF)
    schema = "k long, v long, seq long, op string"
    sink(spark.createDataFrame([(1, 10, 1, "u"), (2, 20, 1, "u")], schema), 0)
    sink(spark.createDataFrame([(1, 11, 2, "u"), (2, None, 2, "d")], schema), 1)
    version = DeltaTable.forPath(spark, str(path)).version()
    found = changes(path, version)
    if scd_type == 1:
        assert found == Counter({("update_preimage", 1, 10): 1, ("update_postimage", 1, 11): 1,
                                 ("delete", 2, 20): 1})
    else:  # the old versions are closed (updated __END_AT), the new one inserted
        assert found == Counter({("update_preimage", 1, 10): 1, ("update_postimage", 1, 10): 1,
                                 ("insert", 1, 11): 1, ("update_preimage", 2, 20): 1,
                                 ("update_postimage", 2, 20): 1})
