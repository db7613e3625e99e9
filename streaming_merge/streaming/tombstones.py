"""Tombstones: remember deletes so a late event never resurrects a deleted row.

Once a row is deleted the target holds nothing to compare a late insert's sequence
against, so the delete's (key, sequence, time) goes into an auxiliary Delta table
beside the target. Each batch drops its inserts/updates that are older than a
tombstone of their key, then appends its own deletes with the same app transaction
as the target's commit (written first, so a crash between the two replays cleanly).
Tombstones past the retention are purged from time to time.

Several sinks (flows) into one target share its tombstone table: each appends its own
deletes (blind appends, which never conflict), purges and compacts it (a purge or compaction
whose files another writer rewrote meanwhile conflicts and commits nothing, so no tombstone
is lost), reads everyone's tombstones, and checks right before its MERGE commits that no
other writer recorded a tombstone of its keys after it read them
(:meth:`Tombstones.check_none_recorded_since`).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import IntegralType

from streaming_merge.delta_table import DeltaTable
from streaming_merge.errors import ConcurrentModificationError, InvalidArgumentError
from streaming_merge.merge.skipping import ColumnScope, SkippingPlan, decoded_paths
from streaming_merge.spark.per_context import PerContext
from streaming_merge.streaming.cdc import DELETE_FLAG, CdcSpec, clustered_by_keys, values_newer_than
from streaming_merge.streaming.compaction import AutoCompact, run_auto_compaction
from streaming_merge.table.append import append_rows, recorded_now
from streaming_merge.table.follow import FollowedTable
from streaming_merge.table.location import TableLocation
from streaming_merge.table.scan import scan_files
from streaming_merge.table.snapshot import DataFile, Snapshot, table_exists
from streaming_merge.table.store import NOT_FOUND, get_bytes, table_store

log = logging.getLogger(__name__)

DELETED_AT = "deleted_at"
# Every batch with deletes appends one small file, and every later batch's lookup opens each
# file whose key range overlaps its keys (with uniform keys: all of them), so the lookup grew
# with the stream's age. At this many small files the table is compacted after the batch.
COMPACT_SMALL_FILES = 10


# See Tombstones.is_small: a stream's first deletes, or a table with few of them.
SMALL_TABLE_BYTES = 1024 * 1024
# Tombstones (their files' bytes) that one task may check a batch folded into one partition
# against (Tombstones.fit_one_task).
ONE_TASK_MAX_BYTES = 8 * 1024 * 1024


@dataclass(frozen=True)
class _LateFilter:
    """The late-event filter's expressions for events of one set of columns: built once per
    SparkContext, not per micro-batch (for partial updates the select is a few JVM round trips
    per column; built per batch, the lookup took 117 ms of a 5k-record Kafka batch, now 82).
    ``newest``, ``kept`` and ``outputs`` serve partial updates (a left join), else None (an
    anti join on ``condition``)."""

    keys: list[Column]
    condition: Column
    newest: Column | None = None
    kept: Column | None = None
    outputs: list[Column] | None = None


class Tombstones:
    """The tombstone table of one target; only used with ``sequence_by``."""

    def __init__(self, path: TableLocation, spec: CdcSpec, retention: dt.timedelta, purge_every: int) -> None:
        if not spec.sequence_by:
            raise InvalidArgumentError(
                "tombstones need sequence_by: without it there is nothing to compare a late event to")
        self.path = path
        self._followed = FollowedTable(path)
        self._spec = spec
        self._retention = retention
        self._purge_every = purge_every
        self._columns = [*spec.keys, *spec.sequence_by]
        self._late_filters: PerContext[_LateFilter] = PerContext()
        # The truncates recorded so far and the files they were read from (or that this sink
        # wrote): a file never changes and a truncate is never purged, so each file with NULL
        # keys is read once, whoever wrote it (several sinks may share the table).
        self._truncates: set[Any] = set()
        self._truncate_files: set[str] = set()

    def _newer_than_tombstone(self) -> str:
        """SQL over aliases e (event) and d (tombstone): the event is at least as new."""
        return self._spec.newer(target="d", source="e") or "true"

    def snapshot(self) -> Snapshot | None:
        """The tombstone table as of now, or None before the first delete (this sink is its
        writer: followed from batch to batch, see FollowedTable)."""
        return self._followed.latest()

    def lookup_files(self, spark: SparkSession, snapshot: Snapshot | None,
                     key_ranges: Mapping[str, tuple[Any, Any]], oldest_sequence: Any = None) -> list[DataFile]:
        """The tombstone files a batch must be checked against, decided on the driver from the
        files' stats (no Spark job, no scan of tombstones): none when no file's key range
        overlaps the batch's, or when every overlapping file's newest sequence value is older
        than ``oldest_sequence`` (the batch's oldest first sequence value, None when unknown or
        when an event has none). In-order streams (every event newer than every earlier delete,
        the usual case) thus pay nothing for tombstones but the append of their own deletes."""
        files = self._overlapping_files(spark, snapshot, key_ranges)
        if not files or self._all_older_than(snapshot, files, oldest_sequence):
            return []
        return files

    @staticmethod
    def all_files(snapshot: Snapshot | None) -> list[DataFile]:
        """Every tombstone file that holds a row."""
        return [f for f in snapshot.files if f.live_records] if snapshot is not None else []

    @staticmethod
    def is_small(files: Sequence[DataFile]) -> bool:
        """True when ``files`` (:meth:`all_files`) hold at most SMALL_TABLE_BYTES: checking a
        batch against every tombstone while it is materialized then costs a shuffle of that
        little data, where a check after it (when the lookup finds files to read) costs the
        MERGE a materialization of its own, a whole Spark job."""
        return bool(files) and sum(f.size for f in files) <= SMALL_TABLE_BYTES

    @staticmethod
    def fit_one_task(files: Sequence[DataFile]) -> bool:
        """True when the tombstones of ``files`` may all be checked by one task (a hash table
        of their keys and sequences in its memory): a batch folded into one partition then meets
        them there, in the task that folds it, rather than both being shuffled again."""
        return sum(f.size for f in files) <= ONE_TASK_MAX_BYTES

    def lookup_reads_most(self, snapshot: Snapshot | None, files: Sequence[DataFile]) -> bool:
        """True when a lookup of ``files`` reads at least half the tombstones' bytes: pruning by
        the batch's key range saved little (uniform keys overlap every file), so the next batch
        may as well drop its late events while it is materialized, against every file, instead
        of after it in a pass of the MERGE's own."""
        everything = sum(f.size for f in self.all_files(snapshot))
        return bool(files) and 2 * sum(f.size for f in files) >= everything

    def without_late(self, spark: SparkSession, events: DataFrame, snapshot: Snapshot,
                     files: Sequence[DataFile], partitions: int, partitioned_by_keys: bool = False) -> DataFrame:
        """``events`` minus the inserts/updates not newer than a tombstone of their key in
        ``files``, lazily (an anti join; a left join that also forgets older values for
        partial updates), in ``partitions`` partitions. ``partitioned_by_keys``: the events come
        straight from the sink's fold, which put them in that many partitions by key
        (:func:`clustered_by_keys`), so no repartition is added (Spark still adds an exchange
        where their partitioning does not fit the join, e.g. after dedupe="error")."""
        overlapping = self._scan(spark, snapshot, files)
        late = self._late_filters.get(spark.sparkContext, tuple(events.columns),
                                      lambda: self._late_filter(events.columns))
        keys = late.keys
        # Hash-partitioned into one partition, the tombstones fit a batch folded into one (Spark
        # pairs a single partition with any one-partition side, under ONE_PARTITION_JOINS: see
        # batch_copy.copy_batch) without an exchange on its side.
        tombstones = overlapping.repartition(partitions, *keys).alias("d").hint("shuffle_hash")
        if not partitioned_by_keys:
            events = clustered_by_keys(events, partitions, keys)
        if late.newest is None:
            return events.alias("e").join(tombstones, late.condition, "left_anti")
        # Partial updates: besides dropping the late events, forget the values a folded event
        # took from events not newer than the key's newest tombstone (the row was deleted after
        # them), so an insert after a delete never resurrects a deleted value.
        assert late.kept is not None and late.outputs is not None
        newest = tombstones.groupBy(*keys).agg(late.newest).alias("d")
        return events.alias("e").join(newest, late.condition, "left").filter(late.kept).select(*late.outputs)

    def _late_filter(self, columns: Sequence[str]) -> _LateFilter:
        spec = self._spec
        keys = [F.col(f"`{k}`") for k in spec.keys]
        same_key = F.expr(" AND ".join(f"e.`{k}` = d.`{k}`" for k in spec.keys))
        if not spec.partial:
            return _LateFilter(keys, same_key & ~F.col(f"e.`{DELETE_FLAG}`") & ~F.expr(self._newer_than_tombstone()))
        tombstone = F.col("d.__sm_tombstone__")
        final = spec.sequence()  # the sequence columns are only on the events' side
        return _LateFilter(keys, same_key, newest=F.max(spec.sequence()).alias("__sm_tombstone__"),
                           kept=tombstone.isNull() | F.col(f"e.`{DELETE_FLAG}`") | (final > tombstone),
                           outputs=values_newer_than(columns, spec, tombstone, alias="e."))

    def overlapping(self, spark: SparkSession, snapshot: Snapshot | None,
                    key_ranges: Mapping[str, tuple[Any, Any]]) -> DataFrame | None:
        """The tombstones (keys and sequence columns) of the files whose key stats overlap the
        batch's key range, lazily; None when no file can hold one of the batch's keys."""
        files = self._overlapping_files(spark, snapshot, key_ranges)
        return self._scan(spark, snapshot, files) if files and snapshot is not None else None

    def _overlapping_files(self, spark: SparkSession, snapshot: Snapshot | None,
                           key_ranges: Mapping[str, tuple[Any, Any]],
                           among: Sequence[DataFile] | None = None) -> list[DataFile]:
        """The files (of ``among``, default all) that hold rows and whose key stats overlap the
        batch's key ranges."""
        if snapshot is None:
            return []
        files = [f for f in (snapshot.files if among is None else among) if f.live_records]
        if not files:
            return []
        scope = ColumnScope("d", "e", self._columns, self._columns)
        ranges = [(k, *key_ranges[k], key_ranges[k][0] is not None) for k in self._spec.keys if k in key_ranges]
        return SkippingPlan((), ranges, scope, snapshot.schema, skip_nothing=False).select(spark, snapshot, files)

    def _scan(self, spark: SparkSession, snapshot: Snapshot, files: Sequence[DataFile]) -> DataFrame:
        return (scan_files(spark, snapshot, files).select(*[F.col(f"`{c}`") for c in self._columns])
                .filter(F.col(f"`{self._spec.keys[0]}`").isNotNull()))

    def _all_older_than(self, snapshot: Snapshot | None, files: Sequence[DataFile], oldest_sequence: Any) -> bool:
        """True when every tombstone in ``files`` has a first sequence value below
        ``oldest_sequence``, by the files' max stats: then no event can be late (an event is
        late only when a tombstone of its key is at least as new). Integer sequences only,
        whose Python and Arrow orders are Spark's; False whenever a file has no max."""
        column = self._spec.sequence_by[0]
        if snapshot is None or type(oldest_sequence) is not int or \
                not isinstance(snapshot.schema[column].dataType, IntegralType) or \
                f"max.{column}" not in snapshot.stats.column_names:
            return False
        paths = {f.path for f in files}
        stats = snapshot.stats
        maxima = [m for p, m in zip(decoded_paths(stats), stats.column(f"max.{column}").cast(pa.int64()).to_pylist(),
                                    strict=True)
                  if p in paths]
        return len(maxima) == len(paths) and all(m is not None and m < oldest_sequence for m in maxima)

    def recorded_truncates(self, spark: SparkSession, snapshot: Snapshot | None) -> list[Any]:
        """The sequence values of the truncates recorded so far (rows whose keys are NULL), by
        every writer of the table. Read only from the files whose stats say they may hold a NULL
        key and that were neither read before nor written by this sink, so a table that never saw
        a truncate costs no Spark job, and one that did costs one job when another writer, an
        earlier run or a compaction (which moves the truncate rows into a new file) added such a
        file."""
        if snapshot is None:
            return []
        paths = self._files_with_null_keys(snapshot, snapshot.files)
        unread = [f for f in snapshot.files if f.path in paths and f.path not in self._truncate_files]
        if unread:
            sequence = self._spec.sequence()
            rows = (scan_files(spark, snapshot, unread).filter(F.col(f"`{self._spec.keys[0]}`").isNull())
                    .select(sequence.alias("at")).distinct().collect())
            self._truncates.update(row["at"] for row in rows)
            self._truncate_files.update(f.path for f in unread)
        return sorted(self._truncates)

    def record(self, spark: SparkSession, events: DataFrame, app_id: str, batch_id: int,
               snapshot: Snapshot | None = None, truncates: Sequence[Column] = (),
               truncate_values: Sequence[Any] = ()) -> list[int]:
        """Append this batch's deletes, and its truncates as rows with NULL keys (idempotent
        through txn(app_id, batch_id)); returns the versions of the tombstone table this call
        committed (the append unless an earlier run made it, and a purge when one was due).
        ``truncate_values``: the truncates' values, remembered with the file that holds them.

        An append rather than an upsert: one file write and a commit, no join. Several
        tombstones of one key are harmless, since a late event is dropped when *any*
        tombstone of its key is at least as new. Truncate rows are never purged: they are
        few, and a late event older than a truncate must stay dropped.
        """
        deletes = events.filter(F.col(f"`{DELETE_FLAG}`")).select(
            *[F.col(f"`{c}`") for c in self._columns], recorded_now().alias(DELETED_AT))
        types = dict(deletes.dtypes)
        for value in truncates:
            fields = [F.lit(None).cast(types[k]).alias(k) for k in self._spec.keys]
            if len(self._spec.sequence_by) == 1:
                fields.append(value.alias(self._spec.sequence_by[0]))
            else:
                fields += [value.getField(c).alias(c) for c in self._spec.sequence_by]
            deletes = deletes.unionByName(
                spark.range(1).select(*fields, recorded_now().alias(DELETED_AT)))
        committed: list[int] = []
        appended = append_rows(spark, deletes, self.path, app_id, batch_id, snapshot)
        if appended is not None:
            committed.append(appended)
            if truncate_values:
                added = self._added_paths(appended)
                if added is not None:
                    self._truncate_files.update(added)
                    self._truncates.update(truncate_values)
        if self._purge_every and batch_id > 0 and batch_id % self._purge_every == 0:
            purged = self._purge(spark)[1]
            if purged is not None:
                committed.append(purged)
        return committed

    def check_none_recorded_since(self, spark: SparkSession, read: Snapshot | None, own_versions: Collection[int],
                                  events: DataFrame, key_ranges: Mapping[str, tuple[Any, Any]]) -> None:
        """Raise ConcurrentModificationError when a writer other than the caller recorded, after
        the caller read the tombstones (``read``, None when there was no table yet), a tombstone
        of one of the keys of ``events`` or a truncate: the caller's batch was planned without
        it and must run again. ``own_versions``: the commits of the tombstone table that are the
        caller's own (its append, its purge).

        Only the commits since ``read`` are read (each one's JSON, for the files it added with
        ``dataChange``, so another writer's compaction is no news); of their files still live,
        those whose stats may hold one of the batch's keys (by its key ranges) or a NULL key are
        scanned, in one Spark job, for such a tombstone. A purge by another writer rewrites
        tombstones that were there before; when they hold the batch's keys the batch reruns once
        more than it needed to."""
        latest = self._followed.latest()
        if latest is None:
            return
        start = read.version + 1 if read is not None else 0
        versions = [v for v in range(start, latest.version + 1) if v not in own_versions]
        if not versions:
            return
        added: set[str] = set()
        for version in versions:
            paths = self._added_paths(version)
            if paths is None:  # the commit is gone from the log: every file it could have added counts
                known = {f.path for f in read.files} if read is not None else set()
                added = {f.path for f in latest.files if f.path not in known}
                break
            added |= paths
        files = [f for f in latest.files if f.path in added and f.live_records != 0]
        if not files:
            return
        candidates = {f.path for f in self._overlapping_files(spark, latest, key_ranges, files)}
        candidates |= self._files_with_null_keys(latest, files)
        relevant = [f for f in files if f.path in candidates]
        if not relevant:
            return
        keys = list(self._spec.keys)
        first = F.col(f"`{keys[0]}`")
        recorded = scan_files(spark, latest, relevant).select(*[F.col(f"`{k}`") for k in keys])
        batch_keys = events.select(*[F.col(f"`{k}`") for k in keys])
        hits = recorded.filter(first.isNull()).unionByName(recorded.join(batch_keys, keys, "left_semi")).take(1)
        if hits:
            row = hits[0].asDict()
            what = "a truncate" if row[keys[0]] is None else f"a tombstone of key {row}"
            raise ConcurrentModificationError(
                f"Another writer recorded {what} in `{self.path}` (versions {versions[0]}..{latest.version}) after "
                f"this batch read the tombstones at version {read.version if read is not None else None}; rerun the "
                "batch from a fresh snapshot.")

    def _added_paths(self, version: int) -> set[str] | None:
        """The files commit ``version`` of the tombstone table added as a data change (decoded
        paths); None when the log no longer holds the commit."""
        store = table_store(self.path.log_uri, self.path.options)
        try:
            data = get_bytes(store, f"_delta_log/{version:020d}.json")
        except NOT_FOUND:
            return None
        paths: set[str] = set()
        for line in data.splitlines():
            if not line.strip():
                continue
            add = json.loads(line).get("add")
            if add is not None and add.get("dataChange", True):
                paths.add(unquote(add["path"]))
        return paths

    def _files_with_null_keys(self, snapshot: Snapshot, files: Sequence[DataFile]) -> set[str]:
        """Of ``files``, the paths of those whose stats say they may hold a row with a NULL key
        (a truncate); all of them when the table keeps no null counts."""
        stat = f"null_count.{self._spec.keys[0]}"
        wanted = {f.path for f in files}
        if stat not in snapshot.stats.column_names:
            return wanted
        nulls = snapshot.stats.column(stat).to_pylist()
        return {p for p, n in zip(decoded_paths(snapshot.stats), nulls, strict=True)
                if p in wanted and (n is None or n > 0)}

    def compact_if_due(self, spark: SparkSession, batch_id: int, before: Snapshot | None) -> None:
        """Bin-pack the tombstone files once ``COMPACT_SMALL_FILES`` small ones piled up (an
        OPTIMIZE commit, no data change); ``before``: the table as this batch found it. Called
        after the batch's MERGE committed: it never delays that commit, and a failure is
        logged, never raised (the next batch with deletes tries again)."""
        if before is not None and len(before.files) + 1 < COMPACT_SMALL_FILES:
            # This batch appended one file, so the table cannot hold that many small ones yet: no
            # log read. (A purge batch may add more; the next batch with deletes then counts them.)
            return
        result = run_auto_compaction(spark, AutoCompact(min_small_files=COMPACT_SMALL_FILES), batch_id, before,
                                     self.path)
        if result is not None and result["error"] is None:
            log.info("Compacted %d tombstone files of %s into %d", result["numFilesRemoved"], self.path,
                     result["numFilesAdded"])

    def purge(self, spark: SparkSession, now: dt.datetime | None = None) -> int:
        """Delete tombstones older than the retention; returns how many went."""
        return self._purge(spark, now)[0]

    def _purge(self, spark: SparkSession, now: dt.datetime | None = None) -> tuple[int, int | None]:
        """How many tombstones older than the retention went, and the version that deleted
        them (None: nothing committed). The MERGE reads and rewrites only the files holding
        expired tombstones: another sink's concurrent append adds files of its own, which stay;
        another writer's rewrite of a file this read (its purge or compaction) makes this purge
        conflict and commit nothing (ConcurrentModificationError, raised: the batch reruns)."""
        if not table_exists(self.path):
            return 0, None
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
        return deleted, metrics["tableVersion"]
