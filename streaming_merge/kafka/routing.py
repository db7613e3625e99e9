"""A whole database in one streaming query: which Delta table a change-event topic goes to,
which keys it is merged by, and how a Kafka Connect (Debezium) schema maps to Spark's types.

Why these pieces live apart from the job: they are pure decisions (a topic name → a path,
a record key → key columns, a Connect schema → a ``StructType``, two types → compatible or
not) that must be the same in every batch and on every replay, so they are plain functions
of their inputs, testable without Spark or a broker. The job (``jobs/_database.py``) applies
them to the few per-topic samples it collects from a batch.

Routing. Debezium names a table's topic ``<topic.prefix>.<schema>.<table>`` (MySQL:
``<prefix>.<database>.<table>``); the prefix itself may contain dots, so the name is split
from the right. :data:`DEBEZIUM_TOPIC_REGEX` captures ``prefix``, ``schema`` and ``table``;
another layout gives its own regex with named groups. The table path is a ``str.format``
template over those groups plus ``root`` (``--target-root``) and ``topic``.

Keys. A Debezium record key is the row's primary key as a JSON object, plain
(``{"id": 1}``) or schema-wrapped (``{"schema": ..., "payload": {"id": 1}}``); its field
names are the table's key columns. :func:`record_key_fields` reads them in Spark (one small
JSON parse of the key per record); a key that is not a JSON object (NULL for a table
without a primary key, or a plain string key) has none.

Types. :func:`connect_row_schema` maps the envelope schema's ``after`` (else ``before``)
struct: int8/16/32/64 → byte/short/int/long, float32/64 → float/double, boolean, string,
bytes → binary, array, map, struct. Debezium's logical types become their Spark types
(decimal, date, timestamp_ntz, timestamp, time as µs), decoded from their wire encoding by
``streaming_merge.kafka.logical`` (its table lists them).
"""

from __future__ import annotations

import json
import re
import string
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
    DataType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructType,
)

from streaming_merge.errors import InvalidArgumentError, StreamingMergeError
from streaming_merge.kafka.logical import logical_field

__all__ = [
    "DEBEZIUM_TOPIC_REGEX",
    "DEFAULT_TABLE_PATH_TEMPLATE",
    "TopicRouter",
    "UnroutableTopicError",
    "connect_row_schema",
    "connect_type",
    "incompatible_columns",
    "key_fields_of",
    "record_key_fields",
    "type_change",
]

# Split from the right: the prefix (Debezium's topic.prefix) may itself contain dots.
DEBEZIUM_TOPIC_REGEX = r"(?P<prefix>.+)\.(?P<schema>[^.]+)\.(?P<table>[^.]+)"
DEFAULT_TABLE_PATH_TEMPLATE = "{root}/{schema}/{table}"


class UnroutableTopicError(StreamingMergeError):
    """Raised when a topic's name does not match the topic regex or yields an unusable path
    segment; the job sends that topic's records to the dead letter with this message."""


@dataclass(frozen=True)
class TopicRouter:
    """Topic name → table path, by ``topic_regex`` (named groups) and ``template``.

    Build it with :meth:`of`, which checks the template against the regex once (at job
    start), so a typo fails the command rather than every batch."""

    template: str
    topic_regex: str
    root: str | None

    @classmethod
    def of(cls, root: str | None, template: str = DEFAULT_TABLE_PATH_TEMPLATE,
           topic_regex: str = DEBEZIUM_TOPIC_REGEX) -> TopicRouter:
        try:
            regex = re.compile(topic_regex)
        except re.error as exc:
            raise InvalidArgumentError(f"topic regex {topic_regex!r} does not compile: {exc}") from exc
        known = {"root", "topic", *regex.groupindex}
        used: list[str] = []
        try:
            parsed = list(string.Formatter().parse(template))
        except ValueError as exc:
            raise InvalidArgumentError(f"table path template {template!r} is not a valid format string: {exc}") from exc
        for _, name, spec, conversion in parsed:
            if name is None:
                continue
            if not name or spec or conversion or name not in known:
                raise InvalidArgumentError(
                    f"table path template {template!r}: '{{{name}{'!' + conversion if conversion else ''}"
                    f"{':' + spec if spec else ''}}}' is not one of {sorted('{' + k + '}' for k in known)} "
                    "(plain names only; the regex's named groups, root and topic)")
            used.append(name)
        if "root" in used and not (root or "").strip():
            raise InvalidArgumentError(f"table path template {template!r} uses {{root}}: give --target-root")
        if not set(used) - {"root"}:
            raise InvalidArgumentError(
                f"table path template {template!r} names no part of the topic: every topic would go "
                             "to the same table")
        return cls(template, topic_regex, root.rstrip("/") if root else None)

    def route(self, topic: str) -> str:
        """The table path of ``topic``; raises :class:`UnroutableTopicError` with the reason."""
        match = re.fullmatch(self.topic_regex, topic)
        if match is None:
            raise UnroutableTopicError(f"topic '{topic}' does not match the topic regex {self.topic_regex!r}, so it "
                                       "has no table")
        fields: dict[str, str] = {"root": self.root or "", "topic": topic}
        for name, value in match.groupdict().items():
            if value is None or value in ("", ".", "..") or "/" in value:
                raise UnroutableTopicError(f"topic '{topic}': group '{name}' is {value!r}, not a usable path segment")
            fields[name] = value
        return self.template.format(**fields)


