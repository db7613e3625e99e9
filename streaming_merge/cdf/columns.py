"""The change data feed's output columns: the table's, then Delta's three (PROTOCOL.md, "Reader
Requirements for AddCDCFile"). A module of its own so that the streaming source's workers get
the schema without importing the Spark-side reader."""

from __future__ import annotations

from pyspark.sql.types import LongType, StringType, StructField, StructType, TimestampType

__all__ = ["CDF_FIELDS", "CHANGE_TYPE", "COMMIT_TIMESTAMP", "COMMIT_VERSION", "output_schema", "table_part"]

CHANGE_TYPE = "_change_type"
COMMIT_VERSION = "_commit_version"
COMMIT_TIMESTAMP = "_commit_timestamp"
CDF_FIELDS = (
    StructField(CHANGE_TYPE, StringType()),
    StructField(COMMIT_VERSION, LongType()),
    StructField(COMMIT_TIMESTAMP, TimestampType()),
)


def output_schema(table_schema: StructType) -> StructType:
    """The table's columns in table order, then ``_change_type``, ``_commit_version`` and
    ``_commit_timestamp``."""
    return StructType([*table_schema.fields, *CDF_FIELDS])


def table_part(schema: StructType) -> StructType:
    """The table's own columns of an :func:`output_schema`."""
    return StructType(schema.fields[: len(schema.fields) - len(CDF_FIELDS)])
