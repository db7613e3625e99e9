"""Applying deletion vectors to a Spark scan, inside the JVM and without a join.

A scan keeps a row unless its file's deletion vector holds the row's ``_metadata.row_index``.
The test must cost little per row whatever the number of files, and no Spark job: a broadcast
anti-join of the deleted positions costs a job of its own and a hash probe of two keys a row.
Instead the driver turns each vector into a plain bitset (one bit per row of its file) and the
scan looks bits up with array arithmetic on constant arrays, compiled by Spark:

    base    = lookup(<ids of the files with a vector> -> <their first word>, <the row's file id>)
    deleted = base > 0 AND (bits[base + row_index / 64] >>> (row_index % 64)) & 1 = 1

The file id is a number Spark reads per file for free (its size, or a hash of its path where
sizes repeat; streaming_merge.table.file_ids), and the lookup takes constant time whatever the
number of files (streaming_merge.spark.constant_lookup: a perfect hash over primitive arrays;
``array_position`` over the ids cost a third of a 3M-row scan of 20 files). The bitsets cost one
bit per row of the files that have a vector, shipped once per stage; the decoded vectors are
kept in memory by their immutable ids (streaming_merge.table.dv_positions).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from pyspark.sql import Column, SparkSession
from pyspark.sql import functions as F

from streaming_merge.spark.constant_lookup import ConstantTable, long_array
from streaming_merge.spark.per_context import PerContext
from streaming_merge.table.dv_positions import deleted_positions_of
from streaming_merge.table.file_ids import FileIds
from streaming_merge.table.snapshot import DataFile, Snapshot

_built: PerContext[Column] = PerContext(limit=16)


def bitset_words(positions: np.ndarray, num_records: int) -> np.ndarray:
    """The positions as 64-bit words, bit ``i % 64`` of word ``i // 64`` set for a deleted row."""
    mask = np.zeros(max(num_records, int(positions.max()) + 1 if len(positions) else 0), dtype=bool)
    mask[positions] = True
    packed = np.packbits(mask, bitorder="little")
    padded = np.zeros(-(-len(packed) // 8) * 8, dtype=np.uint8)
    padded[: len(packed)] = packed
    return padded.view("<i8")


def live_row_column(spark: SparkSession, snapshot: Snapshot, files: Sequence[DataFile],
                    size_column: str, path_column: str, row_index_column: str) -> Column | None:
    """True for a row that the deletion vector of its file does not delete (None when no file
    of the scan has one). ``files`` are every file the scan reads: the ids tell them all apart.
    Built negated once: each operation on a Column holding the bitsets costs the JVM ~5 ms."""
    with_vectors = [i for i, f in enumerate(files) if f.deletion_vector is not None]
    if not with_vectors:
        return None
    # The same files with the same vectors give the same test: built once (a scan of a version
    # read again, a sink's lookups of the files a batch did not touch), not per scan.
    key = (snapshot.location.log_uri, size_column, path_column, row_index_column,
           tuple((f.path, f.size, f.num_records,
                  None if f.deletion_vector is None else f.deletion_vector.unique_id) for f in files))

    def build() -> Column:
        ids = FileIds.of(spark, snapshot, files)
        positions = deleted_positions_of(snapshot, [files[i] for i in with_vectors])
        sets = {ids.ids[i]: (rows, files[i].num_records or 0) for i, rows in zip(with_vectors, positions, strict=True)}
        # Every row comes from one of ``files``: with each file's row count known, the files
        # without a vector share a bitset of zeros and the lookup need not test for a miss.
        vectorless = {ids.ids[i]: f.num_records for i, f in enumerate(files) if f.deletion_vector is None}
        none_deleted = ({k: n for k, n in vectorless.items() if n is not None}
                        if all(n is not None for n in vectorless.values()) else None)
        return ~bitset_membership(spark, ids.column(size_column, path_column), F.col(row_index_column), sets,
                                  none_deleted)

    return _built.get(spark.sparkContext, key, build)


def bitset_membership(spark: SparkSession | None, key: Column, row: Column,
                      sets: Mapping[int, tuple[np.ndarray, int]],
                      none_deleted: Mapping[int, int] | None = None) -> Column:
    """True where ``row`` is among the positions of the set of ``key`` (``sets``: key -> the
    positions and a bound on them), as constant bitsets looked up in generated code: the set's
    first word found by a constant-time lookup of ``key`` (streaming_merge.spark.constant_lookup),
    then one array read a row; no join and no Spark job.

    ``none_deleted`` (key -> a bound on its rows): the other keys of the rows, when every row's
    key is in ``sets`` or here. They share one bitset of zeros, and the lookup, knowing every key,
    skips the test for a key it lacks (3M rows in 20 files, 10 % deleted: the scan 1.29x -> 1.22x the
    same rows compacted)."""
    keys: list[int] = []
    bases: list[int] = []
    words: list[np.ndarray] = []
    next_base = 1  # element_at is 1-based
    for set_key, (positions, bound) in sets.items():
        bits = bitset_words(positions, bound)
        keys.append(set_key)
        bases.append(next_base)
        words.append(bits)
        next_base += len(bits)
    if none_deleted:
        keys += list(none_deleted)
        bases += [next_base] * len(none_deleted)
        words.append(np.zeros(-(-max(none_deleted.values()) // 64) or 1, dtype="<i8"))
    all_words = np.concatenate(words) if words else np.zeros(0, dtype="<i8")
    table = ConstantTable.of(keys)
    present = none_deleted is not None
    slot = table.slot(spark, key, present=present)
    word = (table.at(spark, bases, slot, present=present) + F.shiftright(row, 6)).cast("int")
    # The SQL function takes the shift as a column (PySpark's wrapper only as a number).
    bit = F.call_function("shiftrightunsigned", F.element_at(long_array(spark, all_words), word),
                          row.bitwiseAND(F.lit(63)).cast("int")).bitwiseAND(F.lit(1))
    return bit == 1 if present else F.when(table.found(spark, key, slot), bit == 1).otherwise(F.lit(False))