def record_key_fields(key: Column) -> Column:
    """``array<string>``: the field names of a JSON record key in document order, from the
    payload of a schema-wrapped key; NULL when the key is not a JSON object."""
    text = key.cast("string")
    top = F.json_object_keys(text)
    wrapped = (F.size(top) == 2) & F.array_contains(top, "schema") & F.array_contains(top, "payload")
    return F.when(wrapped, F.json_object_keys(F.get_json_object(text, "$.payload"))).otherwise(top)


def key_fields_of(key: bytes | str | None) -> list[str] | None:
    """The same as :func:`record_key_fields`, on the driver (for tests and samples)."""
    if key is None:
        return None
    try:
        parsed = json.loads(key)
    except (ValueError, UnicodeDecodeError):
        return None
    if isinstance(parsed, dict) and set(parsed) == {"schema", "payload"} and isinstance(parsed["payload"], dict):
        parsed = parsed["payload"]
    return list(parsed) if isinstance(parsed, dict) else None


_PRIMITIVES: dict[str, DataType] = {
    "int8": ByteType(), "int16": ShortType(), "int32": IntegerType(), "int64": LongType(),
    "float32": FloatType(), "float": FloatType(), "float64": DoubleType(), "double": DoubleType(),
    "boolean": BooleanType(), "string": StringType(), "bytes": BinaryType(),
}


def connect_type(schema: Mapping[str, Any]) -> DataType:
    """Spark type of one Kafka Connect field schema; a struct's fields of Debezium's logical
    types get their Spark type and the logical name in their metadata (``logical.LOGICAL``)."""
    kind = schema.get("type")
    if kind in _PRIMITIVES:
        return _PRIMITIVES[kind]
    if kind == "struct":
        return StructType([logical_field(f["field"], f, connect_type(f)) for f in schema.get("fields") or []])
    if kind == "array":
        return ArrayType(logical_field("item", schema["items"], connect_type(schema["items"])).dataType, True)
    if kind == "map":
        return MapType(connect_type(schema["keys"]), connect_type(schema["values"]), True)
    raise InvalidArgumentError(f"unknown Kafka Connect type {kind!r} in {dict(schema)}")


def connect_row_schema(envelope_schema: Mapping[str, Any] | str | None) -> StructType | None:
    """The row image's Spark schema from a Debezium envelope schema (the ``schema`` of a
    schema-wrapped record): its ``after`` struct, else ``before``; None when it has neither
    (not a Debezium envelope schema) or does not parse."""
    if isinstance(envelope_schema, str):
        try:
            envelope_schema = json.loads(envelope_schema)
        except ValueError:
            return None
    if not isinstance(envelope_schema, Mapping):
        return None
    by_name = {f.get("field"): f for f in envelope_schema.get("fields") or [] if isinstance(f, Mapping)}
    image = by_name.get("after") or by_name.get("before")
    if not image or image.get("type") != "struct":
        return None
    try:
        row = connect_type(image)
    except (KeyError, TypeError, ValueError):
        return None
    return row if isinstance(row, StructType) and row.fields else None


# A value of the key type fits a column of any of these types without loss (the JSON parse
# reads it as the column's type); everything else changes what the column holds.
_WIDER: dict[type[DataType], tuple[type[DataType], ...]] = {
    ByteType: (ShortType, IntegerType, LongType),
    ShortType: (IntegerType, LongType),
    IntegerType: (LongType,),
    FloatType: (DoubleType,),
}


def type_change(column: str, table_type: DataType, new_type: DataType, table: str = "") -> str | None:
    """None when values of ``new_type`` fit the table's ``table_type`` column, else the
    reason (naming the column and both types) that such records go to the dead letter.

    The table's type is the contract: a narrower integer or float fits its wider column;
    anything else (string ↔ number, long into int, a changed struct) would need a table
    type change that streaming ingestion does not make behind the readers' backs."""
    if table_type == new_type or isinstance(table_type, _WIDER.get(type(new_type), ())):
        return None
    where = f" of `{table}`" if table else ""
    return (f"incompatible type change: column `{column}`{where} is {table_type.simpleString()} in the table but "
            f"{new_type.simpleString()} in the record's Debezium schema; change the table's type by hand (or "
            "re-create the table) and replay these records from the dead letter")


def incompatible_columns(table: StructType, row: StructType, table_name: str = "") -> list[str]:
    """Reasons (one per column) why records of ``row``'s schema cannot go to ``table``;
    column names compare case-insensitively, as Spark resolves them."""
    by_name = {f.name.lower(): f for f in table.fields}
    reasons = []
    for field in row.fields:
        known = by_name.get(field.name.lower())
        if known is not None:
            reason = type_change(known.name, known.dataType, field.dataType, table_name)
            if reason:
                reasons.append(reason)
    return reasons
