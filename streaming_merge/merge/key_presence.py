"""Which target files hold a source key inside their own key range: pruning finer than one
[min, max] of the whole source.

The source's key range keeps every file it overlaps. A batch that updates recent rows and
inserts new keys spans from those rows to the newest key, so a table clustered by key keeps
most of its files although one or two hold a matching row, and findTouchedFiles reads them
all. Here each file's own [min, max] of the join keys (from the log) is tested against every
source row inside the job that already reads the source (its materialization, or the stats
pass over a stable source). A file no source row falls into holds no key any source row has,
so no row of it can match. Rows are only ever compared by Spark; the driver reads the log's
stats and a few observed numbers.

How it is computed, measured on 20 files (the first shape was 20 observed ``max(CASE ...)``
aggregates, +100 ms per MERGE at 1k source rows and +280 ms at 100k): a projection, which
Spark compiles into the scan's generated code, gives each row a bit mask of the files whose
ranges hold its keys (63 files per ``bigint``), and the observation only ORs the masks
(``bit_or``): about +50 ms at either size. The masks are dropped again before the copy.

Integer keys only: their SQL literals are exact and Spark compares them after the same
widening the equi-join applies. Other key types keep the [min, max] pruning. Every source row
costs two comparisons per probed file, so tables with more files than the bound
(``MergeOptions.key_presence_max_files``) are not probed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql import Column, DataFrame, Observation
from pyspark.sql import functions as F
from pyspark.sql.types import IntegralType, StructType

from streaming_merge.merge.skipping import decoded_paths
from streaming_merge.table.snapshot import DataFile, Snapshot

DEFAULT_KEY_PRESENCE_MAX_FILES = 64
_BITS = 63  # files per mask: the sign bit stays clear, so the OR is also a plain sum
_MASK_PREFIX = "__sm_key_presence_"


@dataclass(frozen=True)
class KeyPresenceProbe:
    """The files probed, in bit order, and the SQL of each mask (one per ``_BITS`` files)."""

    paths: tuple[str, ...]
    mask_sql: tuple[str, ...]

    @property
    def mask_columns(self) -> list[str]:
        return [f"{_MASK_PREFIX}{i}__" for i in range(len(self.mask_sql))]

    @property
    def aggregates(self) -> list[Column]:
        """What to observe (or aggregate) over ``with_masks(frame)``."""
        return [F.bit_or(F.col(name)).alias(name) for name in self.mask_columns]

    def with_masks(self, frame: DataFrame) -> DataFrame:
        """``frame`` plus the mask columns; drop them (``mask_columns``) once observed."""
        return frame.select("*", *[F.expr(sql).alias(name) for sql, name in zip(self.mask_sql, self.mask_columns,
                                                                                 strict=True)])

    def observed(self, frame: DataFrame, observation: Observation) -> DataFrame:
        """``frame`` as it was, its rows' masks ORed into ``observation``."""
        return self.with_masks(frame).observe(observation, *self.aggregates).drop(*self.mask_columns)

    def absent(self, values: Mapping[str, Any]) -> frozenset[str]:
        """The probed files no source row's keys fall into. Nothing is absent when a mask is
        missing (an observation Spark optimized away because its input was empty, which the
        key ranges already handle)."""
        masks = [values.get(name) for name in self.mask_columns]
        if any(mask is None for mask in masks):
            return frozenset()
        return frozenset(path for bit, path in enumerate(self.paths)
                         if not int(masks[bit // _BITS] or 0) >> (bit % _BITS) & 1)

    def absent_observed(self, observation: Observation) -> frozenset[str]:
        """``absent`` from an observation of ``aggregates``; nothing when it never reported."""
        try:
            values = observation.get
        except Exception:  # Py4JJavaError: the observed subtree was optimized away as empty
            return frozenset()
        return self.absent(values)


def key_presence_probe(snapshot: Snapshot, key_pairs: Sequence[tuple[str, str]], source_schema: StructType,
                       max_files: int = DEFAULT_KEY_PRESENCE_MAX_FILES) -> KeyPresenceProbe | None:
    """The probe for ``key_pairs`` (target column, source column) of a key-equality ON
    condition, or None when no pair is an integer on both sides, or the table has fewer than
    two files or more than ``max_files``."""
    stats = snapshot.stats
    usable = _integer_pairs_with_ranges(snapshot, key_pairs, source_schema)
    if not usable or not 2 <= stats.num_rows <= max_files:
        return None
    bounds = [(s, stats.column(f"min.{t}").to_pylist(), stats.column(f"max.{t}").to_pylist()) for t, s in usable]
    paths: list[str] = []
    conditions: list[str] = []
    for row, path in enumerate(decoded_paths(stats)):
        parts = [f"{_quoted(s)} >= {_literal(lows[row])} AND {_quoted(s)} <= {_literal(highs[row])}"
                 for s, lows, highs in bounds if lows[row] is not None and highs[row] is not None]
        if parts:
            paths.append(path)
            conditions.append(" AND ".join(parts))
    if not paths:
        return None
    masks = tuple(" + ".join(f"IF({condition}, {1 << (bit % _BITS)}L, 0L)"
                             for bit, condition in enumerate(conditions) if bit // _BITS == chunk)
                  for chunk in range(-(-len(conditions) // _BITS)))
    return KeyPresenceProbe(tuple(paths), masks)


def _integer_pairs_with_ranges(snapshot: Snapshot, key_pairs: Sequence[tuple[str, str]], source_schema: StructType
                               ) -> list[tuple[str, str]]:
    """The (target, source) key pairs that are integers on both sides and whose target column
    has per-file ranges in the log (a partition column has none)."""
    target_types = {f.name: f.dataType for f in snapshot.schema.fields}
    source_types = {f.name: f.dataType for f in source_schema.fields}
    columns = set(snapshot.stats.column_names)
    return [(t, s) for t, s in key_pairs
            if t not in snapshot.partition_columns and isinstance(target_types.get(t), IntegralType)
            and isinstance(source_types.get(s), IntegralType) and {f"min.{t}", f"max.{t}"} <= columns]


def _quoted(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _literal(value: int) -> str:
    # A cast of the integer text, not an ``L`` suffix: the smallest long has no positive twin.
    return f"CAST({int(value)} AS BIGINT)"


def outside_candidate_ranges(snapshot: Snapshot, candidates: Sequence[DataFile], key_pairs: Sequence[tuple[str, str]],
                             source_schema: StructType, max_ranges: int = DEFAULT_KEY_PRESENCE_MAX_FILES
                             ) -> Column | None:
    """A predicate over source rows: true when the row's key lies in no candidate file's
    [min, max] of that key (from the log), so the row matches no target row and, if a
    NOT MATCHED clause takes it, is inserted whatever the target holds. A file skipped
    before this point holds no row any source row can match, so only the candidates count.

    Built for the first integer key pair (one key outside every range is enough); the
    candidates' ranges are merged where they touch, so a table written in key order needs one
    range. None when no pair is an integer on both sides, a candidate has no range for it,
    or more than ``max_ranges`` ranges remain. A NULL key is never outside (it may match
    through ``<=>``)."""
    usable = _integer_pairs_with_ranges(snapshot, key_pairs, source_schema)
    if not usable or not candidates:
        return None
    target_key, source_key = usable[0]
    stats = snapshot.stats
    wanted = {f.path for f in candidates}
    lows, highs = stats.column(f"min.{target_key}").to_pylist(), stats.column(f"max.{target_key}").to_pylist()
    # snapshot.files holds the stats' rows in order, their paths already decoded once.
    listed = [(low, high) for file, low, high in zip(snapshot.files, lows, highs, strict=True) if file.path in wanted]
    # A candidate without a range (no stats, or only NULL keys) is checked before sorting: None
    # does not order against an integer.
    if len(listed) != len(wanted) or any(low is None or high is None for low, high in listed):
        return None
    ranges = sorted(listed)
    merged: list[list[int]] = []
    for low, high in ranges:
        if merged and low <= merged[-1][1] + 1:
            merged[-1][1] = max(merged[-1][1], high)
        else:
            merged.append([low, high])
    if len(merged) > max_ranges:
        return None
    key = _quoted(source_key)
    inside = " OR ".join(f"({key} >= {_literal(low)} AND {key} <= {_literal(high)})" for low, high in merged)
    return F.expr(f"coalesce(NOT ({inside}), false)")
