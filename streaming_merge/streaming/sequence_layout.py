"""Where an SCD type 1 table keeps each row's sequence value.

The sink's out-of-order guard compares an event's sequence with the row's: an event never
overwrites or deletes a newer row, and partial updates decide per column against it. So the
table must remember every row's sequence, even when the user leaves the ``sequence_by``
columns out of it (``except_column_list=["operation", "sequenceNum"]``, Databricks'
canonical AUTO CDC example, or a ``column_list`` that does not name them). Two layouts:

* **columns**: the ``sequence_by`` columns themselves are table columns (how the sink always
  worked; a table that has them keeps this layout, whatever the column selection says now);
* **metadata**: one reserved column ``__spark_autocdc_metadata``, a struct
  ``<deleteSequence, upsertSequence>`` of the sequence's type (a struct of the columns for
  several), chosen for a new table whose column selection leaves a sequence column out.

The metadata column is Spark's own: Spark 4.3's AUTO CDC (``Scd1BatchProcessor``) gives an
SCD 1 target exactly this column, with this name, layout and field order, and keeps only live
rows in it, so ``deleteSequence`` is always NULL and ``upsertSequence`` is the row's sequence.
Reusing it, rather than a name of our own, means one documented reserved column for readers
of both engines' tables, and a name no source column may use: Spark refuses sources with
``__spark_autocdc_`` columns, and so does this sink for a column of that name that would
reach the table. Deletes are remembered in the tombstone table, as before, not in the target.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import DataType, StructField, StructType

from streaming_merge.errors import MergeAnalysisError

if TYPE_CHECKING:
    from streaming_merge.streaming.cdc import CdcSpec, ColumnSelection

CDC_METADATA = "__spark_autocdc_metadata"
DELETE_SEQUENCE = "deleteSequence"
UPSERT_SEQUENCE = "upsertSequence"


@dataclass(frozen=True)
class SequenceLayout:
    """``in_metadata``: the table keeps the sequence in ``__spark_autocdc_metadata`` (else in
    the ``sequence_by`` columns). ``sequence_columns``: the sequence columns the table keeps
    whatever the selection (all of them in the columns layout, none in the metadata one)."""

    in_metadata: bool
    sequence_columns: tuple[str, ...] = ()


def choose_layout(spec: CdcSpec, table: StructType | None, selected: Sequence[str], *, target: str,
                  schema_evolution: bool) -> SequenceLayout:
    """The layout of the table at ``target`` (None: not created yet), given the batch columns
    the column selection lets through (``selected``)."""
    wanted = [c.lower() for c in spec.sequence_by]
    if table is not None:
        present = {f.name.lower() for f in table.fields}
        if CDC_METADATA.lower() in present:
            return SequenceLayout(True)
        if all(c in present for c in wanted):
            return SequenceLayout(False, tuple(spec.sequence_by))
        if not schema_evolution:
            raise MergeAnalysisError(
                f"The table `{target}` has neither the sequence_by column(s) {list(spec.sequence_by)} nor "
                f"`{CDC_METADATA}`, so the sink cannot tell how new its rows are (it compares every event with "
                "the row's sequence). Pass schema_evolution=True to add the column, or write to a new table.")
    kept = {c.lower() for c in selected}
    if all(c in kept for c in wanted):
        return SequenceLayout(False, tuple(spec.sequence_by))
    return SequenceLayout(True)


def sequence_type(spec: CdcSpec, schema: StructType) -> DataType:
    """The sequence's type: its column's, or a struct of the columns for several (the type of
    ``CdcSpec.sequence()`` over ``schema``)."""
    types = {f.name.lower(): f.dataType for f in schema.fields}
    if len(spec.sequence_by) == 1:
        return types[spec.sequence_by[0].lower()]
    return StructType([StructField(c, types[c.lower()]) for c in spec.sequence_by])


def metadata_value(spec: CdcSpec, schema: StructType) -> Column:
    """A live row's ``__spark_autocdc_metadata``: no delete sequence, the event's sequence as
    the upsert sequence (Spark's field order)."""
    kind = sequence_type(spec, schema)
    return F.struct(F.lit(None).cast(kind).alias(DELETE_SEQUENCE),
                    spec.sequence().cast(kind).alias(UPSERT_SEQUENCE)).alias(CDC_METADATA)


def refuse_reserved(columns: Sequence[str]) -> None:
    """A batch column named like the reserved column cannot reach the table: it would be taken
    for (or clash with) the sink's own."""
    clashing = [c for c in columns if c.lower() == CDC_METADATA.lower()]
    if clashing:
        raise MergeAnalysisError(
            f"The micro-batch has a column `{clashing[0]}`: that name is reserved for the sequence of each row "
            f"(Spark's AUTO CDC metadata column). Leave it out with except_column_list=[{CDC_METADATA!r}] or "
            "rename it.")


@dataclass(frozen=True)
class TableColumns:
    """For one sink: where its table keeps the sequence and which batch columns reach it.
    ``sequence_in_columns``: SCD 2 (``__START_AT`` / ``__END_AT`` carry the sequence) and custom
    clauses (which refuse a selection without the sequence) never use the metadata column."""

    spec: CdcSpec | None
    selection: ColumnSelection
    target: str
    schema_evolution: bool
    sequence_in_columns: bool

    def layout(self, table: StructType | None, columns: Sequence[str]) -> SequenceLayout:
        """The layout of the table (``table``: its schema, None before it exists) for a batch
        of ``columns``: what the table has, or for a new table what the selection lets through."""
        spec = self.spec
        if spec is None or not spec.sequence_by:
            return SequenceLayout(False)
        selected = {c.lower() for c in self.selection.columns(columns)}
        if self.sequence_in_columns:
            present = {f.name.lower() for f in table.fields} if table is not None else set()
            return SequenceLayout(False, tuple(c for c in spec.sequence_by
                                               if c.lower() in present or c.lower() in selected))
        return choose_layout(spec, table, list(selected), target=self.target, schema_evolution=self.schema_evolution)

    def columns(self, columns: Sequence[str], layout: SequenceLayout) -> list[str]:
        """The batch columns that reach the table: the selection's, the keys, and the sequence
        columns the table keeps (``layout``); a column named like the metadata column is refused."""
        selected = self.selection.columns(columns, keep=layout.sequence_columns)
        if self.spec is not None:
            refuse_reserved([c for c in selected if not c.startswith("__sm_")])
        return selected

    def frame(self, source: DataFrame, layout: SequenceLayout) -> DataFrame:
        """SCD 1's MERGE source: the columns that reach the table, plus the metadata column when
        the table keeps the sequence there (computed here, after the tombstones and truncates,
        which read the sequence columns). The keys are selected as they are (not aliased), so the
        materialized batch's partitioning on them still holds (see ``cdc.values_newer_than``)."""
        columns = self.columns(source.columns, layout)
        if not layout.in_metadata:
            if list(columns) == list(source.columns):
                return source
            return source.select(*[F.col(f"`{c}`") for c in columns])
        assert self.spec is not None
        return source.select(*[F.col(f"`{c}`") for c in columns], metadata_value(self.spec, source.schema))
