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

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from pyspark.sql import Column, DataFrame, Observation, Window
from pyspark.sql import functions as F

from streaming_merge.errors import MergeAnalysisError, MultipleSourceRowMatchingTargetRowError

DELETE_FLAG = "__sm_is_delete__"
NULL_KEY_FLAG = "__sm_null_key__"
ORDER_COL = "__sm_batch_order__"
SEQUENCE_COL = "__sm_sequence__"
Dedupe = Literal["last", "error"]


@dataclass(frozen=True)
class CdcSpec:
    """How to read a change stream: which columns are the key, which order events, and
    which rows are deletes."""

    keys: Sequence[str]
    sequence_by: Sequence[str] = ()
    delete_when: str | Column | None = None
    dedupe: Dedupe = "last"

    def __post_init__(self) -> None:
        if not self.keys:
            raise ValueError("keys must name at least one column")
        if self.dedupe not in ("last", "error"):
            raise ValueError(f"dedupe must be 'last' or 'error', got {self.dedupe!r}")

    def check_columns(self, columns: Sequence[str]) -> None:
        known = {c.lower() for c in columns}
        for role, names in (("key", self.keys), ("sequence_by", self.sequence_by)):
            missing = [n for n in names if n.lower() not in known]
            if missing:
                raise MergeAnalysisError(
                    f"The micro-batch has no {role} column(s) {missing}; its columns are {list(columns)}."
                )

    def key_condition(self, target: str = "t", source: str = "s") -> str:
        return " AND ".join(f"`{target}`.`{k}` = `{source}`.`{k}`" for k in self.keys)

    def newer(self, target: str = "t", source: str = "s") -> str | None:
        """SQL: the source event is newer than the target row (a NULL table sequence loses)."""
        if not self.sequence_by:
            return None
        if len(self.sequence_by) == 1:
            column = self.sequence_by[0]
            return f"(`{target}`.`{column}` IS NULL OR `{source}`.`{column}` > `{target}`.`{column}`)"
        t_struct = ", ".join(f"`{target}`.`{c}`" for c in self.sequence_by)
        s_struct = ", ".join(f"`{source}`.`{c}`" for c in self.sequence_by)
        return f"(struct({t_struct}) IS NULL OR struct({s_struct}) > struct({t_struct}))"

    def sequence(self) -> Column:
        """One orderable value for the event's position (a struct for several columns)."""
        if len(self.sequence_by) == 1:
            return F.col(f"`{self.sequence_by[0]}`")
        return F.struct(*[F.col(f"`{c}`") for c in self.sequence_by])


@dataclass(frozen=True)
class ColumnSelection:
    """Which source columns reach the table (AUTO CDC's ``column_list`` /
    ``except_column_list``). The keys and the ``sequence_by`` columns always do: the MERGE
    matches on the keys and its out-of-order guard compares the table's sequence."""

    include: Sequence[str] | None = None
    exclude: Sequence[str] | None = None
    required: Sequence[str] = ()

    def __post_init__(self) -> None:
        if self.include is not None and self.exclude is not None:
            raise ValueError("Pass column_list or except_column_list, not both.")
        for name, value in (("column_list", self.include), ("except_column_list", self.exclude)):
            if value is not None and (isinstance(value, str) or not all(isinstance(c, str) for c in value)):
                raise ValueError(f"{name} must be a list of column names, got {value!r}")
        dropped_required = sorted({c.lower() for c in self.exclude or ()} & {c.lower() for c in self.required})
        if dropped_required:
            raise ValueError(
                f"except_column_list names {dropped_required}, which the sink needs in the table: keys and "
                "sequence_by columns are always kept (the MERGE matches on the keys and guards on the sequence)."
            )

    @property
    def active(self) -> bool:
        return self.include is not None or self.exclude is not None

    def columns(self, available: Sequence[str]) -> list[str]:
        """The batch's columns to keep, in batch order (internal ``__sm_`` columns included)."""
        named = list(self.include if self.include is not None else self.exclude or ())
        known = {c.lower() for c in available}
        unknown = [c for c in named if c.lower() not in known]
        if unknown:
            option = "column_list" if self.include is not None else "except_column_list"
            raise MergeAnalysisError(
                f"{option} names column(s) {unknown} that the micro-batch does not have; its columns are "
                f"{[c for c in available if not c.startswith('__sm_')]}."
            )
        if self.include is not None:
            wanted = {c.lower() for c in [*self.include, *self.required]}
            return [c for c in available if c.lower() in wanted or c.startswith("__sm_")]
        dropped = {c.lower() for c in self.exclude or ()}
        return [c for c in available if c.lower() not in dropped]


def null_key_filter(spec: CdcSpec) -> Column:
    """True for rows that cannot be applied because a key column is NULL."""
    condition = F.lit(False)
    for key in spec.keys:
        condition = condition | F.col(f"`{key}`").isNull()
    return condition


