"""MergeSink: the ``foreachBatch`` callable that upserts each micro-batch exactly once.

Exactly once comes from Delta's app transactions: the MERGE of batch N commits
``txn(app_id, N)`` atomically with its data, and a batch whose txn is already in the
table (a replay after a crash between our commit and Spark's offset commit) is
skipped. ``app_id`` defaults to the streaming query's id, which Spark keeps in the
checkpoint and so is stable across restarts.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from streaming_merge.delta_table import DeltaTable
from streaming_merge.errors import (
    ConcurrentModificationError,
    InvalidArgumentError,
    MaterializedSourceLostError,
    StreamingMergeError,
)
from streaming_merge.merge.command import MergeOptions, merge_conf
from streaming_merge.merge.key_presence import key_presence_probe
from streaming_merge.merge.materialize import DEFAULT_STORAGE_LEVELS, is_lost_block_error, level_for_attempt, release
from streaming_merge.merge.metrics import MergeMetrics
from streaming_merge.merge.skipping import SourceStats
from streaming_merge.spark.answers_at_once import ready_driver_thread
from streaming_merge.spark.interpreted import interpreted_if_small, rows_of
from streaming_merge.spark.slots import task_slots
from streaming_merge.streaming.arguments import (
    ColumnArg,
    ScdType,
    check_retry_budget,
    column_names,
    name_list,
    renamed,
    scd_type_of,
    sequence_columns,
)
from streaming_merge.streaming.background import BackgroundCall
from streaming_merge.streaming.batch_copy import copy_batch
from streaming_merge.streaming.batch_steps import (
    Attempt,
    CopiedBatch,
    MergeOutcome,
    PreparedBatch,
    TxnCheck,
    all_truncates,
    empty_progress,
    ensure_table,
    merged_progress,
    no_tombstones_missed,
    skipped_progress,
)
from streaming_merge.streaming.cdc import (
    NULL_KEY_FLAG,
    BatchPreparer,
    CdcSpec,
    ColumnSelection,
    Dedupe,
    forget_truncated,
)
from streaming_merge.streaming.compaction import AutoCompact, run_auto_compaction
from streaming_merge.streaming.null_keys import refuse_unsequenced, route_null_keys
from streaming_merge.streaming.progress import MergeProgress, ProgressLog, millis_since
from streaming_merge.streaming.retries import DEFAULT_CONFLICT_BACKOFF, DEFAULT_MAX_CONFLICT_RETRIES, conflict_backoff
from streaming_merge.streaming.scd2 import (
    TrackHistory,
)
from streaming_merge.streaming.sequence_layout import CDC_METADATA, TableColumns
from streaming_merge.streaming.sink_clauses import (
    ClauseBuilder,
    cdc_upsert,
    check_history_options,
    history_condition,
    history_source,
    history_upsert,
)
from streaming_merge.streaming.sink_options import (
    CdcOptions,
    PerformanceOptions,
    PhaseHook,
    ProgressOptions,
    RetryOptions,
    TableOptions,
    grouped,
)
from streaming_merge.streaming.spark_metrics import publish as publish_metrics
from streaming_merge.streaming.tombstones import Tombstones
from streaming_merge.table.follow import FollowedTable
from streaming_merge.table.location import TableLocation, resolve
from streaming_merge.table.option_check import checked_storage_options
from streaming_merge.table.snapshot import Snapshot, file_rows
from streaming_merge.table.write import parquet_write_conf

log = logging.getLogger(__name__)

# After a batch whose MERGE touched every candidate file (uniform keys over a table of this
# size do), the next batch skips findTouchedFiles and rewrites every candidate: one Spark job
# fewer (MergeOptions.rewrite_all_candidates_bytes). Every PROBE_TOUCHED_EVERY-th batch of such a
# run scans again, so a stream whose keys stop touching everything goes back to the scan.
REWRITE_ALL_CANDIDATES_BYTES = 64 * 1024 * 1024
PROBE_TOUCHED_EVERY = 8
# Candidates this small are always rewritten whole: findTouchedFiles's Spark job costs more than
# copying their untouched rows (a new table's first updates, a small dimension table).
SMALL_CANDIDATES_BYTES = 1024 * 1024
# A batch of at most this many events is folded (newest event per key) in one task, with no
# shuffle; a larger one in a partition per task slot (see MergeSink._fold_partitions).
FOLD_IN_ONE_TASK_MAX_ROWS = 20_000


class MergeSink:
    """Upsert every micro-batch into the Delta table at ``target``; see the README section
    "Streaming upserts" for each option.

    The CDC options carry AUTO CDC's names (Spark 4.3's ``create_auto_cdc_flow``, Databricks'
    AUTO CDC): ``apply_as_deletes``, ``apply_as_truncates``, ``stored_as_scd_type``,
    ``column_list`` / ``except_column_list``, ``track_history_*``, ``ignore_null_updates*``;
    keys, column lists and ``sequence_by`` take names or PySpark Columns. ``delete_when`` and
    ``scd_type`` are deprecated aliases of ``apply_as_deletes`` and ``stored_as_scd_type``.

    Several sinks (flows) may upsert into one table at once, each with its own ``app_id``
    (exactly once per flow: its txn is its own, and commits of other app ids never disturb it).
    A batch whose commit conflicts with another writer's (``ConcurrentModificationError``: a
    file it read was rewritten, a file its keys could match was added, the table was created
    or its schema changed meanwhile, a lost commit race, or another flow recorded a tombstone
    of its keys after the batch read the tombstones) is rerun from a fresh snapshot of the
    target and the tombstones, so the sequence guard compares against the newest row whichever
    flow wrote it. Those reruns have their own budget: at most ``max_conflict_retries`` (8),
    the n-th after a pause of ``min(cap, first * 2**(n-1))`` seconds times a random factor in
    [0.5, 1), ``conflict_backoff=(first, cap)`` = (0.1, 5.0) by default (at most 16.3 s of
    pauses in all); each is logged (WARNING) and counted in the progress (``conflictRetries``;
    ``attempts`` counts every attempt). Reruns after lost materialized blocks are bounded by
    ``max_attempts`` as before, apart from these.

    The options also come in groups, frozen dataclasses whose fields carry the keywords' names
    and defaults: ``table=TableOptions(...)``, ``cdc=CdcOptions(...)``, ``retries=RetryOptions(...)``,
    ``progress=ProgressOptions(...)``, ``performance=PerformanceOptions(...)``. A group not given
    is built from its keywords; a group given with one of its keywords set too is refused."""

    def __init__(
        self,
        target: str,
        keys: ColumnArg | Sequence[ColumnArg] | None = None,
        *,
        condition: str | None = None,
        sequence_by: ColumnArg | Sequence[ColumnArg] | None = None,
        apply_as_deletes: str | Column | None = None,
        apply_as_truncates: str | Column | None = None,
        stored_as_scd_type: ScdType | None = None,
        dedupe: Dedupe = "last",
        clauses: ClauseBuilder | None = None,
        app_id: str | None = None,
        schema_evolution: bool = False,
        storage_levels: Sequence[str] = DEFAULT_STORAGE_LEVELS,
        max_attempts: int = 4,
        max_conflict_retries: int = DEFAULT_MAX_CONFLICT_RETRIES,
        conflict_backoff: tuple[float, float] = DEFAULT_CONFLICT_BACKOFF,
        dead_letter: str | None = None,
        create_if_missing: bool = True,
        partition_by: Sequence[str] | None = None,
        table_properties: Mapping[str, str] | None = None,
        tombstones: bool | str = True,
        tombstone_retention: dt.timedelta = dt.timedelta(days=7),
        tombstone_purge_every: int = 100,
        progress_capacity: int = 100,
        merge_options: MergeOptions | None = None,
        phase_hook: PhaseHook | None = None,
        storage_options: Mapping[str, str] | None = None,
        auto_compact: AutoCompact | None = None,
        column_list: Sequence[ColumnArg] | None = None,
        except_column_list: Sequence[ColumnArg] | None = None,
        ignore_null_updates: bool = False,
        ignore_null_updates_column_list: Sequence[ColumnArg] | None = None,
        ignore_null_updates_except_column_list: Sequence[ColumnArg] | None = None,
        unavailable_value: str | None = None,
        track_history_column_list: Sequence[ColumnArg] | None = None,
        track_history_except_column_list: Sequence[ColumnArg] | None = None,
        table: TableOptions | None = None,
        cdc: CdcOptions | None = None,
        retries: RetryOptions | None = None,
        progress: ProgressOptions | None = None,
        performance: PerformanceOptions | None = None,
        delete_when: str | Column | None = None,
        scd_type: int | None = None,
    ) -> None:
        # Each group given whole, or built from its keywords (sink_options.grouped).
        keywords = dict(locals())
        table = grouped(TableOptions, "table", table, keywords)
        cdc = grouped(CdcOptions, "cdc", cdc, keywords)
        retries = grouped(RetryOptions, "retries", retries, keywords)
        progress = grouped(ProgressOptions, "progress", progress, keywords)
        performance = grouped(PerformanceOptions, "performance", performance, keywords)
        deletes = renamed("delete_when", delete_when, "apply_as_deletes", cdc.apply_as_deletes)
        scd_value = renamed("scd_type", scd_type, "stored_as_scd_type", cdc.stored_as_scd_type)
        scd = scd_type_of(1 if scd_value is None else scd_value)
        key_list = column_names(keys, "keys")
        if not key_list and condition is None:
            raise InvalidArgumentError("MergeSink needs keys=[...] or condition='t.k = s.k'")
        check_retry_budget(retries.max_attempts, retries.max_conflict_retries, retries.conflict_backoff)
        if not isinstance(target, str) or not target.strip():
            raise InvalidArgumentError(f"MergeSink needs a target table path or URI, got {target!r}")
        self.target = target  # as given until the first batch resolves it with the session's file system
        self._storage_options = dict(table.storage_options or {})
        checked_storage_options(target, self._storage_options)  # a misspelt option fails here, not at batch 0
        self._location: TableLocation | None = None
        self._followed: FollowedTable | None = None  # the target, from one batch to the next
        # List options take names or Columns; an empty list is no selection (see name_list).
        null_columns = name_list(cdc.ignore_null_updates_column_list, "ignore_null_updates_column_list")
        null_except = name_list(cdc.ignore_null_updates_except_column_list, "ignore_null_updates_except_column_list")
        partial = (cdc.ignore_null_updates or null_columns is not None or null_except is not None
                   or cdc.unavailable_value is not None)
        if partial and not key_list:
            raise InvalidArgumentError("ignore_null_updates / unavailable_value need keys=[...]: a partial update is "
                             "folded per key")
        if partial and table.schema_evolution:
            raise InvalidArgumentError("ignore_null_updates / unavailable_value cannot go with schema_evolution yet "
                             "(their MERGE assigns columns one by one, which does not add new columns)")
        sequence_list = sequence_columns(cdc.sequence_by)
        track_list = name_list(cdc.track_history_column_list, "track_history_column_list")
        track_except = name_list(cdc.track_history_except_column_list, "track_history_except_column_list")
        selected = name_list(cdc.column_list, "column_list")
        excepted = name_list(cdc.except_column_list, "except_column_list")
        check_history_options(scd, key_list, sequence_list, clauses, table.schema_evolution, track_list,
                              track_except, cdc.apply_as_truncates)
        self._scd_type = scd
        self._track = TrackHistory(track_list, track_except)
        self._spec = CdcSpec(key_list, sequence_list, deletes, cdc.dedupe, cdc.ignore_null_updates,
                             cdc.unavailable_value, cdc.apply_as_truncates, keep_all_events=scd == 2,
                             ignore_null_columns=null_columns, ignore_null_except=null_except
                             ) if key_list else None
        # The batch's CDC plan, its expressions built once per batch schema (BatchPreparer).
        self._preparer = BatchPreparer(self._spec) if self._spec else None
        self._condition = condition or (self._spec.key_condition() if self._spec else "")
        # Key presence per target file is observed while materializing when the MERGE joins on
        # the keys alone (a condition of the caller's may join on anything).
        self._joins_on_keys = condition is None and self._spec is not None and scd == 1
        self._selection = ColumnSelection(selected, excepted, key_list)
        if clauses is not None and self._spec is not None and self._selection.leaves_out(sequence_list):
            raise InvalidArgumentError(
                f"column_list / except_column_list leave the sequence_by column(s) "
                f"{self._selection.leaves_out(sequence_list)} out of the table, which custom clauses cannot do: the "
                f"sequence then goes to `{CDC_METADATA}`, which only the upsert preset maintains.")
        # Where the table keeps the sequence, and which batch columns reach it, decided per batch.
        self._columns = TableColumns(self._spec, self._selection, target, table.schema_evolution,
                                     sequence_in_columns=scd == 2 or clauses is not None)
        self._clauses = clauses
        self._app_id = app_id
        self._schema_evolution = table.schema_evolution
        self._storage_levels = tuple(retries.storage_levels)
        self._max_attempts = retries.max_attempts
        self._max_conflict_retries = retries.max_conflict_retries
        self._conflict_backoff = (float(retries.conflict_backoff[0]), float(retries.conflict_backoff[1]))
        self._dead_letter_ref = table.dead_letter
        self._dead_letter: TableLocation | None = None
        self._create_if_missing = table.create_if_missing
        self._partition_by = list(table.partition_by or [])
        self._table_properties = dict(table.table_properties or {})
        self._merge_options = performance.merge_options or MergeOptions()
        self._phase_hook = progress.phase_hook
        self._auto_compact = performance.auto_compact
        self._progress = ProgressLog(progress.progress_capacity)
        self._tombstones: Tombstones | None = None
        # Set by each batch's tombstone lookup for the next (see Tombstones.lookup_reads_most); None
        # until a lookup has seen a tombstone (a new stream, a restart): the next batch then filters
        # while materializing only when the tombstones are few (Tombstones.is_small).
        self._filter_while_materializing: bool | None = None
        # Batches in a row whose MERGE rewrote every candidate file (see REWRITE_ALL_CANDIDATES_BYTES).
        self._all_touched_streak = 0
        self._last_input_rows: int | None = None  # the previous batch's, for _fold_partitions
        self._tombstone_settings = (cdc.tombstones, cdc.tombstone_retention, cdc.tombstone_purge_every)

    # ------------------------------------------------------------------ progress

    @property
    def lastProgress(self) -> dict[str, Any] | None:
        last = self._progress.last()
        return last.to_dict() if last is not None else None

    @property
    def recentProgress(self) -> list[dict[str, Any]]:
        return [p.to_dict() for p in self._progress.all()]

    def progress_for(self, batch_id: int, query_id: str | None = None) -> MergeProgress | None:
        return self._progress.get(batch_id, query_id)

    def served_query_ids(self) -> set[str]:  # the streaming queries whose batches it recorded
        return self._progress.query_ids()

    # ------------------------------------------------------------------ the batch

    def _bind(self, spark: SparkSession) -> TableLocation:
        """Resolve the tables' locations once, with the session's Hadoop file system (a
        relative or scheme-less path means what it means to Spark, e.g. HDFS on a cluster)."""
        if self._location is not None:
            return self._location
        location = resolve(self.target, spark, self._storage_options)
        if self._dead_letter_ref:
            self._dead_letter = resolve(self._dead_letter_ref, spark, self._storage_options)
        tombstones, retention, purge_every = self._tombstone_settings
        if tombstones and self._spec is not None and self._spec.sequence_by:
            path = tombstones if isinstance(tombstones, str) else f"{location.uri}_tombstones"
            self._tombstones = Tombstones(resolve(path, spark, self._storage_options), self._spec, retention,
                                          purge_every)
        self._location = location
        self._followed = FollowedTable(location)
        self.target = location.uri
        return location

    def __call__(self, batch_df: DataFrame, batch_id: int, *, rows_at_most: int | None = None) -> None:
        """Merge one micro-batch (the ``foreachBatch`` function). ``rows_at_most``: a bound on
        the batch's rows when the caller knows one (it counted them, or its trigger reads at
        most that many records); a small batch is then materialized without generated code
        (``MergeOptions.interpreted_max_rows``). Unknown, only the steps after the
        materialization, which counts the rows, can run interpreted."""
        started = time.monotonic()
        spark = batch_df.sparkSession
        ready_driver_thread(spark)
        self._bind(spark)
        query_id = spark.sparkContext.getLocalProperty("sql.streaming.queryId") or None
        self._progress.running(query_id)
        app_id = self._resolve_app_id(query_id)
        lost = conflicts = 0  # attempts that lost their materialized blocks; reruns after a conflict
        attempt = 0
        while True:
            attempt += 1
            level = level_for_attempt(self._storage_levels, lost + 1)
            try:
                with merge_conf(spark), parquet_write_conf(spark):  # held for both writes (see parquet_write_conf)
                    self._run_batch(Attempt(spark, batch_df, batch_id, app_id, attempt, conflicts, level, started,
                                            rows_at_most, self._bind(spark)))
                return
            except Exception as exc:
                if is_lost_block_error(exc):
                    lost += 1
                    if lost >= self._max_attempts:
                        raise MaterializedSourceLostError(
                            f"Batch {batch_id} into `{self.target}`: the materialized micro-batch lost its blocks "
                            f"on {lost} attempts (of {attempt}).", attempts=attempt) from exc
                    log.warning("Batch %d into %s lost its materialized blocks on attempt %d; rerunning the batch "
                                "(%d of at most %d such attempts)", batch_id, self.target, attempt, lost + 1,
                                self._max_attempts)
                    continue
                if not isinstance(exc, ConcurrentModificationError):
                    raise
                if conflicts >= self._max_conflict_retries:
                    raise ConcurrentModificationError(
                        f"Batch {batch_id} of {app_id!r} into `{self.target}` still conflicted with concurrent commits "
                        f"after {conflicts} rerun(s) from a fresh snapshot (max_conflict_retries="
                        f"{self._max_conflict_retries}); nothing of it was committed. Last conflict: {exc}") from exc
                conflicts += 1
                pause = conflict_backoff(conflicts, *self._conflict_backoff)
                log.warning("Batch %d of %r into %s conflicted with a concurrent commit on attempt %d; conflict retry "
                            "%d of %d from a fresh snapshot in %.0f ms: %s", batch_id, app_id, self.target, attempt,
                            conflicts, self._max_conflict_retries, pause * 1000, exc)
                _sleep(pause)

    def _run_batch(self, attempt: Attempt) -> None:
        """One attempt: txn check → copy → prepare → MERGE → report. The copy is released
        whatever happens after it; the batch is reported once its MERGE returned."""
        txn = self._check_txn(attempt)
        if txn.applied:
            assert txn.snapshot is not None
            self._report(skipped_progress(attempt, txn.snapshot))
            return
        copied = self._copy(attempt, txn.snapshot)
        try:
            if self._phase_hook:
                self._phase_hook("after_materialize", copied.frame)
            self._last_input_rows = copied.counts.rows
            if copied.counts.rows == 0:
                self._report(empty_progress(attempt, copied))
                return
            # The rest of the batch reads the batch, the target and the tombstones: generated code
            # or not, decided from their row counts (streaming_merge.spark.interpreted).
            with interpreted_if_small(
                    attempt.spark, rows_of([copied.counts.rows, *file_rows(copied.snapshot),
                                            *file_rows(copied.tombstones)]),
                    self._merge_options.interpreted_max_rows):
                prepared = self._prepare(attempt, copied)
                outcome = self._merge(attempt, copied, prepared)
        finally:
            release(copied.frame)
        self._report_merged(attempt, copied, prepared, outcome)

    def _check_txn(self, attempt: Attempt) -> TxnCheck:
        """The target as this attempt reads it, and whether it already holds txn(app_id, batch_id)."""
        assert self._followed is not None
        snapshot = self._followed.latest()
        applied = snapshot.transaction_version(attempt.app_id) if snapshot is not None else None
        return TxnCheck(snapshot, applied is not None and applied >= attempt.batch_id)

    def _copy(self, attempt: Attempt, snapshot: Snapshot | None) -> CopiedBatch:
        """The batch's one copy (copy_batch): prepared, counted, its key ranges observed, late
        events dropped in the same job when the tombstones say it pays."""
        spark = attempt.spark
        tombstone_snapshot = self._tombstones.snapshot() if self._tombstones is not None else None
        partitions = self._fold_partitions(spark, attempt.rows_at_most)
        # Late events are dropped while the batch is materialized when the previous batch's lookup
        # read most tombstones anyway, or, before any lookup saw one, when there are few
        # (Tombstones.is_small); the MERGE then takes that copy as it is (no pass of its own). An
        # in-order stream's lookups find nothing to read, so it goes back to paying nothing.
        early: Callable[[DataFrame], DataFrame] | None = None
        everything = Tombstones.all_files(tombstone_snapshot)
        if self._tombstones is not None and tombstone_snapshot is not None and self._scd_type == 1 and everything and \
                (self._filter_while_materializing or
                 (self._filter_while_materializing is None and Tombstones.is_small(everything))):
            early = functools.partial(self._tombstones.without_late, spark, snapshot=tombstone_snapshot,
                                      files=everything, partitions=partitions, partitioned_by_keys=True)
        started = time.monotonic()
        with interpreted_if_small(spark, rows_of([attempt.rows_at_most,
                                                  *(file_rows(tombstone_snapshot) if early else [])]),
                                  self._merge_options.interpreted_max_rows):
            # Not while the batches touch every candidate anyway (the streak that also skips
            # findTouchedFiles): the probe would find no file to drop and costs ~30-50 ms.
            probe = (key_presence_probe(snapshot, [(k, k) for k in self._spec.keys], attempt.batch_df.schema,
                                        self._merge_options.key_presence_max_files)
                     if snapshot is not None and self._spec is not None and self._joins_on_keys
                     and not self._all_touched_streak % PROBE_TOUCHED_EVERY else None)
            frame, counts, stats, kept_rows = copy_batch(
                self._spec, self._preparer, self._scd_type, attempt.batch_df, attempt.storage_level, partitions,
                early, probe, Tombstones.fit_one_task(everything))
        return CopiedBatch(frame, counts, stats, kept_rows, snapshot, tombstone_snapshot, everything, partitions,
                           millis_since(started))

    def _prepare(self, attempt: Attempt, copied: CopiedBatch) -> PreparedBatch:
        """The MERGE's source from the copy: NULL keys routed to the dead letter, events older
        than a tombstone or a truncate dropped (SCD 1) or placed in the history (SCD 2), the
        column selection applied; the target is created when missing."""
        spark, counts, stats = attempt.spark, copied.counts, copied.stats
        source, dead_letter_rows = copied.frame, 0
        if self._spec is not None:
            refuse_unsequenced(self._spec, self._scd_type, self.target, attempt.batch_id, counts.sequence_nulls)
            dead_letter_rows = route_null_keys(spark, self._spec, self._dead_letter, self.target, copied.frame,
                                               attempt.batch_id, attempt.app_id, counts.null_keys)
            source = copied.frame.filter(~F.col(NULL_KEY_FLAG)).drop(NULL_KEY_FLAG)
            if self._phase_hook:
                self._phase_hook("after_prepare", source)
        # The column selection applies right before the MERGE: the dead letter keeps whole
        # records, and the tombstones, truncates and SCD 2 history need the sequence columns,
        # which the table may leave out (see TableColumns).
        layout = self._columns.layout(copied.snapshot.schema if copied.snapshot is not None else None, source.columns)
        started = time.monotonic()
        late_dropped = copied.kept_rows is not None  # the copy dropped them: the key ranges still bound the rest
        merge_stats: SourceStats | None = (dataclasses.replace(stats, rows=copied.kept_rows)
                                           if copied.kept_rows is not None else stats)
        events = source
        if self._tombstones is not None and self._scd_type == 1:  # SCD 2 places late events in the history
            files = self._tombstones.lookup_files(spark, copied.tombstones, stats.ranges, counts.oldest_sequence)
            self._filter_while_materializing = (self._tombstones.lookup_reads_most(copied.tombstones, files)
                                                if copied.tombstone_files else None)
            if files and not late_dropped:
                assert copied.tombstones is not None
                # The MERGE materializes the filtered batch and counts what is left.
                source = self._tombstones.without_late(spark, source, copied.tombstones, files, copied.partitions)
                merge_stats, late_dropped = None, True
        truncates = all_truncates(spark, self._spec, self._tombstones, counts.truncates, copied.tombstones,
                                  source.schema)
        batch_truncates = [self._spec.sequence_literal(v, source.schema) for v in sorted(counts.truncates)] \
            if self._spec is not None else []
        if self._scd_type == 2:
            source, merge_stats = history_source(spark, self._spec, self._columns, self._track, self._tombstones,
                                                 self.target, source, stats, copied.snapshot, truncates,
                                                 batch_truncates, copied.tombstones, layout)
        else:
            if truncates:
                assert self._spec is not None  # truncates need keys and a sequence
                source, merge_stats, late_dropped = forget_truncated(source, self._spec, truncates[-1]), None, True
            source = self._columns.frame(source, layout)
        ensure_table(spark, attempt.location, source, copied.snapshot, create_if_missing=self._create_if_missing,
                     partition_by=self._partition_by, properties=self._table_properties)
        return PreparedBatch(source, events, merge_stats, late_dropped, layout, batch_truncates, dead_letter_rows,
                             millis_since(started))

    def _merge(self, attempt: Attempt, copied: CopiedBatch, prepared: PreparedBatch) -> MergeOutcome:
        """The MERGE, which commits txn(app_id, batch_id); the batch's deletes and truncates are
        recorded as tombstones beside it, and it waits for them before committing."""
        spark, counts = attempt.spark, copied.counts
        own_versions: list[int] = []  # of the tombstone table: this batch's append (and purge)
        recording: BackgroundCall | None = None
        if self._tombstones is not None and (counts.deletes or counts.truncates):
            # From the materialized batch, not the late-event filter (which never drops a delete
            # and would be computed once more for this append alone).
            tombstones = self._tombstones
            recording = BackgroundCall(lambda: own_versions.extend(tombstones.record(
                spark, prepared.events, attempt.app_id, attempt.batch_id, copied.tombstones, prepared.truncates,
                counts.truncates)), "tombstone-append")
        commit_check = None
        if self._tombstones is not None:
            commit_check = functools.partial(
                no_tombstones_missed, self._tombstones, spark,
                copied.snapshot.version if copied.snapshot is not None else None, copied.tombstones, own_versions,
                prepared.events, copied.stats.ranges)
        started = time.monotonic()
        try:
            metrics = self._execute_merge(attempt, copied.snapshot, prepared,
                                          recording.result if recording is not None else None, commit_check,
                                          partial=counts.partial_events > 0)
        except BaseException:
            if recording is not None:
                recording.wait_quietly()
            raise
        if recording is not None:
            recording.result()  # a MERGE skipped by its txn never reached the wait before its commit
        return MergeOutcome(metrics, millis_since(started))

    def _report_merged(self, attempt: Attempt, copied: CopiedBatch, prepared: PreparedBatch,
                       outcome: MergeOutcome) -> None:
        """What follows a MERGE: the all-touched streak, auto compaction, the tombstones'
        compaction, and the batch's progress."""
        metrics, spark = outcome.metrics, attempt.spark
        candidates = int(metrics["numTargetFilesAfterSkipping"] or 0)
        removed = int(metrics["numTargetFilesRemoved"] or 0)
        all_touched = not metrics["skipped"] and candidates > 0 and removed == candidates
        self._all_touched_streak = self._all_touched_streak + 1 if all_touched else 0
        compaction = (run_auto_compaction(spark, self._auto_compact, attempt.batch_id, copied.snapshot,
                                          attempt.location)
                      if self._auto_compact is not None and not metrics["skipped"] else None)
        if self._tombstones is not None and (copied.counts.deletes or copied.counts.truncates):
            self._tombstones.compact_if_due(spark, attempt.batch_id, copied.tombstones)
        self._report(merged_progress(attempt, copied, prepared, outcome, compaction))

    def _fold_partitions(self, spark: SparkSession, rows_at_most: int | None) -> int:
        """How many partitions the batch is folded into (newest event per key): one for a small
        batch, which then needs no shuffle (:func:`clustered_by_keys`), else one per task slot.
        Small means ``rows_at_most`` (the caller's bound) or, without one, the previous batch's
        input rows are at most FOLD_IN_ONE_TASK_MAX_ROWS: a stream's batches are alike in size,
        and a sudden large batch costs one batch folded in one task; the first batch of a
        process has no previous one and gets the task slots."""
        bound = rows_at_most if rows_at_most is not None else self._last_input_rows
        if bound is not None and bound <= FOLD_IN_ONE_TASK_MAX_ROWS:
            return 1
        return task_slots(spark)

    def _resolve_app_id(self, query_id: str | None) -> str:
        if self._app_id:
            return self._app_id
        if not query_id:
            raise StreamingMergeError(
                "MergeSink has no app_id and is not running inside a streaming query (no query id); pass "
                "app_id='...' to call it directly.")
        return query_id

    def _execute_merge(self, attempt: Attempt, snapshot: Snapshot | None, prepared: PreparedBatch,
                       before_commit: Callable[[], None] | None, commit_check: Callable[[Snapshot], None] | None,
                       *, partial: bool) -> MergeMetrics:
        """The MERGE of the prepared source: the SCD 2 history clauses, the caller's clauses or
        the upsert preset, with the sink's MERGE options."""
        source, layout, truncates, stats = prepared.source, prepared.layout, prepared.truncates, prepared.stats
        table = DeltaTable(attempt.spark, attempt.location, "t")
        if self._scd_type == 2:
            builder = history_upsert(self._spec, table.merge(source.alias("s"), history_condition(self._condition)),
                                     source.columns, truncates)
        else:
            builder = table.merge(source.alias("s"), self._condition)
            builder = (self._clauses(builder) if self._clauses
                       else cdc_upsert(self._spec, builder, source.columns, layout, partial=partial))
            if truncates:  # rows at or before the batch's newest truncate, of keys the batch does not touch
                assert self._spec is not None
                row = self._spec.sequence_of("t", layout.in_metadata)
                builder = builder.whenNotMatchedBySourceDelete(condition=row.isNull() | (row <= truncates[-1]))
        # The batch is materialized once, above, with its statistics; a tombstone-filtered
        # source (stats None) is materialized by the MERGE, which counts what is left.
        options: dict[str, Any] = {f.name: getattr(self._merge_options, f.name)
                                   for f in dataclasses.fields(MergeOptions)}
        options["rewrite_all_candidates_bytes"] = max(
            options["rewrite_all_candidates_bytes"],
            REWRITE_ALL_CANDIDATES_BYTES if self._all_touched_streak % PROBE_TOUCHED_EVERY else SMALL_CANDIDATES_BYTES)
        options.update({"materialize_source": "none" if stats is not None else "all",
                        "source_stats": stats, "snapshot": snapshot, "storage_levels": self._storage_levels,
                        "before_commit": before_commit, "commit_check": commit_check})
        if self._phase_hook:
            options["phase_hook"] = self._phase_hook
        builder = builder.withOptions(**options)
        if self._schema_evolution:
            builder = builder.withSchemaEvolution()
        return builder.execute(app_id=attempt.app_id, version=attempt.batch_id)

    def _report(self, progress: MergeProgress) -> None:
        self._progress.add(progress)
        log.info("MergeSink %s", progress.summary())
        publish_metrics(progress)  # to Spark's metrics system (spark_metrics): Prometheus, JMX, ...


_sleep = time.sleep  # the conflict backoff's pause (a test replaces it)
