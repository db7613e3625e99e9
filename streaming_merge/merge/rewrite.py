"""writeAllChanges and the insert-only path: produce the new files of a MERGE.

Each joined row gets an *action code*: the number of the first clause that applies,
COPY (keep the target row as it is) or DROP (nothing to write). Output columns are
CASE expressions over that code, and the per-clause counts are collected with
``DataFrame.observe`` in the same job that writes the files, so metrics cost no
extra scan (Delta increments SQL metrics inside the same plan for the same reason).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql import Column, DataFrame, Observation, SparkSession, Window
from pyspark.sql import functions as F

from streaming_merge.merge.change_data import (
    deduplicates_deletes,
    matched_delete_rows,
    preimage_columns,
    with_change_rows,
)
from streaming_merge.merge.resolve import (
    ACTION_COL,
    COPY,
    DROP,
    SOURCE_PRESENT,
    TARGET_PRESENT,
    ResolvedClause,
    ResolvedMerge,
    qualified,
)
from streaming_merge.merge.touched import FILE_ID_COL, any_of, join_partitions, scan_with_file_ids
from streaming_merge.spark.conf import ONE_PARTITION_JOINS, temporary_conf
from streaming_merge.spark.slots import task_slots
from streaming_merge.table.file_ids import FileIds
from streaming_merge.table.scan import scan_files
from streaming_merge.table.snapshot import DataFile, Snapshot
from streaming_merge.table.write import WrittenFile, write_files

log = logging.getLogger(__name__)



TOUCHED_FILES = "touchedFileIds"
ROWS_PER_KEY_COL = "__sm_rows_per_key__"
# Observed among the touched files' identities (FileIds never gives -1) when a matched pair's
# key has two source rows.
SHARED_KEY = -1


@dataclass(frozen=True)
class RewriteResult:
    files: list[WrittenFile]
    counts: dict[str, int]
    # Set by a one-pass rewrite (TouchProbe): the candidates (positions, or sizes) that held a
    # matched row the clauses act on, and whether the key of a matched pair has two source rows
    # (never when the source's keys were known unique).
    touched: frozenset[int] | None = None
    matched_key_shared: bool = False


@dataclass(frozen=True)
class TouchProbe:
    """What a one-pass rewrite of every candidate file observes in its own job so that it can
    stand in for findTouchedFiles: which candidates hold a matched row the clauses act on, and
    whether a target row could have matched two source rows.

    The second is read from the rows joined: every candidate's record count is in the log, so
    a target row joined twice shows as more joined target rows than records (joined_twice).
    Where a candidate has no record count, it is read from the source side instead
    (``count_keys``): two source rows that match one target row through ``t.k = s.k``
    equalities of same-typed columns share their key, so when every matched pair's key has one
    source row, no target row matched twice; the source's rows per key are then counted (a
    window on the source, hash-partitioned on the keys as the join needs it anyway). Neither is
    needed when the source's keys are known unique."""

    # How the candidates' rows name their file (RewriteResult.touched holds these ids).
    file_ids: FileIds
    target_keys: tuple[str, ...]
    source_keys: tuple[str, ...]
    count_keys: bool
    partitions: int


def observed(observation: Observation) -> dict[str, int]:
    """The observation's counts; all zero when Spark optimized the observed subtree away.

    Spark drops a CollectMetrics node when it proves its input empty (empty-relation
    propagation, also at run time under AQE) and the observation then never completes.
    Only an empty input is removed, and every count over an empty input is zero.
    """
    return {k: int(v or 0) for k, v in observed_values(observation).items()}


def observed_values(observation: Observation) -> dict[str, Any]:
    """The observation's values as Spark returns them; empty when it never arrived (see observed)."""
    try:
        return dict(observation.get)
    except Exception as exc:  # Py4JJavaError: the metrics row never arrived
        log.debug("Observation %s not reported (subtree optimized away as empty): %s", observation, exc)
        return {}


