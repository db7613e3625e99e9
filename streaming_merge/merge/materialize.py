"""Materialize the MERGE source once, so both scans see the same rows, and survive its loss.

A MERGE reads its source twice (find touched files, then rewrite). A non-deterministic
or changing source (a Kafka micro-batch, a query over a table being written) could give
different rows each time, so Delta checkpoints it locally first. Local checkpoint
blocks live on executors; when one is lost the whole merge is rerun from the original
source at a more replicated storage level, as Delta's MergeIntoMaterializeSource does.
"""

from __future__ import annotations

import logging
from typing import Literal

from pyspark import StorageLevel
from pyspark.sql import DataFrame

log = logging.getLogger(__name__)

MaterializePolicy = Literal["auto", "all", "none"]
DEFAULT_STORAGE_LEVELS: tuple[str, ...] = ("DISK_ONLY", "DISK_ONLY_2", "DISK_ONLY_3")
_LOST_BLOCK_MARKERS = ("CHECKPOINT_RDD_BLOCK_ID_NOT_FOUND", "Checkpoint block")


def storage_level(name: str) -> StorageLevel:
    level = getattr(StorageLevel, name, None)
    if not isinstance(level, StorageLevel):
        raise ValueError(f"Unknown storage level {name!r}; use a StorageLevel name such as 'DISK_ONLY'.")
    return level


def level_for_attempt(levels: tuple[str, ...], attempt: int) -> str:
    """First attempt uses levels[0], the first retry levels[1], later retries the last one."""
    return levels[min(attempt - 1, len(levels) - 1)]


def should_materialize(policy: MaterializePolicy, source: DataFrame, insert_only: bool) -> bool:
    """Delta's ``merge.materializeSource`` policy.

    ``auto`` skips materializing an insert-only merge (its source is read once) and a
    source that is already a deterministic read of files or local data; anything else
    (a streaming micro-batch, a UDF, a non-deterministic expression) is materialized.
    """
    if policy == "all":
        return True
    if policy == "none" or insert_only:
        return False
    plan = source._jdf.queryExecution().analyzed()
    if not plan.deterministic():
        return True
    leaves = plan.collectLeaves()
    for i in range(leaves.size()):
        name = str(leaves.apply(i).getClass().getSimpleName())
        if name not in ("LogicalRelation", "LocalRelation", "LogicalRDD", "Range"):
            return True
    return False


def materialize(source: DataFrame, level_name: str) -> DataFrame:
    """Eager local checkpoint of ``source`` at the given storage level."""
    return source.localCheckpoint(eager=True, storageLevel=storage_level(level_name))


def checkpoint_rdd_id(materialized: DataFrame) -> int:
    """The RDD holding the materialized blocks (tests drop its blocks to simulate loss)."""
    return int(materialized._jdf.queryExecution().analyzed().rdd().id())


def release(materialized: DataFrame) -> None:
    """Drop the materialized blocks now rather than waiting for GC."""
    try:
        materialized.sparkSession.sparkContext._jsc.sc().unpersistRDD(checkpoint_rdd_id(materialized), False)
    except Exception as exc:  # best effort: the blocks may already be gone
        log.debug("Could not unpersist materialized source: %s", exc)


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
