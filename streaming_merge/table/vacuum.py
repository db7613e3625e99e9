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
"""

from __future__ import annotations

import logging
import math
import re

from deltalake.exceptions import DeltaError

from streaming_merge.errors import DeltaTableError, VacuumRetentionError
from streaming_merge.table.location import TableRef
from streaming_merge.table.snapshot import check_writable, load_snapshot

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
    try:
        deleted = snapshot._table.vacuum(
            retention_hours=math.ceil(retention),
            dry_run=dry_run,
            enforce_retention_duration=False,  # checked above, against the same property
            full=True,
        )
    except DeltaError as exc:
        raise DeltaTableError(f"VACUUM of `{snapshot.table_path}` failed: {exc}") from exc
    log.info("VACUUM %s (retention %g h%s): %d file(s)", snapshot.table_path, retention,
             ", dry run" if dry_run else "", len(deleted))
    return sorted(deleted)