def first_applicable(resolved: ResolvedMerge, clauses: Sequence[ResolvedClause], default: int) -> Column:
    """Code of the first clause whose condition holds (NULL counts as false)."""
    def build() -> Column:
        result: Column | None = None
        for clause in clauses:
            condition = clause.condition if clause.condition is not None else F.lit(True)
            result = F.when(condition, F.lit(clause.code)) if result is None else result.when(
                condition, F.lit(clause.code))
        return F.lit(default) if result is None else result.otherwise(F.lit(default))

    return resolved.derive(("first", default, *[c.code for c in clauses]), build)


def action_count(resolved: ResolvedMerge, codes: Sequence[int], name: str) -> Column:
    def build() -> Column:
        if not codes:
            return F.lit(0).alias(name)
        return F.sum(F.when(F.col(ACTION_COL).isin(list(codes)), 1).otherwise(0)).alias(name)

    return resolved.derive(("count", name, *codes), build)


def outputs(resolved: ResolvedMerge, clauses: Sequence[ResolvedClause], copy_from_target: bool) -> list[Column]:
    def build() -> list[Column]:
        writers = [c for c in clauses if c.outputs is not None]
        columns = []
        for field in resolved.output_schema.fields:
            fallback = qualified(resolved.target_alias, field.name) if copy_from_target else F.lit(None)
            value: Column | None = None
            for clause in writers:
                assert clause.outputs is not None
                branch = clause.outputs[field.name]
                value = F.when(F.col(ACTION_COL) == clause.code, branch) if value is None else value.when(
                    F.col(ACTION_COL) == clause.code, branch)
            value = fallback if value is None else value.otherwise(fallback)
            columns.append(value.cast(field.dataType).alias(field.name))
        return columns

    return resolved.derive(("outputs", copy_from_target, *[c.code for c in clauses]), build)


def codes_of(clauses: Sequence[ResolvedClause], delete: bool) -> list[int]:
    return [c.code for c in clauses if c.clause.is_delete == delete]


# What happened to target rows; a joined target row gets exactly one of these (or is dropped
# unmatched by a full outer join's source side, which has no target row).
TARGET_ROW_COUNTS = ("numTargetRowsCopied", "numTargetRowsMatchedUpdated", "numTargetRowsMatchedDeleted",
                     "numTargetRowsNotMatchedBySourceUpdated", "numTargetRowsNotMatchedBySourceDeleted")


def target_row_counts(resolved: ResolvedMerge) -> list[Column]:
    """The metrics of what happened to target rows (TARGET_ROW_COUNTS), by action code."""
    codes = ([COPY], codes_of(resolved.matched, delete=False), codes_of(resolved.matched, delete=True),
             codes_of(resolved.not_matched_by_source, delete=False),
             codes_of(resolved.not_matched_by_source, delete=True))
    return [action_count(resolved, c, name) for c, name in zip(codes, TARGET_ROW_COUNTS, strict=True)]


@dataclass(frozen=True)
class RowAggregate:
    """An aggregate of the rewrite's observation over one value per joined row (``value``,
    over the joined columns), which the generated code computes before the observation.
    Made by ``ResolvedMerge.derive``, so that one resolution keeps each value alive and
    observed_output may name it by its identity."""

    name: str
    value: Column
    aggregate: Callable[[Column], Column]

    @property
    def input_column(self) -> str:
        return f"__sm_observed_{self.name}__"


