"""The difference between a snapshot and the table's current rows, as MERGE source rows.

Why a diff first and then a MERGE of the differences, rather than one MERGE of the whole
snapshot with WHEN NOT MATCHED BY SOURCE DELETE: a snapshot usually differs from the table
in a few rows. One full outer join of the snapshot with the current rows (the job that also
materializes the MERGE's source) yields only those rows, and the MERGE then handles a small
source: it skips files by key range, broadcasts the source, rewrites (or, with deletion
vectors, marks) only the touched files. A whole-snapshot MERGE would join the snapshot with
the table twice (findTouchedFiles and the rewrite, both full outer joins because of NOT
MATCHED BY SOURCE) and could not use any of those shortcuts. The diff also decides "did
anything change" per row, null-safe, so an unchanged row is never rewritten, counted as
updated, or given a new SCD 2 version.

The checks a snapshot needs run inside the same job, as Spark expressions: a NULL or
duplicated key fails the job through ``raise_error`` with a marker that
:func:`key_error_of` turns into a :class:`SnapshotKeyError` naming the key.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, Observation, Window
from pyspark.sql import functions as F
from pyspark.sql.types import DataType, IntegralType, LongType, MapType, StructField, StructType

from streaming_merge.errors import MergeAnalysisError
from streaming_merge.snapshots.errors import SnapshotKeyError, SnapshotSchemaError
from streaming_merge.streaming.cdc import CdcSpec
from streaming_merge.streaming.scd2 import END_AT, HISTORY_COLUMNS, START_AT, TrackHistory

ACTION = "__sm_snapshot_action__"
# Per key: I(nsert) a new key; D(elete) a key the snapshot lacks; U(pdate) the row in place
# (SCD 1: any change; SCD 2: only untracked columns changed); N(ew version) a tracked change.
# SCD 2 source rows: I opens a version, C closes one, U updates the current one in place.
INSERT, DELETE, UPDATE, NEW_VERSION, CLOSE = "I", "D", "U", "N", "C"

_NEW, _OLD, _OLD_START, _KEY_ROWS = "__sm_new__", "__sm_old__", "__sm_old_start__", "__sm_key_rows__"
_PRESENT = "__sm_present__"
_KEY_MARKER = "SM_SNAPSHOT_KEY_ERROR"
_KEY_ERROR = re.compile(_KEY_MARKER + r"\[(\d+|null)\]<<(.*?)>>", re.DOTALL)

COUNTS = ("snapshotRows", "inserted", "updated", "deleted", "unchanged", "newVersions")


def _q(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


@dataclass(frozen=True)
class SnapshotLayout:
    """The table's columns as one snapshot flow sees them: keys and data columns (the
    table's own spellings, in table order), the SCD 2 tracked columns and history type."""

    keys: tuple[str, ...]
    data: tuple[str, ...]
    types: dict[str, DataType]
    scd_type: int
    tracked: tuple[str, ...] = ()
    history_type: DataType | None = None

    @property
    def columns(self) -> list[str]:
        return [c for c in self.types if c not in HISTORY_COLUMNS]


def table_schema(snapshot: StructType, scd_type: int) -> StructType:
    """The schema of a table created from a first snapshot: its columns, plus for SCD 2
    ``__START_AT`` / ``__END_AT`` holding snapshot versions (BIGINT), last, as AUTO CDC and
    ``MergeSink(scd_type=2)`` lay them out."""
    if scd_type == 1:
        return snapshot
    history = [StructField(START_AT, LongType(), True), StructField(END_AT, LongType(), True)]
    return StructType([*snapshot.fields, *history])


