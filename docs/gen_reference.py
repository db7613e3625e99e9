"""The reference tables of the documentation, generated from the code so they cannot drift.

* ``MergeOptions``: every field of the dataclass (``dataclasses.fields``), its default, and its
  meaning; the meaning is the text below when there is one, else the comment above the field in
  the class's source, so a new field shows up with its comment.
* ``MergeSink``: every parameter of ``MergeSink.__init__`` (``inspect.signature``) with its type
  annotation and default.
* The jobs' command lines: the ``argparse`` parser each job builds, captured as it calls
  ``parse_args`` (nothing runs), with every option's flags, default, choices and help text.

What the code cannot say (when to change a setting) is written here, keyed by name. A name
without text here is still listed, with its code's own description (the comment or the help
text) or "Not described yet"; a text whose name the code no longer has is reported by
``stale_texts()`` (printed by the docs build, which does not fail on it: the code is the truth).

The benchmark pages' tables come from ``docs/img/figures.json``, which ``bench/plots.py`` writes
with the charts (``bench:*`` names).

``docs/hooks.py`` replaces ``<!-- reference:NAME -->`` markers in the pages with ``render(NAME)``;
``python docs/gen_reference.py [NAME]`` prints the tables.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import importlib
import inspect
import io
import re
import sys
import textwrap
import tokenize
from collections.abc import Callable, Iterator
from typing import Any

INTERNAL = "Internal: set by `MergeSink` for its own MERGEs; leave unset."

# name: (meaning, or None for the comment in the code; when to change it)
MERGE_OPTIONS: dict[str, tuple[str | None, str]] = {
    "materialize_source": (
        "Delta's `merge.materializeSource`: whether the source is copied once (`localCheckpoint`) "
        "before the MERGE reads it twice. `auto` copies every source except in-memory local data and "
        "this library's own scans of a Delta table (pinned to immutable files); `all` always; `none` "
        "never. A Parquet or JSON folder, an RDD or a micro-batch can change between the two reads.",
        "Keep `auto`. `none` only for a source you know is deterministic and unchanged between the "
        "two reads (a wrong guess gives wrong results, as in Delta); `all` to also copy a local "
        "source."),
    "storage_levels": (
        "Storage level of the materialized source on the first try, the first retry and later "
        "retries (Spark's `StorageLevel` names).",
        "`MEMORY_AND_DISK` first where executors have memory to spare; a replicated level "
        "(`DISK_ONLY_2`) from the first try on clusters that lose executors often (spot nodes)."),
    "max_attempts": (
        "Runs of the MERGE when the materialized source lost blocks (a lost executor); then "
        "`MaterializedSourceLostError` names the attempts.",
        "Raise it on clusters that lose executors often; 1 fails at the first loss."),
    "optimize_matched_only": (
        "Delta's `merge.optimizeMatchedOnlyMerge`: a MERGE with only WHEN MATCHED clauses uses a right "
        "outer join instead of a full outer one, and skips target files with its clauses' conditions.",
        "Leave on; off only to compare plans (the result is the same)."),
    "repartition_before_write": (
        "Delta's `merge.repartitionBeforeWrite`: on a partitioned table the rows are shuffled by the "
        "partition columns before writing, so each partition value gets few, large files.",
        "Off when a MERGE writes into many partitions and small files are acceptable (no shuffle; "
        "each task writes to every partition it holds)."),
    "source_key_range_skipping": (
        "Data skipping by the source's join-key range against each target file's min/max stats "
        "(beyond Delta's static skipping): a CDC batch touching a narrow key range reads few files.",
        "Leave on; it never changes a result. Off only to compare with Delta's plan."),
    "broadcast_source_bytes": (
        "A source up to this estimated size is broadcast and the touched files are rewritten map-side "
        "(no shuffle of the target); `None`: Spark's `spark.sql.autoBroadcastJoinThreshold` (10 MB by "
        "default); a negative value never broadcasts.",
        "Raise it for batches larger than Spark's threshold on executors with memory to hold them; "
        "`-1` to force the shuffled plan."),
    "broadcast_scan_min_bytes": (
        "When the data-skipped target files add up to at least this and the source fits a broadcast, "
        "findTouchedFiles (or the one pass) streams the target past the broadcast source instead of "
        "shuffling it: one Spark job more, but the shuffle grows with the target (5M target rows x 100k "
        "source rows: findTouchedFiles 0.9 s instead of 2.3 s; a 10k-row upsert into 1M rows, 22 MB, "
        "1.11 s instead of 1.40 s).",
        "Lower it if profiling (`bench.merge_profile --option broadcast_scan_min_bytes=...`) shows the "
        "shuffle dominating smaller targets; raise it to keep small targets on the shuffled plan."),
    "target_file_size": (
        "New files are cut to about this size (Delta's default 128 MB): a MERGE adds one file per "
        "touched partition value, not one per task.",
        "Lower it for tables read by engines that like smaller files or for very selective reads; "
        "compaction (`optimize()`) has its own `target_file_size`."),
    "min_parallel_file_size": (
        "An unpartitioned output is spread over up to one file per core while each file still gets at "
        "least this much: one file is written by one task, so a 22 MB rewrite on 2 cores writes 2 files "
        "in about half the time of one.",
        "Raise it to get fewer, larger files from mid-sized MERGEs; lower it to use more cores on "
        "small rewrites."),
    "source_stats": (None, INTERNAL),
    "snapshot": (None, INTERNAL),
    "rewrite_all_candidates_bytes": (
        "When the data-skipped files add up to at most this, no target row can match two source rows "
        "and no clause acts on unmatched target rows, findTouchedFiles is skipped and every candidate "
        "file is rewritten (its untouched rows counted as copied). 0 is Delta's algorithm. `MergeSink` "
        "sets 64 MB for the batch after one that touched every candidate anyway, scanning again every "
        "8th such batch.",
        "For your own repeated MERGEs whose sources touch every candidate file (uniform keys over a "
        "small table): a few MB saves findTouchedFiles' Spark job."),
    "single_pass": (
        "The one pass: when the source has at least `single_pass_min_rows_per_file` rows per "
        "data-skipped file, every candidate is rewritten in one Spark job that also observes which "
        "candidates were touched and whether a target row could have matched two source rows; a wrong "
        "guess costs one extra write, never a different result (see How it works).",
        "Leave on; off (`bench.merge_profile --option single_pass=0`) to compare with Delta's two passes."),
    "single_pass_min_rows_per_file": (
        "Source rows per data-skipped candidate file from which the one pass is tried.",
        "Raise it when your sources are sparse over the files they skip to (the one pass then often "
        "rewrites untouched files and writes twice); 0 tries it always."),
    "interpreted_max_rows": (
        "When the source's rows plus the data-skipped files' rows (the log's `numRecords`) are known "
        "and at most this many, findTouchedFiles and the rewrite run without generated code: a new "
        "query's first MERGEs then compile no Java. 0 turns this off.",
        "Lower it (or 0) for long-running streams of small batches on many cores, where compiled code "
        "pays off after the first batches; raise it when new queries start often (short jobs)."),
    "key_presence_max_files": (
        "Data skipping by key presence per file, for tables of up to this many files: the job that "
        "materializes the source tests each target file's own [min, max] of the integer join keys "
        "against every source row, so a batch updating a few clustered keys reads only the files "
        "holding them (1M rows in 20 files, 10k-row clustered upsert: 1 file read instead of 14). 0 "
        "turns it off.",
        "Raise it for tables of more files with clustered keys (each file costs one comparison per "
        "source row); 0 when your keys are not integers or never clustered."),
    "phase_hook": (
        "Called with a phase name and the (materialized) source between the MERGE's phases.",
        "For diagnostics and fault-injection tests only."),
    "before_commit": (
        "Called after the new files are written, right before the commit; raising aborts the MERGE "
        "and deletes its files.",
        "For callers that must finish something of their own before the MERGE commits (the sink's "
        "tombstone append)."),
    "commit_check": (None, INTERNAL),
}

MERGE_SINK: dict[str, tuple[str, str]] = {
    "target": (
        "Delta table path or URI (see Storage and URIs).",
        "—"),
    "keys": (
        "Key column(s) of the upsert (names or Columns; one name or a list).",
        "Required unless `condition` is given."),
    "condition": (
        "A custom ON condition instead of `keys` (`t.` the target, `s.` the batch).",
        "When rows match on something other than equal keys; the CDC preset options need `keys`."),
    "sequence_by": (
        "Column(s) ordering the events of one key: the newest wins, older events never overwrite or "
        "delete newer rows. A name, a Column naming one, `struct()` of plain columns, or a list "
        "(compared in order).",
        "Always for CDC streams whose events can arrive out of order or be replayed."),
    "apply_as_deletes": (
        "SQL predicate (or Column) marking delete events (`delete_when` is its deprecated alias).",
        "When the stream carries deletes."),
    "apply_as_truncates": (
        "SQL predicate (or Column) marking truncate events, applied as of their sequence value "
        "(see Partial updates and truncates).",
        "When the source emits truncates (Debezium's `op = 't'`); needs `keys` and `sequence_by`."),
    "stored_as_scd_type": (
        "`1` (default) keeps the latest row per key; `2` (or `\"2\"`) keeps every version with "
        "`__START_AT` / `__END_AT` (`scd_type` is the deprecated alias).",
        "2 when you need history (see SCD type 2)."),
    "dedupe": (
        "`\"last\"`: the newest event per key in a batch (by `sequence_by`, then batch order); "
        "`\"error\"`: fail the batch on duplicate keys.",
        "`error` when duplicates in a batch mean an upstream bug."),
    "clauses": (
        "`callable(DeltaMergeBuilder) -> DeltaMergeBuilder` for a custom MERGE instead of the upsert "
        "preset (the source has the column `__sm_is_delete__`).",
        "When the upsert preset is not the MERGE you need."),
    "app_id": (
        "Idempotency id (the Delta txn app id); default the streaming query's id, which Spark keeps in "
        "the checkpoint.",
        "Set it when the checkpoint may be replaced but the table's exactly-once must hold, or when "
        "several flows write one table (each its own id)."),
    "schema_evolution": (
        "New batch columns are appended to the table.",
        "When upstream adds columns; not combinable with partial updates or SCD 2 yet."),
    "storage_levels": (
        "Storage level of the materialized batch per attempt (first try, first retry, later retries).",
        "As `MergeOptions.storage_levels`."),
    "max_attempts": (
        "Bound on reruns of a batch whose materialized blocks were lost.",
        "Raise it on clusters that lose executors often."),
    "max_conflict_retries": (
        "Reruns of a batch whose commit conflicted with another writer's "
        "(`ConcurrentModificationError`), each from a fresh snapshot; logged and counted in the "
        "progress (`conflictRetries`).",
        "Raise it when many flows or maintenance jobs write one table; 0 fails at the first conflict."),
    "conflict_backoff": (
        "`(first, cap)` seconds: the n-th conflict rerun waits `min(cap, first * 2**(n-1))` times a "
        "random factor in [0.5, 1).",
        "Larger when concurrent writers commit slowly (object stores)."),
    "dead_letter": (
        "Delta table for rows that cannot be applied (NULL keys) with the reason and the row as JSON; "
        "without it such a batch fails with a clear error and nothing is written.",
        "When a bad row must not stop the stream."),
    "create_if_missing": (
        "Create the target from the first batch's schema.",
        "Off when the table must exist (created by a migration) and a missing one is an error."),
    "partition_by": (
        "Partition columns of a table the sink creates.",
        "For large tables queried by a low-cardinality column (a day)."),
    "table_properties": (
        "Table properties of a table the sink creates, e.g. `{\"delta.enableDeletionVectors\": "
        "\"true\"}`.",
        "To create the table with deletion vectors or the change data feed."),
    "tombstones": (
        "With `sequence_by`, deletes leave (key, sequence, deleted_at) in `<target>_tombstones` (or the "
        "path given) so a late insert or update cannot resurrect a deleted row; the sink bin-packs "
        "that table once 10 small files piled up.",
        "`False` when events never arrive out of order across batches (saves the append beside each "
        "MERGE and the lookups)."),
    "tombstone_retention": (
        "Tombstones older than this are purged (an event later than this after its delete is applied "
        "as if the delete had not happened).",
        "Longer than the worst lateness of your stream."),
    "tombstone_purge_every": (
        "Purge expired tombstones every N batches.",
        "Rarely."),
    "progress_capacity": (
        "How many batches `sink.recentProgress` keeps.",
        "Larger to keep more history in memory."),
    "merge_options": (
        "`MergeOptions` for the MERGE itself (see the MergeOptions table).",
        "To tune the MERGE."),
    "phase_hook": (
        "Called with a phase name between the batch's phases.",
        "For diagnostics and fault-injection tests only."),
    "storage_options": (
        "delta-rs options for the tables' logs (see Storage and URIs).",
        "For object stores whose settings cannot be derived from Spark's Hadoop configuration."),
    "auto_compact": (
        "`AutoCompact(...)`: compact small files after a batch's MERGE (off by default; see Compaction "
        "and vacuum).",
        "For long-running streams into tables nobody compacts otherwise."),
    "column_list": (
        "Which batch columns reach the table (AUTO CDC's name; names or Columns). The keys are always "
        "kept; a `sequence_by` column left out is kept in `__spark_autocdc_metadata` (SCD 1) or "
        "`__START_AT` / `__END_AT` (SCD 2). An empty list is no selection.",
        "To keep CDC bookkeeping columns (`op`, `lsn`) out of the table."),
    "except_column_list": (
        "All batch columns but these reach the table (the other of `column_list`); keys cannot be "
        "named.",
        "As `column_list`."),
    "ignore_null_updates": (
        "A NULL in any data column of an event means \"unchanged\" (partial updates).",
        "When the source sends only changed columns."),
    "ignore_null_updates_column_list": (
        "A NULL means \"unchanged\" only in these columns (one of the three ignore-null options).",
        "When only some columns are sent partially."),
    "ignore_null_updates_except_column_list": (
        "A NULL means \"unchanged\" in every data column but these.",
        "When a few columns must accept real NULLs."),
    "unavailable_value": (
        "In a string column, this placeholder means \"unchanged\" and never lands in the table (e.g. "
        "Debezium's `__debezium_unavailable_value` for unchanged TOAST columns).",
        "For Debezium sources with TOAST or LOB columns."),
    "track_history_column_list": (
        "SCD 2: only a change of these columns opens a new version.",
        "When most columns are noise for history."),
    "track_history_except_column_list": (
        "SCD 2: a change of any column but these opens a new version (the others update the current "
        "version in place).",
        "To leave bookkeeping columns (`op`, `ts_ms`) out of history."),
    "table": (
        "`TableOptions(...)`: the table options (below) as one object instead of their keywords.",
        "To build a group once and share it; a group and one of its keywords together are refused."),
    "cdc": (
        "`CdcOptions(...)`: the CDC options (below) as one object instead of their keywords.",
        "As `table`, e.g. one `CdcOptions` for every flow into a table."),
    "retries": (
        "`RetryOptions(...)`: the rerun options (below) as one object instead of their keywords.",
        "As `table`."),
    "progress": (
        "`ProgressOptions(...)`: the progress options (below) as one object instead of their keywords.",
        "As `table`."),
    "performance": (
        "`PerformanceOptions(...)`: the performance options (below) as one object instead of their "
        "keywords.",
        "As `table`."),
    "delete_when": ("Deprecated alias of `apply_as_deletes`.", "Use `apply_as_deletes`."),
    "scd_type": ("Deprecated alias of `stored_as_scd_type`.", "Use `stored_as_scd_type`."),
}

# The jobs' options: flag -> (meaning when the parser has no help text, or None; when to change it)
CLI: dict[str, dict[str, tuple[str | None, str]]] = {
    "jobs.kafka_cdc_ingest": {
        "--bootstrap-servers": (None, "Always."),
        "--topics": (None, "Single-table mode: the topics of one table (with `--target`, `--keys`)."),
        "--target": (None, "Single-table mode."),
        "--subscribe-pattern": (None, "Whole-database mode (with `--target-root`)."),
        "--target-root": (None, "Whole-database mode."),
        "--table-path-template": (None, "When tables must not land at `<root>/<schema>/<table>`."),
        "--topic-regex": (None, "When topics are not named `<prefix>.<schema>.<table>`."),
        "--keys": (None, "Required with `--topics`; with a pattern, for tables without a primary key."),
        "--sequence": (None, "When a column of the row (a version) must order events before Debezium's "
                             "position."),
        "--checkpoint": (None, "Always; one folder per query, never shared."),
        "--available-now": (None, "Scheduled runs (a cron job) instead of a long-running stream."),
        "--processing-time": (None, "To batch more events per MERGE at a steady rate."),
        "--dead-letter": (None, "Always in production: without it a malformed record fails the batch."),
        "--on-malformed": ("`dead_letter`: undecodable records go to the dead-letter table; `fail`: the "
                           "batch fails before anything is written.",
                           "`fail` when any malformed record must stop the pipeline."),
        "--row-schema": (None, "For plain (schema-less) envelopes whose first batch cannot show every "
                               "column."),
        "--max-offsets-per-trigger": ("Kafka records per micro-batch at most (Spark's "
                                      "`maxOffsetsPerTrigger`; default: everything available).",
                                      "To bound batch size and latency, and the first batch of a backlog."),
        "--starting-offsets": ("Where a new query starts: `earliest`, `latest` or JSON offsets per "
                               "partition (Spark's `startingOffsets`; a restart uses the checkpoint).",
                               "`latest` to skip history; JSON to start at known offsets."),
        "--source-format": (None, "`kafka` to read with Spark's own connector (added to a local session; "
                                  "`--packages` under spark-submit)."),
        "--kafka-option": (None, "SASL/SSL and other client settings, by Spark's connector's names "
                                 "([Kafka guide](../guides/kafka.md#security-and-client-options))."),
        "--master": (None, "Locally only; under spark-submit the cluster's master is used."),
        "--ignore-null-updates": (None, "When the source sends only changed columns."),
        "--unavailable-value": (None, "`''` when your connector sends the placeholder as real data."),
        "--apply-truncates": (None, "When truncates upstream must empty the table."),
        "--scd-type": (None, "2 to keep history."),
        "--track-history-except": (None, "With `--scd-type 2`, to keep more columns out of history."),
        "--change-data-feed": (None, "When downstream jobs read the table's changes (`jobs.cdf_chain`)."),
        "--deletion-vectors": (None, "Large tables with small batches (merge-on-read)."),
        "--spark-conf": (None, "Object-store credentials and endpoints, locally."),
        "--storage-option": (None, "Object-store settings that Spark's configuration cannot give."),
    },
    "jobs.cdf_chain": {
        "--source": (None, "Always."),
        "--target": (None, "Always."),
        "--keys": (None, "Always."),
        "--checkpoint": (None, "Always; one folder per chain."),
        "--available-now": (None, "Scheduled runs."),
        "--processing-time": (None, "To batch more changes per MERGE."),
        "--max-files-per-trigger": (None, "To bound batch size (memory, latency)."),
        "--max-bytes-per-trigger": (None, "To bound batch size by bytes."),
        "--starting-version": (None, "When the target already holds the source's state up to a version."),
        "--sequence-column": (None, "When the target has a column of that name already."),
        "--change-data-feed": (None, "When another chain reads the target (gold → platinum)."),
        "--deletion-vectors": (None, "Large targets with small batches."),
        "--storage-option": (None, "Object stores."),
        "--master": (None, "Locally only."),
    },
    "jobs.kafka_cdc_demo": {
        "--events": (None, "More for a longer run."),
        "--keys": (None, "Fewer for more updates per key."),
        "--partitions": (None, "To see ordering across partitions."),
        "--max-offsets-per-trigger": (None, "Smaller for more, smaller batches."),
        "--workdir": (None, "To keep the tables for a look afterwards."),
        "--deletion-vectors": (None, "To see merge-on-read."),
    },
}


# ------------------------------------------------------------------ formatting


def _cell(text: str) -> str:
    """One table cell: on one line, its pipes escaped outside code spans (Python-Markdown's tables
    leave code spans whole, and would show the backslash there)."""
    parts = " ".join(text.split()).split("`")
    return "`".join(part if i % 2 else part.replace("|", "\\|") for i, part in enumerate(parts))


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


_QUOTED = re.compile(r"(?<![\w'])'([^'\s][^']*)'(?![\w'])")
_FLAG = re.compile(r"(?<![\w`-])(--[a-z][a-z0-9-]*)")
_MARKUP = str.maketrans({c: "\\" + c for c in "\\`*_[]"} | {"<": "&lt;", ">": "&gt;", "&": "&amp;"})


def _plain(text: str) -> str:
    """Markdown for a plain-text description (a help text, a code comment): quoted values and
    --flags as code, everything else shown as written (no emphasis from underscores, no tags)."""
    text = _FLAG.sub(r"'\1'", " ".join(text.split()))
    parts = _QUOTED.split(text)  # odd items: what was quoted
    return "".join(f"`{part}`" if i % 2 else part.translate(_MARKUP) for i, part in enumerate(parts))


def _size(value: int) -> str:
    for unit, factor in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if value >= factor and value % factor == 0:
            return f"`{value}` ({value // factor} {unit})"
    return f"`{value}`"


def _default(name: str, value: Any) -> str:
    if value is None:
        return "`None`"
    if isinstance(value, bool):
        return f"`{value}`"
    if isinstance(value, int) and re.search(r"(bytes|size)$", name):
        return _size(value)
    if isinstance(value, int):
        return f"`{value:,}`".replace(",", "_") if value >= 10_000 else f"`{value}`"
    if isinstance(value, dt.timedelta):
        days, seconds = value.days, value.seconds
        return f"`timedelta(days={days})`" if not seconds else f"`{value!r}`"
    if isinstance(value, tuple):
        return "`(" + ", ".join(repr(v) for v in value) + ")`"
    return f"`{value!r}`"


# ------------------------------------------------------------------ MergeOptions


def _field_comments(cls: type) -> dict[str, str]:
    """The comment lines right above each field of a dataclass, joined."""
    source = textwrap.dedent(inspect.getsource(cls))
    comments: dict[str, str] = {}
    pending: list[str] = []
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT and token.start[1] == 4:
            pending.append(token.string.lstrip("#").strip())
        elif token.type == tokenize.NAME and token.start[1] == 4:
            match = re.match(r"\s*(\w+)\s*:", token.line)
            if match and match.group(1) == token.string:
                comments[token.string] = " ".join(pending)
            pending = []
        elif (token.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT)
              and token.start[1] <= 4):
            pending = []
    return comments


def merge_options() -> str:
    from streaming_merge import MergeOptions

    comments = _field_comments(MergeOptions)
    rows = []
    for f in dataclasses.fields(MergeOptions):
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = None
        meaning, when = MERGE_OPTIONS.get(f.name, (None, "—"))
        meaning = meaning or _plain(comments.get(f.name, "")) or "—"
        rows.append([f"`{f.name}`<br><small>`{f.type}`</small>", _default(f.name, default), meaning,
                     when])
    return _table(["option", "default", "meaning", "when to change it"], rows)


# ------------------------------------------------------------------ MergeSink


def merge_sink() -> str:
    from streaming_merge import MergeSink

    rows = []
    for p in list(inspect.signature(MergeSink.__init__).parameters.values())[1:]:
        default = "required" if p.default is inspect.Parameter.empty else _default(p.name, p.default)
        meaning, when = MERGE_SINK.get(p.name, ("*Not described yet.*", "—"))
        annotation = "" if p.annotation is inspect.Parameter.empty else str(p.annotation)
        rows.append([f"`{p.name}`<br><small>`{annotation}`</small>", default, meaning, when])
    return _table(["parameter", "default", "meaning", "when to change it"], rows)


def merge_sink_groups() -> str:
    """Which keywords each option group of ``MergeSink`` holds (streaming_merge.streaming.sink_options)."""
    import dataclasses as dc

    from streaming_merge.streaming.sink_options import GROUPS

    rows = [[f"`{parameter}=`", f"`{cls.__name__}`", ", ".join(f"`{f.name}`" for f in dc.fields(cls)),
             " ".join((inspect.getdoc(cls) or "").replace("``", "`").split())]
            for parameter, cls in GROUPS.items()]
    return _table(["parameter", "class", "its keywords (fields)", "what it groups"], rows)


# ------------------------------------------------------------------ the jobs' command lines


class _Captured(Exception):
    """Not an error: carries the parser out of the job's ``parse_args``."""

    def __init__(self, parser: argparse.ArgumentParser) -> None:
        super().__init__("parser captured")
        self.parser = parser


