"""Interop with Delta Lake on Spark (delta-spark, in the test session's JVM), both ways.

Why: the tables we write were only ever read back by delta-rs, and Delta-written tables were a
few static fixtures. Here Delta Lake itself reads what we write, at every version, and writes at
test time the tables (with the features it offers) that we read and merge into.

- ``test_delta_reads_every_version_we_write``: plain, DV, CDF and DV+CDF tables with a checkpoint
  every two commits, through MERGE, DELETE, UPDATE and OPTIMIZE: at every version Delta's
  time travel reads our rows and schema, its history lists our versions and operations, its
  change feed equals our ``changes()``, and it honours our ``txn`` versions (an idempotent
  write of Delta's with an app id and version we committed is skipped).
- ``test_delta_written_feature``: for each feature Delta writes, we either merge into the table
  exactly as Delta's own MERGE does on a copy (and Delta reads our result and merges on), or we
  refuse with ``UnsupportedTableFeatureError`` and write nothing. docs/guides/delta-lake.md lists
  the outcome of each.
"""

from __future__ import annotations

import contextlib
import json
import shutil
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from delta.tables import DeltaTable as DeltaLakeTable
from pyspark.sql import DataFrame, SparkSession

from streaming_merge import DeltaTable
from streaming_merge.errors import UnsupportedTableFeatureError

pytestmark = [pytest.mark.delta]

CDF_META = ("_commit_version", "_commit_timestamp")


def rows_of(df: DataFrame) -> Counter[tuple[tuple[str, Any], ...]]:
    return Counter(tuple(sorted(r.asDict().items(), key=lambda kv: kv[0])) for r in df.collect())


def delta_history(spark: SparkSession, path: str) -> list[tuple[int, str]]:
    return sorted((int(r["version"]), r["operation"]) for r in DeltaLakeTable.forPath(spark, path).history().collect())


def log_actions(path: str, key: str) -> list[dict[str, Any]]:
    """Every ``key`` action in the table's JSON commits."""
    found = []
    for commit in sorted((Path(path) / "_delta_log").glob("*.json")):
        for line in commit.read_text().splitlines():
            if line.strip() and key in (action := json.loads(line)):
                found.append(action[key])
    return found


# --- Delta reads what we write ------------------------------------------------------------------


TABLE_KINDS = {
    "plain": {},
    "dv": {"delta.enableDeletionVectors": "true"},
    "cdf": {"delta.enableChangeDataFeed": "true"},
    "dv+cdf": {"delta.enableDeletionVectors": "true", "delta.enableChangeDataFeed": "true"},
}


