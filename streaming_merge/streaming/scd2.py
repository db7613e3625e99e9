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

With partial updates an upsert's missing values (a NULL where NULLs mean "unchanged", the
placeholder) are first carried from the key's events before it, back to its last delete or
truncate, so its tracked columns compare as AUTO CDC's ``ignore_null_updates`` means them. The
``sequence_by`` columns may be left out of the table: ``__START_AT`` / ``__END_AT`` carry the
sequence, and the events keep their columns for the fold.

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
from pyspark.sql.window import WindowSpec

from streaming_merge.errors import InvalidArgumentError, MergeAnalysisError
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
# A table row's content (data, __END_AT); from the batch?; a row's end as a delete; rows that go.
_OLD, _BATCH, _MARKER, _GONE = "__sm_old__", "__sm_from_batch__", "__sm_marker__", "__sm_gone__"
_BOUND = "__sm_oldest_event__"  # per touched key: history ending before it cannot change
_SEGMENT = "__sm_since_delete__"  # partial updates: how many deletes precede an event of its key
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
            raise InvalidArgumentError("Pass track_history_column_list or track_history_except_column_list, not both.")
        for name, value in (("track_history_column_list", self.include),
                            ("track_history_except_column_list", self.exclude)):
            if value is not None and (isinstance(value, str) or not all(isinstance(c, str) for c in value)):
                raise InvalidArgumentError(f"{name} must be a list of column names, got {value!r}")

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
                    deletes: DataFrame | None, truncates: Sequence[Column],
                    columns: Sequence[str] | None = None) -> DataFrame:
    """The history rows to insert, update or delete (column ``ACTION``) so that the keys of
    ``events`` hold the fold of their whole event list.

    ``columns``: the table's columns besides the history ones (default: the events' own); the
    events may carry more, the ``sequence_by`` columns among them when the table leaves them
    out (``__START_AT`` / ``__END_AT`` carry the sequence already).

    Partial updates (``spec.partial``): an upsert that carries no value for a column (a NULL
    where NULLs mean "unchanged", the placeholder) takes the value of the event before it in
    sequence order, back to the key's last delete or truncate (none: NULL), before its tracked
    columns are compared; so an event that changes nothing but leaves columns out updates its
    version in place, as any event whose tracked values are unchanged does.

    ``events``: the batch's events (table columns plus ``DELETE_FLAG``), one per (key,
    sequence value). ``current``: the table's rows of those keys that the batch can change
    (``current_rows``; or None for a new table). ``deletes``: tombstones (keys and sequence columns) that may belong to
    them. ``truncates``: the sequence values of every truncate to apply (recorded ones and
    the batch's), as literals. Rows of other keys in ``current`` / ``deletes`` are ignored.

    One plan without joins: every input becomes events of one shape, each table row carrying
    its old content (``_OLD``), so that the difference to write (insert, update, delete of a
    history row) comes out of the fold itself.
    """
    keys = list(spec.keys)
    columns = list(columns) if columns is not None else [c for c in events.columns if not c.startswith("__sm_")]
    data = [c for c in columns if c not in keys]
    key_cols = [F.col(_q(k)) for k in keys]
    old_value = F.struct(*[F.col(_q(c)) for c in [*data, END_AT]])
    no_old = F.lit(None).cast(current.select(old_value.alias("o")).schema["o"].dataType if current is not None
                              else "boolean")

    def as_events(frame: DataFrame, sequence: Column, is_delete: Column, priority: Column, *, with_data: bool,
                  old: Column | None = None, from_batch: bool = False, marker: Column | None = None
                  ) -> DataFrame:
        values = [F.col(_q(c)) if with_data else F.lit(None).alias(c) for c in data]
        return frame.select(*key_cols, sequence.alias(_SEQ), is_delete.alias(_DEL), priority.alias(_PRIORITY),
                            *values, (old if old is not None else no_old).alias(_OLD),
                            F.lit(from_batch).alias(_BATCH),
                            (marker if marker is not None else F.lit(False)).alias(_MARKER))

    is_delete = F.col(_q(DELETE_FLAG))
    parts = [as_events(events, spec.sequence(), is_delete, F.when(is_delete, _DELETE).otherwise(_BATCH_UPSERT),
                       with_data=True, from_batch=True)]
    if truncates:  # a delete of every touched key at each truncate (re-sends collapse below)
        parts.append(as_events(events, F.explode(F.array(*truncates)), F.lit(True), F.lit(_DELETE),
                               with_data=False))
    if current is not None:
        # Each table row is an upsert at __START_AT and, when it has one, a delete marker at
        # __END_AT: a marker where another row of the key starts is dropped below (the row
        # ended because the next version began, not because the key was deleted).
        ends = F.array(F.lit(False), F.lit(True))
        exploded = current.select("*", F.explode(ends).alias(_MARKER)).filter(
            ~F.col(_MARKER) | F.col(_q(END_AT)).isNotNull())
        marker = F.col(_MARKER)
        parts.append(as_events(
            exploded, F.when(marker, F.col(_q(END_AT))).otherwise(F.col(_q(START_AT))), marker,
            F.when(marker, _DELETE).otherwise(_TABLE_ROW), with_data=True,
            old=F.when(~marker, old_value).otherwise(no_old), marker=marker))
    if deletes is not None:
        parts.append(as_events(deletes, spec.sequence(), F.lit(True), F.lit(_DELETE), with_data=False))
    union = parts[0]
    for part in parts[1:]:
        union = union.unionByName(part)

    by_key = Window.partitionBy(*key_cols)
    position = Window.partitionBy(*key_cols, F.col(_SEQ))
    first_at_position = position.orderBy(F.col(_PRIORITY).desc())
    ordered = by_key.orderBy(F.col(_SEQ))
    tracked_value = F.struct(*[F.col(_q(c)) for c in tracked]) if tracked else F.lit(True)
    previous_deleted = F.lag(F.col(_DEL)).over(ordered)
    same_tracked = F.lag(tracked_value).over(ordered).eqNullSafe(tracked_value)
    opens = ~F.col(_DEL) & (previous_deleted.isNull() | previous_deleted | ~same_tracked)
    is_row = F.col(_PRIORITY) == _TABLE_ROW
    folded = (union
              .withColumn("__sm_touched__", F.max(F.col(_BATCH)).over(by_key))
              .filter(F.col("__sm_touched__"))
              # one event per (key, sequence value); the table's row there, if any, stays known
              .withColumn(_OLD, F.first(F.col(_OLD), ignorenulls=True).over(position))
              .withColumn("__sm_row_here__", F.max(is_row).over(position))
              .filter(~(F.col(_MARKER) & F.col("__sm_row_here__")))
              .withColumn("__sm_rank__", F.row_number().over(first_at_position))
              .filter(F.col("__sm_rank__") == 1)
              .transform(_carried_forward, spec, data, dict(union.dtypes), key_cols, ordered)
              .withColumn(_NEW, opens)
              .withColumn(_NEXT, F.lead(F.col(_SEQ)).over(ordered))
              .withColumn(_VERSION, F.sum(F.col(_NEW).cast("int")).over(
                  ordered.rowsBetween(Window.unboundedPreceding, Window.currentRow))))
    untracked = [c for c in data if c not in set(tracked)]
    upsert_at = F.when(~F.col(_DEL), F.col(_SEQ))  # NULL for deletes: min_by/max_by skip them
    # A table row whose start no longer opens a version (a delete won its position, or it now
    # continues the version before it) goes.
    gone_at = F.when(F.col(_OLD).isNotNull() & ~F.col(_NEW), F.col(_SEQ))
    versions = folded.groupBy(*key_cols, F.col(_VERSION)).agg(
        F.min(upsert_at).alias(START_AT),
        F.min_by(F.struct(*[F.col(_q(c)) for c in tracked], F.col(_OLD)), upsert_at).alias(_FIRST),
        F.max_by(F.struct(*[F.col(_q(c)) for c in untracked], F.col(_NEXT)), upsert_at).alias(_LAST),
        F.collect_list(gone_at).alias(_GONE))
    row_value = [F.col(_q(c)) if c in keys else F.col(f"{_FIRST}.{_q(c)}" if c in set(tracked) else f"{_LAST}.{_q(c)}")
                 for c in columns]
    end = F.col(f"{_LAST}.{_NEXT}")
    old = F.col(f"{_FIRST}.{_OLD}")
    if current is None:
        action = F.when(F.col(_q(START_AT)).isNotNull(), F.lit("I"))
    else:
        new_value = F.struct(*[v for c, v in zip(columns, row_value, strict=True) if c not in keys], end)
        action = (F.when(F.col(_q(START_AT)).isNull(), F.lit(None))
                  .when(old.isNull(), "I").when(~new_value.eqNullSafe(old), "U"))
    types = dict(union.dtypes)
    version_row = F.struct(*[v.alias(c) for c, v in zip(columns, row_value, strict=True)],
                           F.col(_q(START_AT)).alias(START_AT), end.alias(END_AT), action.alias(ACTION))
    row_type = versions.select(version_row.alias("r")).schema["r"].dataType
    gone_rows = F.transform(F.col(_GONE), lambda at: F.struct(
        *[F.col(_q(c)) if c in keys else F.lit(None).cast(types[c]) for c in columns],
        at.alias(START_AT), F.lit(None).cast(types[_SEQ]).alias(END_AT), F.lit("D").alias(ACTION)
    ).cast(row_type))
    kept = F.filter(F.array(version_row), lambda row: row.getField(ACTION).isNotNull())
    changes = F.concat(kept, gone_rows)
    return versions.select(F.explode(changes).alias("__sm_change__")).select("__sm_change__.*")