@contextlib.contextmanager
def _capturing_parsers() -> Iterator[None]:
    original = argparse.ArgumentParser.parse_args

    def capture(self: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> Any:
        raise _Captured(self)

    argparse.ArgumentParser.parse_args = capture  # type: ignore[method-assign]
    try:
        yield
    finally:
        argparse.ArgumentParser.parse_args = original  # type: ignore[method-assign]


def parser_of(module_name: str) -> argparse.ArgumentParser:
    """The parser a job builds: its ``parse_args(argv)`` (or ``main(argv)``) is called and stopped
    when it asks argparse to parse, before anything else runs."""
    module = importlib.import_module(module_name)
    entry: Callable[[list[str]], Any] = getattr(module, "parse_args", None) or module.main
    with _capturing_parsers():
        try:
            entry([])
        except _Captured as captured:
            return captured.parser
    raise RuntimeError(f"{module_name} did not build an argparse parser")


def _exclusive(parser: argparse.ArgumentParser) -> dict[argparse.Action, list[str]]:
    others: dict[argparse.Action, list[str]] = {}
    for group in parser._mutually_exclusive_groups:
        flags = [a.option_strings[0] for a in group._group_actions]
        for action in group._group_actions:
            others[action] = [f for f in flags if f != action.option_strings[0]]
    return others


def cli(module_name: str) -> str:
    parser = parser_of(module_name)
    texts = CLI.get(module_name, {})
    exclusive = _exclusive(parser)
    rows = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        flag = action.option_strings[0]
        metavar = "" if action.nargs == 0 else f" {action.metavar or action.dest.upper()}"
        if isinstance(action, argparse._StoreTrueAction):
            default = "off"
        elif isinstance(action, argparse._AppendAction):
            default = "none (repeatable)"
        elif action.required:
            default = "required"
        elif action.default is None:
            default = "—"
        elif action.default == "":
            default = "`''`"
        else:
            default = f"`{action.default}`"
        fallback, when = texts.get(flag, (None, "—"))
        help_text = action.help % {**vars(action), "prog": parser.prog} if action.help else None
        meaning = _plain(help_text) if help_text else (fallback or "—")
        if (action.choices or action in exclusive) and not meaning.rstrip().endswith("."):
            meaning = meaning.rstrip() + "."
        if action.choices:
            meaning += " Choices: " + ", ".join(f"`{c}`" for c in action.choices) + "."
        if action in exclusive:
            meaning += " Not with " + ", ".join(f"`{f}`" for f in exclusive[action]) + "."
        rows.append([f"`{flag}{metavar}`", default, meaning, when])
    return _table(["option", "default", "meaning", "when to change it"], rows)


# ------------------------------------------------------------------ benchmark figures


def _figures() -> dict[str, Any]:
    import json
    from pathlib import Path

    path = Path(__file__).parent / "img" / "figures.json"
    return json.loads(path.read_text()) if path.exists() else {}


def _source_line(source: dict[str, str]) -> str:
    return f"\n*{source.get('when', '')}, `{source.get('command', '')}`*\n"


def bench_merge(key: str) -> str:
    """A merge_bench chart's numbers (docs/img/figures.json, written by bench/plots.py)."""
    figure = _figures().get(key)
    if not figure:
        return "*No figures: run `python -m bench.plots` after the bench.*\n"
    engines = figure["engines"]
    rows = [[row["scenario"], *[
        (f"{row['seconds'][e]:.3f} s" + (f" ({row['x_delta_rs'][e]:.2f}x)" if e in row["x_delta_rs"] else ""))
        if e in row["seconds"] else "—" for e in engines]] for row in figure["rows"]]
    return _table(["target x batch", *[f"`{e}`" for e in engines]], rows) + _source_line(figure["source"])


def bench_dv_scan() -> str:
    figure = _figures().get("dv_scan")
    if not figure:
        return "*No figures: run `python -m bench.plots` after the bench.*\n"
    rows = [[f"`{r['engine']}`", f"{r['dv_ms']:g} ms", f"{r['compacted_ms']:g} ms", f"{r['ratio']:.2f}x",
             f"{r['cold_dv_ms']:g} ms" if r.get("cold_dv_ms") else "—"] for r in figure["rows"]]
    return (_table(["engine", "with DVs", "compacted", "DV / compacted", "first (cold) DV scan"], rows)
            + _source_line(figure["source"]))


def bench_cdf_read() -> str:
    figure = _figures().get("cdf_read")
    if not figure:
        return "*No figures: run `python -m bench.plots` after the bench.*\n"
    rows = []
    for r in figure["rows"]:
        cells = [f"`{r['writer']}`"]
        for reader in ("ours", "stream", "delta-rs"):
            found = r.get(reader)
            cells.append(f"{found['ms']:,.0f} ms, {found['rows_per_s'] / 1e6:.2f}M rows/s" if found else "—")
        rows.append(cells)
    header = ["table written by", "`changes()`", "`delta_changes` stream", "delta-rs `load_cdf`"]
    sources = "".join(_source_line(r["source"]) for r in figure["rows"])
    return _table(header, rows) + sources


# ------------------------------------------------------------------ the sink's Spark metrics


def spark_metrics() -> str:
    """Every metric of a stream's source (streaming_merge/streaming/spark_metrics.py), with the
    names Prometheus and JMX show."""
    from streaming_merge.streaming.spark_metrics import METRICS

    rows = []
    for metric in METRICS:
        exposed = re.sub(r"[^a-zA-Z0-9]", "_", metric.name)
        prometheus = f"`{exposed}_Count`" if metric.kind == "counter" else f"`{exposed}_Value`"
        rows.append([prometheus, f"`{metric.name}`", metric.kind, _plain(metric.meaning)])
    return _table(["Prometheus name ends with", "JMX name ends with", "type", "meaning"], rows)


# ------------------------------------------------------------------ names


TABLES: dict[str, Callable[[], str]] = {
    "merge-options": merge_options,
    "merge-sink": merge_sink,
    "merge-sink-groups": merge_sink_groups,
    "spark-metrics": spark_metrics,
    "cli:jobs.kafka_cdc_ingest": lambda: cli("jobs.kafka_cdc_ingest"),
    "cli:jobs.cdf_chain": lambda: cli("jobs.cdf_chain"),
    "cli:jobs.kafka_cdc_demo": lambda: cli("jobs.kafka_cdc_demo"),
    "bench:merge": lambda: bench_merge("merge"),
    "bench:merge_cdf": lambda: bench_merge("merge_cdf"),
    "bench:dv_scan": bench_dv_scan,
    "bench:cdf_read": bench_cdf_read,
}


def render(name: str) -> str:
    if name not in TABLES:
        raise KeyError(f"no reference table {name!r}; known: {sorted(TABLES)}")
    return TABLES[name]()


def stale_texts() -> list[str]:
    """Names that have a text here but no longer exist in the code."""
    import dataclasses as dc

    from streaming_merge import MergeOptions, MergeSink

    stale = [f"MergeOptions.{n}" for n in MERGE_OPTIONS if n not in {f.name for f in dc.fields(MergeOptions)}]
    params = inspect.signature(MergeSink.__init__).parameters
    stale += [f"MergeSink({n}=)" for n in MERGE_SINK if n not in params]
    for module_name, texts in CLI.items():
        flags = {a.option_strings[0] for a in parser_of(module_name)._actions if a.option_strings}
        stale += [f"{module_name} {flag}" for flag in texts if flag not in flags]
    return stale


if __name__ == "__main__":
    for table in sys.argv[1:] or list(TABLES):
        print(f"## {table}\n\n{render(table)}")
    for name in stale_texts():
        print(f"stale text: {name}", file=sys.stderr)
