"""Materialize the MERGE source once, so both scans see the same rows, and survive its loss.

A MERGE reads its source twice (find touched files, then rewrite). A non-deterministic
or changing source (a Kafka micro-batch, a query over a table being written) could give
different rows each time, so Delta checkpoints it locally first. Local checkpoint
blocks live on executors; when one is lost the whole merge is rerun from the original
source at a more replicated storage level, as Delta's MergeIntoMaterializeSource does.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from typing import Any, Literal

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, Observation, SparkSession

from streaming_merge.errors import InvalidArgumentError
from streaming_merge.table.scan import PINNED_SCAN_OPTION

log = logging.getLogger(__name__)

MaterializePolicy = Literal["auto", "all", "none"]
DEFAULT_STORAGE_LEVELS: tuple[str, ...] = ("DISK_ONLY", "DISK_ONLY_2", "DISK_ONLY_3")
_LOST_BLOCK_MARKERS = ("CHECKPOINT_RDD_BLOCK_ID_NOT_FOUND", "Checkpoint block")


def storage_level(name: str) -> StorageLevel:
    level = getattr(StorageLevel, name, None)
    if not isinstance(level, StorageLevel):
        raise InvalidArgumentError(f"Unknown storage level {name!r}; use a StorageLevel name such as 'DISK_ONLY'.")
    return level


def level_for_attempt(levels: tuple[str, ...], attempt: int) -> str:
    """First attempt uses levels[0], the first retry levels[1], later retries the last one."""
    return levels[min(attempt - 1, len(levels) - 1)]


_LOCAL_LEAVES = ("LocalRelation", "Range", "OneRowRelation")


def is_stable(source: DataFrame) -> bool:
    """True when reading ``source`` twice gives the same rows: a deterministic plan over
    in-memory local data and our own scans of a Delta table's files (pinned to one version,
    and Delta files are never changed in place). A Parquet or JSON folder, an RDD, a
    streaming micro-batch can all change between two reads."""
    plan = source._jdf.queryExecution().analyzed()
    if not plan.deterministic():
        return False
    leaves = plan.collectLeaves()
    for i in range(leaves.size()):
        leaf = leaves.apply(i)
        name = str(leaf.getClass().getSimpleName())
        if name in _LOCAL_LEAVES:
            continue
        if name == "LogicalRelation" and _is_pinned_scan(leaf):
            continue
        return False
    return True


def carries_local_rows(source: DataFrame) -> bool:
    """True when the plan reads rows held in the plan itself (``createDataFrame`` of local
    data). Such a source is stable, so Delta's rule does not materialize it, but every task
    that reads it gets those rows serialized into it, and a MERGE reads its source up to three
    times: copying it once costs the one job that counting it would have cost anyway."""
    leaves = source._jdf.queryExecution().analyzed().collectLeaves()
    return any(str(leaves.apply(i).getClass().getSimpleName()) == "LocalRelation" for i in range(leaves.size()))


def _is_pinned_scan(leaf: Any) -> bool:
    try:
        options = leaf.relation().options()
        return str(options.get(PINNED_SCAN_OPTION)) == "Some(true)"
    except Exception:  # not a file relation
        return False


def should_materialize(policy: MaterializePolicy, source: DataFrame, insert_only: bool) -> bool:
    """Delta's ``merge.materializeSource`` policy.

    ``auto`` materializes every source that is not stable (see ``is_stable``) unless the
    merge is insert-only (its source is read once).
    """
    if policy == "all":
        return True
    if policy == "none" or insert_only:
        return False
    return not is_stable(source)


def materialize(source: DataFrame, level_name: str, observed: Sequence[Column] = (), drop: Sequence[str] = ()
                ) -> tuple[DataFrame, dict[str, Any]]:
    """Eager local checkpoint of ``source`` at the given storage level, with the aggregates
    ``observed`` computed in the same job (one pass over the source, not one per question);
    the columns ``drop`` served the aggregates only and are not copied."""
    if not observed:
        return source.localCheckpoint(eager=True, storageLevel=storage_level(level_name)), {}
    observation = Observation()
    frame = source.observe(observation, *observed)
    if drop:
        frame = frame.drop(*drop)
    frame = frame.localCheckpoint(eager=True, storageLevel=storage_level(level_name))
    return frame, dict(observation.get)


def checkpoint_rdd_id(materialized: DataFrame) -> int:
    """The RDD holding the materialized blocks under ``materialized`` (a checkpoint, or a
    projection or filter of one); tests drop its blocks to simulate their loss."""
    leaves = materialized._jdf.queryExecution().analyzed().collectLeaves()
    for i in range(leaves.size()):
        leaf = leaves.apply(i)
        if str(leaf.getClass().getSimpleName()) == "LogicalRDD":
            return int(leaf.rdd().id())
    raise InvalidArgumentError("the DataFrame reads no materialized (checkpointed) data")


def release(materialized: DataFrame) -> None:
    """Drop the materialized blocks now rather than waiting for GC."""
    try:
        materialized.sparkSession.sparkContext._jsc.sc().unpersistRDD(checkpoint_rdd_id(materialized), False)
    except Exception as exc:  # best effort: the blocks may already be gone
        log.debug("Could not unpersist materialized source: %s", exc)


_LOST_RDD = re.compile(r"rdd_(\d+)_\d+")


def next_rdd_id(spark: SparkSession) -> int:
    """An RDD id no RDD created before this call has: ids grow within a SparkContext, so an
    RDD with a smaller id predates the call (one JVM call; the id itself is never used)."""
    return int(spark.sparkContext._jsc.sc().newRddId())


def lost_rdd_ids(exc: BaseException) -> set[int]:
    """The RDDs whose checkpoint blocks ``exc`` (or its cause chain) reports lost."""
    found: set[int] = set()
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        found |= {int(m) for m in _LOST_RDD.findall(str(current))}
        current = current.__cause__ or current.__context__
    return found


def is_lost_block_error(exc: BaseException) -> bool:
    """True when a lost checkpoint block caused ``exc`` (anywhere in its cause chain)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        text = str(current)
        if any(marker in text for marker in _LOST_BLOCK_MARKERS) and "not found" in text.lower():
            return True
        if "CHECKPOINT_RDD_BLOCK_ID_NOT_FOUND" in text:
            return True
        current = current.__cause__ or current.__context__
    return False
