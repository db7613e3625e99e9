"""Tombstones: remember deletes so a late event never resurrects a deleted row.

Once a row is deleted the target holds nothing to compare a late insert's sequence
against, so the delete's (key, sequence, time) goes into an auxiliary Delta table
beside the target. Each batch drops its inserts/updates that are older than a
tombstone of their key, then appends its own deletes with the same app transaction
as the target's commit (written first, so a crash between the two replays cleanly).
Tombstones past the retention are purged from time to time.
"""

from __future__ import annotations

import datetime as dt
import logging

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from streaming_merge.delta_table import DeltaTable
from streaming_merge.streaming.cdc import DELETE_FLAG, CdcSpec
from streaming_merge.table.append import append_rows
from streaming_merge.table.snapshot import load_snapshot, table_exists

log = logging.getLogger(__name__)

DELETED_AT = "deleted_at"


class Tombstones:
    """The tombstone table of one target; only used with ``sequence_by``."""

    def __init__(self, path: str, spec: CdcSpec, retention: dt.timedelta, purge_every: int) -> None:
        if not spec.sequence_by:
            raise ValueError("tombstones need sequence_by: without it there is nothing to compare a late event to")
        self.path = path
        self._spec = spec
        self._retention = retention
        self._purge_every = purge_every
        self._columns = [*spec.keys, *spec.sequence_by]

    def _newer_than_tombstone(self) -> str:
        """SQL over aliases e (event) and d (tombstone): the event is at least as new."""
        return self._spec.newer(target="d", source="e") or "true"

    def drop_late(self, spark: SparkSession, events: DataFrame) -> tuple[DataFrame, int]:
        """Events minus inserts/updates older than their key's tombstone, and how many went."""
        if not table_exists(self.path) or not any(f.num_records for f in load_snapshot(self.path).files):
            return events, 0
        tombstones = DeltaTable.forPath(spark, self.path).toDF().select(*self._columns).alias("d")
        keys = " AND ".join(f"e.`{k}` = d.`{k}`" for k in self._spec.keys)
        late = events.alias("e").join(
            tombstones, F.expr(keys) & ~F.col(f"e.`{DELETE_FLAG}`") & ~F.expr(self._newer_than_tombstone()),
            "left_semi")
        count = late.count()
        if not count:
            return events, 0
        kept = events.alias("e").join(late.alias("l"), F.expr(" AND ".join(
            f"e.`{k}` = l.`{k}`" for k in self._spec.keys)), "left_anti")
        return kept, count

    def record(self, spark: SparkSession, events: DataFrame, app_id: str, batch_id: int) -> None:
        """Append this batch's deletes (idempotent through txn(app_id, batch_id)).

        An append rather than an upsert: one file write and a commit, no join. Several
        tombstones of one key are harmless, since a late event is dropped when *any*
        tombstone of its key is at least as new.
        """
        deletes = events.filter(F.col(f"`{DELETE_FLAG}`")).select(
            *[F.col(f"`{c}`") for c in self._columns], F.current_timestamp().alias(DELETED_AT))
        append_rows(spark, deletes, self.path, app_id, batch_id)
        if self._purge_every and batch_id > 0 and batch_id % self._purge_every == 0:
            self.purge(spark)

    def purge(self, spark: SparkSession, now: dt.datetime | None = None) -> int:
        """Delete tombstones older than the retention; returns how many went."""
        if not table_exists(self.path):
            return 0
        cutoff = (now or dt.datetime.now(dt.UTC)) - self._retention
        table = DeltaTable.forPath(spark, self.path)
        expired = table.toDF().filter(F.col(DELETED_AT) < F.lit(cutoff)).alias("s")
        # The cutoff is in the ON condition too: a key may also hold a newer tombstone, which stays.
        condition = F.expr(self._spec.key_condition()) & (F.col(f"t.{DELETED_AT}") < F.lit(cutoff))
        metrics = (table.alias("t").merge(expired, condition)
                   .whenMatchedDelete().withOptions(materialize_source="none").execute())
        deleted = int(metrics["numTargetRowsDeleted"] or 0)
        if deleted:
            log.info("Purged %d tombstones older than %s from %s", deleted, cutoff.isoformat(), self.path)
        return deleted
