"""The parts of ``streaming_merge.table`` that need no JVM: footer stats, partition value
strings, schema helpers, and ``check_writable`` on tables made by delta-rs.

Why: the Spark tests write through Spark, which only produces the layouts Spark likes. Here the
Parquet footers come from pyarrow (several row groups, all-NULL columns, years before 1000) and the
tables from delta-rs with the features a user's table may carry, so each rule is pinned exactly.
"""

from __future__ import annotations

import datetime as dt
import json
import os
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, TableFeatures, write_deltalake
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from streaming_merge.errors import DeltaTableError, NotADeltaTableError, UnsupportedTableFeatureError
from streaming_merge.table.schema import (
    check_partition_columns,
    data_columns,
    delta_json_to_spark,
    evolve,
    spark_to_delta_json,
)
from streaming_merge.table.snapshot import check_readable, check_writable, load_snapshot
from streaming_merge.table.write import footer_stats, partition_value_string

UTC = dt.UTC

# ---------------------------------------------------------------------------------------------
# footer_stats
# ---------------------------------------------------------------------------------------------

_INNER = pa.struct([pa.field("x", pa.string()), pa.field("y", pa.date32())])
_ARROW_SCHEMA = pa.schema([
    pa.field("id", pa.int64()),
    pa.field("ts", pa.timestamp("us", tz="UTC")),
    pa.field("tsn", pa.timestamp("us")),
    pa.field("d", pa.date32()),
    pa.field("code", pa.string()),
    pa.field("long_s", pa.string()),
    pa.field("flag", pa.bool_()),
    pa.field("dbl", pa.float64()),
    pa.field("dec", pa.decimal128(10, 2)),
    pa.field("bin", pa.binary()),
    pa.field("st", pa.struct([pa.field("a", pa.int32()), pa.field("inner", _INNER)])),
    pa.field("nothing", pa.int32()),
])
_SPARK_SCHEMA = StructType([
    StructField("id", LongType()),
    StructField("ts", TimestampType()),
    StructField("tsn", TimestampNTZType()),
    StructField("d", DateType()),
    StructField("code", StringType()),
    StructField("long_s", StringType()),
    StructField("flag", BooleanType()),
    StructField("dbl", DoubleType()),
    StructField("dec", DecimalType(10, 2)),
    StructField("bin", BinaryType()),
    StructField("st", StructType([
        StructField("a", IntegerType()),
        StructField("inner", StructType([StructField("x", StringType()), StructField("y", DateType())])),
    ])),
    StructField("nothing", IntegerType()),
    StructField("p", StringType()),  # a partition column: never in the file, never in the stats
])
_ROWS: list[dict[str, Any]] = [
    {"id": 5, "ts": dt.datetime(2024, 1, 1, 12, 0, 0, 123456, tzinfo=UTC),
     "tsn": dt.datetime(999, 6, 15, 12, 30),
     "d": dt.date(2024, 2, 29), "code": "日本", "long_s": "a", "flag": True, "dbl": float("nan"),
     "dec": Decimal("1.50"), "bin": b"\x00", "st": {"a": 7, "inner": {"x": "m", "y": dt.date(1900, 1, 1)}},
     "nothing": None},
    {"id": -3, "ts": dt.datetime(1, 1, 1, tzinfo=UTC), "tsn": None, "d": dt.date(1, 1, 1), "code": "",
     "long_s": "z" * 33, "flag": False, "dbl": 1.0, "dec": None, "bin": None, "st": None, "nothing": None},
    # second row group
    {"id": 9, "ts": dt.datetime(999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
     "tsn": dt.datetime(9999, 12, 31, 23, 59, 59, 999999), "d": None, "code": "Ωmega", "long_s": None,
     "flag": None, "dbl": None, "dec": Decimal("-2.00"), "bin": b"\xff",
     "st": {"a": None, "inner": None}, "nothing": None},
    {"id": 0, "ts": None, "tsn": dt.datetime(1969, 12, 31, 23, 59, 59), "d": dt.date(9999, 12, 31),
     "code": "a" * 32, "long_s": "b", "flag": True, "dbl": -0.0, "dec": Decimal("0.00"), "bin": b"",
     "st": {"a": -1, "inner": {"x": None, "y": dt.date(2000, 1, 1)}}, "nothing": None},
]


def test_footer_stats_match_the_data_across_row_groups(tmp_path: Path) -> None:
    """numRecords, nullCount for every leaf, min/max only where exact and Spark-ordered; years
    below 1000 keep four digits (glibc's strftime would write ``999-...``, which no reader parses)."""
    file = tmp_path / "f.parquet"
    pq.write_table(pa.Table.from_pylist(_ROWS, schema=_ARROW_SCHEMA), file, row_group_size=2)
    metadata = pq.read_metadata(file)
    assert metadata.num_row_groups == 2

    stats = json.loads(footer_stats(metadata, _SPARK_SCHEMA, ["p"]))

    assert stats == {
        "numRecords": 4,
        "minValues": {
            "id": -3,
            "ts": "0001-01-01T00:00:00.000000Z",
            "tsn": "0999-06-15T12:30:00.000000",
            "d": "0001-01-01",
            "code": "",
            "flag": False,
            "st": {"a": -1, "inner": {"x": "m", "y": "1900-01-01"}},
        },
        "maxValues": {
            "id": 9,
            "ts": "2024-01-01T12:00:00.123456Z",
            "tsn": "9999-12-31T23:59:59.999999",
            "d": "9999-12-31",
            "code": "日本",  # code point order: 'a' < 'Ω' (U+03A9) < '日' (U+65E5)
            "flag": True,
            "st": {"a": 7, "inner": {"x": "m", "y": "2000-01-01"}},
        },
        # a NULL struct makes each of its leaves NULL, as Delta counts them
        "nullCount": {
            "id": 0, "ts": 1, "tsn": 1, "d": 1, "code": 0, "long_s": 1, "flag": 1, "dbl": 1, "dec": 1,
            "bin": 1, "st": {"a": 2, "inner": {"x": 3, "y": 2}}, "nothing": 4,
        },
    }


def test_footer_stats_keep_a_string_of_exactly_32_characters(tmp_path: Path) -> None:
    file = tmp_path / "f.parquet"
    pq.write_table(pa.table({"s": ["é" * 32, "a"]}), file)
    stats = json.loads(footer_stats(pq.read_metadata(file), StructType([StructField("s", StringType())]), []))
    assert stats["minValues"] == {"s": "a"} and stats["maxValues"] == {"s": "é" * 32}


# ---------------------------------------------------------------------------------------------
# partition_value_string (the partitionValues of our remove actions)
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, None),
        (True, "true"),
        (False, "false"),
        (0, "0"),
        (-42, "-42"),
        ("a/b=c %", "a/b=c %"),
        ("", ""),
        (dt.date(1, 1, 1), "0001-01-01"),
        (dt.date(2024, 2, 29), "2024-02-29"),
        (dt.datetime(999, 1, 1), "0999-01-01 00:00:00.000000"),
        (dt.datetime(2024, 1, 1, 12, 0, 0, 123456), "2024-01-01 12:00:00.123456"),
        (Decimal("0E-18"), "0.000000000000000000"),  # delta-rs hands zero of scale 18 back like this
        (Decimal("12.500000000000000000"), "12.500000000000000000"),
        (Decimal("-1.50"), "-1.50"),
    ],
)
def test_partition_value_string_is_deltas_serialization(value: Any, expected: str | None) -> None:
    assert partition_value_string(value) == expected


