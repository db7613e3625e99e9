"""``DeltaTable.optimize()``: the builder, with delta-spark's method names.

``DeltaTable.forPath(spark, path).optimize().where("day = '2024-01-01'").executeCompaction()``
compacts the small files of the matching partitions, and the files whose deletion vectors
delete too many of their rows (see streaming_merge.optimize.binpack for the rule), and returns
OptimizeMetrics. ``executePurge()`` is Delta's ``REORG TABLE ... APPLY (PURGE)``: it rewrites
every file with a deletion vector. Immutable, like the MERGE builder.
"""

from __future__ import annotations

import dataclasses

from streaming_merge.optimize.compact import compact, purge
from streaming_merge.optimize.metrics import OptimizeMetrics
from streaming_merge.optimize.options import OptimizeOptions
from streaming_merge.optimize.predicate import Predicate, as_column, files_matching, predicate_text
from streaming_merge.table.location import TableHandle
from streaming_merge.table.snapshot import check_writable, load_snapshot


@dataclasses.dataclass(frozen=True)
class DeltaOptimizeBuilder:
    """One OPTIMIZE of ``table``; ``executeCompaction()`` runs it."""

    table: TableHandle
    predicates: tuple[Predicate, ...] = ()
    options: OptimizeOptions = dataclasses.field(default_factory=OptimizeOptions)

    def where(self, partitionFilter: Predicate) -> DeltaOptimizeBuilder:
        """Compact only the partitions matching ``partitionFilter`` (SQL text or a Column over
        partition columns only; several calls are ANDed, as in delta-spark)."""
        as_column(partitionFilter)  # a SQL syntax error surfaces here, at the call that caused it
        return dataclasses.replace(self, predicates=(*self.predicates, partitionFilter))

    def withOptions(self, **options: object) -> DeltaOptimizeBuilder:
        """Override OptimizeOptions fields: ``target_file_size`` (bytes; default the table's
        ``delta.targetFileSize``, else 128 MB), ``min_file_size`` (default the target),
        ``min_num_files`` (2), ``max_deleted_rows_ratio`` (a file whose deletion vector deletes more
        than this share of its rows is compacted whatever its size; default the session's
        ``spark.databricks.delta.optimize.maxDeletedRowsRatio``, else 0.05)."""
        return dataclasses.replace(self, options=dataclasses.replace(self.options, **options))  # type: ignore[arg-type]

    def executeCompaction(self) -> OptimizeMetrics:
        """Bin-pack the small files of the selected partitions, and those whose deletion vector
        deletes more than ``max_deleted_rows_ratio`` of their rows, into files of about the
        target size (without deletion vectors), in one Spark job and one dataChange=false commit; nothing is committed
        when there is nothing to compact."""
        spark = self.table.spark
        snapshot = load_snapshot(self.table.location)
        check_writable(snapshot)
        considered = files_matching(spark, snapshot, self.predicates)
        return compact(spark, snapshot, considered, self.options,
                       predicates=[predicate_text(p) for p in self.predicates])

    def executePurge(self) -> OptimizeMetrics:
        """Delta's ``REORG TABLE ... APPLY (PURGE)``: rewrite every file of the selected
        partitions that has a deletion vector, whatever its size, into files without one (the
        deleted rows are dropped), in bins of up to the target size, in one ``dataChange=false``
        commit whose operation is REORG; nothing is committed when no file has a deletion vector."""
        spark = self.table.spark
        snapshot = load_snapshot(self.table.location)
        check_writable(snapshot)
        considered = files_matching(spark, snapshot, self.predicates)
        return purge(spark, snapshot, considered, self.options, predicates=[predicate_text(p) for p in self.predicates])

    def executeZOrderBy(self, *columns: str) -> OptimizeMetrics:
        """Not supported: Z-ordering needs Delta's interleaving functions."""
        raise NotImplementedError(
            f"OPTIMIZE ZORDER BY {list(columns)} is not supported by streaming_merge; use executeCompaction().")
