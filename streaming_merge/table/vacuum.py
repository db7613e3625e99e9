"""VACUUM through delta-rs: delete the files no version within the retention references.

delta-rs runs it in "full" mode here: it lists the whole table folder and deletes every file
that neither the current version nor a remove still inside the retention references and
that is older than the retention, which includes the leftovers of a failed or killed write
(files Spark wrote but no commit ever referenced). delta-rs' default "lite" mode only deletes
files removed in the log and never finds such orphans.

What delta-rs 1.6 skips (measured, tests/spark/test_vacuum.py): a path is "hidden", and never
deleted, when its path *relative to the table root* starts with ``_`` or ``.`` (so only
top-level entries: ``_delta_log/``, ``.anything/``, ``_anything/``), except ``_delta_index``
and ``_change_data`` and names starting with a partition column's name. A ``.`` or ``_``
folder below the top level (``day=1/.tmp/``, ``sm-write-x/_temporary/``) is not hidden.
Empty folders are left in place (only files are deleted).

The retention check mirrors Delta's ``spark.databricks.delta.retentionDurationCheck.enabled``:
a retention shorter than the table's ``delta.deletedFileRetentionDuration`` (default one
week) is refused unless ``enforce_retention_duration=False``.

Deletion vectors (measured, tests/spark/test_dv_maintenance.py): delta-rs 1.6.6's full vacuum
does not know DV files. It lists every ``deletion_vector_<uuid>.bin`` older than the
retention as unreferenced, the ones the current version's adds need included, so it would
corrupt the table (its lite mode never deletes a DV file at all). For a table whose protocol
has deletion vectors, delta-rs only lists (a dry run); the DV files still referenced are taken
out of its list and the rest is deleted here, between the same ``VACUUM START`` / ``VACUUM
END`` commits delta-rs writes. Referenced, as in Delta's VacuumCommand: the DV of a live add,
and the DV of a ``remove`` whose ``deletionTimestamp`` is within the retention (a reader of an
older version still needs it). Orphaned DV files (of a write that never committed, or only
referenced by an expired remove) older than the retention are deleted, like orphaned data files.
"""

from __future__ import annotations

import json
import logging
import math
import re
import time
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import obstore
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake.exceptions import DeltaError

from streaming_merge.errors import ConcurrentModificationError, DeltaTableError, VacuumRetentionError
from streaming_merge.table.commit import CommitRequest, commit
from streaming_merge.table.deletion_vectors import DeletionVector
from streaming_merge.table.dv_log import list_log, newest_checkpoint
from streaming_merge.table.location import TableLocation, TableRef
from streaming_merge.table.snapshot import Snapshot, check_writable, load_snapshot
from streaming_merge.table.store import NOT_FOUND, first_line, get_bytes, table_store

log = logging.getLogger(__name__)

RETENTION_PROPERTY = "delta.deletedFileRetentionDuration"
DEFAULT_RETENTION = "interval 1 week"

_UNIT_HOURS = {
    "week": 24 * 7, "day": 24, "hour": 1, "minute": 1 / 60, "second": 1 / 3600,
    "millisecond": 1 / 3_600_000, "microsecond": 1 / 3_600_000_000,
}
_PART = re.compile(r"(\d+(?:\.\d+)?)\s*([a-z]+?)s?\b")


def retention_hours_of(interval: str) -> float:
    """Hours of a Delta interval property value (``interval 7 days``, ``168 hours``,
    ``interval 1 day 12 hours``); months and years are refused, as Delta does."""
    text = interval.strip().lower()
    text = text[len("interval"):] if text.startswith("interval") else text
    hours = 0.0
    consumed = 0
    for part in _PART.finditer(text):
        unit = part.group(2)
        if unit not in _UNIT_HOURS:
            raise DeltaTableError(f"{RETENTION_PROPERTY}={interval!r}: unit {unit!r} is not allowed "
                                  f"(use weeks, days, hours, minutes, seconds).")
        hours += float(part.group(1)) * _UNIT_HOURS[unit]
        consumed += 1
    if not consumed or _PART.sub("", text).strip():
        raise DeltaTableError(f"{RETENTION_PROPERTY}={interval!r} is not an interval such as 'interval 7 days'.")
    return hours