def observed_output(resolved: ResolvedMerge, with_action: DataFrame, clauses: Sequence[ResolvedClause],
                    copy_from_target: bool, dropped: Sequence[int], observation: Observation,
                    counts: Sequence[Column], row_aggregates: Sequence[RowAggregate] = ()) -> DataFrame:
    """The rows to write: ``with_action``'s output columns for every row whose action is not in
    ``dropped``, observed (``counts`` over ACTION_COL, ``row_aggregates``) before the drop.

    Spark runs an observation outside generated code, on rows it first copies out of it. So
    the observation sits on the narrow row of the output columns, the action and one plain
    column per aggregate, not on the joined row with both sides (5M target rows x 100k: the
    write 2.74-2.80 s -> 2.41-2.54 s in one process, /tmp experiment of 2026-11-27)."""
    # Built once per resolution (each Column is a JVM round trip); the values are derived
    # Columns themselves, so their identities name them.
    key = (copy_from_target, tuple(c.code for c in clauses), tuple(dropped),
           tuple((a.name, id(a.value), a.aggregate) for a in row_aggregates))

    def build() -> tuple[list[Column], list[Column], Column, list[Column]]:
        narrow = [*outputs(resolved, clauses, copy_from_target), F.col(ACTION_COL),
                  *[a.value.alias(a.input_column) for a in row_aggregates],
                  *(preimage_columns(resolved) if resolved.change_data else [])]
        aggregates = [a.aggregate(F.col(a.input_column)).alias(a.name) for a in row_aggregates]
        kept = ~F.col(ACTION_COL).isin(list(dropped))
        return narrow, aggregates, kept, [F.col(f"`{name}`") for name in resolved.output_schema.fieldNames()]

    narrow, aggregates, kept, written = resolved.derive(("observed-output", key), build)
    observed_rows = with_action.select(*narrow).observe(observation, *counts, *aggregates)
    if resolved.change_data:
        return with_change_rows(resolved, observed_rows, clauses, keep_copies=copy_from_target)
    return observed_rows.filter(kept).select(*written)


