"""CDC preparation of a micro-batch: keys, ordering, deletes, duplicates.

A change stream carries several events per key, out of order across partitions and
batches. Before the MERGE each batch is reduced to one event per key (the newest by
``sequence_by``, or the last in batch order), delete events are flagged, and the MERGE
clauses only let an event win over a table row that is older, so a late event never
overwrites or deletes newer data (Databricks' APPLY CHANGES gives the same guarantee).

Batch order without ``sequence_by``: rows are ordered by (input partition, position in
that partition) of the materialized batch, i.e. ``monotonically_increasing_id()``. For a
Kafka source that is offset order within a Kafka partition; for a file source it is
file order then line order. Use ``sequence_by`` whenever events of one key can arrive
in different partitions.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pyspark.sql import Column, DataFrame, Observation, Window
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from streaming_merge.errors import InvalidArgumentError, MergeAnalysisError, MultipleSourceRowMatchingTargetRowError
from streaming_merge.spark.per_context import PerContext
from streaming_merge.streaming.sequence_layout import CDC_METADATA, UPSERT_SEQUENCE

DELETE_FLAG = "__sm_is_delete__"
NULL_KEY_FLAG = "__sm_null_key__"
ORDER_COL = "__sm_batch_order__"
SEQUENCE_COL = "__sm_sequence__"
TRUNCATE_FLAG = "__sm_is_truncate__"
RESET_COL = "__sm_reset_seq__"  # partial updates: sequence of the batch's last delete of the key
# Partial updates: struct(seq) of the event a column's value came from; NULL when no event
# carried a value (a struct, so that an event without a sequence still counts as one).
PROVIDER_PREFIX = "__sm_from__"
Dedupe = Literal["last", "error"]


@dataclass(frozen=True)
class CdcSpec:
    """How to read a change stream: which columns are the key, which order events, and
    which rows are deletes."""

    keys: Sequence[str]
    sequence_by: Sequence[str] = ()
    delete_when: str | Column | None = None
    dedupe: Dedupe = "last"
    # Partial updates: a NULL (with ignore_null_updates, in every data column, or only in those of
    # ignore_null_columns, or in all but those of ignore_null_except) or the placeholder value in a
    # string column (unavailable_value) means "unchanged" and never overwrites the table's value.
    ignore_null_updates: bool = False
    unavailable_value: str | None = None
    # Rows for which this is true truncate the table as of their sequence value (they carry no key).
    truncate_when: str | Column | None = None
    # SCD type 2 keeps every event of a key (one per sequence value), not only the newest.
    keep_all_events: bool = False
    ignore_null_columns: Sequence[str] | None = None  # ignore_null_updates_column_list
    ignore_null_except: Sequence[str] | None = None  # ignore_null_updates_except_column_list

    @property
    def partial(self) -> bool:
        return (self.ignore_null_updates or bool(self.ignore_null_columns) or self.ignore_null_except is not None
                or self.unavailable_value is not None)

    def __post_init__(self) -> None:
        if not self.keys:
            raise InvalidArgumentError("keys must name at least one column")
        if self.dedupe not in ("last", "error"):
            raise InvalidArgumentError(f"dedupe must be 'last' or 'error', got {self.dedupe!r}")
        given = [name for name, value in (("ignore_null_updates=True", self.ignore_null_updates or None),
                                          ("ignore_null_updates_column_list", self.ignore_null_columns),
                                          ("ignore_null_updates_except_column_list", self.ignore_null_except))
                 if value is not None]
        if len(given) > 1:
            raise InvalidArgumentError(
                f"Pass one of {' / '.join(given)}: they are alternatives (every column, only the "
                             "listed ones, all but the listed ones), as in Spark's create_auto_cdc_flow.")

    def check_columns(self, columns: Sequence[str]) -> None:
        known = {c.lower() for c in columns}
        for role, names in (("key", self.keys), ("sequence_by", self.sequence_by)):
            missing = [n for n in names if n.lower() not in known]
            if missing:
                raise MergeAnalysisError(
                    f"The micro-batch has no {role} column(s) {missing}; its columns are {list(columns)}."
                )
        named = self.ignore_null_columns if self.ignore_null_columns is not None else self.ignore_null_except
        if named:
            option = ("ignore_null_updates_column_list" if self.ignore_null_columns is not None
                      else "ignore_null_updates_except_column_list")
            data = {c.lower() for c in self.data_columns(columns)}
            wrong = [c for c in named if c.lower() not in data]
            if wrong:
                raise MergeAnalysisError(
                    f"{option} names {wrong}, which are not data columns of the micro-batch: keys and sequence_by "
                    f"columns always come from the newest event. Its data columns are {self.data_columns(columns)}.")

    def ignores_nulls(self, column: str) -> bool:
        """True when a NULL in ``column`` means "unchanged" (AUTO CDC's ignore-null selection)."""
        if self.ignore_null_updates:
            return True
        if self.ignore_null_columns is not None:
            return column.lower() in {c.lower() for c in self.ignore_null_columns}
        if self.ignore_null_except is not None:
            return column.lower() not in {c.lower() for c in self.ignore_null_except}
        return False

    def present(self, column: str, data_type: str) -> Column:
        """True where an event carries a value for ``column`` (of Spark type name ``data_type``):
        not a NULL when NULLs mean "unchanged" there, not the placeholder in a string column."""
        value = F.col(f"`{column}`")
        present = value.isNotNull() if self.ignores_nulls(column) else F.lit(True)
        if self.unavailable_value is not None and data_type == "string":
            present = present & ~value.eqNullSafe(F.lit(self.unavailable_value))
        return present

    def key_condition(self, target: str = "t", source: str = "s") -> str:
        return " AND ".join(f"`{target}`.`{k}` = `{source}`.`{k}`" for k in self.keys)

    def stored_sequence(self, alias: str, in_metadata: bool = False) -> str:
        """SQL: the sequence of a row of the frame aliased ``alias``, kept in the ``sequence_by``
        columns or, ``in_metadata``, in ``__spark_autocdc_metadata.upsertSequence`` (see
        ``sequence_layout``); a struct of the columns for several, as ``sequence`` forms it."""
        if in_metadata:
            return f"`{alias}`.`{CDC_METADATA}`.`{UPSERT_SEQUENCE}`"
        if len(self.sequence_by) == 1:
            return f"`{alias}`.`{self.sequence_by[0]}`"
        return "struct(" + ", ".join(f"`{alias}`.`{c}`" for c in self.sequence_by) + ")"

    def newer(self, target: str = "t", source: str = "s", in_metadata: bool = False) -> str | None:
        """SQL: the source event is newer than the target row (a NULL table sequence loses).
        ``in_metadata``: both sides keep the sequence in the metadata column."""
        if not self.sequence_by:
            return None
        row = self.stored_sequence(target, in_metadata)
        # coalesce: a NULL source sequence is older (false, not NULL), also where this is negated
        return f"({row} IS NULL OR coalesce({self.stored_sequence(source, in_metadata)} > {row}, false))"

    def later(self, sequence_sql: str, target: str = "t", in_metadata: bool = False) -> str:
        """SQL: ``sequence_sql`` (a sequence value of the source's form) is newer than the target
        row's sequence (a NULL table sequence loses)."""
        if not self.sequence_by:
            return "true"
        row = self.stored_sequence(target, in_metadata)
        return f"({row} IS NULL OR coalesce({sequence_sql} > {row}, false))"

    def data_columns(self, columns: Sequence[str]) -> list[str]:
        """The columns a partial update may leave unchanged: all but keys, sequence, the
        sequence's metadata column and internal ones."""
        fixed = {c.lower() for c in [*self.keys, *self.sequence_by, CDC_METADATA]}
        return [c for c in columns if c.lower() not in fixed and not c.startswith("__sm_")]

    def sequence_literal(self, value: Any, schema: StructType) -> Column:
        """A sequence value observed on the driver (a scalar, or a Row for several columns)
        as a typed literal of the sequence's form, to compare with the table's columns."""
        types = {f.name.lower(): f.dataType for f in schema.fields}
        if len(self.sequence_by) == 1:
            return F.lit(value).cast(types[self.sequence_by[0].lower()])
        return F.struct(*[F.lit(part).cast(types[name.lower()]).alias(name)
                          for name, part in zip(self.sequence_by, value, strict=True)])

    def sequence_of(self, alias: str, in_metadata: bool = False) -> Column:
        """The sequence of the rows of the table aliased ``alias`` (as ``sequence`` forms it)."""
        if in_metadata:
            return F.col(f"{alias}.`{CDC_METADATA}`.`{UPSERT_SEQUENCE}`")
        if len(self.sequence_by) == 1:
            return F.col(f"{alias}.`{self.sequence_by[0]}`")
        return F.struct(*[F.col(f"{alias}.`{c}`").alias(c) for c in self.sequence_by])

    def sequence(self) -> Column:
        """One orderable value for the event's position (a struct for several columns)."""
        if len(self.sequence_by) == 1:
            return F.col(f"`{self.sequence_by[0]}`")
        return F.struct(*[F.col(f"`{c}`") for c in self.sequence_by])


@dataclass(frozen=True)
class ColumnSelection:
    """Which source columns reach the table (AUTO CDC's ``column_list`` /
    ``except_column_list``). The keys always do: the MERGE matches on them. The ``sequence_by``
    columns reach it when selected; when they are not, an SCD 1 table keeps each row's sequence
    in ``__spark_autocdc_metadata`` instead (``sequence_layout``), and a table that already has
    them keeps them (``columns(keep=...)``)."""

    include: Sequence[str] | None = None
    exclude: Sequence[str] | None = None
    required: Sequence[str] = ()

    def __post_init__(self) -> None:
        if self.include is not None and self.exclude is not None:
            raise InvalidArgumentError("Pass column_list or except_column_list, not both.")
        for name, value in (("column_list", self.include), ("except_column_list", self.exclude)):
            if value is not None and (isinstance(value, str) or not all(isinstance(c, str) for c in value)):
                raise InvalidArgumentError(f"{name} must be a list of column names, got {value!r}")
        dropped_required = sorted({c.lower() for c in self.exclude or ()} & {c.lower() for c in self.required})
        if dropped_required:
            raise InvalidArgumentError(
                f"except_column_list names {dropped_required}, which the sink needs in the table: keys are always "
                "kept (the MERGE matches on them)."
            )

    @property
    def active(self) -> bool:
        return self.include is not None or self.exclude is not None

    def leaves_out(self, names: Sequence[str]) -> list[str]:
        """Those of ``names`` the selection keeps out of the table (before seeing a batch)."""
        if self.include is not None:
            wanted = {c.lower() for c in [*self.include, *self.required]}
            return [n for n in names if n.lower() not in wanted]
        dropped = {c.lower() for c in self.exclude or ()}
        return [n for n in names if n.lower() in dropped]

    def columns(self, available: Sequence[str], keep: Sequence[str] = ()) -> list[str]:
        """The batch's columns to keep, in batch order (internal ``__sm_`` columns and ``keep``
        included)."""
        named = list(self.include if self.include is not None else self.exclude or ())
        known = {c.lower() for c in available}
        unknown = [c for c in named if c.lower() not in known]
        if unknown:
            option = "column_list" if self.include is not None else "except_column_list"
            raise MergeAnalysisError(
                f"{option} names column(s) {unknown} that the micro-batch does not have; its columns are "
                f"{[c for c in available if not c.startswith('__sm_')]}."
            )
        forced = {c.lower() for c in keep}
        if self.include is not None:
            wanted = {c.lower() for c in [*self.include, *self.required]} | forced
            return [c for c in available if c.lower() in wanted or c.startswith("__sm_")]
        dropped = {c.lower() for c in self.exclude or ()} - forced
        return [c for c in available if c.lower() not in dropped]


def null_key_filter(spec: CdcSpec) -> Column:
    """True for rows that cannot be applied because a key column is NULL."""
    condition = F.lit(False)
    for key in spec.keys:
        condition = condition | F.col(f"`{key}`").isNull()
    return condition


@dataclass(frozen=True)
class PreparedBatch:
    """A micro-batch ready to be materialized in one job: one event per key plus the rows
    with a NULL key (flagged ``NULL_KEY_FLAG``, kept for the dead-letter table), and the
    observations that job fills in.

    ``counts`` (over the raw batch): ``rows``, ``nullKeys``, ``deletes``, with ``sequence_by``
    ``sequenceLo`` and ``sequenceNulls`` (the least first sequence value of the events with a
    key, and how many of them have none), with ``truncate_when`` ``truncates`` (their sequence
    values) and ``truncateNulls`` (how many have none). ``stats`` (over
    the events kept): ``rows`` and ``lo{i}``/``hi{i}``, the min/max of the i-th key column,
    in the form ``streaming_merge.merge.skipping.source_stats_of`` reads.
    """

    frame: DataFrame
    counts: Observation
    stats: Observation


def prepare_observed(batch: DataFrame, spec: CdcSpec, partitions: int) -> PreparedBatch:
    """One event per key (the newest), delete events flagged, as one plan whose counts and
    key ranges are observed while it runs (see :class:`BatchPreparer`, which also keeps the
    expressions for the next batch of the same schema)."""
    return BatchPreparer(spec).prepare(batch, partitions)


Plan = Callable[[DataFrame, Observation, Observation], DataFrame]


class BatchPreparer:
    """``prepare_observed`` for a stream of micro-batches of one schema.

    The plan's expressions depend on the spec and the batch's schema only, but building them
    takes hundreds of Python→JVM round trips (about 900 and 150 ms for a partial-update fold of
    a dozen columns), paid again by every micro-batch. They are built once per schema (and
    SparkContext) and applied to each batch, which then costs a dozen DataFrame operations.

    The NULL-key rows stay in the frame (flagged) instead of being filtered in a second
    read of the batch, and the batch is hash-partitioned on the keys once, which is the
    partitioning the newest-per-key step needs.
    """

    def __init__(self, spec: CdcSpec) -> None:
        self._spec = spec
        self._plans: PerContext[Plan] = PerContext()

    def prepare(self, batch: DataFrame, partitions: int) -> PreparedBatch:
        plan = self._plans.get(batch.sparkSession.sparkContext, (tuple(batch.dtypes), partitions),
                               lambda: _plan(self._spec, batch.columns, dict(batch.dtypes), partitions))
        counts, stats = Observation(), Observation()
        return PreparedBatch(plan(batch, counts, stats), counts, stats)


def _plan(spec: CdcSpec, columns: Sequence[str], types: dict[str, str], partitions: int) -> Plan:
    """The expressions of ``prepare_observed`` for batches with these columns, built now, and
    the DataFrame operations that apply them to a batch."""
    spec.check_columns(columns)
    is_delete = _flag(spec.delete_when)
    is_truncate = _flag(spec.truncate_when)
    observed = [F.count(F.lit(1)).alias("rows"), F.count(F.when(F.col(NULL_KEY_FLAG), 1)).alias("nullKeys"),
                F.count(F.when(F.col(DELETE_FLAG), 1)).alias("deletes")]
    valid_event = ~F.col(NULL_KEY_FLAG) & ~F.col(TRUNCATE_FLAG)
    if spec.sequence_by:
        # The oldest event's (first) sequence value, and how many events have none: a batch
        # whose every event is newer than every tombstone needs no tombstone lookup.
        first = F.col(f"`{spec.sequence_by[0]}`")
        observed += [F.min(F.when(valid_event, first)).alias("sequenceLo"),
                     F.count(F.when(valid_event & first.isNull(), 1)).alias("sequenceNulls")]
    if spec.partial:
        # Events that leave a data column unchanged (a NULL or the placeholder where that means
        # "unchanged"): with none, every folded row takes all its values from its newest event,
        # and the partial clauses write what the whole-row ones do (see sink_clauses.cdc_upsert).
        complete = F.lit(True)
        for column in spec.data_columns(columns):
            complete = complete & spec.present(column, types[column])
        observed.append(F.count(F.when(valid_event & ~F.col(DELETE_FLAG) & ~complete, 1)).alias("partialEvents"))
    if spec.truncate_when is not None:
        if not spec.sequence_by:
            raise InvalidArgumentError(
                "apply_as_truncates needs sequence_by: a truncate applies as of its sequence value")
        observed += [F.collect_list(F.when(F.col(TRUNCATE_FLAG), spec.sequence())).alias("truncates"),
                     F.count(F.when(F.col(TRUNCATE_FLAG) & first.isNull(), 1)).alias("truncateNulls")]
    # One projection for the three flags (each DataFrame operation analyses the whole plan again).
    flags = {TRUNCATE_FLAG: is_truncate, NULL_KEY_FLAG: null_key_filter(spec) & ~is_truncate,
             DELETE_FLAG: is_delete & ~is_truncate}
    not_truncate = ~F.col(TRUNCATE_FLAG)
    keys = [F.col(f"`{k}`") for k in spec.keys]
    row_columns = [*columns, *[c for c in (NULL_KEY_FLAG, DELETE_FLAG) if c not in columns]]
    keep: Callable[[DataFrame], DataFrame]
    if spec.keep_all_events or not (spec.partial or spec.dedupe == "error"):
        keep = _newest_per_key(spec, keys, partitions)
    elif spec.partial:
        fold = _fold_partial(spec, row_columns, types, keys, partitions)
        keep = fold if spec.dedupe != "error" else _failing_on_duplicates(spec, keys, fold)
    else:
        keep = _failing_on_duplicates(spec, keys, lambda rows: rows)
    valid = ~F.col(NULL_KEY_FLAG)
    aggregates = [F.count(F.when(valid, 1)).alias("rows")]
    for i, key in enumerate(keys):
        aggregates += [F.min(F.when(valid, key)).alias(f"lo{i}"), F.max(F.when(valid, key)).alias(f"hi{i}")]

    def apply(batch: DataFrame, counts: Observation, stats: Observation) -> DataFrame:
        rows = (batch.withColumns(flags)
                .observe(counts, *observed)
                .filter(not_truncate).drop(TRUNCATE_FLAG))
        return keep(rows).observe(stats, *aggregates)

    return apply


def _newest_per_key(spec: CdcSpec, keys: list[Column], partitions: int) -> Callable[[DataFrame], DataFrame]:
    """The newest event per key (by ``sequence_by``, then batch order); SCD 2 keeps every
    event and collapses only re-sends of one (key, sequence value), to the last in batch order."""
    if spec.keep_all_events:
        window = Window.partitionBy(*keys, spec.sequence()).orderBy(F.col(ORDER_COL).desc())
    else:
        order: list[Column] = []
        if spec.sequence_by:
            order.append(spec.sequence().desc_nulls_last())
        order.append(F.col(ORDER_COL).desc())
        window = Window.partitionBy(*keys).orderBy(*order)
    order_id = F.monotonically_increasing_id()
    rank = F.row_number().over(window)
    first = F.col(NULL_KEY_FLAG) | (F.col("__sm_rank__") == 1)

    def keep(rows: DataFrame) -> DataFrame:
        return (clustered_by_keys(rows.withColumn(ORDER_COL, order_id), partitions, keys)
                .withColumn("__sm_rank__", rank)
                .filter(first).drop("__sm_rank__", ORDER_COL))

    return keep


def clustered_by_keys(rows: DataFrame, partitions: int, keys: Sequence[Column]) -> DataFrame:
    """``rows`` with each key's rows in one of ``partitions`` partitions, as a per-key window,
    aggregate or join needs them. One partition is a coalesce, not a shuffle: Spark's single
    partition satisfies every clustering, so the window or aggregate above runs in the same
    stage as the read, one task instead of a shuffle between two stages of a task per slot (the
    sink's materialization on 2 cores, 2026-11-27: 1k-event batches 148-182 -> 113-119 ms, 20k-event
    batches 227-257 -> 194-197 ms). Past a few tens of thousands of rows one task would hold back
    the cores, so MergeSink asks for one partition only for small batches."""
    if partitions == 1:
        return rows.coalesce(1)
    return rows.repartition(partitions, *keys)


def _failing_on_duplicates(spec: CdcSpec, keys: list[Column], then: Callable[[DataFrame], DataFrame]
                           ) -> Callable[[DataFrame], DataFrame]:
    """dedupe='error': a Spark job of its own refuses a batch with two events of one key."""
    valid = ~F.col(NULL_KEY_FLAG)

    def keep(rows: DataFrame) -> DataFrame:
        _fail_on_duplicates(rows.filter(valid), spec, keys)
        return then(rows)

    return keep


def _flag(condition: str | Column | None) -> Column:
    """A boolean column from a SQL condition or Column (NULL counts as false)."""
    if condition is None:
        return F.lit(False)
    return F.coalesce(F.expr(condition) if isinstance(condition, str) else condition, F.lit(False))


def forget_truncated(events: DataFrame, spec: CdcSpec, truncated_at: Column) -> DataFrame:
    """The prepared events minus what a truncate at ``truncated_at`` erased: events at or
    before it go, and for partial updates the values taken from such events are forgotten and
    the row starts afresh (the truncate acts as a delete of every key)."""
    kept = events.filter(spec.sequence() > truncated_at)
    if not spec.partial:
        return kept
    columns = values_newer_than(events.columns, spec, truncated_at)
    columns = [F.greatest(F.col(f"`{RESET_COL}`"), truncated_at).alias(RESET_COL) if name == RESET_COL else column
               for name, column in zip(events.columns, columns, strict=True)]
    return kept.select(*columns)


def values_newer_than(columns: Sequence[str], spec: CdcSpec, threshold: Column, alias: str = "") -> list[Column]:
    """``columns`` of a folded partial-update frame (``_fold_partial``), each data value and its
    provider sequence kept only when the event it came from is newer than ``threshold`` (all
    kept where ``threshold`` is NULL): what a delete or truncate at ``threshold`` erased is
    forgotten. ``alias`` qualifies the columns (``"e."``) in a join."""
    data = set(spec.data_columns(columns))
    kept = []
    for column in columns:
        value = F.col(f"{alias}`{column}`")
        if column in data or column.startswith(PROVIDER_PREFIX):
            provider = F.col(f"{alias}`{column if column.startswith(PROVIDER_PREFIX) else PROVIDER_PREFIX + column}`")
            value = F.when(threshold.isNull() | (provider.getField("seq") > threshold), value).alias(column)
        # The other columns (the keys among them) are selected as they are, not aliased to their
        # own name: the optimizer drops such an alias, and a local checkpoint of this frame then
        # states its hash partitioning on the keys in attributes its output no longer has, so a
        # join on the keys shuffled the checkpoint once more.
        kept.append(value)
    return kept


def _fold_partial(spec: CdcSpec, columns: Sequence[str], types: dict[str, str], keys: list[Column],
                  partitions: int) -> Callable[[DataFrame], DataFrame]:
    """One row per key that carries the batch's events folded in sequence order, for partial
    updates: the newest event's keys, sequence and delete flag; per data column the newest
    *present* value after the batch's last delete of the key (NULL when none) and, in
    ``__sm_from__<column>``, the sequence of the event it came from (as ``struct(seq)``: NULL
    when no event carried a value, not NULL for an event without a sequence, which wins over a
    table row without one as a whole-row upsert does); in ``__sm_reset_seq__`` the
    sequence of that last delete. The MERGE then decides per column against the table row's
    sequence (``MergeSink``): a value from an event older than the row is ignored, as a whole
    event older than the row is. NULL-key rows pass through unchanged, for the dead letter.

    Events of one key in one batch are ordered by ``sequence_by`` then batch order, as the
    newest-per-key rule orders them."""
    data = spec.data_columns(columns)
    # An event's position among its key's events, unique per key: its sequence (the batch
    # order itself without sequence_by), then its batch order.
    sequence = spec.sequence() if spec.sequence_by else F.col(ORDER_COL)
    ordering = F.struct(sequence.alias("seq"), F.col(ORDER_COL).alias("pos"))
    null_key = F.col(NULL_KEY_FLAG)
    aggregates = [F.max_by(F.struct(*[F.col(f"`{c}`") for c in columns if c not in data]),
                           ordering).alias("__sm_last__"),
                  F.max(F.when(F.col(DELETE_FLAG) & ~null_key, ordering)).alias("__sm_last_delete__")]
    for column in data:
        value = F.col(f"`{column}`")
        present = spec.present(column, types[column])
        # The newest present value with its position: one aggregate, no window. It counts only
        # when it comes after the key's last delete; if it does not, no present value does.
        aggregates.append(F.max(F.when(present | null_key, F.struct(ordering.alias("o"), value.alias("v"))))
                          .alias(f"__sm_newest_{column}"))
    # A NULL-key row is a group of its own (its batch order joins the grouping), so it passes
    # through whole, for the dead letter, in the same aggregate instead of a second read.
    alone = F.when(null_key, F.col(ORDER_COL)).alias("__sm_alone__")
    last_delete = F.col("__sm_last_delete__")
    passes = F.col(f"__sm_last__.`{NULL_KEY_FLAG}`")

    def after_reset(column: str) -> Column:
        return last_delete.isNull() | (F.col(f"`__sm_newest_{column}`.o") > last_delete)

    def provider_of(column: str) -> Column:
        newest = F.col(f"`__sm_newest_{column}`")
        return F.when(newest.isNotNull(), F.struct(newest.getField("o").getField("seq").alias("seq")))

    def folded_only(column: str, value: Column) -> Column:
        return F.when(~passes & after_reset(column), value)

    outputs = [
        *[F.when(passes | after_reset(c), F.col(f"`__sm_newest_{c}`.v")).alias(c) if c in data
          else F.col(f"`{c}`") if c in spec.keys else F.col(f"__sm_last__.`{c}`").alias(c) for c in columns],
        F.when(~passes, last_delete.getField("seq")).alias(RESET_COL),
        *[folded_only(c, provider_of(c)).alias(f"{PROVIDER_PREFIX}{c}") for c in data]]
    order_id = F.monotonically_increasing_id()

    def fold(rows: DataFrame) -> DataFrame:
        with_order = clustered_by_keys(rows.withColumn(ORDER_COL, order_id), partitions, keys)
        return with_order.groupBy(*keys, alone).agg(*aggregates).select(*outputs)

    return fold


def _fail_on_duplicates(rows: DataFrame, spec: CdcSpec, keys: list[Column]) -> None:
    duplicates = rows.groupBy(*keys).count().filter(F.col("count") > 1).limit(10).collect()
    if duplicates:
        found = [({k: row[k] for k in spec.keys}, int(row["count"])) for row in duplicates]
        listing = "; ".join(", ".join(f"{k}={v!r}" for k, v in key.items()) + f" ({n} events)" for key, n in found)
        raise MultipleSourceRowMatchingTargetRowError(
            f"The micro-batch holds several events for the same key and dedupe='error': {listing}. "
            "Use dedupe='last' (with sequence_by) to keep the newest event per key.", found)