def vacuum(
    location: TableRef,
    retention_hours: float | None = None,
    *,
    dry_run: bool = False,
    enforce_retention_duration: bool = True,
) -> list[str]:
    """Delete (or with ``dry_run`` only list) the unreferenced files older than the retention;
    returns their paths relative to the table root, sorted.

    delta-rs takes whole hours: a fractional retention is rounded up (keeps more, never less).
    """
    snapshot = load_snapshot(location)
    check_writable(snapshot)
    configured_text = snapshot.configuration.get(RETENTION_PROPERTY) or DEFAULT_RETENTION
    configured = retention_hours_of(configured_text)
    retention = configured if retention_hours is None else float(retention_hours)
    if retention < 0 or math.isnan(retention):
        raise VacuumRetentionError(
            f"The VACUUM retention must be a non-negative number of hours, got {retention_hours}.")
    if enforce_retention_duration and retention < configured:
        raise VacuumRetentionError(
            "Are you sure you would like to vacuum files with such a low retention period "
            f"({retention:g} hours for `{snapshot.table_path}`)? If you have writers that are currently writing "
            "to this table, there is a risk that you may corrupt the state of your Delta table. If you are "
            "certain that there are no operations being performed on this table, such as insert/upsert/delete/"
            "optimize, then you may turn off this check with vacuum(..., enforce_retention_duration=False) "
            f"(Delta: spark.databricks.delta.retentionDurationCheck.enabled = false). If you are not sure, "
            f"please use a value not less than \"{configured:g} hours\" ({RETENTION_PROPERTY} = "
            f"{configured_text!r}). Nothing was deleted.")
    hours = math.ceil(retention)
    if snapshot.has_deletion_vectors:
        deleted = _vacuum_keeping_deletion_vectors(snapshot, hours, dry_run=dry_run,
                                                   check_enabled=enforce_retention_duration,
                                                   default_hours=configured)
    else:
        deleted = _listed_by_delta_rs(snapshot, hours, dry_run=dry_run)
    log.info("VACUUM %s (retention %g h%s): %d file(s)", snapshot.table_path, retention,
             ", dry run" if dry_run else "", len(deleted))
    return sorted(deleted)


def _listed_by_delta_rs(snapshot: Snapshot, hours: int, *, dry_run: bool) -> list[str]:
    """delta-rs' full vacuum: the files it deletes (or, dry, would delete)."""
    try:
        return list(snapshot._table.vacuum(
            retention_hours=hours,
            dry_run=dry_run,
            enforce_retention_duration=False,  # checked by vacuum(), against the same property
            full=True,
        ))
    except DeltaError as exc:
        raise DeltaTableError(f"VACUUM of `{snapshot.table_path}` failed: {exc}") from exc


_HOUR_MS = 3_600_000
_DELETE_THREADS = 16


def _vacuum_keeping_deletion_vectors(snapshot: Snapshot, hours: int, *, dry_run: bool, check_enabled: bool,
                                     default_hours: float) -> list[str]:
    """delta-rs' list less the DV files still referenced; deleted here unless ``dry_run``."""
    # Taken before delta-rs takes its own "now": never later than delta-rs' cutoff, so a remove
    # it counts as within the retention is counted so here too.
    cutoff_ms = int(time.time() * 1000) - hours * _HOUR_MS
    listed = _listed_by_delta_rs(snapshot, hours, dry_run=True)
    referenced = referenced_dv_files(snapshot, cutoff_ms)
    kept = sorted(p for p in listed if p in referenced)
    doomed = sorted(p for p in listed if p not in referenced)
    if kept:
        log.info("VACUUM %s keeps %d deletion-vector file(s) delta-rs listed although the log references them: "
                 "%s", snapshot.table_path, len(kept), kept[:5])
    if dry_run or not doomed:
        return doomed
    location = snapshot.location
    store = table_store(location.log_uri, location.options)
    with ThreadPoolExecutor(min(_DELETE_THREADS, len(doomed))) as pool:
        sizes = list(pool.map(lambda path: _size_of(store, path), doomed))
    _log_operation(location, "VACUUM START", {
        "retentionCheckEnabled": check_enabled,
        "specifiedRetentionMillis": hours * _HOUR_MS,
        "defaultRetentionMillis": int(default_hours * _HOUR_MS),
    }, {"numFilesToDelete": len(doomed), "sizeOfDataToDelete": sum(sizes)})
    with ThreadPoolExecutor(min(_DELETE_THREADS, len(doomed))) as pool:
        deleted = sum(pool.map(lambda path: _delete(store, location, path), doomed))
    _log_operation(location, "VACUUM END", {"status": "COMPLETED"},
                   {"numDeletedFiles": deleted, "numVacuumedDirectories": 0})
    return doomed


def _size_of(store: Any, path: str) -> int:
    try:
        return int(obstore.head(store, path)["size"])
    except NOT_FOUND:
        return 0


def _delete(store: Any, location: TableLocation, path: str) -> bool:
    """Delete one file; False when it was already gone (another vacuum)."""
    try:
        obstore.delete(store, path)
    except NOT_FOUND:
        return False
    except Exception as exc:
        raise DeltaTableError(f"VACUUM of `{location}` could not delete `{path}`: {first_line(exc)}") from exc
    return True


_LOG_RACES = 3


