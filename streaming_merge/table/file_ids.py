"""Which candidate file a scanned target row came from, as a number each row gets cheaply.

findTouchedFiles and the one-pass rewrite tell the files of the rows they join apart. A file's
size is a constant Spark reads from the listing, free per row, and tells the candidates apart
when no two share a size. The rows of files that share their size take a hash of their file's
path instead (Spark's ``xxhash64``, computed on the driver with the same algorithm and seed for
the candidates' paths): a few dozen nanoseconds a row whatever the number of files, where the
literal path map used before is searched key by key (0.8 us a row with 400 candidates here,
0.8 s of CPU per million target rows, per scan). Should two of those hashes collide, the map
lookup is used after all.
"""

from __future__ import annotations

import functools
import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import xxhash
from pyspark.sql import Column, SparkSession
from pyspark.sql import functions as F

from streaming_merge.table.snapshot import DataFile, Snapshot
from streaming_merge.table.spark_paths import FILE_PATH_COL, FILE_SIZE_COL, spark_file_paths

# A file's id is its size (>= 0), or for a file sharing its size a hash of its path with the
# sign bit set (< 0, never -1), or, when those hashes collide, -2 - its position: -1 is no
# file's id, so callers may use it as a marker among ids.
_FIRST_PATH_ID = -2
# Spark's xxhash64 seed (org.apache.spark.sql.catalyst.expressions.XxHash64).
_SPARK_XXHASH_SEED = 42
_SIGN_BIT = 1 << 63
_LONG_MIN = -_SIGN_BIT


def path_hash_id(path: str) -> int:
    """The id Spark computes for a row of the file at ``path`` (as Spark reports it):
    ``xxhash64(path) | Long.MIN_VALUE``, as a signed 64-bit integer."""
    unsigned = xxhash.xxh64_intdigest(path.encode("utf-8"), seed=_SPARK_XXHASH_SEED) | _SIGN_BIT
    return unsigned - (1 << 64)


@dataclass(frozen=True)
class FileIds:
    """The ids of one list of candidate files, and the way back to their positions."""

    by_size: Mapping[int, int]  # size -> position, for the sizes one candidate has
    by_hash: Mapping[int, int]  # path_hash_id -> position, for the others (empty when two collide)
    by_path: Mapping[str, int]  # path as Spark reports it -> position, when two path hashes collide
    shared_sizes: tuple[int, ...]  # the sizes of the files in by_hash or by_path
    ids: tuple[int, ...] = ()  # each candidate's id, in the candidates' order

    @classmethod
    def of(cls, spark: SparkSession, snapshot: Snapshot, candidates: Sequence[DataFile]) -> FileIds:
        sizes = Counter(f.size for f in candidates)
        shared = [i for i, f in enumerate(candidates) if sizes[f.size] > 1]
        paths = spark_file_paths(spark, snapshot.location, [candidates[i] for i in shared]) if shared else []
        by_size = {f.size: i for i, f in enumerate(candidates) if sizes[f.size] == 1}
        shared_sizes = tuple(sorted({candidates[i].size for i in shared}))
        by_hash = {path_hash_id(p): i for p, i in zip(paths, shared, strict=True)}
        ids = [f.size for f in candidates]
        if len(by_hash) == len(shared) and -1 not in by_hash:
            for file_id, i in by_hash.items():
                ids[i] = file_id
            return cls(by_size, by_hash, {}, shared_sizes, tuple(ids))
        for i in shared:
            ids[i] = _FIRST_PATH_ID - i
        return cls(by_size, {}, dict(zip(paths, shared, strict=True)), shared_sizes, tuple(ids))

    @property
    def needs_paths(self) -> bool:
        """Whether the scan must carry FILE_PATH_COL for :meth:`column`."""
        return bool(self.by_hash or self.by_path)

    def position(self, file_id: int) -> int | None:
        """The candidate's position for an id :meth:`column` gave, None for any other number."""
        if file_id >= 0:
            return self.by_size.get(file_id)
        if self.by_hash:
            return self.by_hash.get(file_id)
        position = _FIRST_PATH_ID - file_id
        return position if file_id <= _FIRST_PATH_ID and position in self._path_positions else None

    @functools.cached_property
    def _path_positions(self) -> frozenset[int]:
        return frozenset(self.by_path.values())

    def column(self, size_column: str = FILE_SIZE_COL, path_column: str = FILE_PATH_COL) -> Column:
        """The id of a scanned row's file, from its file size column and, for the shared sizes
        only, its file path column. A row of a file no candidate is gets an id :meth:`position`
        does not know (or, in the map lookup, fails the query) rather than another file's."""
        size = F.col(size_column)
        if not self.needs_paths:
            return size
        if self.by_hash:
            by_path = F.xxhash64(F.col(path_column)).bitwiseOR(F.lit(_LONG_MIN))
        else:
            ids = F.from_json(F.lit(json.dumps({p: _FIRST_PATH_ID - i for p, i in self.by_path.items()})),
                              "map<string,bigint>")
            by_path = F.coalesce(
                F.try_element_at(ids, F.col(path_column)),
                F.raise_error(F.concat(F.lit("MERGE scanned a file it did not select: "), F.col(path_column))))
        # One SQL literal list, not a Column per size (three JVM calls each); Spark turns it into
        # a hash set past 10 values.
        shared = F.expr(f"{size_column} IN ({', '.join(map(str, self.shared_sizes))})")
        return F.when(shared, by_path).otherwise(size)
