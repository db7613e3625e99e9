"""Debezium's logical types (Kafka Connect schema ``name``s) as Spark types, and the Spark SQL
that turns a value as Debezium's JSON converter writes it (the *wire* value) into that type.

- ``org.apache.kafka.connect.data.Decimal``: base64 of the unscaled big-endian two's
  complement, the scale a schema parameter → ``decimal(p, s)`` (p 38 when not given);
- ``io.debezium.data.VariableScaleDecimal``: ``{"scale": s, "value": base64}`` → ``decimal(38, 18)``;
- ``io.debezium.time.Date``: days since 1970-01-01 → ``date``;
- ``io.debezium.time.Timestamp`` / ``MicroTimestamp`` / ``NanoTimestamp``: ms / µs / ns since
  the epoch of a local time → ``timestamp_ntz``;
- ``io.debezium.time.ZonedTimestamp``: ISO-8601 text with offset → ``timestamp``;
- ``io.debezium.time.Time`` / ``MicroTime`` / ``NanoTime``: ms / µs / ns since midnight →
  ``bigint``, µs since midnight.

Everything else keeps its physical type (``Uuid``, ``Json``, ``Enum``, ``ZonedTime``: string;
``bytes``: binary from base64; arrays element by element).

Why these: a PostgreSQL ``timestamp`` has no time zone, so it is a ``timestamp_ntz`` (the
same wall-clock value whatever the session's zone); ``timestamptz`` is an instant. Spark's
``TIME`` type is not a Delta type, so a ``time`` is its exact µs count since midnight.

The Spark type is what a table stores, so a table's schema alone (Debezium's JSON converter
with ``schemas.enable=false``) decodes too, by Debezium's defaults (``decimal.handling.mode=
precise``, ``time.precision.mode=adaptive`` at PostgreSQL's default precision 6): a ``decimal``
column takes base64 bytes (or the variable-scale object), a ``date`` days, a ``timestamp_ntz``
µs, a ``timestamp`` an ISO text (or µs), a ``bigint`` as it comes. The envelope's schema, when
present, names the encoding exactly (field metadata ``LOGICAL``), e.g. the milliseconds of a
``timestamp(3)``. A value that does not convert (bad base64, a decimal that overflows the
column, or has more fractional digits than its scale, e.g. a ``numeric`` without precision
whose value has 19 into ``decimal(38, 18)``) makes the record's image mismatch the table: a
dead letter, never a NULL and never rounded."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    DataType,
    DateType,
    DecimalType,
    LongType,
    StringType,
    StructField,
    TimestampNTZType,
    TimestampType,
)

__all__ = ["LOGICAL", "SCALE", "from_wire", "logical_field", "needs_conversion", "wire_type"]

LOGICAL = "debezium.logical"  # StructField metadata: the Kafka Connect schema name
SCALE = "debezium.scale"  # StructField metadata: a Decimal's scale

DECIMAL = "org.apache.kafka.connect.data.Decimal"
VARIABLE_DECIMAL = "io.debezium.data.VariableScaleDecimal"
VARIABLE_DECIMAL_TYPE = DecimalType(38, 18)
_EPOCH_UNITS = {"io.debezium.time.Timestamp": "MILLISECOND", "io.debezium.time.MicroTimestamp": "MICROSECOND",
                "io.debezium.time.NanoTimestamp": "NANOSECOND", "org.apache.kafka.connect.data.Timestamp":
                "MILLISECOND"}
# µs since midnight from the wire's count
_TIME_FACTORS = {"io.debezium.time.Time": ("*", 1000), "io.debezium.time.MicroTime": ("*", 1),
                 "io.debezium.time.NanoTime": ("/", 1000), "org.apache.kafka.connect.data.Time": ("*", 1000)}
_DATES = ("io.debezium.time.Date", "org.apache.kafka.connect.data.Date")
_ZONED = "io.debezium.time.ZonedTimestamp"
_DIGITS = r"^-?[0-9]+$"


def logical_field(name: str, schema: Mapping[str, Any], physical: DataType) -> StructField:
    """The row field of one Kafka Connect field schema whose physical type is ``physical``."""
    logical = schema.get("name")
    parameters = schema.get("parameters") or {}
    data_type = physical
    metadata: dict[str, Any] = {}
    if logical == DECIMAL:
        scale = int(parameters.get("scale", 0))
        precision = int(parameters.get("connect.decimal.precision", 38))
        data_type = DecimalType(min(max(precision, scale, 1), 38), scale)
        metadata[SCALE] = scale
    elif logical == VARIABLE_DECIMAL:
        data_type = VARIABLE_DECIMAL_TYPE
    elif logical in _DATES:
        data_type = DateType()
    elif logical in _EPOCH_UNITS:
        data_type = TimestampNTZType()
    elif logical == _ZONED:
        data_type = TimestampType()
    elif logical in _TIME_FACTORS:
        data_type = LongType()
    if data_type != physical or logical in (DECIMAL, VARIABLE_DECIMAL):
        metadata[LOGICAL] = logical
    return StructField(name, data_type, True, metadata)


def needs_conversion(data_type: DataType) -> bool:
    if isinstance(data_type, ArrayType):
        return needs_conversion(data_type.elementType)
    return isinstance(data_type, DecimalType | DateType | TimestampNTZType | TimestampType)


def wire_type(field: StructField) -> DataType:
    """The type ``from_json`` reads the field's JSON value as: text for what is converted
    (a JSON number read as a string is its text), else the field's own type."""
    return _wire(field.dataType, field.metadata.get(LOGICAL))


