"""The deletion-vector MERGE whose written rows all come from the source, in two plain jobs.

When no MATCHED clause reads the target row (``whenMatchedUpdateAll``, deletes, conditions on
the source's columns: an upsert), what a source row writes depends only on the row and on
whether it matched: the target rows matter for which positions the deletion vectors mark, not
for the written values. So the target's keys stream past the broadcast source once, in a job
that writes nothing and observes the matched pairs (the positions to mark, and which source
rows matched); then the source's own rows are written, each taking its MATCHED or its NOT
MATCHED clause by that set. The general plan (dv_rewrite._streamed_past_source) carries every
joined row, with all its columns, through a shuffle to meet the source's rows and find the
inserts; here no row crosses a shuffle and the target side reads the join's columns only.

A source row that matched two target rows (a key the target holds twice) would write one
updated row per match: the caller then runs the general plan.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from streaming_merge.merge.resolve import ResolvedMerge
from streaming_merge.spark.constant_lookup import lookup
from streaming_merge.table.dv_filter import bitset_membership

# Optimized-plan nodes that keep a source's rows in the same partitions and order every time it
# is read, so that monotonically_increasing_id() names the same row in both jobs.
_ORDER_KEEPING = frozenset({"Project", "Filter", "LogicalRDD", "ExternalRDD", "LogicalRelation", "LocalRelation",
                            "Range"})


def writes_from_source_side(resolved: ResolvedMerge, target: DataFrame, source: DataFrame) -> bool:
    """Whether this MERGE can write from the source side: it inserts, has no NOT MATCHED BY
    SOURCE clause and records no change data, no MATCHED clause reads the target row or is
    non-deterministic (the two jobs each evaluate it), and reading the source twice gives the
    same rows in the same order."""
    if not resolved.not_matched or resolved.not_matched_by_source or resolved.change_data:
        return False
    return (resolved.derive(("dv-source-side",), lambda: _matched_reads_source_only(resolved, target, source))
            and _keeps_row_order(source))


def _matched_reads_source_only(resolved: ResolvedMerge, target: DataFrame, source: DataFrame) -> bool:
    expressions: list[Column] = []
    for clause in resolved.matched:
        expressions += [*([clause.condition] if clause.condition is not None else []),
                        *(clause.outputs.values() if clause.outputs is not None else [])]
    if not expressions:
        return True
    plan = target.join(source, resolved.condition).select(*expressions)._jdf.queryExecution().analyzed()
    if not plan.references().intersect(target._jdf.queryExecution().analyzed().outputSet()).isEmpty():
        return False
    listed = plan.expressions()
    return all(bool(listed.apply(i).deterministic()) for i in range(listed.size()))


def _keeps_row_order(source: DataFrame) -> bool:
    pending: list[Any] = [source._jdf.queryExecution().optimizedPlan()]
    while pending:
        node = pending.pop()
        if str(node.nodeName()) not in _ORDER_KEEPING:
            return False
        children = node.children()
        pending += [children.apply(i) for i in range(children.size())]
    return True


# monotonically_increasing_id(): the partition index above bit 33, the row's place in it below.
_PARTITION_SHIFT = 33


def in_row_ids(spark: SparkSession | None, ids: np.ndarray, row_id: Column) -> Column:
    """Whether ``row_id`` (a ``monotonically_increasing_id()`` of a plan partitioned as the one
    that gave ``ids``) is one of the distinct ``ids``: a constant bit set a partition (the scans'
    deletion-vector test), so a row costs a few array reads whatever the number of ids. A row
    past its partition's last id, or of a partition with none, is not one."""
    if not len(ids):
        return F.lit(False)
    ids = np.unique(ids)  # sorted: each partition's ids in one run
    partitions = ids >> _PARTITION_SHIFT
    keys, starts = np.unique(partitions, return_index=True)
    groups = np.split(ids & ((1 << _PARTITION_SHIFT) - 1), starts[1:])
    bounds = [int(g[-1]) + 1 for g in groups]
    partition = F.shiftright(row_id, _PARTITION_SHIFT)
    offset = row_id.bitwiseAND(F.lit((1 << _PARTITION_SHIFT) - 1))
    sets = {int(k): (g, b) for k, g, b in zip(keys, groups, bounds, strict=True)}
    return F.when(offset < lookup(spark, [int(k) for k in keys], bounds, partition),
                  bitset_membership(spark, partition, offset, sets)).otherwise(F.lit(False))
