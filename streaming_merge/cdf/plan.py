"""Which files hold the changes of each version, and which of their rows: the driver's half of
reading the change data feed (metadata only, no data file is opened here).

Delta's rules (its ``CDCReader``, PROTOCOL.md "Add CDC File"), per version:

* a version with ``cdc`` actions: its changes are exactly the rows of its change data files,
  whose ``_change_type`` column says what each row is; its ``add`` and ``remove`` actions are
  not read;
* otherwise ``add`` actions with ``dataChange`` are inserts (the rows the add's deletion vector
  keeps) and ``remove`` actions with ``dataChange`` are deletes (the rows that were live under
  the remove's deletion vector); ``dataChange=false`` actions (OPTIMIZE, a DV purge) change no
  row and emit nothing;
* the same path removed and added again with another deletion vector (a DELETE or UPDATE
  through deletion vectors, on a table whose writer wrote no change data) changed only the
  rows that differ between the vectors: those in the new vector and not the old one are
  deletes, those in the old and not the new (a RESTORE) are inserts. Emitting the whole
  remove and the whole add instead would report every untouched row as deleted and inserted.

Each resulting :class:`ChangeFile` carries everything a reader needs, on the driver (Spark,
streaming_merge.cdf.batch) or on an executor (pyarrow, streaming_merge.cdf.arrow_read): path,
size, partition values, version, timestamp, kind and the row selection.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import unquote

from streaming_merge.cdf.errors import ChangeDataFeedError, ChangeDataNotRecordedError
from streaming_merge.cdf.log import Commit, list_commits, read_commits, timestamp_ms
from streaming_merge.errors import DeltaTableError, UnsupportedTableFeatureError
from streaming_merge.table.deletion_vectors import DeletionVector
from streaming_merge.table.dv_log import live_adds
from streaming_merge.table.location import TableLocation
from streaming_merge.table.store import first_line, table_store

__all__ = [
    "CHANGE_DATA_FEED",
    "ChangeFile",
    "ChangeKind",
    "ChangePlan",
    "RowSelection",
    "VersionChanges",
    "check_recorded",
    "configuration_at",
    "is_recorded",
    "not_recorded_error",
    "plan_changes",
    "previous_add",
    "refuse_column_mapping",
    "starting_timestamp_version",
    "to_epoch_ms",
    "version_changes",
]

log = logging.getLogger(__name__)

CHANGE_DATA_FEED = "delta.enableChangeDataFeed"
ChangeKind = Literal["cdc", "insert", "delete"]
Timestamp = str | dt.datetime


@dataclass(frozen=True)
class RowSelection:
    """The rows of a data file a change task returns, by position in the file. ``keep=False``:
    every row except the positions of ``vector`` (an add's or a remove's deletion vector);
    ``keep=True``: only the positions of ``vector`` that ``minus`` does not hold (the rows a
    deletion-vector update changed)."""

    vector: DeletionVector | None
    minus: DeletionVector | None = None
    keep: bool = False


@dataclass(frozen=True)
class ChangeFile:
    """One file's share of the change feed: a change data file (``cdc``: the rows and their
    ``_change_type`` as written) or a data file whose selected rows are all ``insert`` or all
    ``delete``."""

    path: str  # relative to the table root, URL-decoded (as on disk)
    size: int
    partition_values: Mapping[str, str | None]  # Delta's string form, None for NULL
    version: int
    timestamp_ms: int
    kind: ChangeKind
    selection: RowSelection | None = None
    num_records: int | None = None  # physical rows, when the log says (data files only)

    @property
    def change_type(self) -> str | None:
        """The ``_change_type`` of every row (None for a change data file: its rows say)."""
        return None if self.kind == "cdc" else self.kind


@dataclass(frozen=True)
class VersionChanges:
    """A version's change files in a fixed order (a stream's offsets index into it), its
    timestamp and its ``metaData`` action if it has one."""

    version: int
    timestamp_ms: int
    files: tuple[ChangeFile, ...]
    metadata: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class ChangePlan:
    """The change files of versions ``start``..``end`` (both included) of a table. ``schema``
    and ``partition_columns`` are the ending version's (the rows are read with them)."""

    location: TableLocation
    start: int
    end: int
    versions: tuple[VersionChanges, ...]
    snapshot: Any = field(repr=False)  # streaming_merge.table.snapshot.Snapshot at ``end``

    @property
    def files(self) -> list[ChangeFile]:
        return [f for v in self.versions for f in v.files]


# ---------------------------------------------------------------------------------------------
# One version
# ---------------------------------------------------------------------------------------------