@dataclass(frozen=True)
class FileLayout:
    """How the new files are cut: one file per partition value (a shuffle on the partition
    columns) when ``repartition`` is on, and as few files as ``target_file_size`` allows,
    except that a large output is spread over the cores (``min_parallel_file_size``)."""

    repartition: bool
    target_file_size: int
    estimated_bytes: int  # the rewritten files' bytes plus the source's, a bound on the output
    min_parallel_file_size: int  # MergeOptions.min_parallel_file_size
    largest_file: int = 0  # the largest file rewritten (see scan_split_conf)

    @property
    def files_by_size(self) -> int:
        return max(1, -(-self.estimated_bytes // max(1, self.target_file_size)))

    def files(self, parallelism: int) -> int:
        """Output files (tasks) for an unpartitioned write."""
        by_cores = min(parallelism, self.estimated_bytes // max(1, self.min_parallel_file_size))
        return max(self.files_by_size, by_cores)


def write_frame(spark: SparkSession, snapshot: Snapshot, frame: DataFrame, resolved: ResolvedMerge,
                layout: FileLayout, inserts: DataFrame | None = None, parallelism: int | None = None,
                map_side: bool = False, change_data: bool | None = None, alongside: DataFrame | None = None
                ) -> list[WrittenFile]:
    """Write ``frame`` (and ``inserts``, rows of a plan of their own) as the layout says;
    ``alongside``: a plan that writes no row, run in the same job for what it observes;
    ``parallelism``: the task slots when the caller already asked Spark for them; ``map_side``:
    ``frame`` is the target's scan with no exchange after it (a map-side rewrite);
    ``change_data``: the rows carry ``_change_type`` (streaming_merge.merge.change_data; by
    default when the table records change data).

    An unpartitioned write into several files coalesces its input partitions, and Spark groups
    them by count, not by size: a map-side rewrite's scan, packed into as few partitions as
    there are cores, plus the inserts' one, made a task of the inserts' few rows beside one of
    most of the rewritten files (5M rows x 100k: tasks of 1.3 s and 3.7 s on 2 cores). So that
    scan gets a partition per file (see scan_split_conf), which a coalesce spreads evenly, and
    the inserts join one of the files instead of taking a file of their own (1M x 100k: 3 files
    -> 2). Behind an exchange the partitions are the exchange's, and the scans keep Spark's
    splits (a large source would otherwise be read in tasks of a target file's size)."""
    partition_columns = snapshot.partition_columns
    parallelism = parallelism or task_slots(spark)
    files = layout.files(parallelism)
    if inserts is not None and (partition_columns or files == 1):
        frame, inserts = frame.unionByName(inserts), None
    split_conf: dict[str, str] = {}
    if partition_columns and layout.repartition:
        buckets = max(1, min(int(spark.conf.get("spark.sql.shuffle.partitions") or 1),
                             parallelism * layout.files_by_size))
        frame = frame.repartition(buckets, *[F.col(f"`{c}`") for c in partition_columns])
    elif not partition_columns:
        if inserts is not None:
            frame = frame.unionByName(inserts.coalesce(1))
        if files > 1 and map_side:
            session_max = int(spark._jsparkSession.sessionState().conf().filesMaxPartitionBytes())
            split_conf = scan_split_conf(layout, session_max)
        frame = frame.coalesce(files)
    if alongside is not None:  # after the layout's shaping: its partitions keep their own tasks
        frame = frame.unionByName(alongside)
    with temporary_conf(spark, split_conf):
        return write_files(spark, frame, snapshot.location, resolved.output_schema, partition_columns,
                           change_data=resolved.change_data if change_data is None else change_data)


def scan_split_conf(layout: FileLayout, session_max: int) -> dict[str, str]:
    """Scan settings that give each rewritten file a partition of its own and cut none: Spark's
    split size is then the largest file (``session_max``, the session's split size, at most),
    and opening a file costs as much, so no two files share a partition. A file cut into splits
    would leave all splits but one empty when it has one row group, and the coalesce, counting
    partitions, would then balance the tasks wrongly."""
    split = str(max(1, min(layout.largest_file or session_max, session_max)))
    return {_MAX_PARTITION_BYTES: split, _OPEN_COST_BYTES: split}


def write_all_changes(
    spark: SparkSession,
    snapshot: Snapshot,
    files_to_rewrite: Sequence[DataFile],
    source: DataFrame,
    resolved: ResolvedMerge,
    *,
    optimize_matched_only: bool,
    layout: FileLayout,
    broadcast_source: bool,
    probe: TouchProbe | None = None,
) -> RewriteResult:
    """Rewrite the touched files with every clause applied, plus the inserted rows.

    With ``probe`` the files are the MERGE's candidates, not yet known to be touched, and the
    write's job also observes what findTouchedFiles would have found (see TouchProbe)."""
    src_obs, out_obs = Observation(), Observation()
    matched_only = optimize_matched_only and resolved.clauses.is_matched_only
    shuffled = not (matched_only and broadcast_source)
    # Asked for once here when the layout decides (no probe), and handed to the write.
    slots = task_slots(spark) if probe is None and shuffled and not snapshot.partition_columns else None
    one_task = shuffled and (probe.partitions == 1 if probe is not None else
                             slots is not None and layout.files(slots) == 1)
    if probe is not None:
        source, tgt_scan = _probed_sides(spark, snapshot, files_to_rewrite, source, resolved, probe,
                                         shuffled=shuffled, one_task=one_task)
    else:
        tgt_scan = scan_files(spark, snapshot, files_to_rewrite, schema=resolved.output_schema)
        if one_task:  # as in _probed_sides: one output file, so one partition of each side as read
            source, tgt_scan = source.coalesce(1), tgt_scan.coalesce(1)
    if matched_only and broadcast_source:  # a right outer join can build its left side
        source = F.broadcast(source)
    src = (source.alias(resolved.source_alias).withColumn(SOURCE_PRESENT, F.lit(True))
           .observe(src_obs, F.count(F.lit(1)).alias("rows")))
    if probe is not None and broadcast_source and not matched_only:
        # The candidates are shuffled anyway; hashing the small source beats sorting every target row.
        src = src.hint("shuffle_hash")
    tgt = tgt_scan.alias(resolved.target_alias).withColumn(TARGET_PRESENT, F.lit(True))
    joined = src.join(tgt, resolved.condition, "right_outer" if matched_only else "full_outer")

    source_present = F.col(SOURCE_PRESENT).isNotNull()
    target_present = F.col(TARGET_PRESENT).isNotNull()
    action = (
        F.when(source_present & target_present, first_applicable(resolved, resolved.matched, COPY))
        .when(source_present, first_applicable(resolved, resolved.not_matched, DROP))
        .when(target_present, first_applicable(resolved, resolved.not_matched_by_source, COPY))
        .otherwise(F.lit(DROP))
    )
    output = observed_output(
        resolved, joined.withColumn(ACTION_COL, action), resolved.all, True,
        [DROP, *codes_of(resolved.all, delete=True)], out_obs,
        [*target_row_counts(resolved),
         action_count(resolved, codes_of(resolved.not_matched, delete=False), "numTargetRowsInserted")],
        touch_observations(resolved, probe, matched_only) if probe is not None else ())
    # Sides in one partition pair without an exchange only when Spark's size estimate of each is
    # within this setting; a checkpointed source (a sink's batch) has no estimate (ONE_PARTITION_JOINS).
    deletes = (matched_delete_rows(spark, snapshot, files_to_rewrite, source, resolved)
               if deduplicates_deletes(resolved) else None)
    with temporary_conf(spark, ONE_PARTITION_JOINS if one_task else {}):
        written = write_frame(spark, snapshot, output, resolved, layout, deletes, parallelism=slots,
                              map_side=not shuffled)
    counts, touched_ids, shared = split_touched(observed_values(out_obs))
    counts["numSourceRowsInSecondScan"] = observed(src_obs).get("rows", 0)
    if probe is None:
        return RewriteResult(written, counts)
    return RewriteResult(written, counts, frozenset(touched_ids), shared or joined_twice(counts, files_to_rewrite))


def split_touched(values: dict[str, Any]) -> tuple[dict[str, int], set[int], bool]:
    """An observation's values (see touch_observations) as counts, the touched candidates' ids,
    and whether SHARED_KEY was among them (a matched key with two source rows)."""
    touched = {int(i) for i in values.pop(TOUCHED_FILES, None) or []}
    return {k: int(v or 0) for k, v in values.items()}, touched - {SHARED_KEY}, SHARED_KEY in touched


def joined_twice(counts: dict[str, int], candidates: Sequence[DataFile]) -> bool:
    """Whether a one pass joined more target rows than its candidates hold (the log's record
    counts; False where a candidate has none, and the source's rows per key are counted
    instead, TouchProbe.count_keys): each joined target row is counted once under
    TARGET_ROW_COUNTS per source row it joined, so more rows means a target row matched two
    source rows, which findTouchedFiles then judges."""
    records = [f.live_records for f in candidates]
    if any(n is None for n in records):
        return False
    return sum(counts.get(name, 0) for name in TARGET_ROW_COUNTS) != sum(n for n in records if n is not None)


def with_rows_per_key(source: DataFrame, key_columns: Sequence[str]) -> DataFrame:
    """The source with ROWS_PER_KEY_COL: how many of its rows share each row's key."""
    return source.withColumn(ROWS_PER_KEY_COL, F.count(F.lit(1)).over(
        Window.partitionBy(*[F.col(f"`{k}`") for k in key_columns])))


def _probed_sides(spark: SparkSession, snapshot: Snapshot, candidates: Sequence[DataFile], source: DataFrame,
                  resolved: ResolvedMerge, probe: TouchProbe, *, shuffled: bool, one_task: bool
                  ) -> tuple[DataFrame, DataFrame]:
    """The source with its rows per key (when counted) and the candidates' rows with their file
    positions; for a ``shuffled`` join both hash-partitioned on the join keys alike, so that the
    window's partitioning is the join's and nothing is shuffled twice. A join of ``one_task``
    (one output file: small inputs) takes both sides in one partition as they are read, so the
    join, the window and the write run in the scans' stage without an exchange (a 1k-row upsert
    into 100k rows: 3 stages -> 1, 507 -> 450 ms in one process)."""
    source_keys = [F.col(f"`{k}`") for k in probe.source_keys]
    target = scan_with_file_ids(spark, snapshot, candidates, resolved, probe.file_ids, keep_row_index=False)
    if one_task:
        source, target = source.coalesce(1), target.coalesce(1)
    elif shuffled:
        source = source.repartition(probe.partitions, *source_keys)
        target = target.repartition(probe.partitions, *[F.col(f"`{k}`") for k in probe.target_keys])
    if probe.count_keys:
        source = with_rows_per_key(source, probe.source_keys)
    return source, target


_MAX_PARTITION_BYTES = "spark.sql.files.maxPartitionBytes"
_OPEN_COST_BYTES = "spark.sql.files.openCostInBytes"


def touch_observations(resolved: ResolvedMerge, probe: TouchProbe, matched_only: bool) -> list[RowAggregate]:
    """The candidates holding a matched row the clauses act on (findTouchedFiles' rule: with
    only MATCHED clauses a match counts when one of them applies) and, as SHARED_KEY among
    them, a matched pair whose key has two source rows; a few dozen ints whatever the data size.
    One aggregate for both: Spark evaluates an observation outside generated code, so every
    aggregate costs per row (5M rows: these two, as two, added about 1 s of CPU to the write)."""
    def build() -> list[RowAggregate]:
        pair = F.col(SOURCE_PRESENT).isNotNull() & F.col(TARGET_PRESENT).isNotNull()
        touch = pair & any_of(resolved.matched) if matched_only else pair
        identity = F.when(touch, F.col(FILE_ID_COL))
        if probe.count_keys:
            identity = F.when(pair & (F.col(ROWS_PER_KEY_COL) > 1), F.lit(SHARED_KEY)).when(
                touch, F.col(FILE_ID_COL))
        return [RowAggregate(TOUCHED_FILES, identity, F.collect_set)]

    return resolved.derive(("touch-observations", matched_only, probe.count_keys), build)


def write_changes_map_side(
    spark: SparkSession,
    snapshot: Snapshot,
    files_to_rewrite: Sequence[DataFile],
    source: DataFrame,
    unmatched_source: DataFrame,
    resolved: ResolvedMerge,
    *,
    layout: FileLayout,
) -> RewriteResult:
    """writeAllChanges for a source small enough to broadcast: the touched files LEFT OUTER
    JOIN broadcast(source), so the target is never shuffled, plus the inserts from the
    source rows that findTouchedFiles saw match nothing (no second join for them)."""
    insert_obs = Observation()
    target = scan_files(spark, snapshot, files_to_rewrite, schema=resolved.output_schema)
    output, src_obs, target_obs = rewrite_map_side(target, source, resolved)
    inserts = inserted_rows(resolved, unmatched_source, insert_obs)
    if deduplicates_deletes(resolved):
        inserts = inserts.unionByName(matched_delete_rows(spark, snapshot, files_to_rewrite, source, resolved))
    written = write_frame(spark, snapshot, output, resolved, layout, inserts, map_side=True)
    counts = {**observed(target_obs), **observed(insert_obs)}
    counts["numSourceRowsInSecondScan"] = observed(src_obs).get("rows", 0)
    return RewriteResult(written, counts)


def inserted_rows(resolved: ResolvedMerge, unmatched: DataFrame, observation: Observation, *also: Column
                  ) -> DataFrame:
    """What the NOT MATCHED clauses insert for ``unmatched``, source rows that match no target
    row; ``observation`` counts them (numTargetRowsInserted, and ``also`` over the source rows)."""
    with_action = (unmatched.alias(resolved.source_alias)
                   .withColumn(ACTION_COL, first_applicable(resolved, resolved.not_matched, DROP))
                   .observe(observation,
                            action_count(resolved, codes_of(resolved.not_matched, delete=False),
                                         "numTargetRowsInserted"),
                            *also))
    if resolved.change_data:
        return with_change_rows(resolved, with_action.select(
            *outputs(resolved, resolved.not_matched, copy_from_target=False), F.col(ACTION_COL)),
            resolved.not_matched, keep_copies=False)
    return (with_action.filter(F.col(ACTION_COL) != DROP)
            .select(*outputs(resolved, resolved.not_matched, copy_from_target=False)))


def rewrite_map_side(target: DataFrame, source: DataFrame, resolved: ResolvedMerge,
                     observing: Sequence[RowAggregate] = ()) -> tuple[DataFrame, Observation, Observation]:
    """The target rows as they are written back: ``target`` LEFT OUTER JOIN broadcast(source),
    each row's action applied (deleted rows dropped). Returns that frame and the observations
    it fills when written: the source rows read, and the target's row counts plus
    ``observing`` (aggregates over the joined rows)."""
    src_obs, target_obs = Observation(), Observation()
    src = F.broadcast(source.alias(resolved.source_alias).withColumn(SOURCE_PRESENT, F.lit(True))
                      .observe(src_obs, F.count(F.lit(1)).alias("rows")))
    tgt = target.alias(resolved.target_alias).withColumn(TARGET_PRESENT, F.lit(True))
    target_side = resolved.matched + resolved.not_matched_by_source
    action = F.when(F.col(SOURCE_PRESENT).isNotNull(), first_applicable(resolved, resolved.matched, COPY)).otherwise(
        first_applicable(resolved, resolved.not_matched_by_source, COPY))
    rewritten = tgt.join(src, resolved.condition, "left_outer").withColumn(ACTION_COL, action)
    output = observed_output(resolved, rewritten, target_side, True, [DROP, *codes_of(target_side, delete=True)],
                             target_obs, target_row_counts(resolved), observing)
    return output, src_obs, target_obs


def write_inserts_only(
    spark: SparkSession,
    snapshot: Snapshot,
    candidates: Sequence[DataFile],
    source: DataFrame,
    resolved: ResolvedMerge,
    *,
    layout: FileLayout,
    source_count_metric: str,
    key_pairs: Sequence[tuple[str, str]] = (),
    unmatched_source: DataFrame | None = None,
    change_rows: bool = False,
) -> RewriteResult:
    """Insert the source rows that match no target row (left anti join, both sides
    hash-partitioned on the keys: no broadcast job); remove nothing. ``unmatched_source``
    is used as is when findTouchedFiles already found those rows. ``change_rows``: the inserts
    are part of a commit that writes change data, so they also go there (a commit of inserts
    alone writes none: readers take its added files as inserted rows)."""
    src_obs, out_obs = Observation(), Observation()
    if unmatched_source is not None:
        unmatched = unmatched_source.alias(resolved.source_alias).observe(src_obs, F.count(F.lit(1)).alias("rows"))
    elif candidates:
        partitions = join_partitions(spark, sum(f.size for f in candidates))
        tgt = scan_files(spark, snapshot, candidates, schema=resolved.output_schema)
        if key_pairs:
            source = source.repartition(partitions, *[F.col(f"`{s}`") for _, s in key_pairs])
            tgt = tgt.repartition(partitions, *[F.col(f"`{t}`") for t, _ in key_pairs])
        src = (source.alias(resolved.source_alias).withColumn(SOURCE_PRESENT, F.lit(True))
               .observe(src_obs, F.count(F.lit(1)).alias("rows")))
        unmatched = src.join(tgt.alias(resolved.target_alias).hint("shuffle_hash"), resolved.condition, "left_anti")
    else:
        unmatched = (source.alias(resolved.source_alias).withColumn(SOURCE_PRESENT, F.lit(True))
                     .observe(src_obs, F.count(F.lit(1)).alias("rows")))
    with_action = unmatched.withColumn(ACTION_COL, first_applicable(resolved, resolved.not_matched, DROP)).observe(
        out_obs, action_count(resolved, codes_of(resolved.not_matched, delete=False), "numTargetRowsInserted")
    )
    if change_rows:
        output = with_change_rows(resolved, with_action.select(
            *outputs(resolved, resolved.not_matched, copy_from_target=False), F.col(ACTION_COL)),
            resolved.not_matched, keep_copies=False)
    else:
        output = with_action.filter(F.col(ACTION_COL) != DROP).select(
            *outputs(resolved, resolved.not_matched, copy_from_target=False))
    written = write_frame(spark, snapshot, output, resolved, layout, change_data=change_rows)
    counts = observed(out_obs)
    counts[source_count_metric] = observed(src_obs).get("rows", 0)
    return RewriteResult(written, counts)