def prepare(batch: DataFrame, spec: CdcSpec) -> DataFrame:
    """One event per key (newest wins), with the DELETE_FLAG column; NULL-key rows removed."""
    spec.check_columns(batch.columns)
    is_delete = F.coalesce(F.expr(spec.delete_when) if isinstance(spec.delete_when, str) else spec.delete_when,
                           F.lit(False)) if spec.delete_when is not None else F.lit(False)
    rows = batch.filter(~null_key_filter(spec)).withColumn(DELETE_FLAG, is_delete)
    if spec.dedupe == "error":
        _fail_on_duplicates(rows, spec)
        return rows
    rows = rows.withColumn(ORDER_COL, F.monotonically_increasing_id())
    order: list[Column] = []
    if spec.sequence_by:
        order.append(spec.sequence().desc_nulls_last())
    order.append(F.col(ORDER_COL).desc())
    window = Window.partitionBy(*[F.col(f"`{k}`") for k in spec.keys]).orderBy(*order)
    return (rows.withColumn("__sm_rank__", F.row_number().over(window))
            .filter(F.col("__sm_rank__") == 1).drop("__sm_rank__", ORDER_COL))


@dataclass(frozen=True)
class PreparedBatch:
    """A micro-batch ready to be materialized in one job: one event per key plus the rows
    with a NULL key (flagged ``NULL_KEY_FLAG``, kept for the dead-letter table), and the
    observations that job fills in.

    ``counts`` (over the raw batch): ``rows``, ``nullKeys``, ``deletes``. ``stats`` (over
    the events kept): ``rows`` and ``lo{i}``/``hi{i}``, the min/max of the i-th key column,
    in the form ``streaming_merge.merge.skipping.source_stats_of`` reads.
    """

    frame: DataFrame
    counts: Observation
    stats: Observation


def prepare_observed(batch: DataFrame, spec: CdcSpec, partitions: int) -> PreparedBatch:
    """``prepare`` as one plan whose counts and key ranges are observed while it runs.

    The NULL-key rows stay in the frame (flagged) instead of being filtered in a second
    read of the batch, and the batch is hash-partitioned on the keys once, which is the
    partitioning the newest-per-key window needs.
    """
    spec.check_columns(batch.columns)
    is_delete = F.coalesce(F.expr(spec.delete_when) if isinstance(spec.delete_when, str) else spec.delete_when,
                           F.lit(False)) if spec.delete_when is not None else F.lit(False)
    counts, stats = Observation(), Observation()
    rows = (batch.withColumn(NULL_KEY_FLAG, null_key_filter(spec)).withColumn(DELETE_FLAG, is_delete)
            .observe(counts, F.count(F.lit(1)).alias("rows"),
                     F.count(F.when(F.col(NULL_KEY_FLAG), 1)).alias("nullKeys"),
                     F.count(F.when(F.col(DELETE_FLAG), 1)).alias("deletes")))
    keys = [F.col(f"`{k}`") for k in spec.keys]
    if spec.dedupe == "error":
        _fail_on_duplicates(rows.filter(~F.col(NULL_KEY_FLAG)), spec)
        kept = rows
    else:
        order: list[Column] = []
        if spec.sequence_by:
            order.append(spec.sequence().desc_nulls_last())
        order.append(F.col(ORDER_COL).desc())
        window = Window.partitionBy(*keys).orderBy(*order)
        kept = (rows.withColumn(ORDER_COL, F.monotonically_increasing_id())
                .repartition(partitions, *keys)
                .withColumn("__sm_rank__", F.row_number().over(window))
                .filter(F.col(NULL_KEY_FLAG) | (F.col("__sm_rank__") == 1)).drop("__sm_rank__", ORDER_COL))
    valid = ~F.col(NULL_KEY_FLAG)
    aggregates = [F.count(F.when(valid, 1)).alias("rows")]
    for i, key in enumerate(keys):
        aggregates += [F.min(F.when(valid, key)).alias(f"lo{i}"), F.max(F.when(valid, key)).alias(f"hi{i}")]
    return PreparedBatch(kept.observe(stats, *aggregates), counts, stats)


def _fail_on_duplicates(rows: DataFrame, spec: CdcSpec) -> None:
    keys = [F.col(f"`{k}`") for k in spec.keys]
    duplicates = rows.groupBy(*keys).count().filter(F.col("count") > 1).limit(10).collect()
    if duplicates:
        found = [({k: row[k] for k in spec.keys}, int(row["count"])) for row in duplicates]
        listing = "; ".join(", ".join(f"{k}={v!r}" for k, v in key.items()) + f" ({n} events)" for key, n in found)
        raise MultipleSourceRowMatchingTargetRowError(
            f"The micro-batch holds several events for the same key and dedupe='error': {listing}. "
            "Use dedupe='last' (with sequence_by) to keep the newest event per key.", found)
