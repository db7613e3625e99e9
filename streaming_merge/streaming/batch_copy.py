"""A MergeSink batch's one copy: prepared (one event per key, NULL keys flagged), late events
dropped when the tombstones say so, and checkpointed in one Spark job that also observes the
counts, the truncates, the oldest sequence and the key ranges the MERGE then needs."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

from pyspark.sql import DataFrame, Observation
from pyspark.sql import functions as F

from streaming_merge.merge.key_presence import KeyPresenceProbe
from streaming_merge.merge.materialize import materialize
from streaming_merge.merge.skipping import SourceStats, source_stats_of
from streaming_merge.spark.conf import ONE_PARTITION_JOINS, temporary_conf
from streaming_merge.streaming.cdc import NULL_KEY_FLAG, BatchPreparer, CdcSpec


class BatchCounts(NamedTuple):
    """What the copy's job observed of the batch's events (before one is kept per key).
    ``partial_events``: upserts that leave a data column unchanged (partial updates only; while
    it is 0 the batch needs no partial clause, see sink_clauses.cdc_upsert; an event without a
    sequence needs none either: it wins or loses whole in both, ``cdc._fold_partial``).
    ``sequence_nulls``: keyed events and truncates whose (first) sequence value is NULL."""

    rows: int
    null_keys: int
    deletes: int
    truncates: list[Any]
    oldest_sequence: Any
    partial_events: int = 0
    sequence_nulls: int = 0


def copy_batch(spec: CdcSpec | None, preparer: BatchPreparer | None, scd_type: int, batch_df: DataFrame,
               level: str, partitions: int, drop_late: Callable[[DataFrame], DataFrame] | None = None,
               probe: KeyPresenceProbe | None = None, late_in_one_task: bool = False
               ) -> tuple[DataFrame, BatchCounts, SourceStats, int | None]:
    """The batch, prepared (one event per key, NULL-key rows flagged), checkpointed in one
    job that also observes (rows, NULL-key rows, delete events, truncate values, the oldest
    event's first sequence value or None when an event has none) and the key ranges.
    With ``drop_late`` (the tombstone filter) the copy holds what it keeps, and the last
    value is how many keyed rows that is (observed in the same job; None without it).
    With ``probe`` the stats also name the target files no key of the batch falls into
    (observed before late events are dropped: a superset of the MERGE's keys).
    ``late_in_one_task``: the tombstones ``drop_late`` reads fit one task, so a batch folded into
    one partition meets them there (without it Spark shuffles both sides again, into
    spark.sql.shuffle.partitions: 4 stages instead of 2 for a 5k-event Kafka batch)."""
    if spec is None or preparer is None:
        observation = Observation()
        frame, _ = materialize(batch_df.observe(observation, F.count(F.lit(1)).alias("rows")), level)
        rows = int(observation.get.get("rows") or 0)
        return frame, BatchCounts(rows, 0, 0, [], None), SourceStats(rows, {}), None
    prepared = preparer.prepare(batch_df, partitions)
    kept: Observation | None = None
    presence = Observation()
    to_copy = prepared.frame if probe is None else probe.observed(prepared.frame, presence)
    if drop_late is not None:
        kept = Observation()
        to_copy = drop_late(to_copy).observe(kept, F.count(F.when(~F.col(NULL_KEY_FLAG), 1)).alias("rows"))
    with temporary_conf(batch_df.sparkSession,
                        ONE_PARTITION_JOINS if late_in_one_task and drop_late and partitions == 1 else {}):
        frame, _ = materialize(to_copy, level)
    stats = source_stats_of(prepared.stats.get, list(spec.keys))
    # One event per key either way: "last" keeps the newest, "error" refuses duplicates
    # (SCD 2 keeps several, but its MERGE source is built from them later).
    if scd_type == 1:
        stats = dataclasses.replace(stats, unique_keys=tuple(spec.keys))
    if probe is not None:
        stats = dataclasses.replace(stats, absent_files=probe.absent_observed(presence))
    observed = prepared.counts.get
    truncates = [v for v in observed.get("truncates") or [] if v is not None]
    sequence_nulls = int(observed.get("sequenceNulls") or 0)
    oldest = observed.get("sequenceLo") if not sequence_nulls else None
    partial = int(observed.get("partialEvents") or 0)
    counts = BatchCounts(int(observed["rows"] or 0), int(observed["nullKeys"] or 0), int(observed["deletes"] or 0),
                         truncates, oldest, partial, sequence_nulls + int(observed.get("truncateNulls") or 0))
    return frame, counts, stats, int(kept.get["rows"] or 0) if kept is not None else None

