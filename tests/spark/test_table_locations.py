"""Tables addressed by URIs and awkward paths, end to end through Spark's Hadoop FileSystem
(data files) and delta-rs (log): every spelling of one location is the same table, and
the rows read back independently with delta-rs are the ones written."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import deltalake
import pytest
from pyspark.sql import SparkSession

from streaming_merge import DeltaTable, MergeSink
from streaming_merge.errors import DeltaTableError
from streaming_merge.table.location import resolve
from streaming_merge.table.storage_options import hadoop_getter, storage_options_for

AWKWARD = "a b%c#d é"  # a space, a percent sign, a hash, non-ASCII


def _rows(path: Path) -> list[dict[str, Any]]:
    return sorted(deltalake.DeltaTable(str(path)).to_pyarrow_table().to_pylist(), key=lambda r: r["id"])


def _jvm_cwd(spark: SparkSession) -> str:
    """Relative table paths mean what they mean to Spark: relative to the JVM's directory."""
    return str(spark._jvm.java.lang.System.getProperty("user.dir"))


def test_every_spelling_of_a_location_is_the_same_table(spark: SparkSession, tmp_path: Path) -> None:
    folder = tmp_path / AWKWARD / "t"
    relative = os.path.relpath(folder, _jvm_cwd(spark))
    spellings = [str(folder), f"file://{folder}", f"file:{folder}/", str(tmp_path / AWKWARD / "x" / ".." / "t"),
                 relative]
    locations = {resolve(s, spark) for s in spellings}
    assert len(locations) == 1, locations
    (location,) = locations
    assert location.uri == f"file:{folder}"

    DeltaTable.createFromDataFrame(spark.createDataFrame([(1, "a"), (2, "b")], "id long, v string"), spellings[1])
    assert DeltaTable.isDeltaTable(spark, relative)
    source = spark.createDataFrame([(2, "B"), (3, "c")], "id long, v string")
    metrics = (DeltaTable.forPath(spark, spellings[2]).alias("t").merge(source.alias("s"), "t.id = s.id")
               .whenMatchedUpdateAll().whenNotMatchedInsertAll().execute())
    assert (metrics["numTargetRowsUpdated"], metrics["numTargetRowsInserted"]) == (1, 1)
    assert _rows(folder) == [{"id": 1, "v": "a"}, {"id": 2, "v": "B"}, {"id": 3, "v": "c"}]
    table = DeltaTable.forPath(spark, relative)
    assert sorted(r["id"] for r in table.toDF().collect()) == [1, 2, 3]
    with pytest.raises(DeltaTableError, match="path contains `#`"):  # a delta-rs limitation, said plainly
        table.history()
    # the data files are where the log says, inside the awkwardly named folder
    on_disk = {os.path.relpath(os.path.join(root, n), folder) for root, _, names in os.walk(folder)
               for n in names if n.endswith(".parquet")}
    live = {os.path.relpath(unquote(uri.removeprefix("file://")), folder)
            for uri in deltalake.DeltaTable(str(folder)).file_uris()}
    assert live <= on_disk and live


def test_history_through_a_file_uri_with_spaces_and_non_ascii(spark: SparkSession, tmp_path: Path) -> None:
    folder = tmp_path / "a b é" / "t"
    DeltaTable.createFromDataFrame(spark.createDataFrame([(1, "a")], "id long, v string"), f"file://{folder}")
    source = spark.createDataFrame([(1, "b")], "id long, v string")
    DeltaTable.forPath(spark, str(folder)).alias("t").merge(source.alias("s"), "t.id = s.id") \
        .whenMatchedUpdateAll().execute()
    assert [h["operation"] for h in DeltaTable.forPath(spark, f"file:{folder}").history()] == [
        "MERGE", "CREATE TABLE"]


def test_partitioned_sink_on_a_file_uri_with_tombstones_beside_it(spark: SparkSession, tmp_path: Path) -> None:
    target = tmp_path / AWKWARD / "orders"
    sink = MergeSink(f"file://{target}", keys="id", sequence_by="seq", delete_when="op = 'd'",
                     partition_by=["region"], app_id="orders-sink", dead_letter=f"file://{tmp_path / AWKWARD / 'dead'}")
    schema = "id long, seq long, op string, region string, v string"
    sink(spark.createDataFrame([(1, 1, "c", "eu", "a"), (2, 1, "c", "us", "b"), (None, 1, "c", "eu", "x")], schema), 0)
    sink(spark.createDataFrame([(1, 2, "d", "eu", None), (2, 2, "u", "us", "B"), (1, 1, "c", "eu", "late")],
                               schema), 1)
    assert sink.target == f"file:{target}"
    assert [(r["id"], r["v"]) for r in _rows(target)] == [(2, "B")]
    tombstones = deltalake.DeltaTable(f"{target}_tombstones").to_pyarrow_table().to_pylist()
    assert [(r["id"], r["seq"]) for r in tombstones] == [(1, 2)]
    dead = deltalake.DeltaTable(str(tmp_path / AWKWARD / "dead")).to_pyarrow_table().to_pylist()
    assert len(dead) == 1 and "NULL in key" in dead[0]["reason"]
    assert deltalake.DeltaTable(str(target)).metadata().partition_columns == ["region"]


def test_storage_options_come_from_the_sessions_hadoop_settings_and_explicit_ones_win(
        spark: SparkSession) -> None:
    conf = spark._jsc.hadoopConfiguration()
    keys = {"fs.s3a.access.key": "AK", "fs.s3a.secret.key": "SK", "fs.s3a.endpoint": "http://minio:9000"}
    for key, value in keys.items():
        conf.set(key, value)
    try:
        derived = storage_options_for("s3a://lake/t", hadoop_getter(spark))
    finally:
        for key in keys:
            conf.unset(key)
    assert derived == {"AWS_ACCESS_KEY_ID": "AK", "AWS_SECRET_ACCESS_KEY": "SK",
                       "AWS_ENDPOINT_URL": "http://minio:9000", "AWS_ALLOW_HTTP": "true"}
    table = DeltaTable(spark, "/lake/t", storage_options={"AWS_REGION": "eu-west-1"})
    assert table.location.options == {"AWS_REGION": "eu-west-1"}


def test_a_scheme_without_a_connector_is_a_clear_error(spark: SparkSession) -> None:
    with pytest.raises(ValueError, match=r"Spark cannot reach the table location `s3a://bucket/t`.*hadoop-aws"):
        DeltaTable.forPath(spark, "s3a://bucket/t")


def test_a_folder_name_delta_rs_would_misread_is_refused(spark: SparkSession, tmp_path: Path) -> None:
    """delta-rs decodes a literal ``%20`` in a table folder's name a second time (it then looks
    for the files under ``a b``): refused before anything is written, naming the problem."""
    with pytest.raises(ValueError, match=r"`%20`.*delta-rs"):
        DeltaTable.createFromDataFrame(spark.range(1), str(tmp_path / "a%20b"))
    assert not (tmp_path / "a%20b").exists()


def test_an_empty_write_leaves_no_folder_behind(spark: SparkSession, tmp_path: Path) -> None:
    """Spark writes one empty file for an empty DataFrame; it is not committed, and neither it
    nor its write folder stays in the table."""
    DeltaTable.createFromDataFrame(spark.range(0), str(tmp_path / "empty"))
    assert sorted(os.listdir(tmp_path / "empty")) == ["_delta_log"]
    assert deltalake.DeltaTable(str(tmp_path / "empty")).to_pyarrow_table().num_rows == 0
