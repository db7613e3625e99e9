"""SCD type 2: keep every version of a row, with the interval in which it was current.

A history row holds the key, the data of one version, ``__START_AT`` (the sequence value
of the event that opened the version) and ``__END_AT`` (the sequence value of the event
that closed it: the next version's opening event, a delete, or a truncate; NULL while the
version is current), as Databricks' AUTO CDC does.

Why the history of a key is *recomputed* rather than patched: events arrive out of
order, so an event may fall inside an interval that is already closed, or before the
first version. Each batch therefore rebuilds, for the keys it touches, the key's event
list from what the table already says (a row is an upsert at ``__START_AT``; an
``__END_AT`` that opens no other row is a delete there), the tombstones and truncates
recorded earlier, and the batch's own events; folds it in sequence order; and writes the
difference (rows to insert, to update, to delete) with one MERGE matched on
(keys, ``__START_AT``). The fold, all in Spark:

* an upsert opens a new version when it follows nothing, a delete or a truncate, or when
  one of its *tracked* columns differs from the version it follows; otherwise it updates
  that version in place (the untracked columns take its values, ``__START_AT`` stays);
* a version ends at the sequence value of the next event of its key (NULL if none);
* deletes and truncates open nothing; at one sequence value a delete or truncate wins
  over an upsert, a batch's upsert over the table's row.

What the table cannot remember: an event that changed no tracked column leaves no row of
its own, so a late event that falls after it is placed as if it had never happened. A
delete of a key that had no version yet leaves no row either; the tombstone table
remembers it (for its retention), which is why tombstones are kept for SCD 2 as well.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import StructField, StructType

from streaming_merge.errors import MergeAnalysisError
from streaming_merge.merge.skipping import ColumnScope, SkippingPlan
from streaming_merge.streaming.cdc import DELETE_FLAG, CdcSpec
from streaming_merge.table.scan import scan_files
from streaming_merge.table.snapshot import Snapshot

START_AT = "__START_AT"
END_AT = "__END_AT"
HISTORY_COLUMNS = (START_AT, END_AT)
ACTION = "__sm_scd_action__"  # I(nsert), U(pdate) or D(elete) of one history row

_SEQ, _DEL, _PRIORITY = "__sm_seq__", "__sm_del__", "__sm_priority__"
_NEW, _VERSION, _NEXT = "__sm_new_version__", "__sm_version__", "__sm_next__"
_FIRST, _LAST = "__sm_first__", "__sm_last__"
# At one (key, sequence value): a delete or truncate beats a batch upsert, which beats the table's row.
_TABLE_ROW, _BATCH_UPSERT, _DELETE = 1, 2, 3


def _q(name: str) -> str:
    return f"`{name}`"


@dataclass(frozen=True)
class TrackHistory:
    """Which data columns open a new version when they change (AUTO CDC's
    ``track_history_column_list`` / ``track_history_except_column_list``). By default every
    column but the keys and the ``sequence_by`` columns, which change with every event."""

    include: Sequence[str] | None = None
    exclude: Sequence[str] | None = None

    def __post_init__(self) -> None:
        if self.include is not None and self.exclude is not None:
            raise ValueError("Pass track_history_column_list or track_history_except_column_list, not both.")
        for name, value in (("track_history_column_list", self.include),
                            ("track_history_except_column_list", self.exclude)):
            if value is not None and (isinstance(value, str) or not all(isinstance(c, str) for c in value)):
                raise ValueError(f"{name} must be a list of column names, got {value!r}")

    def tracked(self, spec: CdcSpec, columns: Sequence[str]) -> list[str]:
        """The tracked columns among the table's ``columns``; names that are not data columns
        are refused (a key or sequence column cannot be tracked: it identifies or orders)."""
        data = [c for c in spec.data_columns(columns) if c not in HISTORY_COLUMNS]
        named = list(self.include if self.include is not None else self.exclude or ())
        known = {c.lower() for c in data}
        unknown = [c for c in named if c.lower() not in known]
        if unknown:
            option = "track_history_column_list" if self.include is not None else "track_history_except_column_list"
            raise MergeAnalysisError(
                f"{option} names {unknown}, which are not data columns of the table; its data columns "
                f"(neither keys nor sequence_by) are {data}.")
        if self.include is not None:
            wanted = {c.lower() for c in self.include}
            return [c for c in data if c.lower() in wanted]
        dropped = {c.lower() for c in self.exclude or ()}
        return [c for c in data if c.lower() not in dropped]


def history_changes(spec: CdcSpec, tracked: Sequence[str], events: DataFrame, current: DataFrame | None,
                    deletes: DataFrame | None, truncates: Sequence[Column]) -> DataFrame:
    """The history rows to insert, update or delete (column ``ACTION``) so that the keys of
    ``events`` hold the fold of their whole event list.

    ``events``: the batch's events (table columns plus ``DELETE_FLAG``), one per (key,
    sequence value). ``current``: the table's rows of those keys (or None for a new table).
    ``deletes``: tombstones of those keys (keys and sequence columns). ``truncates``: the
    sequence values of every truncate to apply (recorded ones and the batch's), as literals.
    """
    keys = list(spec.keys)
    columns = [c for c in events.columns if not c.startswith("__sm_")]
    data = [c for c in columns if c not in keys]
    key_cols = [F.col(_q(k)) for k in keys]

    def as_events(frame: DataFrame, sequence: Column, is_delete: Column, priority: Column,
                  with_data: bool) -> DataFrame:
        values = [F.col(_q(c)) if with_data else F.lit(None).alias(c) for c in data]
        return frame.select(*key_cols, sequence.alias(_SEQ), is_delete.alias(_DEL), priority.alias(_PRIORITY),
                            *values)

    is_delete = F.col(_q(DELETE_FLAG))
    parts = [as_events(events, spec.sequence(), is_delete,
                       F.when(is_delete, _DELETE).otherwise(_BATCH_UPSERT), with_data=True)]
    if current is not None:
        parts.append(as_events(current, F.col(_q(START_AT)), F.lit(False), F.lit(_TABLE_ROW), with_data=True))
        # An end that opens no other row of the key is where the key was deleted (or truncated).
        starts = current.select(*key_cols, F.col(_q(START_AT)).alias(_SEQ))
        ends = current.filter(F.col(_q(END_AT)).isNotNull()).select(*key_cols, F.col(_q(END_AT)).alias(_SEQ))
        closed = ends.join(starts, [*keys, _SEQ], "left_anti")
        parts.append(as_events(closed, F.col(_SEQ), F.lit(True), F.lit(_DELETE), with_data=False))
    if deletes is not None:
        parts.append(as_events(deletes, spec.sequence(), F.lit(True), F.lit(_DELETE), with_data=False))
    if truncates:
        touched = events.select(*key_cols).distinct()
        for value in truncates:
            parts.append(as_events(touched, value, F.lit(True), F.lit(_DELETE), with_data=False))
    union = parts[0]
    for part in parts[1:]:
        union = union.unionByName(part)

    one_per_position = Window.partitionBy(*key_cols, F.col(_SEQ)).orderBy(F.col(_PRIORITY).desc())
    folded = (union.withColumn("__sm_rank__", F.row_number().over(one_per_position))
              .filter(F.col("__sm_rank__") == 1).drop("__sm_rank__"))
    ordered = Window.partitionBy(*key_cols).orderBy(F.col(_SEQ))
    tracked_value = F.struct(*[F.col(_q(c)) for c in tracked]) if tracked else F.lit(True)
    previous_deleted = F.lag(F.col(_DEL)).over(ordered)
    same_tracked = F.lag(tracked_value).over(ordered).eqNullSafe(tracked_value)
    opens = ~F.col(_DEL) & (previous_deleted.isNull() | previous_deleted | ~same_tracked)
    folded = (folded.withColumn(_NEW, opens)
              .withColumn(_NEXT, F.lead(F.col(_SEQ)).over(ordered))
              .withColumn(_VERSION, F.sum(F.col(_NEW).cast("int")).over(
                  ordered.rowsBetween(Window.unboundedPreceding, Window.currentRow)))
              .filter(~F.col(_DEL)))
    untracked = [c for c in data if c not in set(tracked)]
    history = folded.groupBy(*key_cols, F.col(_VERSION)).agg(
        F.min(F.col(_SEQ)).alias(START_AT),
        F.min_by(F.struct(*[F.col(_q(c)) for c in tracked]) if tracked else F.lit(None), F.col(_SEQ)).alias(_FIRST),
        F.max_by(F.struct(*[F.col(_q(c)) for c in untracked], F.col(_NEXT)), F.col(_SEQ)).alias(_LAST))
    rows = history.select(
        *[F.col(_q(c)) if c in keys else F.col(f"{_FIRST}.{_q(c)}" if c in set(tracked) else f"{_LAST}.{_q(c)}")
          .alias(c) for c in columns],
        F.col(_q(START_AT)), F.col(f"{_LAST}.{_NEXT}").alias(END_AT))
    if current is None:
        return rows.withColumn(ACTION, F.lit("I"))
    return _difference(rows, current.select(*[F.col(_q(c)) for c in [*columns, *HISTORY_COLUMNS]]), keys,
                       columns)


def _difference(new: DataFrame, old: DataFrame, keys: Sequence[str], columns: Sequence[str]) -> DataFrame:
    """Rows of ``new`` not in ``old`` (I), in both but different (U), of ``old`` only (D),
    matched on (keys, ``__START_AT``); rows that did not change are left out, so the MERGE
    rewrites only files that hold a changed row."""
    n, o = new.alias("n"), old.alias("o")
    on = [F.col(f"n.{_q(k)}") == F.col(f"o.{_q(k)}") for k in keys]
    on.append(F.col(f"n.{START_AT}") == F.col(f"o.{START_AT}"))
    condition = on[0]
    for part in on[1:]:
        condition = condition & part
    joined = n.join(o, condition, "full_outer")
    compared = [c for c in [*columns, END_AT] if c not in keys]
    same = F.struct(*[F.col(f"n.{_q(c)}") for c in compared]).eqNullSafe(
        F.struct(*[F.col(f"o.{_q(c)}") for c in compared]))
    action = (F.when(F.col(f"o.{START_AT}").isNull(), "I").when(F.col(f"n.{START_AT}").isNull(), "D")
              .when(~same, "U"))
    identity = {*keys, START_AT}
    return (joined.select(
        *[(F.coalesce(F.col(f"n.{_q(c)}"), F.col(f"o.{_q(c)}")) if c in identity else F.col(f"n.{_q(c)}")).alias(c)
          for c in [*columns, *HISTORY_COLUMNS]], action.alias(ACTION))
        .filter(F.col(ACTION).isNotNull()))


def truncate_spans(truncates: Sequence[Column]) -> tuple[Column, Column]:
    """For rows of keys the batch does not touch (MERGE's not-matched-by-source): the
    condition "a truncate falls inside this row's interval" and the new ``__END_AT``, the
    first such truncate."""
    start, end = F.col(f"t.{START_AT}"), F.col(f"t.{END_AT}")
    spans = [(start < value) & (end.isNull() | (end > value)) for value in truncates]
    condition = spans[0]
    for span in spans[1:]:
        condition = condition | span
    new_end = F.when(spans[0], truncates[0])
    for span, value in zip(spans[1:], truncates[1:], strict=True):
        new_end = new_end.when(span, value)
    return condition, new_end


def current_rows(spark: SparkSession, snapshot: Snapshot, key_ranges: Mapping[str, tuple[Any, Any]],
                 keys: Sequence[str], touched: DataFrame) -> DataFrame:
    """The table's history rows of the keys in ``touched``, read only from the files whose
    key stats overlap the batch's key range (decided on the driver, no Spark job)."""
    columns = [f.name for f in snapshot.schema.fields]
    scope = ColumnScope("t", "s", columns, list(keys))
    ranges = [(k, *key_ranges[k], key_ranges[k][0] is not None) for k in keys if k in key_ranges]
    files = SkippingPlan((), ranges, scope, snapshot.schema, skip_nothing=False).select(
        spark, snapshot, [f for f in snapshot.files if f.num_records is None or f.num_records > 0])
    rows = scan_files(spark, snapshot, files)
    return rows.join(touched.select(*[F.col(_q(k)) for k in keys]).distinct(), list(keys), "left_semi")


def check_table_columns(table: StructType, columns: Sequence[str], target: str) -> None:
    """An SCD 2 table holds the batch's columns plus the two history columns, no more, no less:
    its MERGE rebuilds whole rows, so a column the batch lacks could not be carried over."""
    expected = {c.lower() for c in columns} | {c.lower() for c in HISTORY_COLUMNS}
    present = {f.name.lower() for f in table.fields}
    if expected != present:
        raise MergeAnalysisError(
            f"The SCD type 2 table `{target}` has columns {sorted(present)}; the micro-batch (with "
            f"{list(HISTORY_COLUMNS)}) gives {sorted(expected)}. Missing from the batch: "
            f"{sorted(present - expected)}; not in the table: {sorted(expected - present)}.")


def history_fields(spec: CdcSpec, schema: StructType) -> list[StructField]:
    """``__START_AT`` / ``__END_AT`` of the sequence's type (a struct for several columns)."""
    types = {f.name.lower(): f.dataType for f in schema.fields}
    if len(spec.sequence_by) == 1:
        kind = types[spec.sequence_by[0].lower()]
    else:
        kind = StructType([StructField(c, types[c.lower()]) for c in spec.sequence_by])
    return [StructField(START_AT, kind), StructField(END_AT, kind)]
