"""Delta ⇄ Spark schema conversion and schema evolution.

Delta's ``schemaString`` is, by the protocol's design, Spark's ``StructType`` JSON, so
the conversion is a JSON round trip rather than a hand-written type mapping.
"""

from __future__ import annotations

import json

from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    MapType,
    NullType,
    StructField,
    StructType,
    TimestampType,
)

from streaming_merge.errors import DeltaTableError

_UNSUPPORTED_PARTITION_TYPES = (TimestampType, BinaryType, ArrayType, MapType, StructType, NullType)


def delta_json_to_spark(schema_json: str) -> StructType:
    """Spark schema of a Delta schema string."""
    return StructType.fromJson(json.loads(schema_json))


def spark_to_delta_json(schema: StructType) -> str:
    """Delta schema string for a Spark schema; every column nullable, as Delta writers do
    for MERGE targets (NOT NULL would be a constraint we do not enforce)."""
    return json.dumps(_nullable(schema).jsonValue())


def _nullable(data_type: DataType) -> DataType:
    if isinstance(data_type, StructType):
        return StructType([StructField(f.name, _nullable(f.dataType), True, {}) for f in data_type.fields])
    if isinstance(data_type, ArrayType):
        return ArrayType(_nullable(data_type.elementType), True)
    if isinstance(data_type, MapType):
        return MapType(_nullable(data_type.keyType), _nullable(data_type.valueType), True)
    return data_type


def check_partition_columns(schema: StructType, partition_columns: list[str]) -> None:
    """Refuse partition columns we cannot write faithfully.

    Spark renders timestamp partition values in the session time zone when it names the
    directories, so their log values would depend on a setting; we refuse rather than guess.
    """
    by_name = {f.name: f for f in schema.fields}
    for name in partition_columns:
        if name not in by_name:
            raise DeltaTableError(
                f"Partition column `{name}` is not in the schema; columns are {schema.fieldNames()}."
            )
        data_type = by_name[name].dataType
        if isinstance(data_type, _UNSUPPORTED_PARTITION_TYPES):
            raise DeltaTableError(
                f"Partition column `{name}` has type {data_type.simpleString()}, which streaming_merge "
                "cannot partition by; use a string, integral, decimal, boolean or date column."
            )
    if len(partition_columns) == len(schema.fields):
        raise DeltaTableError("A Delta table needs at least one column that is not a partition column.")


def data_columns(schema: StructType, partition_columns: list[str]) -> StructType:
    """The columns stored inside the Parquet files (Delta keeps partition values in the log)."""
    return StructType([f for f in schema.fields if f.name not in partition_columns])


INTERNAL_PREFIX = "__sm_"  # our helper columns (delete flags, row ids) never become table columns


def evolve(target: StructType, source: StructType) -> StructType:
    """Target schema with the source's new top-level columns appended (Delta's MERGE schema
    evolution for ``*`` clauses); column names compare case-insensitively as in Spark. Columns
    named with ``INTERNAL_PREFIX`` are helper columns of our own callers (MergeSink's delete
    flag ``__sm_is_delete__``, which its clauses read) and are never added; a table that
    already has such a column keeps it."""
    known = {f.name.lower() for f in target.fields}
    added = [
        StructField(f.name, _nullable(f.dataType), True, {})
        for f in source.fields
        if f.name.lower() not in known and not f.name.startswith(INTERNAL_PREFIX)
    ]
    return StructType(list(target.fields) + added)