# ---------------------------------------------------------------------------------------------
# schema helpers
# ---------------------------------------------------------------------------------------------

_NESTED = StructType([
    StructField("id", LongType(), False),
    StructField("st", StructType([StructField("a", IntegerType(), False)]), False),
    StructField("arr", ArrayType(StructType([StructField("k", StringType(), False)]), False)),
    StructField("m", MapType(StringType(), LongType(), False)),
])


def test_delta_schema_json_round_trips_and_is_all_nullable() -> None:
    delta_json = spark_to_delta_json(_NESTED)
    back = delta_json_to_spark(delta_json)
    assert back == StructType([
        StructField("id", LongType(), True),
        StructField("st", StructType([StructField("a", IntegerType(), True)]), True),
        StructField("arr", ArrayType(StructType([StructField("k", StringType(), True)]), True), True),
        StructField("m", MapType(StringType(), LongType(), True), True),
    ])
    assert delta_json_to_spark(_NESTED.json()) == _NESTED


@pytest.mark.parametrize(
    ("data_type", "allowed"),
    [
        (StringType(), True),
        (IntegerType(), True),
        (LongType(), True),
        (DateType(), True),
        (BooleanType(), True),
        (DecimalType(10, 2), True),
        (TimestampType(), False),
        (BinaryType(), False),
        (ArrayType(IntegerType()), False),
        (StructType([StructField("a", IntegerType())]), False),
    ],
)
def test_check_partition_columns_by_type(data_type: DataType, allowed: bool) -> None:
    schema = StructType([StructField("id", LongType()), StructField("part_col", data_type)])
    if allowed:
        check_partition_columns(schema, ["part_col"])
    else:
        with pytest.raises(DeltaTableError, match="`part_col`"):
            check_partition_columns(schema, ["part_col"])


