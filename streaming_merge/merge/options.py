"""MergeOptions: the MERGE's knobs, with Delta's defaults where Delta has one.

Kept apart from the command so that the modules that choose and run a rewrite path can take
the options without importing the command that calls them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from pyspark.sql import DataFrame

from streaming_merge.errors import InvalidArgumentError
from streaming_merge.merge.key_presence import DEFAULT_KEY_PRESENCE_MAX_FILES
from streaming_merge.merge.materialize import DEFAULT_STORAGE_LEVELS, MaterializePolicy
from streaming_merge.merge.skipping import SourceStats
from streaming_merge.spark.interpreted import DEFAULT_INTERPRETED_MAX_ROWS
from streaming_merge.table.snapshot import Snapshot

PhaseHook = Callable[[str, DataFrame], None]


@dataclass(frozen=True)
class MergeOptions:
    """Knobs with Delta's defaults (``spark.databricks.delta.merge.*`` in Delta)."""

    materialize_source: MaterializePolicy = "auto"
    storage_levels: tuple[str, ...] = DEFAULT_STORAGE_LEVELS
    max_attempts: int = 4
    optimize_matched_only: bool = True
    repartition_before_write: bool = True
    source_key_range_skipping: bool = True
    # A source up to this many bytes (estimated) is broadcast and the touched files are
    # rewritten map-side; None: Spark's spark.sql.autoBroadcastJoinThreshold.
    broadcast_source_bytes: int | None = None
    # A target scan of at least this many bytes is streamed past the broadcast source instead
    # of shuffling every target row (findTouchedFiles, and the one pass, which then rewrites
    # map-side): one more Spark job (the broadcast) and the inserts' own file, but the shuffle
    # grows with the target. 5M rows x 100k: findTouchedFiles 2.3 s -> 0.9 s. 1M rows (22 MB)
    # x 10k, the one pass: 1,399 -> 1,108 ms (local source; Parquet 1,389 -> 1,125), x 100k
    # even (1,366 / 1,339); one 1 MB candidate x 10k: 475 -> 523 ms (merge_profile A/B,
    # 2026-11-27). Smaller scans keep the shuffle.
    broadcast_scan_min_bytes: int = 16 * 1024 * 1024
    # New files are cut to about this size (Delta's and delta-rs' default is 128 MB / 100 MB).
    target_file_size: int = 128 * 1024 * 1024
    # One file is written by one task, so a single output file leaves the other cores idle:
    # the output is spread over up to one file per core while each file still gets at least
    # this many bytes (a 22 MB rewrite on 2 cores: 2 files, half the write time).
    min_parallel_file_size: int = 8 * 1024 * 1024
    # The source's row count and key ranges when the caller already observed them (the
    # streaming sink does, while materializing the batch): saves the MERGE a pass.
    source_stats: SourceStats | None = field(default=None, compare=False)
    # The target as the caller just read it (the sink does, for its txn check): saves the
    # MERGE its log load. Used on the first attempt only; a rerun reads the log again.
    snapshot: Snapshot | None = field(default=None, compare=False)
    # Skip findTouchedFiles and rewrite every candidate file when the candidates hold at most
    # this many bytes, no target row can match two source rows (so there is no multiple match
    # to detect) and no clause acts on unmatched target rows. For callers that know the source
    # touches every candidate anyway (the streaming sink, after a batch that did): the scan's
    # Spark job then finds nothing the rewrite does not. Bounded because the rewrite is then a
    # shuffled full outer join, where a scan would have let a broadcast source rewrite map-side.
    # The metrics count what was done: every candidate removed, an untouched one's rows copied.
    # 0 (Delta's algorithm) unless asked for.
    rewrite_all_candidates_bytes: int = 0
    # One pass instead of two: when the source holds at least single_pass_min_rows_per_file rows
    # per candidate file (so every candidate is most likely touched), every candidate is rewritten
    # in one Spark job that also observes which candidates were touched and whether a target row
    # could have matched two source rows (streaming_merge.merge.rewrite.TouchProbe). When all were
    # touched and none could, that is the MERGE, with Delta's files and metrics; otherwise its
    # files are deleted and the touched candidates are rewritten (or, on a possible multiple
    # match, Delta's findTouchedFiles decides), so a wrong guess costs one extra write.
    single_pass: bool = True
    single_pass_min_rows_per_file: int = 8
    # A deletion-vector MERGE whose MATCHED clauses write only source values (an upsert, the
    # sink's CDC preset) writes its rows from the source after a job that only finds the matched
    # pairs: no joined row crosses a shuffle (streaming_merge.merge.dv_source_side). False: the
    # general plan.
    dv_source_side_write: bool = True
    # findTouchedFiles and the rewrite run without generated code (streaming_merge.spark.interpreted)
    # when the source's rows plus the candidate files' rows (the log's numRecords) are known and
    # at most this many: a new query's first MERGE then compiles no Java. 0: always generated code.
    interpreted_max_rows: int = DEFAULT_INTERPRETED_MAX_ROWS
    # Data skipping by key presence (streaming_merge.merge.key_presence): while the source is
    # materialized or counted, each target file's own [min, max] of the integer join keys is
    # tested against every source row, for tables of up to this many files with such stats
    # (each costs one comparison per source row). 0: the source's key range alone.
    key_presence_max_files: int = DEFAULT_KEY_PRESENCE_MAX_FILES
    # Called with a phase name and the (materialized) source between phases; for
    # diagnostics and fault-injection tests.
    phase_hook: PhaseHook | None = field(default=None, compare=False)
    # Called after the new files are written, right before the commit; raising aborts the
    # MERGE and deletes its files. The streaming sink waits here for its tombstone append,
    # which runs beside the MERGE's Spark work but must commit before the MERGE does.
    before_commit: Callable[[], None] | None = field(default=None, compare=False)
    # Called on every commit attempt with the latest snapshot the commit checked, right before
    # the commit is written (CommitRequest.concurrent_check); raising
    # ConcurrentModificationError aborts the MERGE and deletes its files. The streaming sink
    # checks here that no other flow recorded a tombstone of its keys meanwhile.
    commit_check: Callable[[Snapshot], None] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise InvalidArgumentError(f"max_attempts must be at least 1, got {self.max_attempts}")
        if not self.storage_levels:
            raise InvalidArgumentError("storage_levels needs at least one storage level name")
        if self.target_file_size < 1:
            raise InvalidArgumentError(
                f"target_file_size must be a positive number of bytes, got {self.target_file_size}")
        if self.rewrite_all_candidates_bytes < 0:
            raise InvalidArgumentError("rewrite_all_candidates_bytes must be 0 or more bytes, "
                             f"got {self.rewrite_all_candidates_bytes}")
        if self.broadcast_scan_min_bytes < 0:
            raise InvalidArgumentError(
                f"broadcast_scan_min_bytes must be 0 or more bytes, got {self.broadcast_scan_min_bytes}")
        if self.interpreted_max_rows < 0:
            raise InvalidArgumentError(f"interpreted_max_rows must be 0 or more rows, got {self.interpreted_max_rows}")
        if self.key_presence_max_files < 0:
            raise InvalidArgumentError(
                f"key_presence_max_files must be 0 or more files, got {self.key_presence_max_files}")
        if self.single_pass_min_rows_per_file < 0:
            raise InvalidArgumentError("single_pass_min_rows_per_file must be 0 or more rows, "
                             f"got {self.single_pass_min_rows_per_file}")
        if self.min_parallel_file_size < 1:
            raise InvalidArgumentError("min_parallel_file_size must be a positive number of bytes, "
                             f"got {self.min_parallel_file_size}")