def version_changes(commit: Commit, table: str, partitioned: bool,
                    previous_add: Callable[[str], Mapping[str, Any] | None]) -> VersionChanges:
    """The change files of one commit under Delta's rules (module docstring). ``previous_add``
    looks a path up among the live adds before the commit; it is asked only for a ``remove``
    that lacks its size or partition values (writers before ``extendedFileMetadata``)."""
    version, stamp = commit.version, commit.timestamp_ms
    if commit.cdcs:
        cdc_files = [ChangeFile(path=_path(c, table, version), size=int(c["size"]),
                                partition_values=dict(c.get("partitionValues") or {}), version=version,
                                timestamp_ms=stamp, kind="cdc")
                     for c in commit.cdcs]
        return VersionChanges(version, stamp, tuple(cdc_files), commit.metadata)
    adds = {_path(a, table, version): a for a in commit.adds if a.get("dataChange", True)}
    removes = {_path(r, table, version): r for r in commit.removes if r.get("dataChange", True)}
    files: list[ChangeFile] = []
    for path, add in adds.items():
        remove = removes.get(path)
        if remove is None:
            files.append(_data_file(path, add, version, stamp, "insert", RowSelection(_vector(add))))
            continue
        new, old = _vector(add), _vector(remove)
        if _vector_id(new) == _vector_id(old):
            continue  # the same logical file again: no row changed
        if new is not None:  # rows the new vector deletes that the old one did not
            files.append(_data_file(path, add, version, stamp, "delete", RowSelection(new, old, keep=True)))
        if old is not None:  # rows the old vector deleted that the new one brings back
            files.append(_data_file(path, add, version, stamp, "insert", RowSelection(old, new, keep=True)))
    for path, remove in removes.items():
        if path in adds:
            continue
        if "size" not in remove or (partitioned and "partitionValues" not in remove):
            remove = {**(previous_add(path) or {}), **remove}
            if "size" not in remove:
                raise ChangeDataFeedError(
                    f"The remove action of `{path}` in commit {version} of table `{table}` has no size and no earlier "
                    "add of that path is live: the log is incomplete, its change data cannot be read.")
        files.append(_data_file(path, remove, version, stamp, "delete", RowSelection(_vector(remove))))
    return VersionChanges(version, stamp, tuple(files), commit.metadata)


def _path(action: Mapping[str, Any], table: str, version: int) -> str:
    path = unquote(str(action["path"]))
    if "://" in path or path.startswith("/"):
        raise ChangeDataFeedError(
            f"Commit {version} of table `{table}` names a file by an absolute path (`{path}`, a shallow clone?); "
            "the change data feed reader reads files inside the table only.")
    return path


def _vector(action: Mapping[str, Any]) -> DeletionVector | None:
    vector = action.get("deletionVector")
    return DeletionVector.from_json(vector) if vector else None


def _vector_id(vector: DeletionVector | None) -> str | None:
    return None if vector is None else vector.unique_id


def _data_file(path: str, action: Mapping[str, Any], version: int, stamp: int, kind: ChangeKind,
               selection: RowSelection) -> ChangeFile:
    return ChangeFile(path=path, size=int(action["size"]), partition_values=dict(action.get("partitionValues") or {}),
                      version=version, timestamp_ms=stamp, kind=kind,
                      selection=selection if selection.vector is not None else None,
                      num_records=_num_records(action))


def _num_records(action: Mapping[str, Any]) -> int | None:
    stats = action.get("stats")
    if not stats:
        return None
    try:
        count = (json.loads(stats) if isinstance(stats, str) else stats).get("numRecords")
    except (ValueError, AttributeError):
        return None
    return None if count is None else int(count)


# ---------------------------------------------------------------------------------------------
# Checks shared with the stream
# ---------------------------------------------------------------------------------------------


def is_recorded(configuration: Mapping[str, Any] | None) -> bool:
    """Whether a ``metaData`` configuration has the change data feed on."""
    value = (configuration or {}).get(CHANGE_DATA_FEED)
    return str(value or "false").strip().lower() == "true"


def not_recorded_error(table: str, start: int, end: int | str, version: int) -> ChangeDataNotRecordedError:
    """Delta's wording, with the table and this library's way to turn the feed on."""
    return ChangeDataNotRecordedError(
        f"Error getting change data for range [{start} , {end}] of table `{table}` as change data was not recorded "
        f"for version [{version}]. If you've enabled change data feed on this table, use DeltaTable.history() "
        "(DESCRIBE HISTORY) to see when it was first enabled and read from that version on. Otherwise, to start "
        f"recording change data, set the table property {CHANGE_DATA_FEED}=true "
        "(DeltaTable.setProperties, ALTER TABLE ... SET TBLPROPERTIES).")