def _carried_forward(frame: DataFrame, spec: CdcSpec, data: Sequence[str], types: Mapping[str, str],
                     key_cols: Sequence[Column], ordered: WindowSpec) -> DataFrame:
    """Partial updates: each data column of a batch upsert that carries no value, replaced by
    the last value carried since the key's last delete or truncate (a struct wraps the value so
    that a real NULL, where NULLs do not mean "unchanged", is carried too). Table rows and
    tombstones carry full values. ``frame`` as it is without partial updates."""
    if not spec.partial:
        return frame
    since_delete = (Window.partitionBy(*key_cols, F.col(_SEGMENT)).orderBy(F.col(_SEQ))
                    .rowsBetween(Window.unboundedPreceding, Window.currentRow))
    carried = {}
    for column in data:
        present = ~F.col(_BATCH) | spec.present(column, types[column])
        last = F.last(F.when(present, F.struct(F.col(_q(column)).alias("v"))), ignorenulls=True).over(since_delete)
        carried[column] = last.getField("v")
    deletes_so_far = F.sum(F.col(_DEL).cast("int")).over(
        ordered.rowsBetween(Window.unboundedPreceding, Window.currentRow))
    return frame.withColumn(_SEGMENT, deletes_so_far).withColumns(carried).drop(_SEGMENT)


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
                 spec: CdcSpec, events: DataFrame, truncates: Sequence[Column]) -> DataFrame:
    """The table's history rows that the batch's events can change, read only from the files
    whose key stats overlap the batch's key range (decided on the driver, no Spark job).

    Only versions of the touched keys that are current or end at or after the key's oldest
    event in the batch (or the batch's oldest truncate) can change: a version that ended
    before it keeps its interval and its content whatever the batch holds, and the version
    after it opened a new one already. So a key with a long history costs what its recent
    versions cost, not its whole history, every time it changes."""
    columns = [f.name for f in snapshot.schema.fields]
    keys = list(spec.keys)
    scope = ColumnScope("t", "s", columns, keys)
    ranges = [(k, *key_ranges[k], key_ranges[k][0] is not None) for k in keys if k in key_ranges]
    files = SkippingPlan((), ranges, scope, snapshot.schema, skip_nothing=False).select(
        spark, snapshot, [f for f in snapshot.files if f.live_records is None or f.live_records > 0])
    oldest = F.min(spec.sequence())
    if truncates:
        oldest = F.least(oldest, *truncates)
    bounds = events.groupBy(*[F.col(_q(k)) for k in keys]).agg(oldest.alias(_BOUND))
    end = F.col(_q(END_AT))
    # No broadcast hint: Spark broadcasts the bounds of a small batch on its own and joins a large
    # one by shuffling, instead of sending a million keys through the driver.
    return (scan_files(spark, snapshot, files).join(bounds, keys, "inner")
            .filter(end.isNull() | (end >= F.col(_BOUND))).drop(_BOUND))


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
