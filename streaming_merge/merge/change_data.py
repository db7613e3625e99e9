"""Delta's change data rows, made in the job that writes a MERGE's (or an UPDATE's, a DELETE's)
new files, as Delta's writeAllChanges does when ``delta.enableChangeDataFeed=true``.

Every joined row already carries its action code (streaming_merge.merge.rewrite). With change
data on, each row becomes the rows it stands for, through one ``inline`` of a small array:

- a row the data file keeps (copied, updated, inserted) with ``_change_type`` NULL;
- an updated row also as ``update_preimage`` (the target's values) and ``update_postimage``;
- a deleted row as ``delete`` (the target's values), and nothing else;
- an inserted row also as ``insert``.

The writer then sends the rows with a ``_change_type`` to the commit's change files and the
others to its data files (streaming_merge.table.write, ``change_data=True``), so the change
rows cost no second scan or join.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from streaming_merge.merge.resolve import ACTION_COL, COPY, ResolvedClause, ResolvedMerge, qualified
from streaming_merge.table.protocol import is_enabled
from streaming_merge.table.snapshot import DataFile, Snapshot
from streaming_merge.table.write import CHANGE_TYPE_COL

INSERT = "insert"
UPDATE_PREIMAGE = "update_preimage"
UPDATE_POSTIMAGE = "update_postimage"
DELETE = "delete"
_PREIMAGE = "__sm_preimage_{}__"


def records_change_data(snapshot: Snapshot) -> bool:
    """Whether data changes to the table must write change data (``delta.enableChangeDataFeed``)."""
    return is_enabled(snapshot.configuration, "delta.enableChangeDataFeed")


def deduplicates_deletes(resolved: ResolvedMerge) -> bool:
    """Whether the MERGE's matched deletes get their change rows from matched_delete_rows: its
    only MATCHED clause is an unconditional DELETE, which Delta lets a target row match several
    source rows, and the joined rows would then hold that row's ``delete`` once per match (Delta
    deduplicates them by row id, DeduplicateCDFDeletes)."""
    return resolved.change_data and resolved.clauses.is_only_one_unconditional_delete


def matched_delete_rows(spark: SparkSession, snapshot: Snapshot, files: Sequence[DataFile], source: DataFrame,
                        resolved: ResolvedMerge) -> DataFrame:
    """The ``delete`` change rows of the target rows of ``files`` that match a source row, each
    once (a semi join), written beside the rewrite's rows by the same job."""
    from streaming_merge.table.scan import scan_files

    target = scan_files(spark, snapshot, files, schema=resolved.output_schema).alias(resolved.target_alias)
    matched = target.join(source.alias(resolved.source_alias), resolved.condition, "left_semi")
    return matched.select(*[F.col(f"`{n}`") for n in resolved.output_schema.fieldNames()],
                          F.lit(DELETE).alias(CHANGE_TYPE_COL))


def preimage_names(schema: StructType) -> list[str]:
    """The columns that carry a row's values before the change, one per output column."""
    return [_PREIMAGE.format(i) for i in range(len(schema.fields))]


def preimage_columns(resolved: ResolvedMerge, present: bool = True) -> list[Column]:
    """The target row's values, one column per output column (NULL for a column schema
    evolution adds, which the target row did not have); ``present`` False: all NULL (rows that
    have no target row, such as the source rows a DV MERGE may insert)."""
    def build() -> list[Column]:
        columns = []
        for field, name in zip(resolved.output_schema.fields, preimage_names(resolved.output_schema), strict=True):
            value = (qualified(resolved.target_alias, field.name) if present and field.name in resolved.target_columns
                     else F.lit(None))
            columns.append(value.cast(field.dataType).alias(name))
        return columns

    return resolved.derive(("preimage", present), build)


def with_change_rows(resolved: ResolvedMerge, frame: DataFrame, clauses: Sequence[ResolvedClause],
                     keep_copies: bool) -> DataFrame:
    """``frame`` (the output columns, the action code and the preimage columns) as the rows to
    write, ``_change_type`` last: the data and change rows of ``clauses``' actions, and with
    ``keep_copies`` the copied target rows (a copy-on-write rewrite; a DV MERGE copies none)."""
    return frame.select(_rows(resolved, clauses, keep_copies))


def _rows(resolved: ResolvedMerge, clauses: Sequence[ResolvedClause], keep_copies: bool) -> Column:
    def build() -> Column:
        names = resolved.output_schema.fieldNames()
        after = [F.col(f"`{n}`") for n in names]
        before = [F.col(n) for n in preimage_names(resolved.output_schema)]

        def row(values: list[Column], change_type: str | None) -> Column:
            return F.struct(*[v.alias(n) for v, n in zip(values, names, strict=True)],
                            F.lit(change_type).cast("string").alias(CHANGE_TYPE_COL))

        inserts = {c.code for c in resolved.not_matched}
        updates = [c.code for c in clauses if c.outputs is not None and c.code not in inserts]
        # The lone unconditional DELETE's rows come from matched_delete_rows, once each.
        separate = resolved.matched[0].code if deduplicates_deletes(resolved) else None
        deletes = [c.code for c in clauses if c.outputs is None and c.code != separate]
        insert_codes = [c.code for c in clauses if c.outputs is not None and c.code in inserts]
        action = F.col(ACTION_COL)
        data = row(after, None)
        rows: Column | None = None
        for codes, value in ((updates, F.array(data, row(before, UPDATE_PREIMAGE), row(after, UPDATE_POSTIMAGE))),
                             (deletes, F.array(row(before, DELETE))),
                             (insert_codes, F.array(data, row(after, INSERT)))):
            if codes:
                test = action.isin(codes)
                rows = F.when(test, value) if rows is None else rows.when(test, value)
        if keep_copies:
            copied = action == COPY
            rows = F.when(copied, F.array(data)) if rows is None else rows.when(copied, F.array(data))
        if rows is None:  # nothing to write, yet the job must read its rows (see dv_rewrite._written)
            rows = F.when(F.spark_partition_id() < 0, F.array(data))
        return F.inline(rows)  # no array (NULL: dropped rows, uncopied rows): no row

    return resolved.derive(("change-rows", tuple(c.code for c in clauses), keep_copies), build)