@pytest.mark.parametrize("kind", list(TABLE_KINDS))
def test_delta_reads_every_version_we_write(spark: SparkSession, table_path: str, kind: str) -> None:
    properties = {"delta.checkpointInterval": "2", **TABLE_KINDS[kind]}
    rows = [(k, k * 10, f"w{k}") for k in range(8)]
    ours = DeltaTable.createFromDataFrame(spark.createDataFrame(rows, "k int, v int, w string").repartition(2),
                                          table_path, properties=properties)
    upsert = spark.createDataFrame([(1, 11, "u"), (5, 55, "u"), (20, 200, "new")], "k int, v int, w string")
    (ours.alias("t").merge(upsert.alias("s"), "t.k = s.k").whenMatchedUpdateAll().whenNotMatchedInsertAll()
     .execute(app_id="interop-app", version=7))
    ours.delete("k = 2")
    ours.update("k = 3", {"w": "'upd'"})
    (ours.alias("t").merge(upsert.limit(1).alias("s"), "t.k = s.k").whenMatchedDelete()
     .whenNotMatchedBySourceUpdate("t.k = 7", {"v": "-1"}).execute())
    ours.optimize().executeCompaction()
    last = ours.version()
    assert last >= 5 and sorted(Path(table_path, "_delta_log").glob("*.checkpoint.parquet")), "no checkpoint"
    if "delta.enableDeletionVectors" in properties:
        assert any(add.get("deletionVector") for add in log_actions(table_path, "add")), "we wrote no DV"

    # every version: rows and schema through Delta's time travel
    for version in range(last + 1):
        theirs = spark.read.format("delta").option("versionAsOf", version).load(table_path)
        mine = ours.toDF(version)
        assert theirs.schema.simpleString() == mine.schema.simpleString(), version
        assert rows_of(theirs) == rows_of(mine), f"Delta reads version {version} differently"
    assert rows_of(spark.read.format("delta").load(table_path)) == rows_of(ours.toDF())

    # history, properties, protocol
    assert delta_history(spark, table_path) == sorted((int(h["version"]), h["operation"]) for h in ours.history())
    detail = DeltaLakeTable.forPath(spark, table_path).detail().collect()[0]
    assert {k: detail["properties"][k] for k in properties} == properties
    protocol = log_actions(table_path, "protocol")[-1]
    assert (detail["minReaderVersion"], detail["minWriterVersion"]) == (protocol["minReaderVersion"],
                                                                        protocol["minWriterVersion"])

    # change data, all versions at once
    if "delta.enableChangeDataFeed" in properties:
        theirs = (spark.read.format("delta").option("readChangeFeed", "true").option("startingVersion", 0)
                  .load(table_path))
        assert rows_of(theirs.drop("_commit_timestamp")) == rows_of(ours.changes(0).drop("_commit_timestamp"))

    # txn: Delta's idempotent write skips what our MERGE committed as (interop-app, 7), takes 8
    extra = spark.createDataFrame([(99, 0, "txn")], "k int, v int, w string")
    for txn_version, expected in ((7, last), (8, last + 1)):
        (extra.write.format("delta").mode("append").option("txnAppId", "interop-app")
         .option("txnVersion", txn_version).save(table_path))
        assert DeltaTable.forPath(spark, table_path).version() == expected, txn_version


# --- Delta writes, we read and merge --------------------------------------------------------------


SetUp = Callable[[SparkSession, str], None]


def _sql(*statements: str) -> SetUp:
    def run(spark: SparkSession, path: str) -> None:
        for statement in statements:
            spark.sql(statement.format(t=f"delta.`{path}`"))
    return run


BASE = "CREATE TABLE {t} (k INT, v INT%s) USING delta %s"
INSERT = "INSERT INTO {t} (k, v) VALUES (1, 10), (2, 20), (3, 30), (4, 40)"


def _table(columns: str = "", clauses: str = "", *more: str) -> SetUp:
    return _sql(BASE % (columns, clauses), INSERT, *more)


def _empty(columns: str = "", clauses: str = "", *more: str) -> SetUp:
    """A table without rows: enough for a refusal, which reads only the protocol and metadata."""
    return _sql(BASE % (columns, clauses), *more)


def _props(**properties: str) -> str:
    return "TBLPROPERTIES (" + ", ".join(f"'{k}' = '{v}'" for k, v in properties.items()) + ")"


