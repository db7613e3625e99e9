"""The deletion-vector MERGE whose written rows all come from the source, in two plain jobs.

When no MATCHED clause writes a value read from the target row (``whenMatchedUpdateAll``,
deletes: an upsert, or the CDC preset whose conditions compare sequences), every written row is
a source row, chosen by the clause the row takes: the target rows decide which positions the
deletion vectors mark and which clause a matched source row takes, not the written values. So
the target's keys stream past the broadcast source once, in a job that writes nothing and
observes the matched pairs (the positions to mark, which source rows matched and, when a
MATCHED condition reads the target, which update each took); then the source's own rows are
written, each by its clause. The general plan (dv_rewrite._streamed_past_source) carries every
joined row, with all its columns, through a shuffle to meet the source's rows and find the
inserts; here no row crosses a shuffle and the target side reads the join's columns only.

When a source row writes the same row whether it matched or not (an unconditional
``UPDATE SET *`` beside an unconditional ``INSERT *``: the plain upsert), the write needs nothing
from the matching: both run as one job, the source's rows written beside the target's keys
streaming past the broadcast source (see ``SourceSide.same_row_either_way``).

A source row that matched two target rows (a key the target holds twice) would write one
updated row per match: the caller then runs the general plan.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from streaming_merge.merge.resolve import ResolvedClause, ResolvedMerge
from streaming_merge.spark.constant_lookup import lookup
from streaming_merge.table.dv_filter import bitset_membership

# Optimized-plan nodes that keep a source's rows in the same partitions and order every time it
# is read, so that monotonically_increasing_id() names the same row in both jobs.
_ORDER_KEEPING = frozenset({"Project", "Filter", "LogicalRDD", "ExternalRDD", "LogicalRelation", "LocalRelation",
                            "Range"})


@dataclass(frozen=True)
class SourceSide:
    """A MERGE that writes from the source side. ``decided_in_match``: a MATCHED condition reads
    the target row or is not deterministic, so the job that finds the matched pairs records the
    update each matched source row took (the write cannot evaluate it again).
    ``same_row_either_way``: every source row writes the same row matched or not (one
    unconditional update and one unconditional insert of equal values), so the write need not
    wait for the matching, nor tell the matched rows apart."""

    decided_in_match: bool
    same_row_either_way: bool = False


def source_side(resolved: ResolvedMerge, target: DataFrame, source: DataFrame) -> SourceSide | None:
    """How this MERGE writes from the source side, or None when it cannot: it must insert, have
    no NOT MATCHED BY SOURCE clause, record no change data, write no value that reads the target
    row or is not deterministic, and read the same source rows in the same order twice."""
    if not resolved.not_matched or resolved.not_matched_by_source or resolved.change_data:
        return None
    # In a tuple: an answer of None is remembered too.
    (found,) = resolved.derive(("dv-source-side",), lambda: (_matched_clauses(resolved, target, source),))
    if found is None or found.same_row_either_way:  # the latter never tells source rows apart
        return found
    return found if _keeps_row_order(source) else None


def _matched_clauses(resolved: ResolvedMerge, target: DataFrame, source: DataFrame) -> SourceSide | None:
    """From one analysis of the MATCHED clauses' conditions and values over the join (and of
    the insert's values, to compare with an unconditional update's)."""
    conditions = [c.condition for c in resolved.matched if c.condition is not None]
    values = [v for c in resolved.matched if c.outputs is not None for v in c.outputs.values()]
    if not conditions and not values:
        return SourceSide(decided_in_match=False)
    update, insert = _lone_unconditional(resolved)
    names = list(update.outputs) if update is not None and update.outputs is not None else []
    inserted = [insert.outputs[n] for n in names] if insert is not None and insert.outputs is not None else []
    plan = target.join(source, resolved.condition).select(*conditions, *values, *inserted)._jdf.queryExecution(
    ).analyzed()
    target_columns = target._jdf.queryExecution().analyzed().outputSet()
    listed = plan.expressions()
    matched_end = len(conditions) + len(values)

    def plain(i: int) -> bool:  # reads no target column and is deterministic
        expression = listed.apply(i)
        return bool(expression.references().intersect(target_columns).isEmpty()) and bool(expression.deterministic())

    if not all(plain(i) for i in range(len(conditions), matched_end)):
        return None
    same = len(inserted) == len(values) > 0 and all(
        _unaliased(listed.apply(i)).semanticEquals(_unaliased(listed.apply(matched_end + i)))
        for i in range(len(values)))
    return SourceSide(decided_in_match=not all(plain(i) for i in range(len(conditions))),
                      same_row_either_way=bool(same))


def _lone_unconditional(resolved: ResolvedMerge) -> tuple[ResolvedClause | None, ResolvedClause | None]:
    """The MERGE's update and insert when it has one clause of each kind, neither conditional
    (None, None otherwise)."""
    if len(resolved.matched) != 1 or len(resolved.not_matched) != 1:
        return None, None
    update, insert = resolved.matched[0], resolved.not_matched[0]
    if update.condition is not None or insert.condition is not None or update.outputs is None or (
            insert.outputs is None or set(update.outputs) != set(insert.outputs)):
        return None, None
    return update, insert


def _unaliased(expression: Any) -> Any:
    """A projected expression without the name the projection gave it."""
    return expression.child() if str(expression.nodeName()) == "Alias" else expression


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