def layout_of(table: StructType, snapshot_columns: Sequence[str], keys: Sequence[str], scd_type: int,
              track: TrackHistory, version: int) -> SnapshotLayout:
    """Check the snapshot's columns against the table's and resolve the keys and tracked
    columns to the table's spellings (names match case-insensitively, as Spark's do)."""
    by_lower = {f.name.lower(): f for f in table.fields}
    given = {c.lower(): c for c in snapshot_columns}
    missing_keys = [k for k in keys if k.lower() not in given]
    if missing_keys:
        raise SnapshotSchemaError(f"The snapshot (version {version}) has no key column(s) {missing_keys}; its columns "
                                  f"are {list(snapshot_columns)}.")
    history = {c.lower() for c in HISTORY_COLUMNS}
    clashing = [c for c in snapshot_columns if c.lower() in history or c.startswith("__sm_")]
    if clashing:
        raise SnapshotSchemaError(f"The snapshot (version {version}) has column(s) {clashing}, names the flow keeps "
                                  f"for itself ({list(HISTORY_COLUMNS)} and the __sm_ prefix); rename them.")
    expected = set(given) | (history if scd_type == 2 else set())
    if expected != set(by_lower):
        extra = sorted(given[c] for c in set(given) - set(by_lower))
        lacking = sorted(by_lower[c].name for c in set(by_lower) - expected)
        shape = f"its columns plus {list(HISTORY_COLUMNS)}" if scd_type == 2 else "the same columns"
        raise SnapshotSchemaError(
            f"The snapshot (version {version}) and the target table must have {shape} (SCD type {scd_type}). Not in "
            f"the table: {extra}; not in the snapshot: {lacking}. The table has {[f.name for f in table.fields]}.")
    types = {f.name: f.dataType for f in table.fields}
    table_keys = tuple(by_lower[k.lower()].name for k in keys)
    data = tuple(f.name for f in table.fields if f.name not in table_keys and f.name not in HISTORY_COLUMNS)
    if scd_type == 1:
        return SnapshotLayout(table_keys, data, types, 1)
    try:
        tracked = track.tracked(CdcSpec(keys=table_keys), [*table_keys, *data])
    except MergeAnalysisError as exc:
        raise SnapshotSchemaError(str(exc)) from exc
    history_type = types[START_AT]
    if not isinstance(history_type, IntegralType):
        raise SnapshotSchemaError(f"The table's {START_AT} is {history_type.simpleString()}; a snapshot flow records "
                                  "snapshot versions there, which are integers (a MergeSink table sequenced by a "
                                  "non-integer sequence_by cannot take snapshots).")
    return SnapshotLayout(table_keys, data, types, 2, tuple(tracked), history_type)


def checked_rows(frame: DataFrame, layout: SnapshotLayout) -> DataFrame:
    """The snapshot's rows in the table's columns and types; a NULL or duplicated key fails
    the job that reads them (the count per key is a window over the key, the partitioning the
    join after it needs anyway, so the check costs no shuffle of its own)."""
    rows = frame.select(*[F.col(_q(c)).cast(t).alias(c) for c, t in layout.types.items() if c not in HISTORY_COLUMNS])
    keys = [F.col(_q(k)) for k in layout.keys]
    null_key = keys[0].isNull()
    for key in keys[1:]:
        null_key = null_key | key.isNull()
    key_json = F.to_json(F.struct(*keys))
    counted = rows.withColumn(_KEY_ROWS, F.count(F.lit(1)).over(Window.partitionBy(*keys)))
    fail = F.when(null_key, F.raise_error(F.concat(F.lit(f"{_KEY_MARKER}[null]<<"), key_json, F.lit(">>"))))
    fail = fail.when(F.col(_KEY_ROWS) > 1, F.raise_error(F.concat(
        F.lit(f"{_KEY_MARKER}["), F.col(_KEY_ROWS).cast("string"), F.lit("]<<"), key_json, F.lit(">>"))))
    return counted.filter(fail.otherwise(F.lit(True))).drop(_KEY_ROWS)


def key_error_of(exc: BaseException, keys: Sequence[str], version: int) -> SnapshotKeyError | None:
    """The :class:`SnapshotKeyError` that ``exc`` (a failed Spark job, anywhere in its cause
    chain) reports, or None when it is about something else."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        match = _KEY_ERROR.search(str(current))
        if match:
            rows = None if match.group(1) == "null" else int(match.group(1))
            key = match.group(2)
            if rows is None:
                return SnapshotKeyError(f"The snapshot (version {version}) has a row with a NULL key {list(keys)} "
                                        f"(non-NULL parts: {key}); every row needs a key. Nothing of version "
                                        f"{version} was written.", key, None)
            return SnapshotKeyError(f"The snapshot (version {version}) has {rows} rows with the key {key} "
                                    f"({list(keys)}); a snapshot holds one row per key. Nothing of version {version} "
                                    "was written.", key, rows)
        current = current.__cause__ or current.__context__
    return None


def _comparable(column: Column, data_type: DataType) -> Column:
    """Spark cannot compare maps; their sorted entries compare the same way."""
    return F.array_sort(F.map_entries(column)) if isinstance(data_type, MapType) else column


def _differs(layout: SnapshotLayout, columns: Sequence[str]) -> Column:
    """Any of ``columns`` differs between the snapshot's row and the table's, NULL-safe."""
    if not columns:
        return F.lit(False)
    same = [_comparable(F.col(f"{_NEW}.{_q(c)}"), layout.types[c])
            .eqNullSafe(_comparable(F.col(f"{_OLD}.{_q(c)}"), layout.types[c])) for c in columns]
    all_same = same[0]
    for other in same[1:]:
        all_same = all_same & other
    return ~all_same


def _side(frame: DataFrame, layout: SnapshotLayout, name: str, extra: Sequence[Column] = ()) -> DataFrame:
    """Keys plus the data columns in one struct (never NULL on its own side, so NULL after
    the outer join means "absent there"); the struct's first field keeps it non-empty."""
    return frame.select(*[F.col(_q(k)) for k in layout.keys],
                        F.struct(F.lit(True).alias(_PRESENT), *[F.col(_q(c)) for c in layout.data]).alias(name),
                        *extra)


