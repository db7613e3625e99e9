"""AUTO CDC parity: PySpark Columns as keys, column lists and sequence (as Spark's
create_auto_cdc_flow takes them), ``create_auto_cdc_flow`` starting a streaming query, and
Databricks' documented SCD 1 / SCD 2 examples (the ``cdc_data.users`` change feed) run through
it unchanged apart from the import and the target path, giving the documented tables."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import deltalake
import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.functions import col, expr

import streaming_merge as dp  # the documented code says `from pyspark import pipelines as dp`
from streaming_merge import MergeSink, create_auto_cdc_flow
from streaming_merge.streaming.arguments import sequence_columns
from streaming_merge.streaming.sequence_layout import CDC_METADATA
from tests.spark.test_sink import frame
from tests.spark.test_sink_history import e

# The documented change feed (Databricks, "The AUTO CDC APIs": Example: SCD type 1 and SCD
# type 2 processing with CDF source data), the optional TRUNCATE row apart.
USERS = [(124, "Raul", "Oaxaca", "INSERT", 1), (123, "Isabel", "Monterrey", "INSERT", 1),
         (125, "Mercedes", "Tijuana", "INSERT", 2), (126, "Lily", "Cancun", "INSERT", 2),
         (123, None, None, "DELETE", 6), (125, "Mercedes", "Guadalajara", "UPDATE", 6),
         (125, "Mercedes", "Mexicali", "UPDATE", 5), (123, "Isabel", "Chihuahua", "UPDATE", 5)]
TRUNCATE = (None, None, None, "TRUNCATE", 3)  # "Uncomment to test TRUNCATE"
USERS_SCHEMA = "userId int, name string, city string, operation string, sequenceNum int"


def users_view(spark: SparkSession, folder: Path, rows: list[tuple[Any, ...]]) -> None:
    """``users``, a streaming view of the change feed (the documented ``@dp.view def users()``)."""
    folder.mkdir()
    names = [f.split()[0] for f in USERS_SCHEMA.split(", ")]
    (folder / "part-0.json").write_text("\n".join(json.dumps(dict(zip(names, row, strict=True))) for row in rows))
    spark.readStream.schema(USERS_SCHEMA).json(str(folder)).createOrReplaceTempView("users")


def table(path: str) -> list[dict[str, Any]]:
    def order(row: dict[str, Any]) -> tuple[Any, ...]:
        return row["userId"], row.get("__START_AT") or 0

    return sorted(deltalake.DeltaTable(path).to_pyarrow_table().to_pylist(), key=order)


def run(query: Any) -> None:
    try:
        query.processAllAvailable()
    finally:
        query.stop()


@pytest.mark.parametrize("with_truncate", [False, True])
def test_databricks_scd1_example(spark: SparkSession, tmp_path: Path, with_truncate: bool) -> None:
    users_view(spark, tmp_path / "cdc", [*USERS, *([TRUNCATE] if with_truncate else [])])
    target = str(tmp_path / "users_current")
    query = dp.create_auto_cdc_flow(
      target = target,
      source = "users",
      keys = ["userId"],
      sequence_by = col("sequenceNum"),
      apply_as_deletes = expr("operation = 'DELETE'"),
      apply_as_truncates = expr("operation = 'TRUNCATE'"),
      except_column_list = ["operation", "sequenceNum"],
      stored_as_scd_type = 1
    )
    run(query)
    documented = [{"userId": 125, "name": "Mercedes", "city": "Guadalajara"}] if with_truncate else [
        {"userId": 124, "name": "Raul", "city": "Oaxaca"},
        {"userId": 125, "name": "Mercedes", "city": "Guadalajara"},
        {"userId": 126, "name": "Lily", "city": "Cancun"}]
    rows = table(target)
    # Databricks keeps its bookkeeping out of sight; here it is the reserved metadata column.
    assert [{c: r[c] for c in ("userId", "name", "city")} for r in rows] == documented
    assert [r[CDC_METADATA]["upsertSequence"] for r in rows] == ([6] if with_truncate else [1, 6, 2])


SCD2_DOCUMENTED = [
    (123, "Isabel", "Monterrey", 1, 5), (123, "Isabel", "Chihuahua", 5, 6), (124, "Raul", "Oaxaca", 1, None),
    (125, "Mercedes", "Tijuana", 2, 5), (125, "Mercedes", "Mexicali", 5, 6), (125, "Mercedes", "Guadalajara", 6, None),
    (126, "Lily", "Cancun", 2, None)]
SCD2_CITY_UNTRACKED_DOCUMENTED = [
    (123, "Isabel", "Chihuahua", 1, 6), (124, "Raul", "Oaxaca", 1, None), (125, "Mercedes", "Guadalajara", 2, None),
    (126, "Lily", "Cancun", 2, None)]


@pytest.mark.parametrize("track_city", [False, True])
def test_databricks_scd2_example(spark: SparkSession, tmp_path: Path, track_city: bool) -> None:
    users_view(spark, tmp_path / "cdc", USERS)
    target = str(tmp_path / "users_history")
    if not track_city:
        query = dp.create_auto_cdc_flow(
          target = target,
          source = "users",
          keys = ["userId"],
          sequence_by = col("sequenceNum"),
          apply_as_deletes = expr("operation = 'DELETE'"),
          except_column_list = ["operation", "sequenceNum"],
          stored_as_scd_type = "2"
        )
    else:
        query = dp.create_auto_cdc_flow(
          target = target,
          source = "users",
          keys = ["userId"],
          sequence_by = col("sequenceNum"),
          apply_as_deletes = expr("operation = 'DELETE'"),
          except_column_list = ["operation", "sequenceNum"],
          stored_as_scd_type = "2",
          track_history_except_column_list = ["city"]
        )
    run(query)
    assert deltalake.DeltaTable(target).schema().to_arrow().names == ["userId", "name", "city", "__START_AT",
                                                                       "__END_AT"]
    assert [tuple(r.values()) for r in table(target)] == (SCD2_CITY_UNTRACKED_DOCUMENTED if track_city
                                                          else SCD2_DOCUMENTED)


def test_the_flow_names_its_query_and_txn_and_takes_triggers_and_settings(spark: SparkSession,
                                                                         tmp_path: Path) -> None:
    source_folder = tmp_path / "events"
    source_folder.mkdir()
    (source_folder / "a.json").write_text('{"id": 1, "lsn": 1, "op": "c", "name": "a", "amount": 1}\n'
                                          '{"id": 2, "lsn": 1, "op": "c", "name": "b", "amount": 2}\n'
                                          '{"id": 2, "lsn": 2, "op": "d", "name": null, "amount": null}')
    events = spark.readStream.schema("id long, lsn long, op string, name string, amount long").json(
        str(source_folder))
    settings: list[str | None] = []
    target = str(tmp_path / "orders")
    query = create_auto_cdc_flow(
        events, target=target, keys=[col("id")], sequence_by=col("lsn"), apply_as_deletes=col("op") == "d",
        name="orders_flow", trigger={"availableNow": True}, spark_conf={"spark.streaming_merge.test.flow": "on"},
        phase_hook=lambda phase, df: settings.append(df.sparkSession.conf.get("spark.streaming_merge.test.flow",
                                                                              None)))
    assert query.awaitTermination(120)  # availableNow: the query stops by itself
    assert query.exception() is None
    assert query.name == "orders_flow"
    assert deltalake.DeltaTable(target).transaction_version("orders_flow") == 0  # the flow's name is the app id
    assert [(r["id"], r["name"]) for r in deltalake.DeltaTable(target).to_pyarrow_table().to_pylist()] == [(1, "a")]
    assert settings and set(settings) == {"on"}  # the stream has the setting, the session not
    assert spark.conf.get("spark.streaming_merge.test.flow", None) is None
    assert os.path.isdir(f"{target}_checkpoints/orders_flow")
    with pytest.raises(ValueError, match="needs a streaming source"):
        create_auto_cdc_flow(spark.range(1), target=target, keys="id", sequence_by="id")
    with pytest.raises(ValueError, match="not both"):
        create_auto_cdc_flow(events, target=target, keys="id", sequence_by="lsn", name="x", app_id="y")


def test_columns_name_the_same_columns_as_strings(spark: SparkSession, tmp_path: Path) -> None:
    batches = [[e(1, 1, "c", "a"), e(2, 1, "c", "b"), e(1, 2, "u", "c"), e(2, 2, "d", None, None)]]
    as_columns = MergeSink(str(tmp_path / "columns"), keys=[col("id")], sequence_by=expr("lsn"),
                           apply_as_deletes=col("op") == "d", except_column_list=[col("amount")],
                           stored_as_scd_type=2, track_history_except_column_list=[col("op")], app_id="c")
    as_strings = MergeSink(str(tmp_path / "strings"), keys=["id"], sequence_by="lsn", apply_as_deletes="op = 'd'",
                           except_column_list=["amount"], stored_as_scd_type=2,
                           track_history_except_column_list=["op"], app_id="s")
    for batch_id, batch in enumerate(batches):
        as_columns(frame(spark, batch), batch_id)
        as_strings(frame(spark, batch), batch_id)
    read = [deltalake.DeltaTable(str(tmp_path / name)).to_pyarrow_table().sort_by("id").to_pylist()
            for name in ("columns", "strings")]
    assert read[0] == read[1] and "amount" not in read[0][0]
    assert sequence_columns(F.struct("pos", "off")) == ["pos", "off"]  # Databricks' several-column sequence
    assert sequence_columns(expr("struct(pos, off)")) == ["pos", "off"]
    assert sequence_columns(col("`odd.name`")) == ["odd.name"]


@pytest.mark.parametrize(("option", "value", "message"), [  # values built once Spark runs
    ("keys", lambda: [col("t.id")], r"qualified or nested column reference \(t\.id\); pass the column identifier"),
    ("keys", lambda: [col("a")["x"]], "is not a column identifier without qualifiers"),
    ("sequence_by", lambda: col("lsn") + 1, r"is not a column identifier without qualifiers or struct\(\)"),
    ("sequence_by", lambda: F.struct(col("s.lsn")), r"qualified or nested column reference \(s\.lsn\)"),
    ("except_column_list", lambda: [F.lit(1)], "except_column_list: .* is not a column identifier"),
    ("column_list", lambda: [expr("a + 1")], "column_list: .* is not a column identifier"),
])
def test_qualified_or_complex_columns_are_refused(spark: SparkSession, tmp_path: Path, option: str,
                                                  value: Callable[[], Any], message: str) -> None:
    options: dict[str, Any] = {"keys": "id", "sequence_by": "lsn", option: value()}
    with pytest.raises(ValueError, match=message):
        MergeSink(str(tmp_path), **options)


def test_streaming_sources_by_name_or_frame(spark: SparkSession) -> None:
    from streaming_merge.streaming.auto_cdc import _streaming_frame

    stream: DataFrame = spark.readStream.format("rate").load()
    stream.createOrReplaceTempView("rates")
    assert _streaming_frame("rates").isStreaming and _streaming_frame(stream) is stream