def _wire(data_type: DataType, logical: str | None) -> DataType:
    if isinstance(data_type, ArrayType):
        return ArrayType(_wire(data_type.elementType, None), True)
    if needs_conversion(data_type):
        return StringType()
    if logical in _TIME_FACTORS:
        return LongType()
    return data_type


def from_wire(wire: Column, field: StructField) -> Column:
    """The field's value from its wire value (NULL stays NULL; a value that does not
    convert is NULL too: a non-NULL wire value with a NULL result is a mismatch)."""
    return _convert(wire, field.dataType, field.metadata.get(LOGICAL), field.metadata.get(SCALE))


def _convert(wire: Column, data_type: DataType, logical: str | None, scale: int | None) -> Column:
    if isinstance(data_type, ArrayType):
        if not needs_conversion(data_type.elementType):
            return wire
        return F.transform(wire, lambda item: _convert(item, data_type.elementType, None, None))
    if isinstance(data_type, DecimalType):
        return _decimal(wire, data_type, logical, scale)
    if isinstance(data_type, DateType):
        days = F.date_add(F.lit("1970-01-01").cast("date"), wire.cast("int"))
        return F.when(wire.rlike(_DIGITS), days).otherwise(wire.try_cast("date"))
    if isinstance(data_type, TimestampNTZType | TimestampType):
        unit = _EPOCH_UNITS.get(logical or "", "MICROSECOND")
        count = wire.cast("long")
        if unit == "NANOSECOND":  # timestampadd has no nanoseconds; PostgreSQL has none either
            unit, count = "MICROSECOND", F.floor(count / 1000).cast("long")
        epoch = "TIMESTAMP_NTZ'1970-01-01 00:00:00'" if isinstance(data_type, TimestampNTZType) else \
            "TIMESTAMP'1970-01-01 00:00:00 UTC'"
        counted = F.timestamp_add(unit, count, F.expr(epoch))
        return F.when(wire.rlike(_DIGITS), counted).otherwise(wire.try_cast(data_type))
    if logical in _TIME_FACTORS:
        operator, factor = _TIME_FACTORS[logical]
        return wire * factor if operator == "*" else F.floor(wire / factor).cast("long")
    return wire


def _decimal(wire: Column, data_type: DecimalType, logical: str | None, scale: int | None) -> Column:
    """A decimal from Debezium's base64 unscaled bytes and the scale (the column's, or the
    object's of a variable-scale decimal), built as ``<unscaled>E-<scale>`` text and cast."""
    variable = F.from_json(wire, "struct<scale: int, value: string>")
    is_variable = F.lit(logical == VARIABLE_DECIMAL) if logical else wire.startswith("{")
    raw = F.when(is_variable, variable.getField("value")).otherwise(wire)
    digits_scale = F.when(is_variable, variable.getField("scale")).otherwise(
        F.lit(data_type.scale if scale is None else scale))
    unscaled = _signed_big_endian(F.try_to_binary(raw, F.lit("base64")))
    text = F.concat(unscaled, F.lit("E"), (-digits_scale).cast("string"))
    # a cast to fewer fractional digits would round: such a value does not fit (NULL: a mismatch)
    return F.when(digits_scale <= data_type.scale, text.try_cast(data_type))


def _signed_big_endian(data: Column) -> Column:
    """The decimal text of a big-endian two's complement integer (NULL past 16 bytes)."""
    hexed = F.hex(data)
    length = F.octet_length(data)
    negative = F.substring(hexed, 1, 1) >= F.lit("8")
    # up to 8 bytes: sign-extend to 64 bits, and conv reads it as a signed long
    small = F.conv(F.lpad(hexed, 16, F.when(negative, "F").otherwise("0")), 16, -10)
    # up to 16 bytes: byte by byte in decimal(38, 0); a negative number as -(~x) - 1, so the
    # running sum never exceeds the magnitude
    zero = F.lit(0).cast("decimal(38,0)")
    byte_values = F.transform(F.sequence(F.lit(0), length - 1),
                              lambda i: F.conv(F.substring(hexed, i * 2 + 1, 2), 16, 10).cast("int"))
    magnitude = F.aggregate(byte_values, zero, lambda acc, b: F.try_add(
        F.try_multiply(acc, F.lit(256)), F.when(negative, 255 - b).otherwise(b)).cast("decimal(38,0)"))
    large = F.when(negative, -magnitude - 1).otherwise(magnitude).cast("string")
    return F.when(length <= 8, small).when(length <= 16, large)
