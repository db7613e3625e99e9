"""The multi-table job's decisions without Spark or a broker: topic → table path (Debezium's
naming and other layouts), keys from record keys (plain and schema-wrapped), Kafka Connect
schemas → Spark types, which type changes fit a table, the per-topic plan of a batch, and
the CLI's mode errors.

Why here: every batch (and every replay of one) must decide the same from the same records,
and these decisions are plain functions; the Spark and broker tests
(tests/spark/test_database_batches.py, tests/kafka/test_database_e2e.py) cover the plumbing.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
    DateType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
)

from jobs._database import DatabaseConfig, Variant, plan_topic
from jobs.kafka_cdc_ingest import IngestConfig, parse_args
from streaming_merge.kafka.logical import LOGICAL
from streaming_merge.kafka.routing import (
    TopicRouter,
    UnroutableTopicError,
    connect_row_schema,
    key_fields_of,
    type_change,
)


def connect_envelope(fields: list[tuple[str, str]], *, image: str = "after") -> dict[str, Any]:
    """A Debezium envelope schema (the ``schema`` of a schema-wrapped record)."""
    row = {"type": "struct", "optional": True, "name": "dbserver1.inventory.t.Value",
           "fields": [{"type": t, "optional": n != "id", "field": n} for n, t in fields]}
    return {"type": "struct", "name": "dbserver1.inventory.t.Envelope", "optional": False,
            "fields": [{**row, "field": image}, {"type": "string", "optional": False, "field": "op"},
                       {"type": "int64", "optional": True, "field": "ts_ms"}]}


# ------------------------------------------------------------------------------ routing


@pytest.mark.parametrize(("topic", "path"), [
    ("dbserver1.inventory.customers", "/lake/inventory/customers"),
    ("my.dotted.prefix.public.orders", "/lake/public/orders"),  # the prefix may hold dots: split from the right
    ("db-1.Sales_2024.Order-Lines", "/lake/Sales_2024/Order-Lines"),
])
def test_debezium_topic_naming(topic: str, path: str) -> None:
    assert TopicRouter.of("/lake/").route(topic) == path


@pytest.mark.parametrize("topic", ["dbserver1", "dbserver1.transaction", "__debezium-heartbeat"])
def test_topics_outside_the_naming_have_no_table(topic: str) -> None:
    with pytest.raises(UnroutableTopicError, match=f"topic '{topic}' does not match the topic regex"):
        TopicRouter.of("/lake").route(topic)


def test_other_layouts_by_regex_and_template() -> None:
    router = TopicRouter.of("s3a://bucket/lake", "{root}/{db}__{table}",
                            r"cdc_(?P<db>[a-z]+)_(?P<table>.+)")
    assert router.route("cdc_shop_order_lines") == "s3a://bucket/lake/shop__order_lines"
    assert TopicRouter.of(None, "/warehouse/{topic}", r".*").route("a.b") == "/warehouse/a.b"
    with pytest.raises(UnroutableTopicError, match=re.escape("group 'db' is '..'")):
        TopicRouter.of("/l", "{root}/{db}/{t}", r"(?P<db>[^_]+)_(?P<t>.+)").route(".._x")


@pytest.mark.parametrize(("root", "template", "regex", "message"), [
    ("/l", "{root}/{schema}/{tabel}", None, "'{tabel}' is not one of"),
    ("/l", "{root}/{table!r}", None, "'{table!r}' is not one of"),
    ("/l", "{root}/{table:>10}", None, "'{table:>10}' is not one of"),
    ("/l", "{root}/{", None, "is not a valid format string"),
    (None, "{root}/{schema}/{table}", None, "uses {root}: give --target-root"),
    ("/l", "{root}/all", None, "names no part of the topic"),
    ("/l", "{root}/{table}", "(?P<table>", "does not compile"),
])
def test_router_refuses_templates_that_cannot_route(root: str | None, template: str, regex: str | None,
                                                    message: str) -> None:
    with pytest.raises(ValueError) as failure:
        TopicRouter.of(root, template, *([regex] if regex else []))
    assert message in str(failure.value)


# ------------------------------------------------------------------------------ keys and types


@pytest.mark.parametrize(("key", "fields"), [
    (b'{"id": 1}', ["id"]),
    (b'{"warehouse": "w1", "sku": 7}', ["warehouse", "sku"]),  # document order
    (json.dumps({"schema": {"type": "struct", "fields": [{"type": "int32", "field": "id"}]},
                 "payload": {"id": 1}}).encode(), ["id"]),
    (b"1", None), (b"not json", None), (None, None), (b'"text"', None),
])
def test_key_fields_of_plain_and_wrapped_record_keys(key: bytes | None, fields: list[str] | None) -> None:
    assert key_fields_of(key) == fields


def test_connect_row_schema_maps_debezium_types() -> None:
    envelope = connect_envelope([("id", "int32"), ("small", "int16"), ("tiny", "int8"), ("big", "int64"),
                                 ("f", "float32"), ("d", "float64"), ("ok", "boolean"), ("s", "string"),
                                 ("raw", "bytes")])
    envelope["fields"][0]["fields"] += [
        {"type": "array", "items": {"type": "string"}, "field": "tags"},
        {"type": "map", "keys": {"type": "string"}, "values": {"type": "int64"}, "field": "counts"},
        {"type": "int32", "name": "io.debezium.time.Date", "field": "born"},  # logical: its Spark type
        {"type": "struct", "fields": [{"type": "bytes", "field": "wkb"}, {"type": "int32", "field": "srid"}],
         "field": "geo"}]
    assert connect_row_schema(json.dumps(envelope)) == StructType([
        StructField(n, t) for n, t in [
            ("id", IntegerType()), ("small", ShortType()), ("tiny", ByteType()), ("big", LongType()),
            ("f", FloatType()), ("d", DoubleType()), ("ok", BooleanType()),
            ("s", StringType()), ("raw", BinaryType()), ("tags", ArrayType(StringType())),
            ("counts", MapType(StringType(), LongType()))]] + [
        StructField("born", DateType(), True, {LOGICAL: "io.debezium.time.Date"}),  # the encoding kept
        StructField("geo", StructType([StructField("wkb", BinaryType()), StructField("srid", IntegerType())]))])
    # a delete-only schema has 'before'; a wrapper that is not an envelope schema has no row schema
    assert connect_row_schema(connect_envelope([("id", "int64")], image="before")) == \
        StructType([StructField("id", LongType())])
    assert connect_row_schema({"type": "struct", "name": "envelope"}) is None
    assert connect_row_schema("{not json") is None


@pytest.mark.parametrize(("table", "new", "fits"), [
    (LongType(), IntegerType(), True), (LongType(), ByteType(), True), (DoubleType(), FloatType(), True),
    (StringType(), StringType(), True),
    (StringType(), IntegerType(), False), (IntegerType(), StringType(), False), (IntegerType(), LongType(), False),
    (FloatType(), DoubleType(), False), (LongType(), DoubleType(), False),
])
def test_type_changes_that_fit_the_table(table: Any, new: Any, fits: bool) -> None:
    reason = type_change("c", table, new, "/lake/t")
    if fits:
        assert reason is None
    else:
        assert reason is not None
        assert (f"column `c` of `/lake/t` is {table.simpleString()} in the table but {new.simpleString()} in the "
                "record's Debezium schema") in reason


# ------------------------------------------------------------------------------ plan of a topic


def variant(key_fields: tuple[str, ...] | None, schema_id: int | None = None, values: int = 3, offset: int = 0,
            row: StructType | None = None) -> Variant:
    return Variant(key_fields, schema_id, values, values, (None, 0, offset), row)


ROW = StructType([StructField("id", LongType()), StructField("name", StringType())])


def test_plan_takes_keys_from_the_newest_record_key_layout() -> None:
    router = TopicRouter.of("/lake")
    old, new = variant(("id",), offset=1), variant(("tenant", "id"), offset=9)
    plan = plan_topic("db.s.t", [old, new], router, [], ROW)
    assert (plan.path, plan.keys) == ("/lake/s/t", ("tenant", "id"))
    assert plan.rejected[old].startswith("Kafka record key fields ['id'] differ from the keys ['tenant', 'id'] of "
                                         "`/lake/s/t`")
    assert "key column(s) ['tenant'] of topic 'db.s.t' are not in the row schema" in plan.rejected[new]
    same_set = variant(("id",), offset=9)
    plan = plan_topic("db.s.t", [variant(("id",), offset=1), same_set], router, [], ROW)
    assert (plan.keys, plan.rejected) == (("id",), {})
    given = plan_topic("db.s.t", [variant(None)], router, ["id"], ROW)  # --keys: record keys are not consulted
    assert (given.keys, given.rejected) == (("id",), {})


def test_plan_without_any_key_sends_the_topic_to_the_dead_letter() -> None:
    v = variant(None)
    plan = plan_topic("db.s.t", [v], TopicRouter.of("/lake"), [], ROW)
    assert plan.rejected == {v: "topic 'db.s.t' has no key columns: its Kafka record keys are not JSON objects "
                                "(a table without a primary key?); give --keys"}


def test_plan_evolves_the_schema_and_rejects_variants_that_do_not_fit() -> None:
    v1 = variant(("id",), 1, offset=1, row=StructType([StructField("id", IntegerType()),
                                                       StructField("name", StringType())]))
    v2 = variant(("id",), 2, offset=5, row=StructType([*v1.row_schema.fields,  # type: ignore[union-attr]
                                                       StructField("email", StringType())]))
    bad = variant(("id",), 3, offset=3, row=StructType([StructField("id", IntegerType()),
                                                        StructField("name", IntegerType())]))
    plan = plan_topic("db.s.t", [v1, v2, bad], TopicRouter.of("/lake"), [], ROW)
    assert plan.row_schema is not None and plan.row_schema.fieldNames() == ["id", "name", "email"]
    assert [f.name for f in plan.new_columns] == ["email"]
    assert list(plan.rejected) == [bad] and "column `name` of `/lake/s/t` is string in the table but int" in \
        plan.rejected[bad]
    assert (plan.num_accepted, plan.num_rejected) == (6, 3)
    # a new table takes the newest Debezium schema; an older variant adds its own columns
    fresh = plan_topic("db.s.t", [v1, v2], TopicRouter.of("/lake"), [], None)
    assert fresh.row_schema == v2.row_schema and fresh.new_columns == ()
    plain = plan_topic("db.s.t", [variant(("id",))], TopicRouter.of("/lake"), [], None)
    assert plain.row_schema is None, "plain envelopes of a new table: the job infers the schema"


def test_plan_takes_each_columns_wire_encoding_from_the_newest_debezium_schema() -> None:
    """A table's timestamp_ntz does not say whether it came as ms or µs: the record's schema does."""
    def ts(logical: str) -> StructField:
        return StructField("seen", TimestampNTZType(), True, {LOGICAL: logical})
    table = StructType([StructField("id", LongType()), StructField("seen", TimestampNTZType())])
    old = variant(("id",), 1, offset=1, row=StructType([StructField("id", LongType()),
                                                        ts("io.debezium.time.MicroTimestamp")]))
    new = variant(("id",), 2, offset=5, row=StructType([StructField("id", LongType()),
                                                        ts("io.debezium.time.Timestamp")]))
    plan = plan_topic("db.s.t", [old, new], TopicRouter.of("/lake"), [], table)
    assert plan.row_schema is not None and plan.row_schema["seen"].metadata == {LOGICAL: "io.debezium.time.Timestamp"}
    other = variant(("id",), 3, row=StructType([StructField("id", LongType()), StructField("seen", LongType())]))
    mismatched = plan_topic("db.s.t", [other], TopicRouter.of("/lake"), [], table)
    assert mismatched.row_schema is not None and mismatched.row_schema["seen"].metadata == {}, \
        "a rejected variant lends no encoding"


def test_plan_of_an_unroutable_topic() -> None:
    v = variant(("id",))
    plan = plan_topic("loose", [v], TopicRouter.of("/lake"), [], None)
    assert plan.path is None and "topic 'loose' does not match the topic regex" in plan.rejected[v]


# ------------------------------------------------------------------------------ CLI


BASE = ["--bootstrap-servers", "h:9092", "--checkpoint", "/chk"]


def test_cli_single_table_mode_is_unchanged() -> None:
    config, master, _ = parse_args([*BASE, "--topics", "a,b", "--target", "/t", "--keys", "id, k"])
    assert isinstance(config, IngestConfig) and (config.topics, config.keys, master) == ("a,b", ["id", "k"],
                                                                                          "local[2]")


def test_cli_database_mode() -> None:
    config, _, _ = parse_args([*BASE, "--subscribe-pattern", r"dbserver1\.inventory\..*", "--target-root", "/lake",
                               "--dead-letter", "/dl", "--available-now"])
    assert isinstance(config, DatabaseConfig)
    assert (config.subscribe_pattern, config.target_root, config.keys, config.dead_letter) == \
        (r"dbserver1\.inventory\..*", "/lake", [], "/dl")
    assert config.router().route("dbserver1.inventory.customers") == "/lake/inventory/customers"
    config, _, _ = parse_args([*BASE, "--subscribe-pattern", "cdc_.*", "--table-path-template", "/w/{db}_{t}",
                               "--topic-regex", r"cdc_(?P<db>[^_]+)_(?P<t>.+)", "--keys", "id"])
    assert isinstance(config, DatabaseConfig) and config.keys == ["id"]
    assert config.router().route("cdc_shop_items") == "/w/shop_items"


@pytest.mark.parametrize(("args", "message"), [
    ([], "give either --topics (one table: with --target and --keys) or --subscribe-pattern"),
    (["--topics", "t", "--subscribe-pattern", "t.*", "--target", "/t", "--keys", "id"], "not both"),
    (["--topics", "t", "--target-root", "/lake", "--keys", "id"],
     "--target-root routes the topics of --subscribe-pattern to their tables; with --topics give one --target"),
    (["--topics", "t", "--target", "/t"], "--topics needs --target and --keys"),
    (["--subscribe-pattern", "db.*", "--target", "/t"], "--target names one table; with --subscribe-pattern give "
                                                        "--target-root"),
    (["--subscribe-pattern", "db.*"], "uses {root}: give --target-root"),
    (["--subscribe-pattern", "db.*", "--target-root", "/l", "--row-schema", "id long"], "--row-schema is one table's"),
    (["--subscribe-pattern", "db.*", "--target-root", "/l", "--table-path-template", "{root}/{tbl}"],
     "'{tbl}' is not one of"),
])
def test_cli_mode_errors(args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        parse_args([*BASE, *args])
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err
