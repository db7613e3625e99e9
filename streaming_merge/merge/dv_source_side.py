"""The deletion-vector MERGE whose written rows all come from the source, in one or two plain jobs.

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

When a source row writes the same row whether it matched or not (``UPDATE SET *`` beside
``INSERT *`` under the same condition, as in a plain upsert or the CDC preset without a sequence
guard, deletes aside), the write needs nothing from the matching: both run as one job, the
source's rows written beside the target's keys streaming past the broadcast source (see
``SourceSide.same_row_either_way``).

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
    ``same_row_either_way``: every source row writes the same row, or none, matched or not (see
    _update_beside_insert), so the write need not wait for the matching, nor tell the matched
    rows apart."""

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
    the insert's values and condition, to compare with the update's: see _update_beside_insert)."""
    conditions = [c.condition for c in resolved.matched if c.condition is not None]
    values = [v for c in resolved.matched if c.outputs is not None for v in c.outputs.values()]
    if not conditions and not values:
        return SourceSide(decided_in_match=False)
    shape = _update_beside_insert(resolved)
    compared: list[Column] = []
    if shape is not None:
        update, insert, deletes_before = shape
        assert update.outputs is not None and insert.outputs is not None
        compared = [*[insert.outputs[n] for n in update.outputs], *[~d.condition for d in deletes_before
                                                                     if d.condition is not None]]
        compared += [c for c in (update.condition, insert.condition) if c is not None]
    plan = target.join(source, resolved.condition).select(*conditions, *values, *compared)._jdf.queryExecution(
    ).analyzed()
    target_columns = target._jdf.queryExecution().analyzed().outputSet()
    listed = plan.expressions()
    matched_end = len(conditions) + len(values)

    def plain(i: int) -> bool:  # reads no target column and is deterministic
        expression = listed.apply(i)
        return bool(expression.references().intersect(target_columns).isEmpty()) and bool(expression.deterministic())

    def same(i: int, j: int) -> bool:
        return bool(_unaliased(listed.apply(i)).semanticEquals(_unaliased(listed.apply(j))))

    if not all(plain(i) for i in range(len(conditions), matched_end)):
        return None
    decided_in_match = not all(plain(i) for i in range(len(conditions)))
    if shape is None or decided_in_match:
        return SourceSide(decided_in_match=decided_in_match)
    update, insert, deletes_before = shape
    negated = matched_end + len(values)  # the first NOT of a delete's condition in ``compared``
    update_condition = negated + len(deletes_before) if update.condition is not None else None
    return SourceSide(decided_in_match=False, same_row_either_way=(
        all(same(len(conditions) + i, matched_end + i) for i in range(len(values)))
        and (update_condition is None or all(same(negated + k, update_condition) for k in range(len(deletes_before))))
        and (update.condition is None) == (insert.condition is None)
        and (update_condition is None or same(update_condition, update_condition + 1))))


def _update_beside_insert(resolved: ResolvedMerge
                          ) -> tuple[ResolvedClause, ResolvedClause, list[ResolvedClause]] | None:
    """(The update, the insert, the deletes before the update) of a MERGE whose MATCHED clauses
    are deletes and one update and whose one NOT MATCHED clause inserts the same columns; None
    otherwise. Where the two write the same values under the same condition, a source row writes
    the same row matched or not: a delete after the update writes nothing where the update does
    not apply, as the insert does for an unmatched row; one before it must be the update's exact
    opposite (the CDC preset's ``s.deleted`` beside ``NOT s.deleted``), never taking a row the
    update would write."""
    updates = [c for c in resolved.matched if c.outputs is not None]
    if len(updates) != 1 or len(resolved.not_matched) != 1:
        return None
    update, insert = updates[0], resolved.not_matched[0]
    if insert.outputs is None or update.outputs is None or set(update.outputs) != set(insert.outputs):
        return None
    deletes_before = resolved.matched[:next(i for i, c in enumerate(resolved.matched) if c is update)]
    if deletes_before and (update.condition is None or any(d.condition is None for d in deletes_before)):
        return None  # an unconditional delete before the update: the update never applies
    return update, insert, deletes_before


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