def test_check_partition_columns_refuses_unknown_and_all_columns() -> None:
    schema = StructType([StructField("id", LongType()), StructField("p", StringType())])
    with pytest.raises(DeltaTableError, match="`nope`"):
        check_partition_columns(schema, ["nope"])
    with pytest.raises(DeltaTableError, match="at least one column"):
        check_partition_columns(schema, ["id", "p"])


def test_data_columns_and_evolve() -> None:
    target = StructType([StructField("id", LongType()), StructField("p", StringType())])
    assert data_columns(target, ["p"]) == StructType([StructField("id", LongType())])
    source = StructType([
        StructField("ID", LongType(), False),
        StructField("extra", StructType([StructField("x", IntegerType(), False)]), False),
    ])
    assert evolve(target, source) == StructType([
        *target.fields,
        StructField("extra", StructType([StructField("x", IntegerType(), True)]), True),
    ])


# ---------------------------------------------------------------------------------------------
# load_snapshot / check_writable on tables written by delta-rs
# ---------------------------------------------------------------------------------------------

_DATA = pa.table({"id": pa.array([1, 2], pa.int64()), "v": ["a", "b"]})


def _delta_rs_table(path: Path, data: pa.Table = _DATA, **kwargs: Any) -> str:
    write_deltalake(str(path), data, **kwargs)
    return str(path)


def _with_protocol(path: Path, protocol: dict[str, Any]) -> str:
    """A table whose next commit is a protocol upgrade by some newer writer. Hand-written log JSON is
    test data only: it stands for a writer delta-rs cannot imitate."""
    table = _delta_rs_table(path)
    with open(os.path.join(table, "_delta_log", f"{1:020d}.json"), "w") as log:
        log.write(json.dumps({"commitInfo": {"timestamp": 1, "operation": "UPGRADE PROTOCOL"}}) + "\n")
        log.write(json.dumps({"protocol": protocol}) + "\n")
    return table


def _refused(path: str) -> str:
    with pytest.raises(UnsupportedTableFeatureError) as info:
        check_writable(load_snapshot(path))
    assert path in str(info.value)
    return str(info.value)


@pytest.mark.parametrize(
    ("configuration", "named"),
    [
        ({"delta.columnMapping.mode": "name"}, "delta.columnMapping.mode=name"),
        ({"delta.columnMapping.mode": "id"}, "delta.columnMapping.mode=id"),
    ],
)
def test_check_writable_refuses_configured_features(tmp_path: Path, configuration: dict[str, str],
                                                    named: str) -> None:
    table = _delta_rs_table(tmp_path / "t", configuration=configuration)
    assert named in _refused(table)
    # and to read: its files name columns by physical names, and a read by logical names gives NULLs
    with pytest.raises(UnsupportedTableFeatureError, match=f"{named}.*physical names"):
        check_readable(load_snapshot(table))


def test_check_writable_refuses_check_constraints(tmp_path: Path) -> None:
    table = _delta_rs_table(tmp_path / "t")
    DeltaTable(table).alter.add_constraint({"positive_id": "id > 0"})
    assert "delta.constraints.positive_id" in _refused(table)


@pytest.mark.parametrize(
    "feature", ["ColumnMapping", "DomainMetadata", "IdentityColumns", "RowTracking", "V2Checkpoint"],
)
def test_check_writable_refuses_table_features(tmp_path: Path, feature: str) -> None:
    table = _delta_rs_table(tmp_path / "t")
    DeltaTable(table).alter.add_feature(getattr(TableFeatures, feature),
                                        allow_protocol_versions_increase=True)
    protocol_name = feature[0].lower() + feature[1:]
    assert protocol_name in _refused(table)


@pytest.mark.parametrize("feature", ["ChangeDataFeed", "CheckConstraints", "GeneratedColumns"])
def test_check_writable_accepts_features_we_keep_or_that_ask_nothing_while_unused(tmp_path: Path,
                                                                                 feature: str) -> None:
    """changeDataFeed we honour (change rows when the property is on); checkConstraints and
    generatedColumns come with writer version 4 and ask nothing until a constraint or a generated
    column exists, which check_writable refuses on its own."""
    table = _delta_rs_table(tmp_path / "t")
    DeltaTable(table).alter.add_feature(getattr(TableFeatures, feature),
                                        allow_protocol_versions_increase=True)
    check_writable(load_snapshot(table))


