"""The multi-table job's batch function (``jobs._database.DatabaseBatches``) on hand-made Kafka
records, without a broker: three tables with different key layouts in one batch, a crash
between two tables' commits and the replay, tables created when their topic appears,
columns added from a newer Debezium schema, type changes that do not fit the table in the
dead letter, and the Spark jobs a batch costs for one and for three tables.

Why here: a broker round trip costs seconds per micro-batch; what each batch decides is
cheapest to pin down on static batches (tests/kafka/test_database_e2e.py runs the real
query through a broker with a SIGKILL).
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import deltalake
import pytest
from pyspark.sql import DataFrame, SparkSession

from jobs._database import DatabaseBatches, DatabaseConfig
from streaming_merge.kafka.source import SCHEMA
from streaming_merge.spark.profile import profiling
from tests.job_count import jobs_of
from tests.streaming_support import inventory
from tests.streaming_support.inventory import change_value, record_key, table_state

PREFIX = "dbserver1.inventory"


@pytest.fixture()
def query_id(spark: SparkSession) -> Iterator[str]:
    """The batch function called directly, as Spark would inside a streaming query."""
    context = spark.sparkContext
    value = f"test-query-{uuid.uuid4().hex[:8]}"
    context.setLocalProperty("sql.streaming.queryId", value)
    yield value
    context.setLocalProperty("sql.streaming.queryId", None)  # type: ignore[arg-type]


def kafka_records(spark: SparkSession, by_topic: dict[str, list[tuple[bytes | None, bytes | None]]]) -> DataFrame:
    """One partition per topic, offsets from 0 in the given order."""
    rows = [(key, value, topic, 0, offset, None, 0, [])
            for topic, records in by_topic.items() for offset, (key, value) in enumerate(records)]
    return spark.createDataFrame(rows, SCHEMA)


def config(tmp_path: Path, **overrides: Any) -> DatabaseConfig:
    settings: dict[str, Any] = {"bootstrap_servers": "unused:9092", "subscribe_pattern": ".*",
                                "target_root": str(tmp_path / "lake"), "checkpoint": str(tmp_path / "chk"),
                                "dead_letter": str(tmp_path / "dead_letter")}
    return DatabaseConfig(**{**settings, **overrides})


def rows_of(path: str) -> list[dict[str, Any]]:
    return deltalake.DeltaTable(path).to_pyarrow_table().to_pylist()


def test_three_tables_in_one_batch_keys_from_record_keys_and_dead_letters(
        spark: SparkSession, tmp_path: Path, query_id: str) -> None:
    """Batch 0 creates three tables (keys: plain, schema-wrapped and composite record keys;
    row schemas from the Debezium schema or inferred) and dead-letters what has no table or
    no key; batches 1 and 2 (three tables, then one) count the Spark jobs of a batch: the
    fixed cost (stage the Kafka records, profile them) is paid once, each table adds its
    decode and its MergeSink batch. A crash between two tables' commits is the broker test's
    (tests/kafka/test_database_e2e.py)."""
    data = inventory.generate(events_per_table=14, keys_per_table=5, seed=3)
    by_topic: dict[str, list[tuple[bytes | None, bytes | None]]] = {
        f"{PREFIX}.{table}": list(records) for table, records in data.records.items()}
    plain = change_value("customers", "c", {"id": 9, "name": "x", "tier": 1}, 1, wrapped=False)
    by_topic["dbserver1"] = [(b"k", plain)]  # Debezium's schema-change topic: no table
    by_topic[f"{PREFIX}.audit"] = [(b"9", plain), (None, plain)]  # a table without a primary key
    cfg = config(tmp_path)
    paths = {table: f"{cfg.target_root}/inventory/{table}" for table in inventory.TABLES}
    progress: list[dict[str, Any]] = []
    run = DatabaseBatches(cfg, progress.append)
    run(kafka_records(spark, by_topic), 0)

    assert [(t["topic"], t["target"]) for t in progress[0]["tables"]] == \
        [(f"{PREFIX}.{table}", f"file:{path}") for table, path in paths.items()]
    for table, path in paths.items():
        assert table_state(rows_of(path), table) == data.expected[table], table
        assert deltalake.DeltaTable(path).transaction_version(query_id) == 0
    assert {t: run.table_keys[p] for t, p in paths.items()} == {
        "customers": ("id",), "orders": ("order_number",), "products": ("warehouse", "sku")}
    dead = rows_of(str(cfg.dead_letter))
    assert sorted((r["topic"], r["offset"], r["error"]) for r in dead) == sorted([
        *[(f"{PREFIX}.{table}", offset, "value is not a JSON Debezium envelope")
          for table, records in data.records.items() for offset, (_, v) in enumerate(records)
          if v == inventory.MALFORMED],
        ("dbserver1", 0, f"topic 'dbserver1' does not match the topic regex {cfg.topic_regex!r}, so it has no table"),
        *[(f"{PREFIX}.audit", offset, f"topic '{PREFIX}.audit' has no key columns: its Kafka record keys are not "
                                      "JSON objects (a table without a primary key?); give --keys")
          for offset in (0, 1)]])
    assert progress[0]["malformedRecords"] == len(dead)

    def updates(tables: list[str], lsn: int) -> DataFrame:
        return kafka_records(spark, {f"{PREFIX}.{table}": [
            (record_key(table, image), change_value(table, "u", image, lsn + k))
            for k, image in enumerate(inventory.row(table, k, random.Random(lsn + k)) for k in range(4))]
            for table in tables})

    jobs = {}
    for batch_id, tables in ((1, list(inventory.TABLES)), (2, ["customers"])):
        jobs[len(tables)], _ = jobs_of(spark, lambda b=batch_id, t=tables: run(updates(t, 100 * b), b))
    print(f"Spark jobs per batch: 1 table {jobs[1]}, 3 tables {jobs[3]}")
    per_table = (jobs[3] - jobs[1]) / 2
    assert jobs[1] - per_table <= 3 and per_table <= 6, jobs
    # The tables' logs were read by the batches before (each table's schema, then its sink's
    # MERGE) and are followed since: only the new commits are read.
    with profiling() as profile:
        run(updates(list(inventory.TABLES), 300), 3)
    assert (profile.log_loads, profile.log_updates > 0) == (0, True)


def wrapped_customer(op: str, row: dict[str, Any], lsn: int, columns: list[tuple[str, str]]) -> tuple[bytes, bytes]:
    return record_key("customers", row), change_value("customers", op, row, lsn, columns=columns)


def test_new_topics_create_tables_new_columns_are_added_and_misfit_types_are_dead_letters(
        spark: SparkSession, tmp_path: Path, query_id: str) -> None:
    v1 = inventory.TABLES["customers"]["columns"]  # id int, name string, tier int
    v2 = [*v1, ("email", "string")]
    misfit = [("id", "int32"), ("name", "string"), ("tier", "string")]
    narrower = [("id", "int32"), ("name", "string"), ("tier", "int8")]
    orders = {"order_number": 10_001, "customer": 1, "quantity": 2, "note": None}
    cfg = config(tmp_path)
    batches = DatabaseBatches(cfg, lambda _: None)
    batches(kafka_records(spark, {
        f"{PREFIX}.customers": [wrapped_customer("c", {"id": 1, "name": "a", "tier": 1}, 1, v1),
                                wrapped_customer("c", {"id": 2, "name": "b", "tier": 2}, 2, v1)],
        f"{PREFIX}.orders": [(record_key("orders", orders), change_value("orders", "c", orders, 3))]}), 0)
    customers, orders_path = f"{cfg.target_root}/inventory/customers", f"{cfg.target_root}/inventory/orders"
    orders_version = deltalake.DeltaTable(orders_path).version()

    progress: list[dict[str, Any]] = []
    batches._on_progress = progress.append
    product = {"warehouse": "w1", "sku": 7, "stock": 5}
    bad = wrapped_customer("u", {"id": 2, "name": "b2", "tier": "gold"}, 12, misfit)
    batches(kafka_records(spark, {
        f"{PREFIX}.customers": [wrapped_customer("u", {"id": 1, "name": "a2", "tier": 1}, 10, v1),
                                wrapped_customer("c", {"id": 3, "name": "c", "tier": 0, "email": "c@x"}, 11, v2),
                                bad,
                                wrapped_customer("c", {"id": 4, "name": "d", "tier": 3}, 13, narrower)],
        f"{PREFIX}.products": [(record_key("products", product), change_value("products", "c", product, 14))]}), 1)

    table = deltalake.DeltaTable(customers)
    assert [f.name for f in table.schema().fields][-1] == "email", "the new column is appended"
    assert {r["id"]: (r["name"], r["tier"], r["email"]) for r in rows_of(customers)} == {
        1: ("a2", 1, None), 2: ("b", 2, None), 3: ("c", 0, "c@x"), 4: ("d", 3, None)}
    assert [t["addedColumns"] for t in progress[0]["tables"] if t["topic"].endswith("customers")] == [["email"]]
    assert table_state(rows_of(f"{cfg.target_root}/inventory/products"), "products") == \
        {("w1", 7): product}, "a topic seen for the first time gets its table"
    assert deltalake.DeltaTable(orders_path).version() == orders_version, "no events, no commit"
    (dead,) = rows_of(str(cfg.dead_letter))
    assert (dead["topic"], dead["offset"], dead["value"]) == (f"{PREFIX}.customers", 2, bad[1])
    assert dead["error"] == (
        f"incompatible type change: column `tier` of `{customers}` is int in the table but string in the record's "
        "Debezium schema; change the table's type by hand (or re-create the table) and replay these records from "
        "the dead letter")
    # replaying batch 1 (a crash after the add-columns commit, say) changes nothing
    version = table.version()
    batches(kafka_records(spark, {f"{PREFIX}.customers": [
        wrapped_customer("c", {"id": 3, "name": "c", "tier": 0, "email": "c@x"}, 11, v2)]}), 1)
    assert deltalake.DeltaTable(customers).version() == version