def changes(snapshot_rows: DataFrame, current: DataFrame, layout: SnapshotLayout, version: int
            ) -> tuple[DataFrame, Observation]:
    """The MERGE source: one row per changed key (SCD 1), or per history row to insert,
    close or update (SCD 2), with ``ACTION``; and an Observation of the counts (``COUNTS``),
    filled by the first job that reads the source (the MERGE's materialization).

    ``current``: the table's current rows (SCD 2: ``__END_AT IS NULL``)."""
    extra = [F.col(_q(START_AT)).alias(_OLD_START)] if layout.scd_type == 2 else []
    joined = _side(snapshot_rows, layout, _NEW).join(_side(current, layout, _OLD, extra), list(layout.keys),
                                                     "full_outer")
    new, old = F.col(_NEW), F.col(_OLD)
    action = F.when(old.isNull(), INSERT).when(new.isNull(), DELETE)
    if layout.scd_type == 1:
        action = action.when(_differs(layout, layout.data), UPDATE)
    else:
        untracked = [c for c in layout.data if c not in set(layout.tracked)]
        action = (action.when(_differs(layout, layout.tracked), NEW_VERSION)
                  .when(_differs(layout, untracked), UPDATE))
    labeled = joined.withColumn(ACTION, action)
    observation = Observation()
    is_action = [(name, F.col(ACTION) == code) for name, code in
                 (("inserted", INSERT), ("deleted", DELETE), ("newVersions", NEW_VERSION))]
    counts = [F.count(new).alias("snapshotRows"),
              *[F.count_if(test).alias(name) for name, test in is_action],
              F.count_if(F.col(ACTION).isin(UPDATE, NEW_VERSION)).alias("updated"),
              F.count_if(F.col(ACTION).isNull()).alias("unchanged")]
    labeled = labeled.observe(observation, *counts).filter(F.col(ACTION).isNotNull())
    if layout.scd_type == 1:
        return labeled.select(*[F.col(_q(k)) for k in layout.keys], *[F.col(f"{_NEW}.{_q(c)}") for c in layout.data],
                              F.col(ACTION)), observation
    return _history_rows(labeled, layout, version), observation


def _history_rows(labeled: DataFrame, layout: SnapshotLayout, version: int) -> DataFrame:
    """SCD 2: a new key opens a version at ``version``; a deleted key's current version closes
    there; a tracked change does both; an untracked change updates the current version in
    place (its ``__START_AT`` stays). Rows are matched on (keys, ``__START_AT``)."""
    assert layout.history_type is not None
    at = version_value(version, layout.history_type)
    none = F.lit(None).cast(layout.history_type)
    action = F.col(ACTION)

    def row(start: Column, end: Column, code: str) -> Column:
        return F.struct(*[F.col(_q(k)) for k in layout.keys], *[F.col(f"{_NEW}.{_q(c)}").alias(c) for c in layout.data],
                        start.alias(START_AT), end.alias(END_AT), F.lit(code).alias(ACTION))

    close = F.when(action.isin(DELETE, NEW_VERSION), row(F.col(_OLD_START), at, CLOSE))
    opened = F.when(action.isin(INSERT, NEW_VERSION), row(at, none, INSERT))
    in_place = F.when(action == UPDATE, row(F.col(_OLD_START), none, UPDATE))
    # array_compact, not filter(..., lambda): a lambda's variable gets a new name per plan,
    # which reaches the generated code and compiled it anew every snapshot.
    rows = F.array_compact(F.array(close, opened, in_place))
    return labeled.select(F.explode(rows).alias("__sm_row__")).select("__sm_row__.*")


def version_value(version: int, data_type: DataType) -> Column:
    """The snapshot version as a value the generated code reads, not a literal written into it.

    Whole-stage codegen writes a numeric literal into the generated Java source, so every
    version would compile the diff's classes anew (2 Janino compilations per SCD 2 snapshot, and
    the JIT's work after them), for the same plan. A string literal is passed by reference; the
    optimizer would fold or push a cast of it into the CASE that keeps it from being constant
    (as for ``table.append.recorded_now``), but not ``conv``, whose result is then cast."""
    text = F.when(F.spark_partition_id() >= 0, F.lit(str(version)))
    return F.conv(text, 10, 10).cast(data_type)


def parse_counts(values: dict[str, object]) -> dict[str, int]:
    """The observed counts as ints (0 where Spark reports none)."""
    return {name: int(values.get(name) or 0) for name in COUNTS}  # type: ignore[call-overload]