def test_check_writable_accepts_a_delta_rs_deletion_vector_table(tmp_path: Path) -> None:
    """delta-rs gives a DV table the features deletionVectors, variantType, invariants and
    appendOnly; none asks anything of us while no column uses it, so MERGE may write there."""
    table = _delta_rs_table(tmp_path / "t", configuration={"delta.enableDeletionVectors": "true"})
    snapshot = load_snapshot(table)
    assert {"deletionVectors", "variantType"} <= set(snapshot.protocol.writer_features)
    check_writable(snapshot)
    assert snapshot.writes_deletion_vectors


def test_check_writable_refuses_generated_and_nested_invariant_columns(tmp_path: Path) -> None:
    generated = pa.schema([pa.field("id", pa.int64()),
                           pa.field("twice", pa.int64(), metadata={"delta.generationExpression": "id * 2"})])
    table = _delta_rs_table(tmp_path / "gen", pa.table({"id": [1], "twice": [2]}, schema=generated))
    message = _refused(table)
    assert "`twice`" in message and "delta.generationExpression" in message

    invariant = {"delta.invariants": json.dumps({"expression": {"expression": "st.a > 0"}})}
    nested = pa.schema([pa.field("id", pa.int64()),
                        pa.field("st", pa.struct([pa.field("a", pa.int64(), metadata=invariant)]))])
    table = _delta_rs_table(tmp_path / "inv", pa.table({"id": [1], "st": [{"a": 1}]}, schema=nested))
    message = _refused(table)
    assert "`st.a`" in message and "delta.invariants" in message


@pytest.mark.parametrize(
    ("protocol", "named"),
    [
        ({"minReaderVersion": 1, "minWriterVersion": 7, "writerFeatures": ["someFutureWriterFeature"]},
         "someFutureWriterFeature"),
        ({"minReaderVersion": 3, "minWriterVersion": 7, "readerFeatures": ["someFutureFeature"],
          "writerFeatures": ["someFutureFeature"]}, "someFutureFeature"),
        ({"minReaderVersion": 4, "minWriterVersion": 8}, "reader version 4"),
    ],
)
def test_unknown_features_and_newer_protocols_are_refused(tmp_path: Path, protocol: dict[str, Any],
                                                          named: str) -> None:
    """An unknown reader feature or reader version makes delta-rs refuse to open the table; that
    refusal reaches the caller as UnsupportedTableFeatureError too, not as a generic log error."""
    assert named in _refused(_with_protocol(tmp_path / "t", protocol))


def test_check_writable_accepts_plain_and_harmless_features(tmp_path: Path) -> None:
    not_null = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("v", pa.string())])
    tables = [
        _delta_rs_table(tmp_path / "plain"),
        _delta_rs_table(tmp_path / "append_only", configuration={"delta.appendOnly": "true"}),
        _delta_rs_table(tmp_path / "cdf_off", configuration={"delta.enableChangeDataFeed": "false"}),
        # NOT NULL is enforced by write_files, so it is no reason to refuse
        _delta_rs_table(tmp_path / "not_null", _DATA.cast(not_null)),
    ]
    ntz = _delta_rs_table(tmp_path / "ntz")
    DeltaTable(ntz).alter.add_feature(TableFeatures.TimestampWithoutTimezone,
                                      allow_protocol_versions_increase=True)
    for table in [*tables, ntz]:
        check_writable(load_snapshot(table))
    assert load_snapshot(tables[-1]).schema["id"].nullable is False


def test_missing_table_is_not_a_delta_table(tmp_path: Path) -> None:
    for path in (tmp_path / "absent", tmp_path):
        with pytest.raises(NotADeltaTableError) as info:
            load_snapshot(str(path))
        assert str(path) in str(info.value)


def test_snapshot_of_a_delta_rs_table(tmp_path: Path) -> None:
    data = pa.table({"id": pa.array([1, 2, 3], pa.int64()), "p": ["a/b", None, "a/b"], "v": ["x", "y", "z"]})
    table = _delta_rs_table(tmp_path / "t", data, partition_by=["p"])
    snapshot = load_snapshot(table)
    assert snapshot.version == 0
    assert snapshot.partition_columns == ["p"]
    assert snapshot.schema.fieldNames() == ["id", "p", "v"]
    layout = sorted((f.partition_values["p"] or "", f.num_records) for f in snapshot.files)
    assert layout == [("", 1), ("a/b", 2)]
    for file in snapshot.files:  # decoded relative paths that exist on disk
        assert os.path.isfile(snapshot.absolute_path(file.path).removeprefix("file:")), file.path
        assert os.path.getsize(snapshot.absolute_path(file.path).removeprefix("file:")) == file.size
    assert snapshot.num_bytes == sum(f.size for f in snapshot.files)
    assert snapshot.transaction_version("nobody") is None