def _log_operation(location: TableLocation, operation: str, parameters: Mapping[str, Any],
                   metrics: Mapping[str, Any]) -> None:
    """A commit holding only the operation's commitInfo, against the latest version (a
    concurrent metadata change is no conflict for VACUUM: it only retries)."""
    for attempt in range(_LOG_RACES):
        try:
            commit(CommitRequest(snapshot=load_snapshot(location), adds=(), removes=(), operation=operation,
                                 operation_parameters=parameters, operation_metrics=metrics, data_change=False))
            return
        except ConcurrentModificationError:
            if attempt == _LOG_RACES - 1:
                raise


# ---------------------------------------------------------------------------------------------
# The DV files the log references
# ---------------------------------------------------------------------------------------------

# A remove written within the retention is in a commit written (modified) after the cutoff, less
# the clock skew between the writer and the store, which this allows generously.
_CLOCK_SKEW_MS = 24 * _HOUR_MS


def referenced_dv_files(snapshot: Snapshot, cutoff_ms: int) -> set[str]:
    """The on-disk DV files (paths relative to the table root) that VACUUM must keep: those of
    the live adds at ``snapshot.version`` and those of removes whose ``deletionTimestamp`` is
    after ``cutoff_ms`` (epoch milliseconds).

    The removes come from the JSON commits written since the cutoff (less a day of clock skew)
    and from the newest checkpoint (whose tombstones outlive cleaned-up commits when the log's
    retention is shorter than the files')."""
    location = snapshot.location
    descriptors = [a.get("deletionVector") for a in snapshot.log_adds().values()]
    descriptors += [r.get("deletionVector") for r in _removes_within(snapshot, cutoff_ms)]
    referenced = set()
    for descriptor in descriptors:
        if descriptor:
            relative = _table_relative(DeletionVector.from_json(descriptor), location)
            if relative is not None:
                referenced.add(relative)
    return referenced


def _table_relative(vector: DeletionVector, location: TableLocation) -> str | None:
    """Where a DV file lies relative to the table root; None for an inline DV, or an absolute
    path outside the table (which VACUUM never lists)."""
    path = vector.relative_path()
    if path is None or vector.storage_type == "u":
        return path
    for root in {location.log_uri.rstrip("/"), location.uri.rstrip("/")}:
        variants = {root, root.replace("file:///", "file:/", 1), root.replace("file:/", "file:///", 1)}
        for variant in variants:
            if path.startswith(variant + "/"):
                return path[len(variant) + 1:]
    return None


def _removes_within(snapshot: Snapshot, cutoff_ms: int) -> Iterator[dict[str, Any]]:
    """The ``remove`` actions at or before ``snapshot.version`` whose ``deletionTimestamp`` is
    after ``cutoff_ms``: those of the commits written since the cutoff and of the newest
    checkpoint (the log's own listing, streaming_merge.table.dv_log)."""
    location = snapshot.location
    store = table_store(location.log_uri, location.options)
    try:
        listing = list_log(store, location.log_uri, snapshot.version)
        commits = [f"_delta_log/{v:020d}.json" for v, modified_ms in sorted(listing.commits.items())
                   if modified_ms >= cutoff_ms - _CLOCK_SKEW_MS]
        removes = [r for path in commits for r in _commit_removes(get_bytes(store, path), path)]
        checkpoint = newest_checkpoint(listing, snapshot.version)
        kind, parts = checkpoint if checkpoint is not None else ("", [])
        for path, _ in parts:
            data = get_bytes(store, path)
            removes += (_commit_removes(data, path) if kind == "json" else _checkpoint_removes(data))
    except DeltaTableError:
        raise
    except Exception as exc:
        raise DeltaTableError(f"VACUUM cannot read the removes in the log of `{location}`: {first_line(exc)}") \
            from exc
    return (r for r in removes if int(r.get("deletionTimestamp") or 0) > cutoff_ms)


def _commit_removes(data: bytes, path: str) -> Iterable[dict[str, Any]]:
    removes = []
    for number, line in enumerate(data.splitlines(), 1):
        if not line.strip():
            continue
        try:
            remove = json.loads(line).get("remove")
        except ValueError as exc:
            raise DeltaTableError(f"VACUUM cannot parse line {number} of `{path}`: {exc}") from exc
        if remove is not None:
            removes.append(remove)
    return removes


def _checkpoint_removes(data: bytes) -> list[dict[str, Any]]:
    """The removes of a checkpoint part that carry a DV (their DV and deletion timestamp)."""
    parquet = pq.ParquetFile(pa.BufferReader(data))
    index = parquet.schema_arrow.get_field_index("remove")
    if index < 0:
        return []
    remove_type = parquet.schema_arrow.field(index).type
    if not isinstance(remove_type, pa.StructType) or min(remove_type.get_field_index("deletionVector"),
                                                         remove_type.get_field_index("deletionTimestamp")) < 0:
        return []
    removes = parquet.read(columns=["remove.deletionVector", "remove.deletionTimestamp"]).column("remove")
    removes = removes.combine_chunks()
    with_vector = pc.and_(pc.is_valid(removes), pc.is_valid(removes.field("deletionVector")))
    return pc.filter(removes, with_vector).to_pylist()