def check_recorded(table: str, start: int, end: int | str, configuration_at_start: Mapping[str, Any] | None,
                   commits: Sequence[Commit]) -> None:
    """Raise unless the feed was on at ``start`` and no commit of the range turned it off."""
    if not is_recorded(configuration_at_start):
        raise not_recorded_error(table, start, end, start)
    for commit in commits:
        if commit.metadata is not None and not is_recorded(commit.metadata.get("configuration")):
            raise not_recorded_error(table, start, end, commit.version)


def refuse_column_mapping(table: str, configuration: Mapping[str, Any]) -> None:
    """Column mapping stores columns under physical names this reader does not translate."""
    mode = str(configuration.get("delta.columnMapping.mode") or "none").lower()
    if mode != "none":
        raise UnsupportedTableFeatureError(
            f"Table `{table}` uses column mapping (delta.columnMapping.mode={mode}); the change data feed reader "
            "reads columns by their logical names and cannot read it.")


def to_epoch_ms(value: Timestamp, what: str) -> int:
    """A timestamp option as epoch milliseconds: a ``datetime`` or an ISO-8601 string
    (``2024-01-31``, ``2024-01-31 12:00:00``, ``...T12:00:00Z``, with an offset or not); a
    value without a time zone is UTC, which is also the time zone of ``_commit_timestamp``."""
    if isinstance(value, str):
        try:
            value = dt.datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        except ValueError as exc:
            raise ChangeDataFeedError(f"{what} must be an ISO-8601 timestamp such as '2024-01-31 12:00:00', got "
                                      f"{value!r}") from exc
    if isinstance(value, dt.date) and not isinstance(value, dt.datetime):
        value = dt.datetime(value.year, value.month, value.day)
    if not isinstance(value, dt.datetime):
        raise ChangeDataFeedError(f"{what} must be a datetime or an ISO-8601 string, got {value!r}")
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.UTC)
    return int(value.timestamp() * 1000)


# ---------------------------------------------------------------------------------------------
# A range of versions
# ---------------------------------------------------------------------------------------------


def plan_changes(location: TableLocation, starting_version: int | None = None, ending_version: int | None = None,
                 starting_timestamp: Timestamp | None = None, ending_timestamp: Timestamp | None = None
                 ) -> ChangePlan:
    """The change files of a range of versions (see ``DeltaTable.changes`` for the options),
    after Delta's checks: the range lies within the log, the log still holds every commit of
    it, and the feed was recorded at every version of it."""
    from streaming_merge.table.snapshot import load_snapshot  # delta-rs: the driver only

    table = location.uri
    if starting_version is not None and starting_timestamp is not None:
        raise ChangeDataFeedError("Give at most one of starting_version and starting_timestamp.")
    if ending_version is not None and ending_timestamp is not None:
        raise ChangeDataFeedError("Give at most one of ending_version and ending_timestamp.")
    for name, number in (("starting_version", starting_version), ("ending_version", ending_version)):
        if number is not None and (not isinstance(number, int) or isinstance(number, bool) or number < 0):
            raise ChangeDataFeedError(f"{name} must be a version number >= 0, got {number!r}")
    store = table_store(location.log_uri, location.options)
    by_version = starting_version is not None and starting_timestamp is None and ending_timestamp is None
    listing = list_commits(store, table, starting_version if by_version else None)
    if not listing.commits and not listing.checkpoints and by_version:
        listing = list_commits(store, table)  # nothing at or after the start: what is the latest?
    known = set(listing.commits) | set(listing.checkpoints)
    if not known:
        raise ChangeDataFeedError(f"`{table}` is not a Delta table: its `_delta_log` holds no commit.")
    latest = max(known)
    stamps: dict[int, int] = {}
    start = _start_version(store, table, listing, latest, starting_version, starting_timestamp, stamps)
    end = _end_version(store, table, listing, latest, ending_version, ending_timestamp, stamps)
    if start > latest:
        raise ChangeDataFeedError(
            f"Provided start version ({start}) for reading change data of table `{table}` is invalid: start version "
            f"cannot be greater than the latest version of the table ({latest}).")
    if end < start:
        raise ChangeDataFeedError(
            f"CDC range from start {start} to end {end} of table `{table}` was invalid: end cannot be before start.")
    commits = read_commits(store, table, range(start, end + 1))
    missing = [v for v, c in commits.items() if c is None]
    if missing:
        oldest = min(list_commits(store, table).commits, default=None)
        raise ChangeDataFeedError(
            f"Cannot read the change data of table `{table}` for versions [{start}, {end}]: the log no longer holds "
            f"commit {missing[0]} (its oldest commit is {oldest}). Commits older than delta.logRetentionDuration "
            "(30 days by default) are deleted after a checkpoint; read from a version the log still holds.")
    ordered = [c for c in commits.values() if c is not None]
    snapshot = load_snapshot(location, end)
    refuse_column_mapping(table, snapshot.configuration)
    check_recorded(table, start, end, _configuration_at(location, ordered, snapshot), ordered)
    partitioned = bool(snapshot.partition_columns)
    versions = tuple(version_changes(c, table, partitioned, previous_add(location, c.version)) for c in ordered)
    return ChangePlan(location=location, start=start, end=end, versions=versions, snapshot=snapshot)