#: feature -> (how Delta writes the table, whether we merge into it).
FEATURES: dict[str, tuple[SetUp, bool]] = {
    "plain": (_table(), True),
    "deletion-vectors": (_table("", _props(**{"delta.enableDeletionVectors": "true"}), "DELETE FROM {t} WHERE k = 3"),
                         True),
    "change-data-feed": (_table("", _props(**{"delta.enableChangeDataFeed": "true"}),
                                "UPDATE {t} SET v = 0 WHERE k = 4"), True),
    "classic-checkpoint": (_table("", _props(**{"delta.checkpointInterval": "2"}),
                                  "INSERT INTO {t} VALUES (5, 50)", "INSERT INTO {t} VALUES (6, 60)"), True),
    "timestamp-ntz": (_table(", ts TIMESTAMP_NTZ", "",
                             "UPDATE {t} SET ts = TIMESTAMP_NTZ'2024-01-02 03:04:05' WHERE k = 1"), True),
    "v2-checkpoint": (_table("", _props(**{"delta.checkpointPolicy": "v2", "delta.checkpointInterval": "2"}),
                             "INSERT INTO {t} VALUES (5, 50)"), False),
    "in-commit-timestamps": (_empty("", _props(**{"delta.enableInCommitTimestamps": "true"})), False),
    "column-mapping": (_table("", _props(**{"delta.columnMapping.mode": "name"})), False),
    "row-tracking": (_empty("", _props(**{"delta.enableRowTracking": "true"})), False),
    "liquid-clustering": (_empty("", "CLUSTER BY (k)"), False),
    "type-widening": (_empty("", _props(**{"delta.enableTypeWidening": "true"})), False),
    "identity-column": (_empty(", id BIGINT GENERATED ALWAYS AS IDENTITY"), False),
    "check-constraint": (_empty("", "", "ALTER TABLE {t} ADD CONSTRAINT positive CHECK (v >= 0)"), False),
    "generated-column": (_empty(", g INT GENERATED ALWAYS AS (v * 2)"), False),
    "variant": (_empty(", doc VARIANT"), False),
}


def _merge(table: Any, source: DataFrame) -> Any:
    return (table.alias("t").merge(source.alias("s"), "t.k = s.k").whenMatchedUpdate(set={"v": "s.v"})
            .whenNotMatchedInsert(values={"k": "s.k", "v": "s.v"}).whenNotMatchedBySourceDelete("t.k = 1"))


@pytest.mark.parametrize("feature", list(FEATURES))
def test_delta_written_feature(spark: SparkSession, tmp_path: Path, feature: str) -> None:
    set_up, supported = FEATURES[feature]
    ours, theirs = str(tmp_path / "ours"), str(tmp_path / "theirs")
    set_up(spark, ours)
    source = spark.createDataFrame([(2, 200), (9, 900)], "k int, v int")
    version = DeltaLakeTable.forPath(spark, ours).history(1).collect()[0]["version"]
    if not supported:
        with contextlib.suppress(UnsupportedTableFeatureError):  # a reader reads what Delta reads, or refuses
            assert rows_of(DeltaTable.forPath(spark, ours).toDF()) == rows_of(spark.read.format("delta").load(ours))
        log = sorted(p.name for p in Path(ours, "_delta_log").iterdir())
        with pytest.raises(UnsupportedTableFeatureError) as raised:
            _merge(DeltaTable.forPath(spark, ours), source).execute()
        assert "refus" in str(raised.value).lower(), raised.value
        assert sorted(p.name for p in Path(ours, "_delta_log").iterdir()) == log, "a refused MERGE wrote to the log"
        assert DeltaLakeTable.forPath(spark, ours).history(1).collect()[0]["version"] == version
        return
    shutil.copytree(ours, theirs)
    before = rows_of(spark.read.format("delta").load(ours))
    assert rows_of(DeltaTable.forPath(spark, ours).toDF()) == before, "we read Delta's table differently"
    _merge(DeltaTable.forPath(spark, ours), source).execute()
    _merge(DeltaLakeTable.forPath(spark, theirs), source).execute()
    expected = rows_of(spark.read.format("delta").load(theirs))
    assert rows_of(spark.read.format("delta").load(ours)) == expected, "Delta reads our MERGE's result differently"
    assert rows_of(DeltaTable.forPath(spark, ours).toDF()) == expected
    if feature == "change-data-feed":
        changes = spark.read.format("delta").option("readChangeFeed", "true").option("startingVersion", version + 1)
        assert rows_of(changes.load(ours).drop(*CDF_META)) == rows_of(changes.load(theirs).drop(*CDF_META))
    # and Delta merges on into our result
    again = spark.createDataFrame([(9, 901), (10, 1000)], "k int, v int")
    _merge(DeltaLakeTable.forPath(spark, ours), again).execute()
    _merge(DeltaLakeTable.forPath(spark, theirs), again).execute()
    assert rows_of(spark.read.format("delta").load(ours)) == rows_of(spark.read.format("delta").load(theirs))
