"""Looking a row's number up in a constant table, in generated code and in constant time.

Reads that apply deletion vectors, and the deletion-vector MERGE, ask of every row which of a
list of files it came from, by a number each row carries (its file's id). ``array_position`` over
a literal list answers by a scan of the list: 20 files cost about a third of a 3M-row scan here,
and the cost grows with the number of files. Instead the driver builds a perfect hash: for up to
128 keys, usually one modulus under which every key falls in a slot of its own (a row then costs
one remainder and an array read or two); otherwise two levels (Fredman, Komlós and Szemerédi):
a first modulus spreads the keys over buckets, each bucket has its own modulus under which its
few keys fall in distinct slots, so a row costs two remainders and four array reads whatever the
number of keys. Up to 8 keys, the list is scanned.

The arrays are Spark literals backed by ``UnsafeArrayData``, built from its byte layout (a
private format of Spark's): a read is one memory load, where a literal parsed from JSON (or built
from Python values) holds boxed numbers, and they reach the JVM as one byte array rather than a
text Spark parses into a value at a time. A DV read's bitset is an array of tens of thousands of
words; bench/private_apis.md has the measured gain, tests/spark/test_private_apis.py fails when
a Spark upgrade sends ``long_array`` to its JSON fallback.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from pyspark.sql import Column, SparkSession
from pyspark.sql import functions as F

from streaming_merge.errors import InvalidArgumentError
from streaming_merge.spark.jvm import jvm_class
from streaming_merge.spark.per_context import PerContext

# Up to this many keys a scan of the list is as cheap as hashing.
_SCAN_AT_MOST = 8
# A bucket of c keys gets a modulus in [c, c * c * _SPREAD + 8]; none found -> array_position.
_SPREAD = 4
# One modulus is tried up to this many slots a key (and at most _SINGLE_SLOTS_MAX slots), a
# batch of moduli at a time; past that, two levels.
_SINGLE_SLOTS_PER_KEY = 16
_SINGLE_KEYS_MAX = 128  # beyond, one modulus is rarely found (the birthday bound) and the search costs
_SINGLE_SLOTS_MAX = 1 << 14
_MODULI_AT_ONCE = 256
# First moduli tried: the one giving the fewest slots (sum of squared bucket sizes) wins.
_FIRST_MODULI = 16


def long_array(spark: SparkSession | None, values: Sequence[int] | np.ndarray) -> Column:
    """A constant ``array<bigint>`` (no NULLs) whose reads are memory loads, shipped to the JVM
    as one byte array; without a SparkSession, or on a Spark whose internals differ, the same
    array as a JSON literal Spark parses once while optimizing."""
    if spark is not None:
        with contextlib.suppress(Exception):  # the portable form below gives the same answers
            return _unsafe_long_array(spark, np.asarray(values, dtype="<i8"))
    return F.from_json(F.lit(json.dumps([int(v) for v in values])), "array<bigint>")


def _unsafe_long_array(spark: SparkSession, values: np.ndarray) -> Column:
    """The values laid out as Spark's UnsafeArrayData lays out a long array (its element count,
    a NULL bit per element, the elements; little-endian as the JVM's memory here), sent as one
    byte array that an UnsafeArrayData points to: 4 JVM calls whatever the size."""
    if sys.byteorder != "little":
        raise NotImplementedError("the layout below is little-endian")
    count = len(values)
    layout = np.zeros(1 + (count + 63) // 64 + count, dtype="<i8")
    layout[0] = count
    layout[len(layout) - count:] = values
    handles = _handles.get(spark.sparkContext, "long_array", lambda: _LongArrayHandles.of(spark))
    data = jvm_class(spark, "org.apache.spark.sql.catalyst.expressions.UnsafeArrayData")()
    data.pointTo(bytearray(layout.tobytes()), handles.byte_array_offset, layout.nbytes)
    literal = jvm_class(spark, "org.apache.spark.sql.catalyst.expressions.Literal")(data, handles.data_type)
    return Column(jvm_class(spark, "org.apache.spark.sql.classic.ExpressionUtils").column(literal))


@dataclass(frozen=True)
class _LongArrayHandles:
    """What every long array literal of a JVM shares."""

    byte_array_offset: int
    data_type: Any

    @classmethod
    def of(cls, spark: SparkSession) -> _LongArrayHandles:
        types = jvm_class(spark, "org.apache.spark.sql.types.DataTypes")
        return cls(int(jvm_class(spark, "org.apache.spark.unsafe.Platform").BYTE_ARRAY_OFFSET),
                   types.createArrayType(types.LongType, False))


_handles: PerContext[_LongArrayHandles] = PerContext(limit=8)


@dataclass(frozen=True)
class ConstantTable:
    """Where each of a list of distinct keys sits in a constant table, and the Spark expressions
    that find a row's key there. Build with :meth:`of`; read with :meth:`found` and :meth:`at`,
    which share one slot expression (Spark does not eliminate common subexpressions in a filter,
    so every use of a lookup is computed again: keep them few)."""

    keys: tuple[int, ...]
    modulus: int  # 0: no hash, the slot is the key's position in ``keys`` (array_position)
    bucket_moduli: np.ndarray | None = None  # two levels: each bucket's modulus and first slot
    bucket_offsets: np.ndarray | None = None
    slot_of_key: np.ndarray | None = None  # each key's slot (0-based)
    slots: int = 0

    @classmethod
    def of(cls, keys: Sequence[int]) -> ConstantTable:
        if len(set(keys)) != len(keys):
            raise InvalidArgumentError("lookup: keys must be distinct")
        as_tuple = tuple(int(k) for k in keys)
        return _table(as_tuple) if len(as_tuple) > _SCAN_AT_MOST else cls(as_tuple, 0)

    def slot(self, spark: SparkSession | None, key: Column, *, present: bool = False) -> Column:
        """The 1-based slot ``key`` would sit in (for a key not in the table: some slot, or 0).
        ``present``: every row's key is one of the table's, so where no key is negative a plain
        remainder (one division) gives the slot that the positive one (two) does."""
        if not self.modulus:
            return F.array_position(long_array(spark, self.keys), key).cast("int")
        if present and self.bucket_moduli is None and min(self.keys) >= 0:
            return (key % F.lit(self.modulus)).cast("int") + 1
        first = F.pmod(key, F.lit(self.modulus))
        if self.bucket_moduli is None:
            return first.cast("int") + 1
        assert self.bucket_offsets is not None
        bucket = first.cast("int") + 1
        return (F.element_at(long_array(spark, self.bucket_offsets), bucket)
                + F.pmod(key, F.element_at(long_array(spark, self.bucket_moduli), bucket))).cast("int") + 1

    def found(self, spark: SparkSession | None, key: Column, slot: Column) -> Column:
        """Whether ``key`` is in the table (``slot``: :meth:`slot` of the same key)."""
        if not self.modulus:
            return slot > 0
        return F.element_at(long_array(spark, self.keys_by_slot()), slot) == key

    def at(self, spark: SparkSession | None, values: Sequence[int] | np.ndarray, slot: Column, *,
           present: bool = False) -> Column:
        """The value of the slot's key, ``values`` given in the order of the keys; only for a
        slot whose key :meth:`found` (any number for the others). ``present``: as for
        :meth:`slot` (the slot is then a key's, never 0)."""
        return F.element_at(long_array(spark, self.by_slot(values, 0)), slot if present else F.greatest(slot, F.lit(1)))

    def keys_by_slot(self) -> np.ndarray:
        """The keys by slot; an empty slot holds a number that does not hash to it, so that no
        key absent from the table is found there."""
        laid_out = self.by_slot(self.keys, 0)
        empty = np.ones(self.slots, dtype=bool)
        empty[np.asarray(self.slot_of_key)] = False
        for candidate in itertools.count():
            if not empty.any():
                return laid_out
            fits = empty & (np.arange(self.slots) != self.slot_of(np.array([candidate]))[0])
            laid_out[fits] = candidate
            empty &= ~fits
        raise AssertionError("unreachable")

    def slot_of(self, keys: np.ndarray) -> np.ndarray:
        """The 0-based slot of each of ``keys``, as :meth:`slot` computes it in Spark."""
        first = keys % self.modulus
        if self.bucket_moduli is None:
            return first
        assert self.bucket_offsets is not None
        return self.bucket_offsets[first] + keys % self.bucket_moduli[first]

    def by_slot(self, values: Sequence[int] | np.ndarray, empty: int) -> np.ndarray:
        """``values`` (in the order of the keys) laid out by slot, ``empty`` in the empty slots."""
        if not self.modulus:
            return np.asarray(values, dtype=np.int64)
        assert self.slot_of_key is not None
        laid_out = np.full(self.slots, empty, dtype=np.int64)
        laid_out[self.slot_of_key] = values
        return laid_out


def lookup(spark: SparkSession | None, keys: Sequence[int], values: Sequence[int], key: Column,
           missing: int = 0) -> Column:
    """The value (bigint) of the entry whose key (distinct numbers) is ``key``, ``missing`` for a
    key not among them: ``values[keys.index(key)]`` for every row, in constant time."""
    if len(keys) != len(values):
        raise InvalidArgumentError("lookup: as many keys as values")
    if not keys:
        return F.lit(missing).cast("bigint")
    table = ConstantTable.of(keys)
    slot = table.slot(spark, key)
    return F.when(table.found(spark, key, slot), table.at(spark, values, slot)).otherwise(
        F.lit(missing).cast("bigint"))


@functools.lru_cache(maxsize=64)
def _table(keys: tuple[int, ...]) -> ConstantTable:
    """A perfect hash of ``keys``: one modulus when a small one gives every key its own slot,
    else two levels; a list scan when neither is found (keys in an unlucky pattern)."""
    array = np.asarray(keys, dtype=np.int64)
    single = _single_modulus(array) if len(keys) <= _SINGLE_KEYS_MAX else 0
    if single:
        return ConstantTable(keys, single, slot_of_key=array % single, slots=single)
    plan = _perfect_hash(array)
    if plan is None:
        return ConstantTable(keys, 0)
    modulus, moduli, offsets, slot_of_key, slots = plan
    return ConstantTable(keys, modulus, moduli, offsets, slot_of_key, slots)


def _single_modulus(keys: np.ndarray) -> int:
    """The smallest modulus up to _SINGLE_SLOTS_PER_KEY slots a key under which the keys fall
    in distinct slots, 0 if none: a row then costs one remainder and no bucket read."""
    n = len(keys)
    limit = min(n * _SINGLE_SLOTS_PER_KEY, _SINGLE_SLOTS_MAX)
    for low in range(n, limit + 1, _MODULI_AT_ONCE):
        moduli = np.arange(low, min(low + _MODULI_AT_ONCE, limit + 1), dtype=np.int64)
        remainders = np.sort(keys[:, None] % moduli[None, :], axis=0)
        distinct = np.all(remainders[1:] != remainders[:-1], axis=0)
        if distinct.any():
            return int(moduli[int(np.argmax(distinct))])
    return 0


def _perfect_hash(keys: np.ndarray) -> tuple[int, np.ndarray, np.ndarray, np.ndarray, int] | None:
    """(first modulus, each bucket's modulus, each bucket's first slot, each key's slot, slots),
    with ``slot = offsets[b] + key mod moduli[b]`` for ``b = key mod modulus``, distinct for
    every key; None when some bucket finds no modulus in its range (keys in an unlucky pattern).
    ``mod`` is the floor remainder, as Spark's ``pmod`` and numpy's ``%`` compute it."""
    n = len(keys)
    modulus = min(range(n, n + min(n, _FIRST_MODULI) + 1),
                  key=lambda m: int(np.sum(np.bincount(keys % m, minlength=m) ** 2)))
    buckets = keys % modulus
    order = np.argsort(buckets, kind="stable")
    starts = np.searchsorted(buckets[order], np.arange(modulus + 1))
    moduli = np.ones(modulus, dtype=np.int64)
    offsets = np.zeros(modulus, dtype=np.int64)
    slot_of_key = np.zeros(n, dtype=np.int64)
    next_slot = 0
    for bucket in range(modulus):
        members = order[starts[bucket]:starts[bucket + 1]]
        count = len(members)
        chosen = 1
        if count > 1:
            chosen = next((m for m in range(count, count * count * _SPREAD + 9)
                           if len(np.unique(keys[members] % m)) == count), 0)
            if not chosen:
                return None
        moduli[bucket] = chosen
        offsets[bucket] = next_slot
        slot_of_key[members] = next_slot + keys[members] % chosen
        next_slot += chosen
    return modulus, moduli, offsets, slot_of_key, next_slot
