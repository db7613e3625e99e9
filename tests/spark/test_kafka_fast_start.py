"""What the Kafka job does ahead of its first batch while its query starts (jobs.kafka_cdc_ingest's
_prepare_first_batch): no records read by an executor Python worker (kafka.source.warm_up_records)
and decoded, and the decode plan built before the first batch (debezium.prepare_decode)."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest
from pyspark import SparkConf
from pyspark.sql import SparkSession
from pyspark.sql.types import StructType

from streaming_merge.kafka import debezium, source
from streaming_merge.spark import python_sources


def test_warm_up_records_are_no_records_of_the_sources_columns_once_per_context(
        spark: SparkSession, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(source, "_warmed_up", set())
    records = source.warm_up_records(spark)
    assert records is not None
    assert records.schema == StructType.fromDDL(source.SCHEMA)
    row_schema = StructType.fromDDL("id long, v string")
    decoded = debezium.decode_batch(records, row_schema, keys=["id"])
    try:
        assert (decoded.num_records, decoded.num_malformed, decoded.events.count()) == (0, 0, 0)
    finally:
        decoded.release()
    assert source.warm_up_records(spark) is None, "the worker is readied once per SparkContext"


def test_the_decode_plan_prepared_ahead_is_the_one_the_first_batch_uses(
        spark: SparkSession, monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[StructType] = []
    stage = debezium._stage

    def counted(row_schema: StructType, *args: object) -> object:
        built.append(row_schema)
        return stage(row_schema, *args)

    monkeypatch.setattr(debezium, "_stage", counted)
    row_schema = StructType.fromDDL("id long, v string, prepared_ahead int")
    debezium.prepare_decode(spark, row_schema, keys=["id"])
    assert built == [row_schema]
    value = b'{"op": "c", "after": {"id": 1, "v": "a", "prepared_ahead": 7}, "source": {"lsn": 3}}'
    records = spark.createDataFrame([(b"1", value, "t", 0, 0, None, 0, [])], source.SCHEMA)
    decoded = debezium.decode_batch(records, row_schema, keys=["id"])
    try:
        assert [(r["id"], r["v"], r["prepared_ahead"]) for r in decoded.events.collect()] == [(1, "a", 7)]
    finally:
        decoded.release()
    assert built == [row_schema], "the first batch reused the prepared plan"


def test_registering_a_source_answers_sparks_search_for_installed_sources_from_the_driver(
        spark: SparkSession) -> None:
    """The search would start a Python process of its own; with this interpreter and no
    ``pyspark_*`` module on its path it finds nothing, so the driver says so (and the source
    still registers and reads)."""
    assert python_sources._lookup_would_find_nothing(spark), \
        "the test session runs this interpreter (tests/conftest.py) with no pyspark_* module"
    manager = python_sources._manager(spark)
    getattr(manager, "dataSourceBuilders_$eq")(spark._jvm.scala.Option.empty())  # as in a new JVM
    python_sources.register_data_source(spark, source.KafkaDataSource)
    assert manager.dataSourceBuilders().isDefined()
    assert manager.dataSourceBuilders().get().isEmpty()
    assert spark._jsparkSession.sessionState().dataSourceManager().dataSourceExists(source.SHORT_NAME)


def test_sparks_search_runs_as_usual_when_it_could_find_an_installed_source(
        spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "pyspark_installed_elsewhere.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert not python_sources._lookup_would_find_nothing(spark)
    monkeypatch.undo()
    monkeypatch.setattr(python_sources, "_same_interpreter", lambda command: False)
    assert not python_sources._lookup_would_find_nothing(spark), "another interpreter may see other modules"


def test_sparks_search_runs_as_usual_when_a_python_file_for_the_workers_could_hold_a_source(
        spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--packages`` lists its jars in ``spark.submit.pyFiles``: local archives without a
    ``pyspark_*`` module keep the answer, one with such a module or a remote file does not."""
    plain, installed = tmp_path / "plain.jar", tmp_path / "installed.zip"
    with zipfile.ZipFile(plain, "w") as archive:
        archive.writestr("io/delta/Some.class", b"")
    with zipfile.ZipFile(installed, "w") as archive:
        archive.writestr("pyspark_in_an_archive.py", "")
    real_conf = spark.sparkContext.getConf()

    def with_py_files(py_files: str) -> bool:
        conf = SparkConf(loadDefaults=False).setAll(real_conf.getAll()).set("spark.submit.pyFiles", py_files)
        monkeypatch.setattr(spark.sparkContext, "getConf", lambda: conf)
        return python_sources._lookup_would_find_nothing(spark)

    assert with_py_files(f"file://{plain}")
    assert not with_py_files(f"{plain},{installed}")
    assert not with_py_files(f"{plain},hdfs://namenode/libs/unlisted.zip")