def _configuration_at(location: TableLocation, commits: Sequence[Commit], snapshot: Any) -> Mapping[str, Any]:
    """The table configuration in force at the first commit of ``commits``: its own metaData,
    else the ending snapshot's when no later commit of the range changed the metadata, else
    what delta-rs reads at that version."""
    first = commits[0]
    if first.metadata is not None:
        return first.metadata.get("configuration") or {}
    if all(c.metadata is None for c in commits[1:]):
        return snapshot.configuration
    return configuration_at(location, first.version)


def configuration_at(location: TableLocation, version: int) -> dict[str, Any]:
    """The table's configuration in force at ``version`` (read by delta-rs)."""
    from streaming_merge.table.snapshot import open_table

    try:
        return dict(open_table(location, version).metadata().configuration)
    except DeltaTableError as exc:
        raise ChangeDataFeedError(
            f"Cannot tell whether table `{location.uri}` recorded change data at version {version}: its state at that "
            f"version cannot be read ({first_line(exc)}). Log cleanup removes the commits before a checkpoint once "
            "they are older than delta.logRetentionDuration; start from a version at or after the oldest "
            "checkpoint.") from exc


def starting_timestamp_version(location: TableLocation, timestamp: Timestamp) -> int:
    """The first version committed at or after ``timestamp``; raises when every commit is older."""
    store = table_store(location.log_uri, location.options)
    listing = list_commits(store, location.uri)
    known = set(listing.commits) | set(listing.checkpoints)
    if not known:
        raise ChangeDataFeedError(f"`{location.uri}` is not a Delta table: its `_delta_log` holds no commit.")
    return _start_version(store, location.uri, listing, max(known), None, timestamp, {})


def previous_add(location: TableLocation, version: int) -> Callable[[str], Mapping[str, Any] | None]:
    """The ``previous_add`` of :func:`version_changes`: the live adds before ``version``,
    replayed from the log only when asked."""

    def lookup(path: str) -> Mapping[str, Any] | None:
        if version == 0:
            return None
        return live_adds(location.log_uri, location.options, version - 1).get(path)

    return lookup


def _start_version(store: Any, table: str, listing: Any, latest: int, version: int | None,
                   timestamp: Timestamp | None, stamps: dict[int, int]) -> int:
    if timestamp is None:
        return 0 if version is None else version
    wanted = to_epoch_ms(timestamp, "starting_timestamp")
    earliest = min(listing.commits, default=latest)
    latest_stamp = timestamp_ms(store, table, latest, stamps)
    if wanted > latest_stamp:
        raise ChangeDataFeedError(
            f"The provided timestamp ({_show(wanted)}) is after the latest version available to table `{table}` "
            f"(version {latest}, committed {_show(latest_stamp)}). Please use a timestamp before or at "
            f"{_show(latest_stamp)}.")
    # The first version committed at or after the timestamp (commit timestamps never decrease).
    low, high = earliest, latest
    while low < high:
        middle = (low + high) // 2
        if timestamp_ms(store, table, middle, stamps) >= wanted:
            high = middle
        else:
            low = middle + 1
    return low


def _end_version(store: Any, table: str, listing: Any, latest: int, version: int | None,
                 timestamp: Timestamp | None, stamps: dict[int, int]) -> int:
    if timestamp is None:
        return latest if version is None else min(version, latest)
    wanted = to_epoch_ms(timestamp, "ending_timestamp")
    earliest = min(listing.commits, default=latest)
    if timestamp_ms(store, table, earliest, stamps) > wanted:
        raise ChangeDataFeedError(
            f"The provided ending timestamp ({_show(wanted)}) is before the earliest version available to table "
            f"`{table}` (version {earliest}, committed {_show(stamps[earliest])}).")
    # The last version committed at or before the timestamp.
    low, high = earliest, latest
    while low < high:
        middle = (low + high + 1) // 2
        if timestamp_ms(store, table, middle, stamps) <= wanted:
            low = middle
        else:
            high = middle - 1
    return low


def _show(epoch_ms: int) -> str:
    return dt.datetime.fromtimestamp(epoch_ms / 1000, dt.UTC).isoformat(sep=" ", timespec="milliseconds")
