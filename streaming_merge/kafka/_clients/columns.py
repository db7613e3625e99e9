"""The Arrow columns: records of either client appended to per-column Python lists, each
list one Arrow array per batch (see the package docstring)."""

from __future__ import annotations

from operator import attrgetter, itemgetter, methodcaller
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from streaming_merge.kafka._clients.common import ARROW_SCHEMA

_HEADERS_TYPE = ARROW_SCHEMA.field("headers").type
_HEADER_FIELDS = list(_HEADERS_TYPE.value_type)

_KEY, _VALUE, _OFFSET = methodcaller("key"), methodcaller("value"), methodcaller("offset")
_TIMESTAMP, _HEADERS, _ERROR = methodcaller("timestamp"), methodcaller("headers"), methodcaller("error")
_R_KEY, _R_VALUE, _R_OFFSET = attrgetter("key"), attrgetter("value"), attrgetter("offset")
_R_TIMESTAMP, _R_TYPE, _R_HEADERS = attrgetter("timestamp"), attrgetter("timestamp_type"), attrgetter("headers")
_FIRST, _SECOND = itemgetter(0), itemgetter(1)


class _Columns:
    """One Arrow batch in the making: a Python list per column, filled a client batch at a
    time. confluent-kafka timestamp types are 0 (none), 1 (create), 2 (log append); Spark's
    are -1, 0, 1 (kafka-python's 0/1/None), so ``type_shift`` is 1 for confluent-kafka."""

    __slots__ = ("headers", "keys", "offsets", "stamps", "type_shift", "types", "values")

    def __init__(self, type_shift: int) -> None:
        self.type_shift = type_shift
        self.keys: list[bytes | None] = []
        self.values: list[bytes | None] = []
        self.offsets: list[int] = []
        self.stamps: list[int | None] = []
        self.types: list[int | None] = []
        self.headers: list[tuple[int, list[tuple[str, bytes | None]]]] = []  # (row, headers), only rows with some

    def __len__(self) -> int:
        return len(self.offsets)

    def add_messages(self, messages: list[Any], first: int | None = None) -> None:
        """confluent-kafka messages, all records (no error events). ``first`` given: their
        offsets are first, first + 1, ... (the caller checked), so no ``offset()`` calls."""
        base = len(self.offsets)
        self.keys.extend(map(_KEY, messages))
        self.values.extend(map(_VALUE, messages))
        if first is None:
            self.offsets.extend(map(_OFFSET, messages))
        else:
            self.offsets.extend(range(first, first + len(messages)))
        pairs = list(map(_TIMESTAMP, messages))  # (type, milliseconds)
        self.types.extend(map(_FIRST, pairs))
        self.stamps.extend(map(_SECOND, pairs))
        if any(map(_HEADERS, messages)):
            self.headers.extend((base + i, h) for i, h in enumerate(map(_HEADERS, messages)) if h)

    def add_records(self, records: list[Any], first: int | None = None) -> None:
        """kafka-python ConsumerRecords (``first``: as for :meth:`add_messages`)."""
        base = len(self.offsets)
        self.keys.extend(map(_R_KEY, records))
        self.values.extend(map(_R_VALUE, records))
        if first is None:
            self.offsets.extend(map(_R_OFFSET, records))
        else:
            self.offsets.extend(range(first, first + len(records)))
        self.stamps.extend(map(_R_TIMESTAMP, records))
        self.types.extend(map(_R_TYPE, records))
        headers = list(map(_R_HEADERS, records))
        if any(headers):
            self.headers.extend((base + i, list(h)) for i, h in enumerate(headers) if h)

    def to_batch(self, topic: str, partition: int) -> pa.RecordBatch:
        n = len(self.offsets)
        types = pa.array(self.types, pa.int32())
        if self.type_shift:
            types = pc.subtract(types, pa.scalar(self.type_shift, pa.int32()))
        stamps = pa.array(self.stamps, pa.int64())
        if types.null_count or stamps.null_count or (n and pc.min(types).as_py() < 0):
            # No timestamp (message format v0): null, and type -1 as Spark's NO_TIMESTAMP_TYPE.
            missing = pc.or_(pc.fill_null(pc.less(types, 0), True), pc.is_null(stamps))
            stamps = pc.if_else(missing, pa.scalar(None, pa.int64()), stamps)
            types = pc.if_else(missing, pa.scalar(-1, pa.int32()), types)
        micros = pc.multiply(stamps, pa.scalar(1000, pa.int64())).cast(ARROW_SCHEMA.field("timestamp").type)
        return pa.RecordBatch.from_arrays([
            pa.array(self.keys, pa.binary()),
            pa.array(self.values, pa.binary()),
            pa.repeat(pa.scalar(topic, pa.string()), n),
            pa.repeat(pa.scalar(partition, pa.int32()), n),
            pa.array(self.offsets, pa.int64()),
            micros,
            types,
            self._headers_array(n),
        ], schema=ARROW_SCHEMA)

    def _headers_array(self, n: int) -> pa.Array:
        """An empty list per record without headers (as before); a list of (key, value)
        structs for the few that have some."""
        if not self.headers:
            offsets = pa.array(np.zeros(n + 1, dtype=np.int32))
            empty = pa.StructArray.from_arrays([pa.array([], pa.string()), pa.array([], pa.binary())],
                                               fields=_HEADER_FIELDS)
            return pa.ListArray.from_arrays(offsets, empty, type=_HEADERS_TYPE)
        lengths = np.zeros(n, dtype=np.int32)
        names: list[str] = []
        values: list[bytes | None] = []
        for row, headers in self.headers:
            lengths[row] = len(headers)
            for name, value in headers:
                names.append(name)
                values.append(value)
        offsets = np.zeros(n + 1, dtype=np.int32)
        np.cumsum(lengths, out=offsets[1:])
        structs = pa.StructArray.from_arrays([pa.array(names, pa.string()), pa.array(values, pa.binary())],
                                             fields=_HEADER_FIELDS)
        return pa.ListArray.from_arrays(pa.array(offsets), structs, type=_HEADERS_TYPE)
